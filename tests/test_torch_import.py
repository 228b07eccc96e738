"""Importing PyTorch models as workloads (dnnscale.workload.torch_import).

Every model is built and traced on the meta device: no weights are allocated, nothing computed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.module_tracker import ModuleTracker
from typer.testing import CliRunner

from dnnscale.cli import app
from dnnscale.errors import InputError
from dnnscale.workload.spec import workload_from_dict, workload_to_dict
from dnnscale.workload.torch_counting import CountingMode
from dnnscale.workload.torch_import import from_torch, parse_input_shapes
from dnnscale.workload.zoo import zoo_workload
from tests import torch_models as tm

REPO = Path(__file__).resolve().parents[1]


def _by_name(workload):
    return {layer.name: layer for layer in workload.layers}


# --- the counter itself, on hand-computed cases -------------------------------------------------


def _count(model: nn.Module, *inputs: torch.Tensor) -> CountingMode:
    tracker = ModuleTracker()
    mode = CountingMode(tracker)
    with tracker, mode:
        out = model(*inputs)
        mode.active = False
        seed = (out * 1).sum()
        mode.active = True
        seed.backward()
        mode.classify_weight_gradients(list(model.parameters()))
    return mode


def _phase_totals(mode: CountingMode, module: str) -> dict[str, tuple[float, float]]:
    totals = {p: [0.0, 0.0] for p in ("fwd", "input_grad", "weight_grad")}
    for record in mode.records:
        if record.module == module:
            for phase, (flops, moved) in record.phase_costs().items():
                totals[phase][0] += flops
                totals[phase][1] += moved
    return {p: (f, b) for p, (f, b) in totals.items()}


def test_linear_phases_split_by_hand() -> None:
    """Linear 4->3 on a batch of 2 whose input needs a gradient.

    fwd addmm: 2·2·4·3 = 48 FLOP; reads x 2·4·4 = 32 B, W 12·4 = 48 B, bias 3·4 = 12 B and writes
    y 2·3·4 = 24 B: 116 B. Input grad: mm(grad_y 2x3, W 3x4) 48 FLOP; reads 24 + 48, writes 32:
    104 B. Weight grad: mm(grad_y^T 3x2, x 2x4) 48 FLOP, reads 24 + 32, writes 48 (104 B), plus
    the bias grad sum: reads 24 B, writes 12 B. Total weight grad 140 B. (AccumulateGrad's copies
    into .grad are left out here; they are per step, not per sample, and from_torch drops them.)
    """
    with torch.device("meta"):
        model = nn.Linear(4, 3)
    x = torch.empty(2, 4, device="meta", requires_grad=True)
    mode = _count(model, x)
    mode.records = [r for r in mode.records if r.op not in ("aten.copy_",
                                                            "aten.new_empty_strided")]
    totals = _phase_totals(mode, "Linear")
    assert totals["fwd"] == (48.0, 116.0)
    assert totals["input_grad"] == (48.0, 104.0)
    assert totals["weight_grad"] == (48.0, 140.0)


def test_cpu_flash_attention_is_counted() -> None:
    """On CPU, sdpa runs _scaled_dot_product_flash_attention_for_cpu, which torch's table lacks.

    Forward 4·b·h·s_q·s_k·d = 4·2·3·5·5·4 = 2400 FLOP; backward 2.5x = 6000 FLOP.
    """

    class Attention(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v)

    q, k, v = (torch.randn(2, 3, 5, 4, requires_grad=True) for _ in range(3))
    mode = _count(Attention(), q, k, v)
    ops = {r.op: r for r in mode.records if "attention" in r.op}
    assert ops["aten._scaled_dot_product_flash_attention_for_cpu"].flops == 2400
    assert ops["aten._scaled_dot_product_flash_attention_for_cpu_backward"].flops == 6000
    totals = _phase_totals(mode, "Attention")
    assert totals["fwd"][0] == 2400 and totals["input_grad"][0] == 6000
    assert totals["weight_grad"] == (0.0, 0.0)


# --- zoo CNNs: exactly the zoo's layers -----------------------------------------------------------


@pytest.mark.parametrize(("zoo_name", "factory", "shape"), [
    ("adam-cifar10", tm.adam_cifar10, (3, 32, 32)),
    ("alexnet", tm.alexnet, (3, 224, 224)),
    ("vgg16", tm.vgg16, (3, 224, 224)),
])
def test_zoo_cnns_import_with_zoo_flops(zoo_name, factory, shape) -> None:
    imported = from_torch(factory, shape, loss="cross_entropy")
    zoo = zoo_workload(zoo_name)
    assert [(l.name, l.kind) for l in imported.layers] == [(l.name, l.kind) for l in zoo.layers]
    for mine, theirs in zip(imported.layers, zoo.layers):
        assert (mine.fwd_flops, mine.input_grad_flops, mine.weight_grad_flops) == \
            (theirs.fwd_flops, theirs.input_grad_flops, theirs.weight_grad_flops), mine.name
    assert imported.layers == zoo.layers  # shapes, params, bytes and partition facts too
    assert imported.params == sum(p.numel() for p in factory().parameters())
    assert imported.input_shape == zoo.input_shape


def test_conv_counts_agree_with_the_zoo_formula_by_hand() -> None:
    """Conv 3->8, 3x3, pad 1 on 3x8x8, then conv 8->4 1x1: per sample the first does
    2·8·8·8·3·3·3 = 27,648 FLOP forward and weight grad and 0 input grad (first weighted layer);
    the second 2·4·8·8·8 = 4,096 in each phase."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 1))
    w = from_torch(model, (3, 8, 8))
    first, second = w.layers
    assert first.kind == second.kind == "conv2d"
    assert (first.fwd_flops, first.input_grad_flops, first.weight_grad_flops) == (27648, 0, 27648)
    assert (second.fwd_flops, second.input_grad_flops, second.weight_grad_flops) == (4096,) * 3
    # The real model was left alone: still on CPU, no gradients, same mode.
    assert all(p.device.type == "cpu" and p.grad is None for p in model.parameters())


@settings(max_examples=12, deadline=None)
@given(c_in=st.integers(1, 8), c_out=st.integers(1, 8), kernel=st.integers(1, 4),
       stride=st.integers(1, 3), padding=st.integers(0, 2), size=st.integers(4, 12),
       hidden=st.integers(1, 16))
def test_random_conv_nets_map_to_zoo_kinds(c_in, c_out, kernel, stride, padding, size,
                                           hidden) -> None:
    """Property: any Conv2d/ReLU/Flatten/Linear chain counts exactly the zoo's FLOPs."""
    out = (size + 2 * padding - kernel) // stride + 1
    if out < 1:
        return
    model = nn.Sequential(nn.Conv2d(c_in, c_out, kernel, stride, padding), nn.ReLU(),
                          nn.Flatten(), nn.Linear(c_out * out * out, hidden))
    imported = from_torch(model, (c_in, size, size))
    assert [l.kind for l in imported.layers] == ["conv2d", "relu", "flatten", "linear"]
    conv = imported.layers[0]
    macs = c_out * out * out * kernel * kernel * c_in
    assert (conv.fwd_flops, conv.input_grad_flops, conv.weight_grad_flops) == (2 * macs, 0, 2 * macs)


# --- transformers ---------------------------------------------------------------------------------


GPT_T, GPT_D, GPT_L = 64, 256, 4  # tests.torch_models.GPT defaults: context, width, depth


def _attention_flops(tokens: int, width: int, depth: int) -> int:
    """Attention term per sequence: Q·K^T and A·V are each 2·T·T·d FLOP per layer (counted
    over the full T x T score matrix, as torch's sdpa formula does even when causal), so
    4·T²·d·L in all."""
    return 4 * tokens * tokens * width * depth


@pytest.mark.parametrize("factory", [tm.small_gpt, tm.small_gpt_mha])
def test_small_gpt_forward_flops(factory) -> None:
    """Forward FLOPs per sequence of T tokens = 2·params·T + 4·T²·d·L within 1 %.

    Exactly, 2·(matmul weights)·T + 4·T²·d·L: the tied output embedding is a matmul, the
    position embedding and norm gains are not (they make the ~0.5 % gap to 2·params·T).
    """
    model = factory()
    w = from_torch(factory, (GPT_T,), input_dtypes="int64")
    params = sum(p.numel() for p in model.parameters())
    assert w.params == params
    attention = _attention_flops(GPT_T, GPT_D, GPT_L)
    assert w.fwd_flops == pytest.approx(2 * params * GPT_T + attention, rel=0.01)
    matmul_weights = params - model.wpe.weight.numel() - sum(
        m.weight.numel() for m in model.modules() if isinstance(m, nn.LayerNorm))
    assert w.fwd_flops == 2 * matmul_weights * GPT_T + attention
    # Backward: input grads of all matmuls but nothing upstream of the embeddings; weight
    # grads of every matmul weight (2·W·T) and none for attention.
    assert w.weight_grad_flops == 2 * matmul_weights * GPT_T
    assert w.input_grad_flops == 2 * matmul_weights * GPT_T + 2 * attention


def test_real_cpu_model_is_counted_like_its_meta_twin_and_left_unchanged() -> None:
    """A model with real (tied) weights is traced through meta copies of them."""
    torch.manual_seed(0)
    real = tm.GPT(vocab=64, context=8, width=32, depth=1, heads=2)
    real.eval()
    before = {n: p.detach().clone() for n, p in real.named_parameters()}
    imported = from_torch(real, (8,), input_dtypes="int64")
    twin = from_torch(lambda: tm.GPT(vocab=64, context=8, width=32, depth=1, heads=2), (8,),
                      input_dtypes="int64")
    assert imported.layers == twin.layers
    assert not real.training and real.head.weight is real.wte.weight
    for n, p in real.named_parameters():
        assert p.device.type == "cpu" and p.grad is None and torch.equal(p, before[n])


def test_multihead_attention_owns_its_internal_ops_and_out_proj() -> None:
    """nn.MultiheadAttention becomes its five transformer kinds (workload/torch_transformer.py),
    which together hold its ops and the never-called out_proj."""
    w = from_torch(tm.small_gpt_mha, (GPT_T,), input_dtypes="int64")
    parts = [l for l in w.layers if l.name.startswith("blocks.0.attn.mha.")]
    assert [l.kind for l in parts] == ["attn_qkv", "attn_scores", "attn_softmax",
                                       "attn_context", "attn_out"]
    d, t = GPT_D, GPT_T
    assert sum(l.params for l in parts) == 4 * d * d  # in_proj (3·d·d) + out_proj (d·d)
    assert sum(l.fwd_flops for l in parts) == 2 * 4 * d * d * t + 4 * t * t * d
    assert sum(l.weight_grad_flops for l in parts) == 2 * 4 * d * d * t
    assert "blocks.0.attn.mha.out_proj" not in _by_name(w)


def test_memory_bound_layers_move_bytes() -> None:
    """Norms, activations and softmax count 0 FLOP but their bytes (per sample, fp32):
    LayerNorm over (T, d) reads T·d, writes T·d plus mean and rstd (T each): (2·T·d + 2·T)·4;
    GELU on (T, 4d) reads and writes T·4d: 2·T·4d·4."""
    w = _by_name(from_torch(tm.small_gpt, (GPT_T,), input_dtypes="int64"))
    t, d = GPT_T, GPT_D
    assert w["blocks.0.ln1"].fwd_flops == 0
    assert w["blocks.0.ln1"].fwd_bytes == (2 * t * d + 2 * t) * 4
    assert w["blocks.0.act"].fwd_flops == 0
    assert w["blocks.0.act"].fwd_bytes == 2 * t * 4 * d * 4
    assert w["blocks.0.act"].input_grad_bytes > 0
    assert w["blocks.0.attn.softmax"].fwd_bytes > 0  # softmax of the T x T scores


@pytest.mark.timeout(120)
def test_one_billion_parameter_transformer_imports_fast_without_weights() -> None:
    """In a fresh process: import in < 10 s, peak RSS grows < 400 MB (fp32 weights alone would
    be 5.2 GB), every parameter stays on the meta device."""
    script = textwrap.dedent("""
        import json, resource, time
        import torch
        from tests import torch_models as tm
        from dnnscale.workload.torch_import import from_torch
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        with torch.device("meta"):
            model = tm.gpt_1b()
        w = from_torch(model, (1024,), input_dtypes="int64")
        seconds = time.perf_counter() - start
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
        print(json.dumps({"seconds": seconds, "rss_growth_bytes": grown, "params": w.params,
                          "meta": all(p.device.type == "meta" for p in model.parameters()),
                          "real": sum(p.untyped_storage().nbytes() for p in model.parameters()
                                      if p.device.type != "meta")}))
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                            text=True, timeout=110)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts["params"] > 1e9
    assert facts["meta"] and facts["real"] == 0
    assert facts["rss_growth_bytes"] < 400e6
    assert facts["seconds"] < 10


# --- residual branches and unsupported code -------------------------------------------------------


def test_resnet_blocks_import_with_every_op_counted() -> None:
    """Residual adds belong to their block; the reused ReLU is one layer with both calls; a
    conv whose input is not the previous layer's output stays generic with the same FLOPs."""
    model = tm.resnet_tiny()
    w = from_torch(tm.resnet_tiny, (3, 16, 16))
    layers = _by_name(w)
    assert w.params == sum(p.numel() for p in model.parameters())
    convs = {"stem": (64 * 16 * 16 * 9 * 3), "block1.conv1": 64 * 16 * 16 * 9 * 64,
             "block1.conv2": 64 * 16 * 16 * 9 * 64, "block2.downsample.0": 128 * 8 * 8 * 64,
             "block2.conv1": 128 * 8 * 8 * 9 * 64, "block2.conv2": 128 * 8 * 8 * 9 * 128}
    for name, macs in convs.items():
        assert layers[name].fwd_flops == 2 * macs, name
        assert layers[name].weight_grad_flops == 2 * macs, name
        assert layers[name].input_grad_flops == (0 if name == "stem" else 2 * macs), name
    assert layers["block1.conv1"].kind == "conv2d"
    assert layers["block2.conv1"].kind == "generic"  # its input is the block's, not bn1's
    fc_macs = 128 * 10
    assert w.fwd_flops == 2 * (sum(convs.values()) + fc_macs)
    # In-place ReLU called twice on 64x16x16: each call reads and writes 64·16·16 fp32 values.
    assert layers["block1.relu"].fwd_bytes == 2 * 2 * 64 * 16 * 16 * 4
    # The residual add: reads two 64x16x16 tensors, writes one.
    assert layers["block1"].fwd_bytes == 3 * 64 * 16 * 16 * 4


class _BooleanMask(nn.Module):
    def forward(self, x):
        return x[x > 0].sum() + x.sum()


class _ToList(nn.Module):
    def forward(self, x):
        return x * len([v for v in x.tolist() if v])


@pytest.mark.parametrize("model", [tm.data_dependent, _BooleanMask, _ToList])
def test_data_dependent_control_flow_is_rejected_with_a_reason(model) -> None:
    with pytest.raises(InputError, match="data-dependent Python control flow"):
        from_torch(model, (16,))


def test_no_empty_outside_modules_layer() -> None:
    """Ops outside every module (here only AccumulateGrad's per-step copies) add no layer."""

    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(8, 8)

        def forward(self, x):
            return self.inner(x)

    names = [layer.name for layer in from_torch(Scale(), (8,)).layers]
    assert names == ["inner"]


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(InputError, match="input_shape"):
        from_torch(tm.adam_cifar10, (3, 0, 32))
    with pytest.raises(InputError, match="loss"):
        from_torch(tm.adam_cifar10, (3, 32, 32), loss="hinge")
    with pytest.raises(InputError, match="--input-shape"):
        parse_input_shapes("3,x,4")
    assert parse_input_shapes("3,32,32; 64:int64") == ([(3, 32, 32), (64,)],
                                                       [torch.float32, torch.int64])


# --- a normal workload: YAML, predict, CLI --------------------------------------------------------


@pytest.mark.parametrize(("factory", "shape", "dtype"), [
    (tm.small_gpt_mha, (GPT_T,), "int64"), (tm.resnet_tiny, (3, 16, 16), None)])
def test_imported_workload_round_trips_through_yaml(factory, shape, dtype) -> None:
    w = from_torch(factory, shape, input_dtypes=dtype)
    back = workload_from_dict(workload_to_dict(w))
    assert back.layers == w.layers
    assert (back.name, back.input_shape, back.samples_per_epoch, back.bytes_per_value) == \
        (w.name, w.input_shape, w.samples_per_epoch, w.bytes_per_value)


def test_imported_workload_predicts() -> None:
    from dnnscale.system import load_system
    from dnnscale.plan import check_config, config_from_dict
    from dnnscale.model import predict_config

    w = from_torch(tm.small_gpt, (GPT_T,), input_dtypes="int64", samples_per_epoch=10_000)
    cluster = load_system("adam-2014")
    config = config_from_dict({"replicas": 2, "minibatch": 8})
    check_config(config, w, cluster)
    prediction = predict_config(w, cluster, config)
    assert math.isfinite(prediction.throughput_samples_per_s)
    assert prediction.throughput_samples_per_s > 0


def test_cli_describe_torch_writes_yaml(tmp_path: Path) -> None:
    out = tmp_path / "cifar.yaml"
    result = CliRunner().invoke(app, ["describe", "--torch", "tests.torch_models:adam_cifar10",
                                      "--input-shape", "3,32,32", "--loss", "cross_entropy",
                                      "--json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    zoo = zoo_workload("adam-cifar10")
    assert [l["fwd_flops"] for l in data["layers"]] == [l.fwd_flops for l in zoo.layers]
    from dnnscale.workload.spec import load_workload_yaml

    assert load_workload_yaml(out).layers == zoo.layers


def test_cli_describe_torch_errors_exit_2() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["describe", "--torch", "tests.torch_models:data_dependent",
                                 "--input-shape", "16"])
    assert result.exit_code == 2
    assert "data-dependent" in result.output
    result = runner.invoke(app, ["describe", "--torch", "tests.torch_models:nothing",
                                 "--input-shape", "16"])
    assert result.exit_code == 2 and "--torch" in result.output
    result = runner.invoke(app, ["describe", "--torch", "tests.torch_models:small_gpt"])
    assert result.exit_code == 2 and "--input-shape" in result.output


@pytest.mark.timeout(60)
def test_describe_without_torch_does_not_import_torch() -> None:
    script = ("import sys; from typer.testing import CliRunner; from dnnscale.cli import app; "
              "r = CliRunner().invoke(app, ['describe', 'alexnet', '--json']); "
              "assert r.exit_code == 0, r.output; print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                            text=True, timeout=50)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_imported_convolutions_keep_the_models_memory_layout() -> None:
    """PyTorch's default memory format is NCHW: an imported CNN's convolutions are `nchw`
    (on Tensor Cores they pay cuDNN's transposes); after ``model.to(memory_format=
    torch.channels_last)`` they are `nhwc`."""
    def layouts(model: torch.nn.Module) -> set[object]:
        w = from_torch(model, (3, 32, 32), loss="cross_entropy")
        return {layer.hyper.get("layout") for layer in w.layers if layer.kind == "conv2d"}

    assert layouts(tm.adam_cifar10()) == {"nchw"}
    assert layouts(tm.adam_cifar10().to(memory_format=torch.channels_last)) == {"nhwc"}
    # the layout is a cost fact: the same network costs more in NCHW on an A100 in TF32
    from dnnscale import predict
    plan = {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 64, "global_batch": 64,
            "precision": "tf32"}
    first = predict(from_torch(tm.adam_cifar10(), (3, 32, 32), loss="cross_entropy"),
                    "dgx-a100-80g:1", plan)
    last = predict(from_torch(tm.adam_cifar10().to(memory_format=torch.channels_last),
                              (3, 32, 32), loss="cross_entropy"), "dgx-a100-80g:1", plan)
    assert first.step_time_s > last.step_time_s

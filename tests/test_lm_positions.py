"""A masked language model's LM head runs on its masked positions only (issue 23): the shape's
`predictions`, the `lm_positions` kind, the head's counts and tensor-parallel traffic, the
runtime model, the zoo's BERT-Large and the published-dev BERT rows."""

from __future__ import annotations

import pytest

from dnnscale.errors import InputError
from dnnscale.model.megatron_rules import LOSS_STATISTIC_BYTES, megatron_shard
from dnnscale.model.sharding import SplitContext
from dnnscale.validate.published_dev import bert_predictions, case_of
from dnnscale.workload import load_workload
from dnnscale.workload.transformer import transformer_workload
from dnnscale.workload.workload import Workload

S, H, V, P = 32, 64, 100, 5
TINY = f"gpt:layers=2,hidden={H},heads=4,seq={S},vocab={V},causal=false"


def _layers(workload: Workload) -> dict[str, object]:
    return {layer.name: layer for layer in workload.layers}


def _train_flops(workload: Workload) -> float:
    return workload.fwd_flops + workload.input_grad_flops + workload.weight_grad_flops


def test_the_head_runs_on_the_predicted_positions_by_hand() -> None:
    full, masked = load_workload(TINY), load_workload(f"{TINY},predictions={P}")
    b = masked.bytes_per_value
    gather, logits, loss = masked.layers[-3:]
    assert [layer.kind for layer in masked.layers[-4:]] == [
        "layernorm", "lm_positions", "logits", "cross_entropy"]
    assert (gather.input_shape, gather.output_shape) == ((S, H), (P, H))
    assert gather.params == 0 and gather.train_flops == 0
    assert gather.fwd_bytes == 2 * P * H * b + P * 8                  # the p rows and ids
    assert gather.input_grad_bytes == (S * H + 3 * P * H) * b + P * 8  # zeros, index_add
    assert (logits.input_shape, logits.output_shape) == ((P, H), (P, V))
    assert logits.fwd_flops == logits.input_grad_flops == logits.weight_grad_flops == 2 * P * H * V
    # Megatron's in-place loss: b + 36 bytes a logit forward, 12 + b backward, the targets
    assert loss.fwd_bytes == P * V * (b + 36) + P * 8
    assert loss.input_grad_bytes == P * V * (12 + b) + P * 8
    assert masked.params == full.params
    assert _train_flops(full) - _train_flops(masked) == 3 * 2 * (S - P) * H * V
    assert masked.transformer.predicted == P and full.transformer.predicted == S


@pytest.mark.parametrize("name, field", [
    (f"{TINY},predictions={S + 1}", "workload.gpt.predictions"),
    (f"{TINY},predictions=-1", "workload.gpt.predictions"),
])
def test_bad_predictions_name_their_field(name: str, field: str) -> None:
    with pytest.raises(InputError) as raised:
        load_workload(name)
    assert raised.value.field == field and "\n" not in str(raised.value)


def test_an_lm_positions_layer_needs_its_count() -> None:
    from dnnscale.workload.workload import build_workload

    shape = {"hidden": H, "heads": 4, "seq": S, "vocab": V}
    with pytest.raises(InputError) as raised:
        build_workload("x", [S], [{"kind": "embedding", **shape},
                                  {"kind": "lm_positions", "name": "g", **shape}],
                       samples_per_epoch=1)
    assert raised.value.field == "layers.g.predictions"
    with pytest.raises(InputError) as raised:
        build_workload("x", [S], [{"kind": "embedding", **shape},
                                  {"kind": "lm_positions", "name": "g", "predictions": True,
                                   **shape}], samples_per_epoch=1)
    assert raised.value.field == "layers.g.predictions"


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tensor_parallel_traffic_of_the_head(sequence_parallel: bool) -> None:
    """Column-parallel logits: the input gradient's all-reduce carries b·p·h values (with
    sequence parallelism the whole sequence is all-gathered first: b·s·h); the
    vocabulary-parallel loss all-reduces 3 fp32 statistics of each of the b·p positions."""
    masked = _layers(load_workload(f"{TINY},predictions={P}"))
    context = SplitContext("none", False, 4, 2.0, sequence_parallel)
    logits = megatron_shard(masked["logits"], 2, context,  # type: ignore[arg-type]
                            sequence_parallel)
    rows = S if sequence_parallel else P
    assert {event.payload_bytes for event in logits.events} == {4 * rows * H * 2.0}
    loss = megatron_shard(masked["cross_entropy"], 2, context,  # type: ignore[arg-type]
                          sequence_parallel)
    assert [event.payload_bytes for event in loss.events] == [4 * P * LOSS_STATISTIC_BYTES] * 3


def test_the_runtime_model_counts_what_the_workload_counts() -> None:
    """The PyTorch model a GPU run trains (runtime/gpt_model.py) gathers the same positions:
    its matrix products over a forward and backward of 2 sequences, counted by torch's
    FlopCounterMode, are the workload's FLOPs twice over, with and without `predictions`, and
    it keeps the workload's parameters."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from dnnscale.runtime.gpt_model import GptModel, parameter_count

    def train_flops(name: str) -> tuple[int, Workload]:
        workload = load_workload(f"{name},dropout=false")
        torch.manual_seed(0)
        model = GptModel(workload.transformer)
        tokens = torch.randint(0, V, (2, S))
        with FlopCounterMode(display=False) as counter:
            model(tokens, tokens).backward()
        assert parameter_count(model) == workload.params
        return counter.get_total_flops(), workload

    (full_torch, full), (masked_torch, masked) = (train_flops(TINY),
                                                  train_flops(f"{TINY},predictions={P}"))
    assert full_torch == 2 * _train_flops(full) and masked_torch == 2 * _train_flops(masked)
    assert full_torch - masked_torch == 2 * 3 * 2 * (S - P) * H * V


def test_bert_large_predicts_80_positions() -> None:
    bert = load_workload("bert-large")
    assert bert.transformer.predictions == 80
    assert [layer.name for layer in bert.layers[-3:]] == ["lm_positions", "logits",
                                                          "cross_entropy"]
    assert bert.params == transformer_workload(
        "b", 24, 1024, 16, 512, 30522, causal=False, token_types=2,
        norm_position="post").params


@pytest.mark.parametrize("engine", ["megatron", "deepspeed", "torchtitan"])
def test_export_refuses_a_head_on_some_positions(engine: str) -> None:
    from dnnscale.export.deepspeed import export_deepspeed
    from dnnscale.export.megatron import export_megatron
    from dnnscale.export.torchtitan import export_torchtitan
    from dnnscale.plan.modern import modern_plan_from_dict

    exporter = {"megatron": export_megatron, "deepspeed": export_deepspeed,
                "torchtitan": export_torchtitan}[engine]
    name = "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=100,predictions=4"
    with pytest.raises(InputError) as caught:
        exporter(modern_plan_from_dict(dict(dp=2)), load_workload(name).transformer, name)
    assert caught.value.field == "workload" and "predictions" in caught.value.problem


def test_published_dev_bert_heads() -> None:
    """TensorFlow's BERT gathers max_predictions_per_seq positions (20 at 128, 80 at 512);
    PyTorch's the labelled ones, LDDL's static masking's max(1, round(0.15 x tokens)) of the
    priced tokens (the padded length under binning)."""
    assert bert_predictions("TensorFlow 1.x (NGC 20.06-py3) + Horovod, LAMB", 128, 128) == 20
    assert bert_predictions("TensorFlow 1.x (NGC 19.08-py3) + Horovod, LAMB", 512, 512) == 80
    assert bert_predictions("PyTorch (NGC pytorch:21.11-py3), LAMB", 128, 128) == 19
    assert bert_predictions("PyTorch (NGC pytorch:21.11-py3), LAMB", 512, 296) == 44
    row = {"id": "X2", "source": "NVIDIA DeepLearningExamples TensorFlow BERT README",
           "url_or_repo_path": "", "model": "BERT-Large pretraining",
           "model_details": "BERT-Large (24 layers, hidden 1024, 16 heads), seq len 128",
           "framework": "TensorFlow 1.x (NGC 20.06-py3) + Horovod, LAMB",
           "device": "NVIDIA A100 SXM4 40GB", "inter_node_network": "n/a", "num_nodes": "1",
           "num_devices": "8", "global_batch": "65536", "micro_batch": "64 per GPU",
           "precision": "mixed precision (FP16 AMP)", "measured_value": "2871.89",
           "measured_unit": "sentences/sec (total)", "notes": ""}
    case = case_of(row)
    assert ",predictions=20," in case.workload  # type: ignore[operator]


def test_the_head_kernels_run_on_the_gathered_rows() -> None:
    """The calibration's kernels of the head (calibrate/gpu_kernels.py) build and run on the
    CPU with the gathered rows' shapes: the gather's output, the logits' (p, V) product."""
    pytest.importorskip("torch")
    from dnnscale.calibrate.gpu_device import CpuDevice
    from dnnscale.calibrate.gpu_kernels import layer_kernels

    device = CpuDevice()
    device.use("fp32")
    layers = _layers(load_workload(f"{TINY},predictions={P}"))
    for name in ("lm_positions", "logits", "cross_entropy"):
        kernels = layer_kernels(layers[name], 2, "fp32", 2.0, name)  # type: ignore[arg-type]
        assert kernels, name
        for kernel in kernels:
            out = kernel.make(device)()
            if name == "lm_positions" and kernel.phase == "forward":
                assert tuple(out.shape) == (2, P, H)  # type: ignore[attr-defined]
            if name == "logits" and kernel.phase == "forward":
                assert tuple(out.shape) == (2 * P, V)  # type: ignore[attr-defined]

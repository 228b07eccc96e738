"""Mixtures of experts with dense blocks among them (DeepSeek's first_k_dense_replace,
Qwen-MoE's mlp_only_layers): the workload, the per-kind stage templates, memory, the search
and export, each against a hand count or the layer-by-layer path."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from dnnscale.errors import InputError
from dnnscale.model.predict import block_activation_bytes, predict_plan
from dnnscale.model.stage import block_kinds, pipeline_layout
from dnnscale.model.schedule import stage_layers
from dnnscale.optimize.modern import exhaustive_modern, make_modern_space, optimize_modern
from dnnscale.plan.modern import modern_plan_from_dict
from dnnscale.system import load_system
from dnnscale.workload import load_workload
from dnnscale.workload.spec import workload_from_dict, workload_to_dict
from dnnscale.workload.transformer import transformer_workload

# Per block of h = 256, 8 heads, flash, biases (tiny_moe in test_moe_context_model.py):
# norms 2·512, QKV 256·768 + 768, out 256² + 256 = 263,168 + 1,024 = 264,192 around the MLP.
AROUND_MLP = 2 * 512 + 256 * 768 + 768 + 256 * 256 + 256
ROUTER = 256 * 4                                       # h · E, no bias
EXPERTS = 4 * (256 * 1024 + 1024) + 4 * (1024 * 256 + 256)   # 4 experts of ffn 1024
DENSE_MLP = 256 * 1024 + 1024 + 1024 * 256 + 256       # one dense MLP of ffn 1024
OUTSIDE = (1000 + 128) * 256 + 512                    # embedding (tied) and final norm


def mixed(layers: int = 4, dense: tuple[int, ...] = (0,), **overrides):  # noqa: ANN201
    options = dict(flash_attention=True, experts=4, top_k=2, dense_blocks=dense)
    options.update(overrides)
    return transformer_workload("tiny-mixed", layers, 256, 8, 128, 1000, **options)


def plan(**fields):  # noqa: ANN201
    return modern_plan_from_dict(fields)


def test_dense_blocks_have_the_dense_mlp_by_hand() -> None:
    """Block 0 dense, blocks 1-3 mixtures: 4·264,192 + 1·DENSE_MLP + 3·(router + experts)."""
    workload = mixed()
    assert workload.params == (4 * AROUND_MLP + DENSE_MLP + 3 * (ROUTER + EXPERTS) + OUTSIDE)
    roles = {layer.hyper["role"] for layer in workload.layers if layer.hyper.get("block") == 0}
    assert "mlp_up" in roles and "moe_router" not in roles
    assert sum(1 for layer in workload.layers if layer.kind == "moe_dispatch") == 3
    assert workload.transformer.moe_blocks == 3
    assert [layer.name for layer in workload.layers if layer.hyper.get("block") == 2][0] == \
        "block2.attn_norm"


def test_deepseek_v3_like_has_its_three_dense_blocks() -> None:
    """3 dense blocks of 18,432 and 58 mixtures; MHA 4·7168² per block, no biases:
    61·(4·7168² + 2·7168) + 3·3·7168·18432 + 58·(7168·256 + 256·3·7168·2048 + 3·7168·2048)
    + 2·129,280·7168 (untied) + 7168 = 672,149,632,000 (published 671 B; MLA is not MHA)."""
    h = 7168
    expected = (61 * (4 * h * h + 2 * h) + 3 * 3 * h * 18432
                + 58 * (h * 256 + 256 * 3 * h * 2048 + 3 * h * 2048) + 2 * 129280 * h + h)
    workload = load_workload("deepseek-v3-like")
    assert workload.transformer.dense_blocks == (0, 1, 2)
    assert workload.params == expected == 672_149_632_000


@pytest.mark.parametrize("dense, problem", [
    ((4,), "block indices run from 0 to 3"),
    ((1, 0), "ascending"),
    ((0, 0), "ascending"),
    ((0, 1, 2, 3), "every block is dense"),
    ((True,), "list of block indices"),
])
def test_bad_dense_blocks_are_refused(dense, problem) -> None:  # noqa: ANN001
    with pytest.raises(InputError) as error:
        mixed(dense=dense)
    assert error.value.field == "transformer.dense_blocks"
    assert problem in error.value.problem


def test_a_dense_model_takes_no_dense_blocks() -> None:
    with pytest.raises(InputError) as error:
        transformer_workload("d", 2, 256, 8, 128, 1000, dense_blocks=(0,))
    assert error.value.field == "transformer.dense_blocks"


def test_gpt_first_dense_key() -> None:
    workload = load_workload("gpt:layers=4,hidden=256,heads=8,seq=128,vocab=1000,experts=4,"
                             "top_k=2,first_dense=2")
    assert workload.transformer.dense_blocks == (0, 1)
    with pytest.raises(InputError) as error:
        load_workload("gpt:layers=4,hidden=256,heads=8,seq=128,vocab=1000,experts=4,top_k=2,"
                      "first_dense=4")
    assert error.value.field == "workload.gpt.first_dense"


def test_yaml_round_trip_keeps_dense_blocks() -> None:
    workload = mixed(dense=(0, 2))
    data = json.loads(json.dumps(workload_to_dict(workload)))  # lists, as YAML gives
    assert data["transformer"]["dense_blocks"] == [0, 2]
    again = workload_from_dict(data)
    assert again.transformer == workload.transformer
    assert again.params == workload.params


def test_block_kinds_and_pipeline_layout_count_each_kind() -> None:
    """Blocks 0 and 2 dense: two kinds, dense first (block 0). Two stages of 2 blocks each
    hold one dense and one MoE block."""
    workload = mixed(dense=(0, 2))
    kinds, kind_of = block_kinds(workload)
    assert len(kinds) == 2 and kind_of == {0: 0, 1: 1, 2: 0, 3: 1}
    layout = pipeline_layout(workload, stage_layers(workload.layers, 2, 1))
    assert layout.blocks == ((1, 1), (1, 1))


@pytest.mark.parametrize("fields", [
    dict(pp=2, micro_batch=1, global_batch=8),
    dict(pp=2, micro_batch=1, global_batch=8, schedule="interleaved", virtual_stages=2),
    dict(pp=2, ep=2, tp=2, micro_batch=2, global_batch=8, sequence_parallel=True),
    dict(pp=2, ep=2, zero=1, micro_batch=1, global_batch=4),
])
def test_templates_match_the_layer_by_layer_path(fields) -> None:  # noqa: ANN001
    """predict with per-layer costs and with per-kind block templates give one step time and
    one memory (the template path is what the search uses)."""
    workload = mixed(layers=4, dense=(0,))
    system = load_system("dgx-a100-80g:1")
    the_plan = plan(**fields)
    by_layer = predict_plan(workload, system, the_plan)
    by_kind = predict_plan(workload, system, the_plan, per_layer=False)
    assert by_kind.step_time_s == pytest.approx(by_layer.step_time_s, rel=1e-12)
    assert by_kind.memory_bytes == pytest.approx(by_layer.memory_bytes, rel=1e-12)


def test_activation_memory_prices_dense_blocks_as_dense() -> None:
    """One stage of 4 blocks, block 0 dense, one micro-batch in flight: the same stack with
    every block a mixture keeps (moe − dense) bytes more, each from block_activation_bytes
    (bf16 activations: the formula's 2-byte values, ·2/2); the layers outside are the same."""
    system = load_system("dgx-a100-80g:1")
    the_plan = plan(micro_batch=1, global_batch=1)
    shape = mixed(layers=4, dense=(0,)).transformer
    moe = block_activation_bytes(shape, the_plan)
    dense = block_activation_bytes(shape, the_plan, experts=False)
    assert 0 < dense < moe

    def activations(workload) -> float:  # noqa: ANN001
        prediction = predict_plan(workload, system, the_plan)
        return next(part.bytes for part in prediction.memory if part.name == "activations")

    assert activations(mixed(layers=4, dense=())) - activations(mixed(layers=4, dense=(0,))) \
        == pytest.approx(moe - dense, rel=1e-9)


def test_search_with_dense_blocks_is_exact() -> None:
    """The fast search equals the exhaustive one on a mixed stack over tp, pp and ep."""
    workload = mixed(layers=4, dense=(0,))
    system = load_system("dgx-a100-80g:1")
    space = make_modern_space(workload, system, 8, tensor=(1, 2), pipeline=(1, 2, 4),
                              micro_batch=(1, 2), zero=(0, 1), recompute=("none",),
                              expert=(1, 2, 4), context=(1,))
    fast = optimize_modern(workload, system, space, top=3, curve=False)
    slow = exhaustive_modern(workload, system, space, 8)
    assert fast.best.step_time_s == pytest.approx(slow[0].step_time_s, rel=1e-9)
    assert [p.step_time_s for p in fast.top] == pytest.approx(
        [p.step_time_s for p in slow[:3]], rel=1e-9)


def test_predict_cli_on_deepseek_v3_like() -> None:
    """A real process: the DeepSeek-V3-like zoo entry with ep and its JSON's ep part."""
    run = subprocess.run(
        [sys.executable, "-m", "dnnscale", "predict", "-w", "deepseek-v3-like", "-c",
         "dgx-h100:8", "--tp", "1", "--pp", "1", "--ep", "64", "--dp", "1",
         "--micro-batch", "1", "--global-batch", "512", "--json"],
        capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["mesh"]["sizes"]["ep"] == 64


# ------------------------------------------------------------------ export

EP_PLAN = dict(tp=1, pp=1, ep=4, dp=1, micro_batch=1, global_batch=4)


def _flags(result) -> list[str]:  # noqa: ANN001
    return result.files[-1].text.splitlines()


def test_megatron_gets_the_layer_pattern() -> None:
    """--moe-layer-freq's list expression: block 0 dense, 1-3 MoE: [0]*1+[1]*3, which
    Megatron's moe_freq_type evaluates to [0, 1, 1, 1]; the dense blocks' width is
    --ffn-hidden-size."""
    from dnnscale.export.megatron import export_megatron, moe_layer_pattern

    workload = mixed(layers=4, dense=(0,), gated=True, norm="rmsnorm", positional="rope",
                     tied_embeddings=False, bias=False, expert_ffn=512)
    flags = _flags(export_megatron(plan(**EP_PLAN), workload.transformer, "tiny"))
    assert "--moe-layer-freq [0]*1+[1]*3" in flags
    # the gated default width 256·⌈⌊8·256/3⌋/256⌉ = 768 is the dense blocks'
    assert "--moe-ffn-hidden-size 512" in flags and "--ffn-hidden-size 768" in flags
    assert eval(moe_layer_pattern(mixed(layers=6, dense=(0, 1, 4)).transformer)) == \
        [0, 0, 1, 1, 0, 1]  # noqa: S307 - the pattern is ours, evaluated as Megatron does
    deepseek = moe_layer_pattern(load_workload("deepseek-v3-like").transformer)
    assert deepseek == "[0]*3+[1]*58"
    # Megatron-LM d98e8a64 megatron/training/arguments.py _eval_pattern refuses any other
    # character than , digits [ ] ( ) + *
    assert re.search(r"[^,\d\[\]\(\)\+\*]", deepseek) is None


def test_deepspeed_takes_every_other_block_and_refuses_the_rest() -> None:
    """Megatron-DeepSpeed's --expert-interval 2: MoE where (i + 1) % 2 == 0, i.e. blocks 1
    and 3 with blocks 0 and 2 dense; DeepSeek's first-3-dense is no interval and refused."""
    from dnnscale.export.deepspeed import export_deepspeed
    from dnnscale.plan.engines import moe_interval

    every_other = mixed(layers=4, dense=(0, 2)).transformer
    assert moe_interval(every_other) == 2
    assert moe_interval(mixed(layers=4, dense=()).transformer) == 1
    assert moe_interval(mixed(layers=4, dense=(0,)).transformer) is None
    flags = _flags(export_deepspeed(plan(**EP_PLAN), every_other, "tiny"))
    assert "--expert-interval 2" in flags
    with pytest.raises(InputError) as error:
        export_deepspeed(plan(**EP_PLAN), mixed(layers=4, dense=(0,)).transformer, "tiny")
    assert "--expert-interval" in error.value.problem


def test_torchtitan_refuses_dense_blocks() -> None:
    from dnnscale.export.torchtitan import export_torchtitan

    workload = mixed(layers=4, dense=(0,), gated=True, norm="rmsnorm", positional="rope",
                     tied_embeddings=False, bias=False)
    with pytest.raises(InputError) as error:
        export_torchtitan(plan(**EP_PLAN, zero=3), workload.transformer, "tiny")
    assert "dense blocks" in error.value.problem


# ------------------------------------------------------------------ optimize --engine

def test_optimize_for_deepspeed_leaves_out_zero3_moe_plans() -> None:
    """DeepSpeed-MoE refuses ZeRO-3: the search for deepspeed finds no ZeRO-3 plan of an MoE
    workload, which export then takes; without an engine ZeRO-3 plans are in the space."""
    from dnnscale.export.deepspeed import export_deepspeed

    workload = mixed(layers=4, dense=())
    system = load_system("dgx-a100-80g:1")
    kwargs = dict(tensor=(1,), pipeline=(1,), micro_batch=(1,), zero=(3,), recompute=("none",),
                  expert=(1, 2))
    assert optimize_modern(workload, system, make_modern_space(workload, system, 8, **kwargs),
                           top=1, curve=False).best.plan.data.aggregation.zero_stage == 3
    with pytest.raises(InputError) as error:
        make_modern_space(workload, system, 8, engine="deepspeed", **kwargs)
    assert error.value.field == "zero" and "ZeRO" in error.value.problem
    space = make_modern_space(workload, system, 8, engine="deepspeed",
                              **{**kwargs, "zero": (1, 3)})
    best = optimize_modern(workload, system, space, top=1, curve=False).best
    assert best.plan.data.aggregation.zero_stage == 1
    export_deepspeed(best.plan, workload.transformer, "tiny")  # runs: no refusal


def test_optimize_for_torchtitan_refuses_a_workload_it_cannot_run() -> None:
    workload = mixed(layers=4, dense=(0,), gated=True, norm="rmsnorm", positional="rope",
                     tied_embeddings=False, bias=False)
    system = load_system("dgx-a100-80g:1")
    with pytest.raises(InputError) as error:
        make_modern_space(workload, system, 8, engine="torchtitan", tensor=(1,), pipeline=(1,),
                          micro_batch=(1,), recompute=("none",), expert=(1, 2))
    assert error.value.field == "engine" and "dense blocks" in error.value.problem

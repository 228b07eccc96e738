"""One record per layer kind (workload/kind_record.py): the model reads each kind's facts from
it, and a kind nobody registered is an error at workload load and in the model, never priced
by a default."""

from __future__ import annotations

import dataclasses

import pytest

from dnnscale.errors import InputError
from dnnscale.model import predict_config, stage_costs
from dnnscale.model.gpu_compute import gpu_phase_times_s
from dnnscale.model.sharding import SplitContext, shard_layer
from dnnscale.workload.splits import TENSOR_EXTENT_KEY
from dnnscale.plan import Config
from dnnscale.system import load_system
from dnnscale.workload import build_workload, load_workload
from dnnscale.workload.kind_record import LAYER_KINDS, KernelClass, Recompute, layer_kind
from dnnscale.workload.kinds import ADAM_SPLIT, _elementwise, register_kind
from dnnscale.workload.workload import check_workload
from tests.tiny import tiny_cluster, tiny_workload


def test_unknown_kind_is_an_input_error_at_load_and_in_the_model() -> None:
    w = tiny_workload()
    odd = dataclasses.replace(w.layers[2], kind="conv3d")
    bad = dataclasses.replace(w, layers=(w.layers[0], w.layers[1], odd))
    with pytest.raises(InputError, match="unknown layer kind 'conv3d'") as load:
        check_workload(bad)
    assert load.value.field == "workload.layers[2].kind"
    # a workload that skipped the check: the model names the layer's kind field
    with pytest.raises(InputError, match="unknown layer kind 'conv3d'") as model:
        stage_costs(bad, tiny_cluster(), 1, 8)
    assert model.value.field == "layers.fc.kind"
    with pytest.raises(InputError) as shard:
        shard_layer("adam", odd, "features", 2, SplitContext("features", True, 8, 4))
    assert shard.value.field == "layers.fc.kind"


def test_megatron_unit_of_split_is_the_records() -> None:
    """QKV is split by query groups, the attention core by heads, the MLP by its width; norms
    and the LM head have no unit (they do not limit the degree)."""
    assert TENSOR_EXTENT_KEY["attn_qkv"] == "kv_heads"
    assert TENSOR_EXTENT_KEY.get("attn_softmax") == "heads"
    assert TENSOR_EXTENT_KEY.get("mlp_down") == "ffn"
    assert "layernorm" not in TENSOR_EXTENT_KEY and TENSOR_EXTENT_KEY.get("logits") is None
    assert set(TENSOR_EXTENT_KEY) == {name for name, record in LAYER_KINDS.items()
                                      if record.tensor_extent_key is not None}
    selective = {name for name, r in LAYER_KINDS.items() if r.recompute is Recompute.ATTENTION_CORE}
    assert selective == {"attn_scores", "attn_softmax", "attn_context", "flash_attention"}


def test_kernel_class_decides_whether_an_accelerator_prices_flops() -> None:
    """A generic layer of 1 TFLOP and 1 byte per sample is GEMM work (1e12 / (peak · η)); the
    same counts under a MEMORY kind cost only their byte (the device does no FLOPs for it)."""
    device = load_system("dgx-a100-80g:1").machine
    layer = build_workload("g", [4], [{"kind": "generic", "name": "g", "output_shape": [4],
                                       "fwd_flops": 1e12, "fwd_bytes": 1.0}],
                           samples_per_epoch=1).layers[0]
    assert layer_kind("generic").kernel is KernelClass.GEMM
    gemm, _, _ = gpu_phase_times_s(layer, 1.0, 1, device, "bf16", 1.0)
    memory_kind = dataclasses.replace(layer, kind="relu")
    memory, _, _ = gpu_phase_times_s(memory_kind, 1.0, 1, device, "bf16", 1.0)
    assert gemm > 1e12 / device.peak_flops_per_s["bf16"]
    assert memory < 1e-6


def test_a_kind_registered_once_is_priced_everywhere(monkeypatch) -> None:
    """A user kind (a memory-bound scale by a constant) registered with its facts builds, loads
    and predicts under Adam's rules; Megatron's rules, which its record does not name, refuse it
    by name."""
    monkeypatch.setitem(LAYER_KINDS, "scale", LAYER_KINDS["relu"])  # removed after the test

    @register_kind("scale", kernel=KernelClass.MEMORY, splits={"adam": ADAM_SPLIT["adam"]})
    def scale(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
              needs_input_grad: bool) -> object:
        """Element-wise scale: 0 FLOP, memory bound (as relu)."""
        layer = _elementwise("relu", name, input_shape, input_shape, bytes_per_value,
                             needs_input_grad)
        return dataclasses.replace(layer, kind="scale")

    w = build_workload("scaled", [8], [{"kind": "linear", "name": "fc", "out_features": 4},
                                       {"kind": "scale", "name": "s"}], samples_per_epoch=10)
    assert w.layers[1].kind == "scale"
    relu = build_workload("relu", [8], [{"kind": "linear", "name": "fc", "out_features": 4},
                                        {"kind": "relu", "name": "s"}], samples_per_epoch=10)
    config = Config(partitions=2, replicas=1, ps_shards=1, sync="ps-async", minibatch=4)
    # the same facts as relu's (memory bound, Adam's neuron split): the same prediction
    assert predict_config(w, tiny_cluster(), config).step_time_s == \
        predict_config(relu, tiny_cluster(), config).step_time_s
    with pytest.raises(InputError, match="do not say how to split a scale layer") as refused:
        shard_layer("megatron", w.layers[1], "tensor", 2, SplitContext("tensor", True, 4, 2))
    assert refused.value.field == "plan.tensor.rules"


def test_every_zoo_layer_has_a_record() -> None:
    for name in ("adam-mnist", "alexnet", "gpt3-125m", "llama2-7b"):
        for layer in load_workload(name).layers:
            assert layer_kind(layer.kind).name == layer.kind

"""Batch norms that run the ReLU and the residual add after them in their own kernels (issue 23):
batchnorm2d's `fuse`, shortcut_add's `fused`, the zoo's ``resnet50:fuse_bn=...``, and the
published-dev mapping of DeepLearningExamples' MXNet ResNet-50 (--fuse-bn-relu and
--fuse-bn-add-relu for float16)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dnnscale.errors import InputError
from dnnscale.model.gpu_compute import gpu_phase_times_s
from dnnscale.system import load_system
from dnnscale.validate.published_dev import case_of, resnet50_bn_fusion
from dnnscale.workload import load_workload
from dnnscale.workload.kinds import build_layer
from dnnscale.workload.layer import Layer
from dnnscale.workload.spec import save_workload_yaml
from dnnscale.workload.workload import Workload, build_workload

STAGES = ((64, 3, 56), (128, 4, 28), (256, 6, 14), (512, 3, 7))  # width, blocks, output size


def _bn(fuse: str | None, needs_input_grad: bool = True) -> Layer:
    hyper: dict[str, object] = {} if fuse is None else {"fuse": fuse}
    return build_layer("batchnorm2d", "bn", (8, 4, 4), 2, needs_input_grad, hyper, "layers[0]")


def test_fused_batch_norm_bytes_by_hand() -> None:
    v, b = 8 * 4 * 4, 2
    phases = {fuse: (layer.fwd_bytes, layer.input_grad_bytes, layer.weight_grad_bytes)
              for fuse in ("none", "relu", "add_relu") for layer in [_bn(fuse)]}
    assert phases == {"none": (3 * v * b, 5 * v * b, 0),       # x, x -> y | dy, x, dy, x -> dx
                      "relu": (3 * v * b, 7 * v * b, 0),       # + y read by both passes
                      "add_relu": (4 * v * b, 8 * v * b, 0)}   # + z read, dz written
    assert _bn(None).fwd_bytes == _bn("none").fwd_bytes and "fuse" not in _bn(None).hyper
    # a fused norm before any weighted layer runs only its reduction, which reads y too
    assert (_bn("relu", False).input_grad_bytes, _bn("relu", False).weight_grad_bytes) == (
        0, 3 * v * b)
    assert _bn("none", False).weight_grad_bytes == 2 * v * b


def test_a_fused_add_keeps_only_its_fork() -> None:
    v, b = 8 * 8 * 8, 2
    w = build_workload("r", [8, 8, 8], [
        {"kind": "conv2d", "out_channels": 8, "kernel": 3, "padding": 1, "bias": False},
        {"kind": "batchnorm2d", "fuse": "add_relu"},
        {"kind": "shortcut_add", "name": "identity", "fused": True},
        {"kind": "conv2d", "name": "c2", "out_channels": 8, "kernel": 1, "bias": False},
        {"kind": "batchnorm2d", "name": "bn2", "fuse": "add_relu"},
        {"kind": "shortcut_add", "name": "projected", "identity": False, "fused": True}],
        samples_per_epoch=1, bytes_per_value=b)
    identity, projected = w.layers[2], w.layers[5]
    assert (identity.fwd_bytes, identity.input_grad_bytes) == (0, 3 * v * b)
    assert (projected.fwd_bytes, projected.input_grad_bytes) == (0, 0)


@pytest.mark.parametrize("spec, field", [
    ({"kind": "batchnorm2d", "fuse": "gelu"}, "layers.bn.fuse"),
    ({"kind": "batchnorm2d", "fuse": True}, "layers.bn.fuse"),
    ({"kind": "shortcut_add", "fused": "yes"}, "layers.bn.fused"),
])
def test_bad_fusions_name_their_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(InputError) as raised:
        build_workload("r", [8, 8, 8], [{**spec, "name": "bn"}], samples_per_epoch=1)
    assert raised.value.field == field and "\n" not in str(raised.value)


def _fused_values_by_hand() -> tuple[int, int]:
    """Values (per sample) of ResNet-50's norms followed by a ReLU inside a block's chain
    (the stem's, and each bottleneck's first two: v1.5 runs the first 1x1 at the block's
    input size) and of each block's last norm (4·width at the output size)."""
    relu_values = 64 * 112 * 112
    add_values, size_in = 0, 56
    for width, blocks, size in STAGES:
        for block in range(blocks):
            first_size = size_in if block == 0 else size
            relu_values += width * first_size ** 2 + width * size ** 2
            add_values += 4 * width * size ** 2
            size_in = size
    return relu_values, add_values


def test_resnet50_fusions_by_hand() -> None:
    """Fusing moves 3 fewer values per value of a BN + ReLU pair (13 -> 10: the ReLU's 2 + 3
    go, the norm's backward reads y twice) and 4 fewer per block end (16 -> 12: the add's 3
    and the ReLU's 5 go, the norm reads z and writes dz, reads y twice); parameters and
    FLOPs do not move."""
    plain, relu, fused = (load_workload(name) for name in (
        "resnet50", "resnet50:fuse_bn=relu", "resnet50:fuse_bn=all"))
    b = plain.bytes_per_value
    relu_values, add_values = _fused_values_by_hand()

    def moved(workload: Workload) -> float:
        return sum(layer.fwd_bytes + layer.input_grad_bytes + layer.weight_grad_bytes
                   for layer in workload.layers)

    assert moved(plain) - moved(relu) == pytest.approx(3 * relu_values * b, rel=1e-12)
    assert moved(relu) - moved(fused) == pytest.approx(4 * add_values * b, rel=1e-12)
    relus = [[layer.kind for layer in w.layers].count("relu") for w in (plain, relu, fused)]
    assert relus == [1 + 3 * 16, 16, 0]  # the stem's, and three a block (the FC has none)
    assert plain.params == relu.params == fused.params == 25_557_032
    for phase in ("fwd_flops", "input_grad_flops", "weight_grad_flops"):
        assert getattr(plain, phase) == getattr(relu, phase) == getattr(fused, phase)
    assert sum(layer.hyper.get("fuse") == "add_relu" for layer in fused.layers) == 16
    assert sum(bool(layer.hyper.get("fused")) for layer in fused.layers) == 16


def test_zoo_names_and_errors(tmp_path: Path) -> None:
    assert load_workload("resnet50:fuse_bn=none").name == "resnet50"
    both = load_workload("resnet50:fuse_bn=all,layout=nchw")
    assert both.name == "resnet50:layout=nchw,fuse_bn=all"
    assert load_workload(both.name).layers == both.layers
    path = tmp_path / "r.yaml"
    save_workload_yaml(both, path)
    assert load_workload(path).layers == both.layers
    for bad in ("resnet50:fuse_bn=yes", "vgg16:fuse_bn=all", "resnet50:fuse_bn=all,fuse_bn=all",
                "resnet50:fuse_bn"):
        with pytest.raises(InputError, match="after ':'"):
            load_workload(bad)


@settings(max_examples=40, deadline=None)
@given(channels=st.sampled_from([16, 64, 256, 2048]), size=st.sampled_from([7, 14, 56, 112]),
       batch=st.integers(1, 512),
       case=st.sampled_from([("dgx-a100-80g:1", "fp16"), ("dgx-a100-80g:1", "tf32"),
                             ("dgx-1-v100-16g:1", "fp16"), ("dgx-1-v100-16g:1", "fp32"),
                             ("dgx-h100:1", "bf16")]))
def test_fusing_is_never_slower(channels: int, size: int, batch: int,
                                case: tuple[str, str]) -> None:
    """A fused norm takes no longer than the norm, add and ReLU it replaces, phase by phase."""
    device = load_system(case[0]).machine
    shape = (channels, size, size)

    def seconds(kind: str, hyper: dict[str, object]) -> tuple[float, float, float]:
        layer = build_layer(kind, "l", shape, 4, True, hyper, "l")
        return gpu_phase_times_s(layer, 1.0, batch, device, case[1], 1.0)

    def total(*parts: tuple[float, float, float]) -> list[float]:
        return [sum(phase) for phase in zip(*parts)]

    bn, relu, add = (seconds("batchnorm2d", {}), seconds("relu", {}),
                     seconds("shortcut_add", {}))
    with_relu = seconds("batchnorm2d", {"fuse": "relu"})
    with_add = total(seconds("batchnorm2d", {"fuse": "add_relu"}),
                     seconds("shortcut_add", {"fused": True}))
    assert all(f <= u * (1 + 1e-12) for f, u in zip(with_relu, total(bn, relu)))
    assert all(f <= u * (1 + 1e-12) for f, u in zip(with_add, total(bn, add, relu)))


def test_published_dev_fuses_as_dle_runs_it() -> None:
    assert resnet50_bn_fusion("MXNet (mxnet-22.10-py3), Horovod/DALI", "fp16") == "all"
    assert resnet50_bn_fusion("MXNet (mxnet-20.12-py3), Horovod/DALI", "tf32") == "none"
    assert resnet50_bn_fusion("PyTorch 21.03 NGC (DALI data loader)", "fp16") == "none"
    row = {"id": "X1", "source": "NVIDIA DeepLearningExamples MXNet RN50v1.5 README",
           "url_or_repo_path": "", "model": "ResNet-50 v1.5", "device": "NVIDIA A100 SXM4 80GB",
           "framework": "MXNet (mxnet-22.10-py3), Horovod/DALI",
           "inter_node_network": "n/a", "num_nodes": "1", "num_devices": "8",
           "global_batch": "4096", "micro_batch": "512 per GPU",
           "precision": "mixed precision (FP16)", "measured_value": "8000",
           "measured_unit": "images/sec (total)", "notes": ""}
    assert case_of(row).workload == "resnet50:fuse_bn=all"  # type: ignore[union-attr]
    tf32 = case_of({**row, "precision": "TF32"})
    assert tf32.workload == "resnet50:layout=nchw"  # type: ignore[union-attr]
    pytorch = case_of({**row, "framework": "PyTorch 21.03 NGC (DALI data loader), DDP"})
    assert pytorch.workload == "resnet50"  # type: ignore[union-attr]

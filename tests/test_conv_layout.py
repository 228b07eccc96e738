"""Convolutions kept in NCHW pay cuDNN's layout transposes on Tensor Cores (issue 23): the
`layout` of conv2d and shortcut_conv2d, the zoo's ``resnet50:layout=nchw``, and the
published-dev mapping of DeepLearningExamples' ResNet-50 runs."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dnnscale
from dnnscale.errors import InputError
from dnnscale.model.gpu_compute import (TRANSPOSES_PER_CALL, gpu_phase_times_s,
                                        on_tensor_cores, transposes_layout)
from dnnscale.system import load_system
from dnnscale.validate.published_dev import case_of, resnet50_layout
from dnnscale.workload import load_workload
from dnnscale.workload.kinds import build_layer
from dnnscale.workload.workload import build_workload

V100 = load_system("dgx-1-v100-16g:1").machine
P100 = load_system("dgx-1-p100:1").machine
A100 = load_system("dgx-a100-80g:1").machine


def _conv(layout: str | None, bytes_per_value: int = 4):  # type: ignore[no-untyped-def]
    hyper: dict[str, object] = {"out_channels": 64, "kernel": 3, "padding": 1}
    if layout is not None:
        hyper["layout"] = layout
    return build_layer("conv2d", "c", (64, 56, 56), bytes_per_value, True, hyper, "layers[0]")


def test_an_nchw_conv_on_tensor_cores_pays_two_transposes_per_phase() -> None:
    """64 -> 64 channels, 3x3, 56x56 (200,704 values in and out per sample), 32 samples in
    fp16 (an fp32 workload at bytes_scale 0.5: 2 B a value) on a V100 (900 GB/s at its flat
    0.8711 = 784/900 of it): each phase adds two transposes, each reading and writing one
    tensor, 2 x (2 x 200,704 x 32 x 2 B) = 51,380,224 B at 784 GB/s = 65.536 us."""
    assert V100.memory_efficiency is not None
    assert V100.memory_efficiency.at(1e6) == V100.memory_efficiency.at(1e9)  # flat
    channels_last = gpu_phase_times_s(_conv(None), 1.0, 32, V100, "fp16", 0.5)
    channels_first = gpu_phase_times_s(_conv("nchw"), 1.0, 32, V100, "fp16", 0.5)
    expected = 2 * (2 * 200_704 * 32 * 2) / 784e9
    assert expected == pytest.approx(65.536e-6, rel=1e-12)
    for first, last in zip(channels_first, channels_last):
        assert first - last == pytest.approx(expected, rel=1e-9)
    # an explicit nhwc is the default
    assert gpu_phase_times_s(_conv("nhwc"), 1.0, 32, V100, "fp16", 0.5) == channels_last


def test_no_transposes_without_tensor_cores() -> None:
    """fp32 on a V100 runs on CUDA cores, as fp16 on a P100 (paired FMAs at twice fp32):
    NCHW is their native layout, so the layout changes nothing; TF32 on an A100 is a Tensor
    Core precision."""
    assert not on_tensor_cores(V100, "fp32") and not on_tensor_cores(P100, "fp16")
    assert on_tensor_cores(V100, "fp16") and on_tensor_cores(A100, "tf32")
    assert not on_tensor_cores(V100, "tf32")  # no such unit
    for device, precision in ((V100, "fp32"), (P100, "fp16")):
        assert not transposes_layout(_conv("nchw"), precision, device)
        assert (gpu_phase_times_s(_conv("nchw"), 1.0, 32, device, precision, 1.0)
                == gpu_phase_times_s(_conv(None), 1.0, 32, device, precision, 1.0))
    assert transposes_layout(_conv("nchw"), "tf32", A100)
    assert not transposes_layout(_conv(None), "tf32", A100)


def test_a_projection_shortcut_transposes_its_block_input() -> None:
    """ResNet-50's first projection (64x56x56 -> 256x56x56, 1x1): it reads the block input,
    not the chain's 256-channel value, so its transposes move 64 + 256 channels of 56x56."""
    shortcut = build_layer("shortcut_conv2d", "s", (256, 56, 56), 4, True,
                           {"block_input": [64, 56, 56], "layout": "nchw"}, "layers[0]")
    plain = build_layer("shortcut_conv2d", "s", (256, 56, 56), 4, True,
                        {"block_input": [64, 56, 56]}, "layers[0]")
    fwd_first = gpu_phase_times_s(shortcut, 1.0, 8, V100, "fp16", 1.0)[0]
    fwd_last = gpu_phase_times_s(plain, 1.0, 8, V100, "fp16", 1.0)[0]
    moved = 2 * (64 + 256) * 56 * 56 * 8 * 4  # read + write, 4 B a value (bytes_scale 1)
    assert fwd_first - fwd_last == pytest.approx(moved / 784e9, rel=1e-9)


def test_each_phase_launches_its_transposes() -> None:
    """A two-conv network: the first conv has no input gradient (nothing upstream), so its
    transposes run in forward and weight gradient only: (1 + 2) kernels per phase that runs."""
    specs = [{"kind": "conv2d", "name": "a", "out_channels": 8, "kernel": 3, "padding": 1},
             {"kind": "conv2d", "name": "b", "out_channels": 8, "kernel": 3, "padding": 1},
             {"kind": "flatten", "name": "f"},
             {"kind": "linear", "name": "fc", "out_features": 10},
             {"kind": "softmax_loss", "name": "loss"}]
    launches = {}
    for layout in ("nhwc", "nchw"):
        laid = [{**s, "layout": layout} if s["kind"] == "conv2d" else s for s in specs]
        w = build_workload("two-convs", [8, 16, 16], laid, samples_per_epoch=64)
        p = dnnscale.predict(w, "dgx-a100-80g:1", {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 8,
                                                    "global_batch": 8, "precision": "tf32"})
        launches[layout] = {layer.name: (layer.forward_launches, layer.backward_launches)
                            for layer in p.layers}
    # a: forward and weight gradient; b: forward, input and weight gradient
    more = {name: tuple(x - y for x, y in zip(launches["nchw"][name], launches["nhwc"][name]))
            for name in ("a", "b", "fc")}
    assert more == {"a": (TRANSPOSES_PER_CALL, TRANSPOSES_PER_CALL),
                    "b": (TRANSPOSES_PER_CALL, 2 * TRANSPOSES_PER_CALL), "fc": (0, 0)}


@settings(max_examples=30, deadline=None)
@given(channels=st.sampled_from([3, 16, 64, 256]), size=st.sampled_from([7, 14, 56]),
       kernel=st.sampled_from([1, 3, 7]), batch=st.integers(1, 256),
       case=st.sampled_from([("dgx-a100-80g:1", "tf32"), ("dgx-a100-80g:1", "fp16"),
                             ("dgx-1-v100-16g:1", "fp16"), ("dgx-1-v100-16g:1", "fp32"),
                             ("dgx-h100:1", "bf16")]))
def test_nchw_is_never_faster(channels: int, size: int, kernel: int, batch: int,
                              case: tuple[str, str]) -> None:
    device = load_system(case[0]).machine
    hyper = {"out_channels": 64, "kernel": kernel, "padding": kernel // 2}
    nhwc = build_layer("conv2d", "c", (channels, size, size), 4, True, hyper, "l")
    nchw = build_layer("conv2d", "c", (channels, size, size), 4, True,
                       {**hyper, "layout": "nchw"}, "l")
    first = gpu_phase_times_s(nchw, 1.0, batch, device, case[1], 1.0)
    last = gpu_phase_times_s(nhwc, 1.0, batch, device, case[1], 1.0)
    assert all(f >= t for f, t in zip(first, last))
    assert (first == last) == (not on_tensor_cores(device, case[1]))


def test_zoo_layout_argument() -> None:
    nchw = load_workload("resnet50:layout=nchw")
    assert nchw.name == "resnet50:layout=nchw"
    convs = [layer for layer in nchw.layers if layer.kind in ("conv2d", "shortcut_conv2d")]
    assert len(convs) == 53 and all(layer.hyper["layout"] == "nchw" for layer in convs)
    assert load_workload("resnet50:layout=nhwc").name == "resnet50"
    assert all(layer.hyper.get("layout") == "nchw" for layer in load_workload(
        "vgg16:layout=nchw").layers if layer.kind == "conv2d")
    # counts are the layout's business only on a GPU: params and FLOPs do not move
    plain = load_workload("resnet50")
    assert nchw.params == plain.params and math.isclose(nchw.fwd_flops, plain.fwd_flops)
    for bad in ("resnet50:layout=nhcw", "resnet50:channels=last", "alexnet:layout"):
        with pytest.raises(InputError, match=r"layout=nhwc\|nchw"):
            load_workload(bad)


def test_a_bad_layout_names_its_field() -> None:
    with pytest.raises(InputError) as raised:
        build_layer("conv2d", "c1", (3, 8, 8), 4, False,
                    {"out_channels": 4, "kernel": 3, "layout": "NCHW"}, "workload.layers[0]")
    assert raised.value.field == "layers.c1.layout" and "nhwc, nchw" in str(raised.value)


@pytest.mark.parametrize("name, usage", [("resnet50:layout=bogus", "layout=nhwc|nchw"),
                                         ("resnet50:fuse_bn=bogus", "fuse_bn=none|relu|all")])
def test_cli_rejects_a_bad_zoo_argument_in_one_line(name: str, usage: str) -> None:
    done = subprocess.run([sys.executable, "-m", "dnnscale", "predict", "-w", name, "-c",
                           "dgx-a100-80g:1", "--dp", "1", "--micro-batch", "8",
                           "--global-batch", "8"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert usage in done.stderr


def test_published_dev_runs_dle_resnet_as_its_scripts_do() -> None:
    """AMP runs channels last (PyTorch configs.yml memory_format nhwc; MXNet runner's
    --conv-layout NHWC for float16), TF32 and FP32 runs NCHW."""
    assert resnet50_layout("fp16") == "nhwc"
    assert resnet50_layout("tf32") == resnet50_layout("fp32") == "nchw"
    row = {"id": "X1", "source": "NVIDIA DeepLearningExamples MXNet RN50v1.5 README",
           "url_or_repo_path": "", "model": "ResNet-50 v1.5", "device": "NVIDIA A100 SXM4 80GB",
           "framework": "MXNet (mxnet-22.10-py3), Horovod/DALI",
           "inter_node_network": "n/a", "num_nodes": "1", "num_devices": "8",
           "global_batch": "4096", "micro_batch": "512 per GPU", "precision": "TF32",
           "measured_value": "8000", "measured_unit": "images/sec (total)", "notes": ""}
    case = case_of(row)
    assert case.workload == "resnet50:layout=nchw"  # type: ignore[union-attr]
    case = case_of({**row, "precision": "mixed precision (FP16)"})
    assert case.workload == "resnet50:fuse_bn=all"  # type: ignore[union-attr]

"""ResNet-50 v1.5 in the zoo (issue 23): its counts by hand, the batch-norm and residual kinds,
and a data-parallel GPU plan through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dnnscale
from dnnscale.errors import InputError
from dnnscale.workload import build_workload, load_workload, zoo_workload
from dnnscale.workload.spec import save_workload_yaml

STAGES = ((64, 3, 56), (128, 4, 28), (256, 6, 14), (512, 3, 7))  # width, blocks, output size


def _params_by_hand() -> int:
    """Every count by hand: bias-free convs, 2 per batch-norm channel, the FC's bias."""
    total = 7 * 7 * 3 * 64 + 2 * 64                       # stem conv + bn
    c_in = 64
    for width, blocks, _ in STAGES:
        for block in range(blocks):
            total += c_in * width + 2 * width              # 1x1 + bn
            total += 9 * width * width + 2 * width         # 3x3 + bn
            total += width * 4 * width + 2 * 4 * width     # 1x1 + bn
            if block == 0:
                total += c_in * 4 * width + 2 * 4 * width  # projection + bn
            c_in = 4 * width
    return total + 2048 * 1000 + 1000


def _macs_by_hand() -> int:
    """Forward multiply-adds: the stem at 112², every bottleneck at its output size (v1.5: the
    first 1x1 of a downsampling block runs at the input size), the projections, the FC."""
    macs = 112 * 112 * 64 * 7 * 7 * 3
    c_in, size_in = 64, 56
    for width, blocks, size in STAGES:
        for block in range(blocks):
            first_size = size_in if block == 0 else size
            macs += first_size ** 2 * width * c_in            # 1x1 (stride 1)
            macs += size ** 2 * width * 9 * width            # 3x3 (the stride here)
            macs += size ** 2 * 4 * width * width            # 1x1 up
            if block == 0:
                macs += size ** 2 * 4 * width * c_in          # projection
            c_in, size_in = 4 * width, size
    return macs + 2048 * 1000


def test_resnet50_counts_match_torchvision() -> None:
    """25,557,032 parameters (torchvision's num_params for resnet50) and 4.09 G forward
    multiply-adds per 224x224 image (torchvision's table: 'GFLOPS 4.09', one per multiply-add),
    both also counted here by hand."""
    w = zoo_workload("resnet50")
    assert w.params == _params_by_hand() == 25_557_032
    assert w.fwd_macs == _macs_by_hand() == 4_089_184_256
    assert round(w.fwd_macs / 1e9, 2) == 4.09
    # every weighted phase is the forward's size but the stem's input gradient (nothing needs it)
    stem = w.layers[0]
    assert w.weight_grad_flops == w.fwd_flops
    assert w.input_grad_flops == w.fwd_flops - stem.fwd_flops
    kinds = [layer.kind for layer in w.layers]
    assert kinds.count("conv2d") == 1 + 3 * 16 and kinds.count("shortcut_conv2d") == 4
    assert kinds.count("batchnorm2d") == 53 and kinds.count("shortcut_add") == 16
    assert w.layers[-2].output_shape == (1000,) and w.samples_per_epoch == 1_281_167
    assert w.layers[-4].output_shape == (2048, 1, 1)   # the global average pool


def test_v1_5_puts_the_stride_on_the_3x3() -> None:
    w = {layer.name: layer for layer in zoo_workload("resnet50").layers}
    assert w["layer2.0.conv1"].stride == (1, 1) and w["layer2.0.conv1"].output_shape == (128, 56, 56)
    assert w["layer2.0.conv2"].stride == (2, 2) and w["layer2.0.conv2"].output_shape == (128, 28, 28)
    assert w["layer2.0.shortcut"].hyper["block_input"] == [256, 56, 56]
    assert w["layer2.0.shortcut"].output_shape == (512, 28, 28)


def test_batchnorm_and_shortcut_bytes_by_hand() -> None:
    b = 2
    w = build_workload("r", [4, 8, 8], [
        {"kind": "conv2d", "out_channels": 8, "kernel": 3, "padding": 1, "bias": False},
        {"kind": "batchnorm2d"},
        {"kind": "shortcut_conv2d", "block_input": [4, 8, 8], "stride": 1},
        {"kind": "shortcut_add", "identity": False},
        {"kind": "conv2d", "name": "c2", "out_channels": 8, "kernel": 1, "bias": False},
        {"kind": "shortcut_add", "name": "add2"}], samples_per_epoch=1, bytes_per_value=b)
    conv, bn, short, add, _, add2 = w.layers
    v = 8 * 8 * 8
    assert bn.params == 16 and bn.fwd_flops == 0
    assert (bn.fwd_bytes, bn.input_grad_bytes, bn.weight_grad_bytes) == (3 * v * b, 5 * v * b, 0)
    # the projection reads the block input (4x8x8), not the chain's value, and sums the fork
    assert short.input_shape == short.output_shape == (8, 8, 8)
    assert short.params == 4 * 8 and short.fwd_flops == 2 * 8 * 64 * 4
    assert short.fwd_bytes == (4 * 64 + v) * b
    assert short.input_grad_bytes == (4 * 64 + v) * b + 3 * 4 * 64 * b
    assert (add.fwd_bytes, add.input_grad_bytes) == (3 * v * b, 0)
    assert (add2.fwd_bytes, add2.input_grad_bytes) == (3 * v * b, 3 * v * b)
    # a batch norm before any weighted layer forms only its own gradients
    first = build_workload("f", [2, 4, 4], [{"kind": "batchnorm2d"}, {"kind": "flatten"},
                                            {"kind": "linear", "out_features": 3}],
                           samples_per_epoch=1).layers[0]
    assert (first.input_grad_bytes, first.weight_grad_bytes) == (0, 2 * 32 * 4)


@pytest.mark.parametrize("spec, field", [
    ({"kind": "shortcut_conv2d", "block_input": [4, 16, 16], "stride": 1}, "block_input"),
    ({"kind": "shortcut_conv2d", "block_input": [4, 8], "stride": 1}, "block_input"),
    ({"kind": "shortcut_conv2d", "block_input": "x"}, "block_input"),
    ({"kind": "shortcut_conv2d"}, "block_input"),
    ({"kind": "shortcut_add", "identity": "yes"}, "identity"),
    ({"kind": "batchnorm2d", "eps": 1e-5}, "eps"),
    ({"kind": "batchnorm3d"}, "kind"),
])
def test_bad_residual_layers_name_their_field(spec, field) -> None:
    with pytest.raises(InputError) as info:
        build_workload("r", [8, 8, 8], [spec], samples_per_epoch=1)
    assert info.value.field.endswith(field)
    assert "\n" not in str(info.value)


def test_resnet50_round_trips_through_yaml(tmp_path: Path) -> None:
    original = zoo_workload("resnet50")
    path = tmp_path / "r.yaml"
    save_workload_yaml(original, path)
    again = load_workload(path)
    assert again.layers == original.layers and again.params == 25_557_032


def test_resnet50_data_parallel_on_gpus() -> None:
    """The published rows' kind of plan, by the CLI: data parallelism over 8 A100s, fp16."""
    from typer.testing import CliRunner

    from dnnscale.cli import app

    args = ["predict", "-w", "resnet50", "-c", "dgx-a100-80g:1", "--tp", "1", "--pp", "1",
            "--dp", "8", "--micro-batch", "256", "--global-batch", "2048", "--precision",
            "fp16", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["fits"] and out["throughput_samples_per_s"] > 0
    api = dnnscale.predict("resnet50", "dgx-a100-80g:1",
                           {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 256,
                            "global_batch": 2048, "precision": "fp16"})
    assert api.throughput_samples_per_s == pytest.approx(out["throughput_samples_per_s"])


@pytest.mark.timeout(300)
def test_the_zoo_counts_what_pytorch_runs() -> None:
    """The same network written as PyTorch modules (tests/torch_models.py) and imported by
    tracing one training step: the same parameters and the same FLOPs in every phase."""
    pytest.importorskip("torch")
    from dnnscale.workload.torch_import import from_torch
    from tests import torch_models as tm

    imported = from_torch(tm.resnet50, (3, 224, 224), loss="cross_entropy")
    zoo = zoo_workload("resnet50")
    assert imported.params == zoo.params == 25_557_032
    for phase in ("fwd_flops", "input_grad_flops", "weight_grad_flops"):
        assert getattr(imported, phase) == pytest.approx(getattr(zoo, phase), rel=1e-9), phase


RELU_AND_ADD_OUTPUTS = 15_128_064
"""Values per image the ReLUs and residual adds write (none in place), by hand: conv1's ReLU
64·112² = 802,816; stage 1, three blocks of 64·56² + 64·56² + 2 · 256·56² (two 1x1/3x3 ReLUs,
the add and the block's ReLU) = 6,021,120; stage 2, 128·56² + 128·28² + 2 · 512·28² for its
first block (v1.5: the stride on the 3x3) and three of 2 · 128·28² + 2 · 512·28², 4,315,136;
stage 3 the same at 256 and 28 -> 14, 652,288 + 5 · 501,760 = 3,161,088; stage 4 at 512 and
14 -> 7, 326,144 + 2 · 250,880 = 827,904."""


def test_in_place_relus_and_adds_keep_no_buffer_of_their_own() -> None:
    """PyTorch's bottleneck runs nn.ReLU(inplace=True) and `out += residual`: the zoo's default
    keeps 37,562,832 - 15,128,064 = 22,434,768 values per image, inplace=false all 37,562,832;
    the bytes moved are the same either way."""
    inplace, separate = zoo_workload("resnet50"), load_workload("resnet50:inplace=false")
    assert separate.name == "resnet50:inplace=false"
    assert sum(layer.activation_values for layer in separate.layers) == 37_562_832
    assert sum(layer.kept_values for layer in separate.layers) == 37_562_832
    assert sum(layer.kept_values for layer in inplace.layers) == 37_562_832 - RELU_AND_ADD_OUTPUTS
    assert inplace.activation_values == 22_434_768 + 3 * 224 * 224  # the input too
    assert [(a.fwd_bytes, a.input_grad_bytes) for a in inplace.layers] == [
        (b.fwd_bytes, b.input_grad_bytes) for b in separate.layers]
    # fused into the norms (MXNet's float16 runs) there is nothing left to run in place
    assert sum(layer.kept_values for layer in load_workload("resnet50:fuse_bn=all").layers) == (
        22_434_768)


def test_in_place_decides_whether_nvidias_v100_batch_fits() -> None:
    """DeepLearningExamples ran 256 images a GPU in fp16 on 16 GB V100s: in place the
    activations are 22,434,768 values x 2 B x 256 = 11.49 GB and the plan fits; with a buffer
    each, 37,562,832 x 2 x 256 = 19.23 GB, and it does not."""
    plan = {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 256, "global_batch": 256,
            "precision": "fp16", "amp": "autocast"}
    inplace = dnnscale.predict("resnet50", "dgx-1-v100-16g:1", plan)
    separate = dnnscale.predict("resnet50:inplace=false", "dgx-1-v100-16g:1", plan)
    activations = {p.name: p.bytes for p in inplace.memory}["activations"]
    assert activations == 22_434_768 * 2 * 256
    assert {p.name: p.bytes for p in separate.memory}["activations"] == 37_562_832 * 2 * 256
    assert inplace.fits and not separate.fits
    assert inplace.step_time_s == pytest.approx(separate.step_time_s)


def test_in_place_survives_the_yaml_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    save_workload_yaml(zoo_workload("resnet50"), path)
    assert load_workload(path).activation_values == zoo_workload("resnet50").activation_values


@pytest.mark.parametrize("spec", [{"kind": "relu", "inplace": "yes"},
                                  {"kind": "shortcut_add", "inplace": 1}])
def test_a_bad_inplace_names_its_field(spec) -> None:
    with pytest.raises(InputError, match=r"inplace: must be true or false"):
        build_workload("r", [8, 8, 8], [spec], samples_per_epoch=1)
    with pytest.raises(InputError, match=r"resnet50 takes .*inplace=true\|false"):
        load_workload("resnet50:inplace=maybe")


@pytest.mark.parametrize("name, relu_outputs", [
    # conv ReLUs 2 · 64·224² + 2 · 128·112² + 3 · 256·56² + 3 · 512·28² + 3 · 512·14², and the
    # two FC ReLUs 2 · 4,096
    ("vgg16", 6_422_528 + 3_211_264 + 2_408_448 + 1_204_224 + 301_056 + 8_192),
    # conv ReLUs 64·55² + 192·27² + 384·13² + 256·13² + 256·13², FC 2 · 4,096
    ("alexnet", 193_600 + 139_968 + 64_896 + 43_264 + 43_264 + 8_192),
])
def test_torchvisions_in_place_relus(name: str, relu_outputs: int) -> None:
    """torchvision's AlexNet and VGG-16 run nn.ReLU(inplace=True) too: by default their ReLUs
    keep no buffer (13,555,712 and 493,184 values an image fewer); inplace=false keeps them."""
    inplace, separate = zoo_workload(name), load_workload(f"{name}:inplace=false")
    kept = sum(layer.kept_values for layer in inplace.layers)
    assert sum(layer.kept_values for layer in separate.layers) - kept == relu_outputs
    assert [layer.fwd_bytes for layer in inplace.layers] == [
        layer.fwd_bytes for layer in separate.layers]
    assert load_workload(f"{name}:layout=nchw,inplace=false").name == (
        f"{name}:layout=nchw,inplace=false")

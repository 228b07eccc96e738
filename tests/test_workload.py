"""Workload shapes and counts: the zoo, the YAML format, shape inference and its errors."""

from __future__ import annotations

import pytest

from dnnscale.errors import InputError
from dnnscale.workload import build_workload, load_workload, zoo_workload
from dnnscale.workload.spec import save_workload_yaml


def test_adam_imagenet22k_has_two_billion_connections() -> None:
    w = zoo_workload("adam-imagenet22k")
    convs = [l for l in w.layers if l.kind == "conv2d"]
    fcs = [l for l in w.layers if l.kind == "linear"]
    assert len(convs) == 5 and len(fcs) == 3 and fcs[-1].out_features == 22_000
    # conv: 55²·128·11²·3 + 27²·336·5²·128 + 13²·512·3²·336 + 13²·512·3²·512 + 13²·320·3²·512
    conv_macs = (55**2 * 128 * 121 * 3 + 27**2 * 336 * 25 * 128 + 13**2 * 512 * 9 * 336
                 + 13**2 * 512 * 9 * 512 + 13**2 * 320 * 9 * 512)
    fc_macs = 320 * 6 * 6 * 4096 + 4096 * 4096 + 4096 * 22_000
    assert w.fwd_macs == conv_macs + fc_macs == 1_988_031_872
    assert w.samples_per_epoch == 14_197_122


def test_alexnet_and_vgg16_match_torchvision_parameter_counts() -> None:
    assert zoo_workload("alexnet").params == 61_100_840
    assert zoo_workload("vgg16").params == 138_357_544


def test_mlp_widths_from_name() -> None:
    w = zoo_workload("mlp:10-20-3")
    assert [l.kind for l in w.layers] == ["linear", "relu", "linear", "softmax_loss"]
    assert w.params == 10 * 20 + 20 + 20 * 3 + 3
    # first linear needs no input gradient; the second does
    assert w.layers[0].input_grad_flops == 0 and w.layers[2].input_grad_flops == 2 * 20 * 3


def test_conv_shape_and_flops() -> None:
    w = build_workload("c", [3, 32, 32], [
        {"kind": "conv2d", "out_channels": 8, "kernel": 5, "stride": 2, "padding": 1},
        {"kind": "maxpool2d", "kernel": 3, "stride": 2},
        {"kind": "flatten"}, {"kind": "linear", "out_features": 4}], samples_per_epoch=1)
    conv, pool, flat, fc = w.layers
    assert conv.output_shape == (8, 15, 15)            # (32 + 2 - 5)//2 + 1
    assert conv.fwd_flops == 2 * 8 * 15 * 15 * 25 * 3
    assert pool.output_shape == (8, 7, 7) and pool.fwd_flops == 0
    assert pool.fwd_bytes == (8 * 15 * 15 + 8 * 7 * 7) * 4
    assert flat.output_shape == (392,)
    assert fc.params == 392 * 4 + 4 and fc.input_grad_flops == 2 * 392 * 4


def test_yaml_round_trip(tmp_path) -> None:
    for name in ("adam-cifar10", "alexnet", "mlp:5-7-2"):
        original = zoo_workload(name)
        path = tmp_path / "w.yaml"
        save_workload_yaml(original, path)
        again = load_workload(path)
        assert again.layers == original.layers
        assert again.samples_per_epoch == original.samples_per_epoch


@pytest.mark.parametrize("text, field", [
    ("input_shape: [3, 8, 8]\nsamples_per_epoch: 1\nlayers:\n  - {kind: conv3d}\n",
     "workload.layers[0].kind"),
    ("input_shape: [3, 8, 8]\nsamples_per_epoch: 1\nlayers:\n  - {kind: linear, out_features: 2}\n",
     "layers.linear1"),
    ("input_shape: [3, 8, 8]\nlayers: []\n", "workload.samples_per_epoch"),
    ("input_shape: [3, -8, 8]\nsamples_per_epoch: 1\nlayers: [{kind: relu}]\n",
     "workload.input_shape"),
    ("input_shape: [3, 8, 8]\nsamples_per_epoch: 1\nlayers:\n  - {kind: conv2d, out_channels: 2, kernel: 9}\n",
     "layers.conv2d1.kernel"),
    ("input_shape: [3, 8, 8]\nsamples_per_epoch: 1\nlayers:\n  - {kind: relu, size: 3}\n",
     "workload.layers[0].size"),
    ("input_shape: [3, 8, 8\nlayers: x\n", "workload"),
])
def test_bad_workload_yaml_names_the_field(tmp_path, text, field) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_workload(path)
    assert str(info.value).startswith(field + ":")
    assert "\n" not in str(info.value)


def test_unknown_zoo_name() -> None:
    with pytest.raises(InputError, match="unknown workload 'resnet9000'"):
        zoo_workload("resnet9000")

"""From an nn.Module to a plan without writing YAML: `-w package.module:factory --input-shape`
on predict, optimize and run, and `dnnscale.optimize(module, ..., input_shape=...)`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import dnnscale
from dnnscale.errors import InputError
from dnnscale.workload.source import is_factory_spec, resolve_workload

torch = pytest.importorskip("torch")

from tests.torch_models import adam_cifar10, resnet_tiny  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FACTORY = ["-w", "tests.torch_models:adam_cifar10", "--input-shape", "3,32,32"]


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dnnscale.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def test_factory_specs_are_told_from_zoo_names(tmp_path: Path) -> None:
    assert is_factory_spec("tests.torch_models:adam_cifar10")
    assert is_factory_spec("mypkg.models:Net.build")
    for name in ("gpt:layers=2,hidden=64,heads=4,seq=16,vocab=100", "mlp:784-10", "hf:x.json",
                 "adam-cifar10", "vgg16"):
        assert not is_factory_spec(name), name
    existing = tmp_path / "a:b"
    existing.write_text("")
    assert not is_factory_spec(str(existing))


def test_module_to_best_plan_in_one_command() -> None:
    """`dnnscale optimize -w tests.torch_models:adam_cifar10 --input-shape 3,32,32` gives the
    best plan of the imported network: the same as the Python API given the nn.Module, and the
    zoo's adam-cifar10 (the same layers plus its loss) picks the same configuration within
    0.5 % of its step time."""
    result = cli("optimize", *FACTORY, "-c", "adam-2014", "-M", "16", "--json")
    assert result.returncode == 0, result.stderr
    best = json.loads(result.stdout)["best"]
    api = dnnscale.optimize(adam_cifar10(), "adam-2014", machines=16, input_shape=(3, 32, 32))
    assert best["config"] == api.best.config.to_dict()
    assert best["prediction"]["step_time_s"] == pytest.approx(api.best.step_time_s, rel=1e-12)
    zoo = dnnscale.optimize("adam-cifar10", "adam-2014", machines=16)
    assert zoo.best.config == api.best.config
    assert api.best.step_time_s == pytest.approx(zoo.best.step_time_s, rel=5e-3)


def test_predict_and_report_take_a_factory(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    result = cli("predict", *FACTORY, "-c", "adam-2014", "-P", "2", "-R", "2", "-S", "1",
                 "--json", "--html", str(out))
    assert result.returncode == 0, result.stderr
    step = json.loads(result.stdout)["step_time_s"]
    expected = dnnscale.predict(adam_cifar10(), "adam-2014",
                                dnnscale.Config(partitions=2, replicas=2, ps_shards=1),
                                input_shape=(3, 32, 32))
    assert step == pytest.approx(expected.step_time_s, rel=1e-12)
    assert "adam_cifar10 on adam-2014" in out.read_text()


@pytest.mark.parametrize("args, field", [
    (["-w", "tests.torch_models:adam_cifar10"], "--input-shape"),
    (["-w", "adam-cifar10", "--input-shape", "3,32,32"], "--input-shape"),
    (["-w", "tests.torch_models:no_such_factory", "--input-shape", "3,32,32"], "--workload"),
    (["-w", "tests.torch_models:adam_cifar10", "--input-shape", "3,x"], "--input-shape"),
])
def test_bad_factory_input_is_one_line(args: list[str], field: str) -> None:
    result = cli("predict", *args, "-c", "adam-2014", "-P", "1", "-R", "1", "-S", "1")
    assert result.returncode == 2, result.stdout
    assert result.stderr.strip().startswith(f"error: {field}:")
    assert len(result.stderr.strip().splitlines()) == 1


def test_python_api_names_the_missing_shape() -> None:
    with pytest.raises(InputError) as caught:
        dnnscale.optimize(adam_cifar10(), "adam-2014")
    assert caught.value.field == "input_shape"
    with pytest.raises(InputError) as caught:
        resolve_workload("adam-cifar10", input_shape=(3, 32, 32))
    assert caught.value.field == "input_shape"
    # a factory works as well as a module
    w = resolve_workload(adam_cifar10, (3, 32, 32))
    assert [layer.kind for layer in w.layers][:3] == ["conv2d", "relu", "maxpool2d"]


def test_run_names_the_layer_it_cannot_build() -> None:
    """resnet_tiny has BatchNorm, imported as a generic layer: one line naming it, exit 2,
    before any rank starts."""
    result = cli("run", "-w", "tests.torch_models:resnet_tiny", "--input-shape", "3,32,32",
                 "-P", "1", "-R", "1", "-S", "1", "--local", "--steps", "3")
    assert result.returncode == 2
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1
    layer = next(l for l in resolve_workload(resnet_tiny, (3, 32, 32)).layers
                 if l.kind == "generic")
    assert f"cannot build layer {layer.name!r}: kind 'generic'" in line


@pytest.mark.slow
def test_run_trains_an_imported_model() -> None:
    """The imported CIFAR-10 network trains for real (2 partitions, 1 PS shard)."""
    result = cli("run", *FACTORY, "-P", "2", "-R", "1", "-S", "1", "-n", "8", "--local",
                 "--steps", "4", "--warmup", "1", "--json", timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["steps"] == 4 and summary["measured_throughput_samples_per_s"] > 0
    assert summary["config"]["partitions"] == 2

"""The table of bad inputs for tests/test_fuzz_inputs.py: every loader, command and output path.

Each `Case` is one command line (or one Python API call) whose inputs are generated here: YAML
documents broken in one way each, run through every command that reads that format, flags out
of range, output paths that cannot be written, and so on. The expected outcome of every case is
the same: exit code 2, one line on stderr that starts with ``error: FIELD``, nothing on stdout
under --json, no traceback, no file left behind, within the time and memory caps.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

from dnnscale.safe_yaml import MAX_ALIASES, MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES
from dnnscale.workload.workload import MAX_LAYERS


FIFO = b"\0named pipe\0"
"""A `files` value that makes a named pipe (reading one would block forever)."""


@dataclass(frozen=True)
class Case:
    """One bad input. `argv` may hold ``{d}`` for the case's folder; `files` are written there
    first (text or bytes; a value of None makes a folder). `field`: what the error line must
    start with after ``error: ``. `subprocess`: run the installed CLI in a child process with
    memory and time limits (for the classes that used to hang, grow or crash the interpreter).
    `keep`: files that must be byte-for-byte unchanged afterwards."""

    name: str
    group: str
    argv: tuple[str, ...]
    field: str
    files: dict[str, "str | bytes | None"] = field(default_factory=dict)
    subprocess: bool = False
    keep: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.group}:{self.name}"


# -- valid pieces that a case breaks one at a time ---------------------------------------------

WORKLOAD: dict[str, Any] = {
    "name": "tiny", "input_shape": [3, 8, 8], "samples_per_epoch": 1000,
    "layers": [{"kind": "conv2d", "out_channels": 4, "kernel": 3, "padding": 1},
               {"kind": "relu"}, {"kind": "maxpool2d", "kernel": 2}, {"kind": "flatten"},
               {"kind": "linear", "out_features": 10}, {"kind": "softmax_loss"}]}
CLUSTER: dict[str, Any] = {
    "name": "small", "machines": 16,
    "machine": {"cores": 4, "memory": "8GB", "memory_bandwidth": "10GB/s",
                "flops_per_core": "5GFLOP/s", "update_time_per_param": "1ns"},
    "network": {"bandwidth": "10Gbit/s", "latency": "50us"}}
CONFIG: dict[str, Any] = {"partitions": 1, "replicas": 2, "ps_shards": 1, "sync": "ps-async",
                          "minibatch": 16}
PLAN_FLAGS = ("-P", "1", "-R", "1", "-S", "1")


def dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def with_layer(layer: dict[str, Any], before: list[dict[str, Any]] | None = None,
               input_shape: list[int] | None = None) -> str:
    """The valid workload with one layer spec replaced: `before` (default: none) then `layer`
    then a loss where the shapes allow."""
    data = {**WORKLOAD, "layers": [*(before or []), layer]}
    if input_shape is not None:
        data["input_shape"] = input_shape
    return dump(data)


def nested(key: str, value: Any, data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the dotted `key` set to `value` (a mapping made where missing)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    head, _, rest = key.partition(".")
    if rest:
        out[head] = nested(rest, value, out.get(head) or {})
    else:
        out[head] = value
    return out


# -- YAML documents broken in their structure (apply to every format) ---------------------------

def _laughs(levels: int = 9, width: int = 9) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def laughs_in(key: str) -> str:
    """A 'billion laughs' document whose last anchor is used as the value of `key` (so it
    reaches the field's validation if the loader let it through)."""
    return _laughs() + f"{key}: *l8\n"


def laughs_nested() -> str:
    """The same bomb inside one list value: no unknown top-level keys to stop it early."""
    body = ["x: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    names = "abcdefgh"
    for prev, cur in zip(names, names[1:]):
        body.append(f"  - &{cur} [" + ", ".join([f"*{prev}"] * 10) + "]")
    return "layers:\n  - " + body[0].replace("x: ", "") + "\n" + "\n".join(body[1:]) + "\n"


STRUCTURE: dict[str, tuple[str, "str | bytes | None"]] = {
    # name: (expected problem in the message, the file's content; None: a folder)
    "deep-list": ("nests deeper", "a: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "\n"),
    "deep-map": ("nests deeper", "".join("  " * i + f"k{i}:\n" for i in range(MAX_DEPTH + 5))
                 + "  " * (MAX_DEPTH + 5) + "x: 1\n"),
    "deep-flow-map": ("nests deeper", "a: " + "{b: " * (MAX_DEPTH + 5) + "1" + "}" * (MAX_DEPTH + 5)
                      + "\n"),
    "recursive-alias": ("alias", "a: &x [1, *x]\n"),
    "undefined-alias": ("alias", "a: *nowhere\n"),
    "many-aliases": ("aliases", "a: &x 1\nb: [" + ", ".join(["*x"] * (MAX_ALIASES + 1)) + "]\n"),
    "wide-expansion": ("expands", "a: &x [" + ", ".join(["0"] * 1001) + "]\nb: ["
                       + ", ".join(["*x"] * 1000) + "]\n"),
    "int-key": ("keys must be text", "1: a\nname: b\n"),
    "mixed-keys": ("keys must be text", "name: a\n2.5: b\ntrue: c\n"),
    "null-key": ("keys must be text", "~: a\n"),
    "bool-key": ("keys must be text", "yes: 1\n"),
    "date-key": ("keys must be text", "2024-01-01: 1\n"),
    "list-key": ("keys must be text", "? [a, b]\n: 1\n"),
    "map-key": ("keys must be text", "? {a: 1}\n: 1\n"),
    "alias-key": ("keys must be text", "a: &k b\n*k : 1\n"),
    "duplicate-key": ("twice", "name: a\nname: b\n"),
    "python-tag": ("malformed", "a: !!python/object/apply:os.system [echo hi]\n"),
    "unknown-tag": ("malformed", "a: !mytag 1\n"),
    "multi-document": ("malformed", "a: 1\n---\nb: 2\n"),
    "unclosed-flow": ("malformed", "a: [1, 2\n"),
    "tab-indent": ("malformed", "a:\n\tb: 1\n"),
    "bad-indent": ("malformed", "a:\n  b: 1\n c: 2\n"),
    "nul-byte": ("malformed", "a: 1\x00\n"),
    "control-char": ("malformed", "a: \x07bell\n"),
    "empty-file": ("must hold a YAML mapping", ""),
    "only-comment": ("must hold a YAML mapping", "# nothing here\n"),
    "top-scalar": ("must hold a YAML mapping", "hello\n"),
    "top-list": ("must hold a YAML mapping", "- a\n- b\n"),
    "not-utf8": ("not UTF-8", b"name: caf\xe9\n"),
    "binary": ("not UTF-8", bytes(range(256)) * 4),
    "utf16": ("not UTF-8", "name: x\n".encode("utf-16")),
    "over-size": ("the limit is", "# padding\n" * (MAX_FILE_BYTES // 10 + 1)),
    "folder": ("folder", None),
}


# -- the formats and the commands that read each ------------------------------------------------

def _readers() -> dict[str, list[tuple[str, tuple[str, ...]]]]:
    """format -> [(command label, argv with {f} for the file)]."""
    return {
        "workload": [("describe", ("describe", "{f}", "--json")),
                     ("predict", ("predict", "-w", "{f}", "-c", "adam-2014", *PLAN_FLAGS,
                                  "--json")),
                     ("optimize", ("optimize", "-w", "{f}", "-c", "adam-2014", "-M", "8",
                                   "--json")),
                     ("run", ("run", "-w", "{f}", *PLAN_FLAGS, "--local", "--json"))],
        "cluster": [("predict", ("predict", "-w", "adam-mnist", "-c", "{f}", *PLAN_FLAGS,
                                 "--json")),
                    ("optimize", ("optimize", "-w", "adam-mnist", "-c", "{f}", "--json"))],
        "config": [("predict", ("predict", "-w", "adam-mnist", "-c", "adam-2014", "--config",
                                "{f}", "--json")),
                   ("run", ("run", "-w", "mlp:32-16-4", "--config", "{f}", "--local",
                            "--json"))],
        "profile": [("predict", ("predict", "-w", "adam-mnist", "-c", "{d}/with-profile.yaml",
                                 *PLAN_FLAGS, "--json"))],
        "testbed": [("run", ("run", "-w", "mlp:32-16-4", *PLAN_FLAGS, "--testbed", "{f}",
                             "--json"))],
        "grid": [("validate", ("validate", "--testbed", "tb", "--configs", "{f}", "-o",
                               "{d}/out", "--json"))],
    }


def _profile_cluster() -> str:
    return dump({**CLUSTER, "profile": "bad.yaml"})


def structure_cases() -> Iterator[Case]:
    """Every structural defect in every format, through every command that reads the format."""
    for fmt, readers in _readers().items():
        for defect, (problem, content) in STRUCTURE.items():
            for label, argv in readers:
                files: dict[str, "str | bytes | None"] = {"bad.yaml": content}
                if fmt == "profile":
                    files["with-profile.yaml"] = _profile_cluster()
                # a profile that is a folder is no profile file: the cluster's field says so
                expected = "cluster.profile" if (fmt, defect) == ("profile", "folder") else fmt
                yield Case(f"{fmt}-{defect}-{label}", "yaml-structure",
                           tuple(a.replace("{f}", "{d}/bad.yaml") for a in argv), expected, files)


def bomb_cases() -> Iterator[Case]:
    """Alias bombs and C-stack-deep nesting, in a child process under memory and time limits."""
    bombs = {
        "laughs-top": laughs_in("name"),
        "laughs-layers": laughs_nested(),
        "laughs-value": laughs_in("description"),
        "deep-100k": "a: " + "[" * 100_000 + "]" * 100_000 + "\n",
    }
    for fmt, readers in _readers().items():
        for bomb, content in bombs.items():
            label, argv = readers[0]
            files: dict[str, "str | bytes | None"] = {"bad.yaml": content}
            if fmt == "profile":
                files["with-profile.yaml"] = _profile_cluster()
            yield Case(f"{fmt}-{bomb}-{label}", "yaml-bomb",
                       tuple(a.replace("{f}", "{d}/bad.yaml") for a in argv), fmt, files,
                       subprocess=True)
    for label, argv in _readers()["workload"][1:]:
        yield Case(f"workload-laughs-layers-{label}", "yaml-bomb",
                   tuple(a.replace("{f}", "{d}/bad.yaml") for a in argv), "workload",
                   {"bad.yaml": laughs_nested()}, subprocess=True)


# -- layer values that make no physical sense ---------------------------------------------------

CONV = {"kind": "conv2d", "out_channels": 4, "kernel": 3}
POOL = {"kind": "maxpool2d", "kernel": 2}
GENERIC = {"kind": "generic", "output_shape": [10], "params": 10, "fwd_flops": 100}

LAYERS: dict[str, tuple[str, str]] = {
    # name: (expected field, workload YAML)
    "conv-kernel-negative": ("layers.conv2d1.kernel", with_layer({**CONV, "kernel": -3})),
    "conv-kernel-zero": ("layers.conv2d1.kernel", with_layer({**CONV, "kernel": 0})),
    "conv-kernel-pair-negative": ("layers.conv2d1.kernel", with_layer({**CONV, "kernel": [3, -1]})),
    "conv-kernel-float": ("layers.conv2d1.kernel", with_layer({**CONV, "kernel": 2.5})),
    "conv-kernel-string": ("layers.conv2d1.kernel", with_layer({**CONV, "kernel": "big"})),
    "conv-kernel-triple": ("layers.conv2d1.kernel", with_layer({**CONV, "kernel": [1, 2, 3]})),
    "conv-kernel-bool": ("layers.conv2d1.kernel", with_layer({**CONV, "kernel": True})),
    "conv-kernel-too-big": ("layers.conv2d1.kernel", with_layer({**CONV, "kernel": 99})),
    "conv-kernel-huge": ("layers.conv2d1.kernel", with_layer({**CONV, "kernel": 10**30})),
    "conv-stride-zero": ("layers.conv2d1.stride", with_layer({**CONV, "stride": 0})),
    "conv-stride-negative": ("layers.conv2d1.stride", with_layer({**CONV, "stride": -2})),
    "conv-padding-negative": ("layers.conv2d1.padding", with_layer({**CONV, "padding": -1})),
    "conv-channels-zero": ("layers.conv2d1.out_channels", with_layer({**CONV, "out_channels": 0})),
    "conv-channels-negative": ("layers.conv2d1.out_channels",
                               with_layer({**CONV, "out_channels": -8})),
    "conv-channels-float": ("layers.conv2d1.out_channels",
                            with_layer({**CONV, "out_channels": 4.5})),
    "conv-channels-string": ("layers.conv2d1.out_channels",
                             with_layer({**CONV, "out_channels": "four"})),
    "conv-channels-null": ("layers.conv2d1.out_channels",
                           with_layer({**CONV, "out_channels": None})),
    "conv-groups-zero": ("layers.conv2d1.groups", with_layer({**CONV, "groups": 0})),
    "conv-groups-mismatch": ("layers.conv2d1.groups", with_layer({**CONV, "groups": 2})),
    "conv-bias-string": ("layers.conv2d1.bias", with_layer({**CONV, "bias": "no"})),
    "conv-missing-kernel": ("workload.layers[0].kernel", with_layer({"kind": "conv2d",
                                                              "out_channels": 4})),
    "conv-unknown-field": ("workload.layers[0].dilation", with_layer({**CONV, "dilation": 2})),
    "conv-on-flat-input": ("layers.conv2d1", with_layer(CONV, input_shape=[10])),
    "linear-features-zero": ("layers.linear2.out_features",
                             with_layer({"kind": "linear", "out_features": 0},
                                        [{"kind": "flatten"}])),
    "linear-features-negative": ("layers.linear2.out_features",
                                 with_layer({"kind": "linear", "out_features": -10},
                                            [{"kind": "flatten"}])),
    "linear-features-float": ("layers.linear2.out_features",
                              with_layer({"kind": "linear", "out_features": 1e3},
                                         [{"kind": "flatten"}])),
    "linear-features-huge": ("layers.linear2.out_features",
                             with_layer({"kind": "linear", "out_features": 2**60},
                                        [{"kind": "flatten"}])),
    "linear-on-image": ("layers.linear1", with_layer({"kind": "linear", "out_features": 3})),
    "pool-stride-zero": ("layers.maxpool2d1.stride", with_layer({**POOL, "stride": 0})),
    "pool-kernel-negative": ("layers.maxpool2d1.kernel", with_layer({**POOL, "kernel": -2})),
    "pool-padding-over-half": ("layers.maxpool2d1.padding", with_layer({**POOL, "padding": 2})),
    "pool-padding-negative": ("layers.maxpool2d1.padding", with_layer({**POOL, "padding": -1})),
    "avgpool-stride-zero": ("layers.avgpool2d1.stride",
                            with_layer({"kind": "avgpool2d", "kernel": 2, "stride": 0})),
    "pool-too-big": ("layers.maxpool2d1.kernel", with_layer({**POOL, "kernel": 9})),
    "generic-params-negative": ("layers.generic1.params", with_layer({**GENERIC, "params": -5})),
    "generic-params-float": ("layers.generic1.params", with_layer({**GENERIC, "params": 1.5})),
    "generic-params-huge": ("layers.generic1.params", with_layer({**GENERIC, "params": 10**20})),
    "generic-flops-nan": ("layers.generic1.fwd_flops",
                          with_layer({**GENERIC, "fwd_flops": float("nan")})),
    "generic-flops-inf": ("layers.generic1.fwd_flops",
                          with_layer({**GENERIC, "fwd_flops": float("inf")})),
    "generic-flops-negative": ("layers.generic1.fwd_flops",
                               with_layer({**GENERIC, "fwd_flops": -1e9})),
    "generic-flops-string": ("layers.generic1.fwd_flops",
                             with_layer({**GENERIC, "fwd_flops": "2GFLOP"})),
    "generic-grad-flops-nan": ("layers.generic1.weight_grad_flops",
                               with_layer({**GENERIC, "weight_grad_flops": float("nan")})),
    "generic-bytes-negative": ("layers.generic1.fwd_bytes",
                               with_layer({**GENERIC, "fwd_bytes": -4})),
    "generic-bytes-inf": ("layers.generic1.input_grad_bytes",
                          with_layer({**GENERIC, "input_grad_bytes": float("-inf")})),
    "generic-shape-zero": ("layers.generic1.output_shape",
                           with_layer({**GENERIC, "output_shape": [0]})),
    "generic-shape-negative": ("layers.generic1.output_shape",
                               with_layer({**GENERIC, "output_shape": [10, -1]})),
    "generic-shape-string": ("layers.generic1.output_shape",
                             with_layer({**GENERIC, "output_shape": "10"})),
    "generic-shape-huge": ("layers.generic1.output_shape",
                           with_layer({**GENERIC, "output_shape": [2**40, 2**40]})),
    "generic-shape-missing": ("workload.layers[0].output_shape",
                              with_layer({"kind": "generic", "params": 1, "fwd_flops": 1})),
    "unknown-kind": ("workload.layers[0].kind", with_layer({"kind": "conv3d"})),
    "kind-missing": ("workload.layers[0]", with_layer({"out_features": 3})),
    "layer-not-mapping": ("workload.layers[0]", with_layer("relu")),  # type: ignore[arg-type]
    "duplicate-names": ("workload.layers[1].name",
                        with_layer({"kind": "relu", "name": "a"}, [{"kind": "relu", "name": "a"}])),
    "only-flatten": ("workload.layers", dump({**WORKLOAD, "layers": [{"kind": "flatten"}]})),
    "no-layers": ("workload.layers", dump({**WORKLOAD, "layers": []})),
    "layers-not-list": ("workload.layers", dump({**WORKLOAD, "layers": {"kind": "relu"}})),
    "input-shape-negative": ("workload.input_shape", dump({**WORKLOAD, "input_shape": [3, -8, 8]})),
    "input-shape-zero": ("workload.input_shape", dump({**WORKLOAD, "input_shape": [0]})),
    "input-shape-empty": ("workload.input_shape", dump({**WORKLOAD, "input_shape": []})),
    "input-shape-string": ("workload.input_shape", dump({**WORKLOAD, "input_shape": "3x8x8"})),
    "input-shape-float": ("workload.input_shape", dump({**WORKLOAD, "input_shape": [3, 8.5, 8]})),
    "input-shape-huge": ("workload.input_shape",
                         dump({**WORKLOAD, "input_shape": [2**30, 2**30, 2**30]})),
    "samples-zero": ("workload.samples_per_epoch", dump({**WORKLOAD, "samples_per_epoch": 0})),
    "samples-negative": ("workload.samples_per_epoch",
                         dump({**WORKLOAD, "samples_per_epoch": -100})),
    "samples-float": ("workload.samples_per_epoch",
                      dump({**WORKLOAD, "samples_per_epoch": 1000.5})),
    "samples-huge": ("workload.samples_per_epoch",
                     dump({**WORKLOAD, "samples_per_epoch": 10**400})),
    "samples-missing": ("workload.samples_per_epoch",
                        dump({k: v for k, v in WORKLOAD.items() if k != "samples_per_epoch"})),
    "bytes-per-value-3": ("workload.bytes_per_value", dump({**WORKLOAD, "bytes_per_value": 3})),
    "bytes-per-value-bool": ("workload.bytes_per_value",
                             dump({**WORKLOAD, "bytes_per_value": True})),
    "unknown-top-field": ("workload.epochs", dump({**WORKLOAD, "epochs": 3})),
}


def layer_cases() -> Iterator[Case]:
    readers = _readers()["workload"]
    for name, (expected, text) in LAYERS.items():
        for label, argv in readers[:2]:  # describe and predict
            yield Case(f"{name}-{label}", "layer-values",
                       tuple(a.replace("{f}", "{d}/w.yaml") for a in argv), expected,
                       {"w.yaml": text})


# -- configuration and cluster values ----------------------------------------------------------

CONFIG_FIELDS: dict[str, tuple[str, Any]] = {
    # name: (field, value)
    "partitions-zero": ("partitions", 0), "partitions-negative": ("partitions", -1),
    "partitions-float": ("partitions", 1.5), "partitions-string": ("partitions", "two"),
    "partitions-huge": ("partitions", 10**20),
    "replicas-negative": ("replicas", -2), "replicas-zero": ("replicas", 0),
    "replicas-epoch": ("replicas", 10**8),  # 10^8 replicas for a 60,000-sample epoch
    "replicas-bool": ("replicas", True),
    "ps-shards-negative": ("ps_shards", -1), "ps-shards-zero-with-ps": ("ps_shards", 0),
    "sync-gossip": ("sync", "gossip"), "sync-number": ("sync", 3),
    "minibatch-zero": ("minibatch", 0), "minibatch-over-epoch": ("minibatch", 60001),
    "push-every-zero": ("push_every", 0), "pull-every-negative": ("pull_every", -3),
    "fc-protocol-bad": ("fc_protocol", "both"), "optimizer-bad": ("optimizer", "lion"),
    "optimizer-list": ("optimizer", ["sgd"]), "overlap-string": ("overlap", "yes please"),
    "epoch-fraction-zero": ("epoch_fraction", 0), "epoch-fraction-two": ("epoch_fraction", 2),
    "epoch-fraction-nan": ("epoch_fraction", float("nan")),
    "unknown-field": ("gpus", 8),
}


def config_cases() -> Iterator[Case]:
    predict = ("predict", "-w", "adam-mnist", "-c", "adam-2014", "--json")
    for name, (key, value) in CONFIG_FIELDS.items():
        expected = f"config.{key}"
        if name == "replicas-epoch":
            expected = "config.replicas"
        data = {**CONFIG, key: value}
        yield Case(f"yaml-{name}", "config-values", (*predict, "--config", "{d}/c.yaml"),
                   expected, {"c.yaml": dump(data)})
    flags = {"partitions-zero": ("-P", "0"), "replicas-negative": ("-R", "-2"),
             "replicas-epoch": ("-R", "100000000"), "ps-shards-negative": ("-S", "-1"),
             "sync-gossip": ("--sync", "gossip"), "minibatch-zero": ("-n", "0"),
             "minibatch-over-epoch": ("-n", "60001"), "push-every-zero": ("--push-every", "0"),
             "fc-protocol-bad": ("--fc-protocol", "both"),
             "partitions-huge": ("-P", str(10**20)),
             "allreduce-with-shards": ("--sync", "allreduce", "-S", "2"),
             "vectors-with-allreduce": ("--sync", "allreduce", "--fc-protocol", "vectors"),
             "too-many-machines": ("-P", "8", "-R", "20", "-S", "1"),
             "partitions-over-layer": ("-P", "100000", "-R", "1", "-S", "1")}
    fields = {"allreduce-with-shards": "--ps-shards",
              "vectors-with-allreduce": "--fc-protocol", "too-many-machines": "config",
              "partitions-over-layer": "config"}
    long_flags = {"-P": "--partitions", "-R": "--replicas", "-S": "--ps-shards",
                  "-n": "--minibatch"}
    for name, extra in flags.items():  # a flag's bad value names the flag typed
        yield Case(f"flag-{name}", "config-values", (*predict, *extra),
                   fields.get(name, long_flags.get(extra[0], extra[0])))


CLUSTER_FIELDS: dict[str, tuple[str, Any, str]] = {
    # name: (dotted key, value, expected field)
    "machines-zero": ("machines", 0, "cluster.machines"),
    "machines-negative": ("machines", -4, "cluster.machines"),
    "machines-string": ("machines", "many", "cluster.machines"),
    "machines-10e12": ("machines", 10**12, "cluster.machines"),
    "machines-float": ("machines", 16.5, "cluster.machines"),
    "cores-zero": ("machine.cores", 0, "cluster.machine.cores"),
    "cores-nan": ("machine.cores", float("nan"), "cluster.machine.cores"),
    "cores-string": ("machine.cores", "four", "cluster.machine.cores"),
    "memory-negative": ("machine.memory", "-1GB", "cluster.machine.memory"),
    "memory-unit": ("machine.memory", "8 parsecs", "cluster.machine.memory"),
    "memory-inf": ("machine.memory", float("inf"), "cluster.machine.memory"),
    "memory-overflow": ("machine.memory", "1e400GB", "cluster.machine.memory"),
    "memory-list": ("machine.memory", [8], "cluster.machine.memory"),
    "memory-long-digits": ("machine.memory", "9" * 100_000 + "!", "cluster.machine.memory"),
    "bandwidth-long-unit": ("network.bandwidth", "1" + "G" * 100_000, "cluster.network.bandwidth"),
    "latency-long-number": ("network.latency", "0." + "5" * 100_000 + "us",
                            "cluster.network.latency"),
    "bandwidth-zero": ("network.bandwidth", 0, "cluster.network.bandwidth"),
    "bandwidth-nan": ("network.bandwidth", float("nan"), "cluster.network.bandwidth"),
    "latency-negative": ("network.latency", "-5us", "cluster.network.latency"),
    "latency-nan": ("network.latency", float("nan"), "cluster.network.latency"),
    "flops-zero": ("machine.flops_per_core", 0, "cluster.machine.flops_per_core"),
    "flops-curve-bad": ("machine.flops_per_core", {"default": [[1, 2, 3]]},
                        "cluster.machine.flops_per_core.default[0]"),
    "flops-curve-empty": ("machine.flops_per_core", {"default": []},
                          "cluster.machine.flops_per_core.default"),
    "flops-no-default": ("machine.flops_per_core", {"linear": "1GFLOP/s"},
                         "cluster.machine.flops_per_core.default"),
    "flops-unknown-kind": ("machine.flops_per_core", {"default": "1GFLOP/s", "lstm": "1GFLOP/s"},
                           "cluster.machine.flops_per_core.lstm"),
    "update-negative": ("machine.update_time_per_param", "-1ns",
                        "cluster.machine.update_time_per_param"),
    "gamma-below-one": ("overlap_gamma", 0.5, "cluster.overlap_gamma"),
    "gamma-string": ("overlap_gamma", "lots", "cluster.overlap_gamma"),
    "gamma-nan": ("overlap_gamma", float("nan"), "cluster.overlap_gamma"),
    "gamma-overflow": ("overlap_gamma", 10**400, "cluster.overlap_gamma"),
    "machine-scalar": ("machine", 4, "cluster.machine"),
    "network-unknown-field": ("network.jitter", "1ms", "cluster.network.jitter"),
    "unknown-top-field": ("racks", 2, "cluster.racks"),
    "profile-missing": ("profile", "no-such-profile.yaml", "cluster.profile"),
}


def cluster_cases() -> Iterator[Case]:
    predict = ("predict", "-w", "adam-mnist", "-c", "{d}/c.yaml", *PLAN_FLAGS, "--json")
    for name, (key, value, expected) in CLUSTER_FIELDS.items():
        yield Case(name, "cluster-values", predict, expected,
                   {"c.yaml": dump(nested(key, value, CLUSTER))})
    for name in ("machines-10e12", "bandwidth-zero", "gamma-nan"):
        key, value, expected = CLUSTER_FIELDS[name]
        yield Case(f"{name}-optimize", "cluster-values",
                   ("optimize", "-w", "adam-mnist", "-c", "{d}/c.yaml", "--json"), expected,
                   {"c.yaml": dump(nested(key, value, CLUSTER))})
    missing = {k: v for k, v in CLUSTER.items() if k != "network"}
    yield Case("network-missing", "cluster-values", predict, "cluster.network",
               {"c.yaml": dump(missing)})


# -- huge but well-formed inputs ----------------------------------------------------------------

def huge_cases() -> Iterator[Case]:
    many = dump({**WORKLOAD, "input_shape": [8],
                 "layers": [{"kind": "relu"} for _ in range(MAX_LAYERS + 1)]})
    yield Case("layers-over-limit-describe", "huge-inputs", ("describe", "{d}/w.yaml", "--json"),
               "workload.layers", {"w.yaml": many})
    yield Case("layers-over-limit-predict", "huge-inputs",
               ("predict", "-w", "{d}/w.yaml", "-c", "adam-2014", *PLAN_FLAGS, "--json"),
               "workload.layers", {"w.yaml": many})
    yield Case("machines-10e12", "huge-inputs",
               ("optimize", "-w", "adam-mnist", "-c", "{d}/c.yaml", "--json"), "cluster.machines",
               {"c.yaml": dump({**CLUSTER, "machines": 10**12})})
    yield Case("budget-10e7", "huge-inputs",
               ("optimize", "-w", "adam-mnist", "-c", "adam-2014", "-M", "10000000", "--json"),
               "--machines")
    yield Case("budget-10e30", "huge-inputs",
               ("optimize", "-w", "adam-mnist", "-c", "adam-2014", "-M", str(10**30), "--json"),
               "--machines")
    yield Case("exhaustive-budget", "huge-inputs",
               ("optimize", "-w", "adam-mnist", "-c", "adam-2014", "-M", "100000",
                "--exhaustive", "--json"), "--machines")
    yield Case("minibatch-choices", "huge-inputs",
               ("optimize", "-w", "adam-mnist", "-c", "adam-2014", "-n",
                ",".join(str(n) for n in range(1, 200)), "--json"), "--minibatch")
    yield Case("replicas-epoch", "huge-inputs",
               ("predict", "-w", "adam-mnist", "-c", "{d}/c.yaml", "-P", "1", "-R", "100000000",
                "-S", "1", "--json"), "--replicas",
               {"c.yaml": dump({**CLUSTER, "machines": 1_000_000})})
    yield Case("minibatch-over-epoch-optimize", "huge-inputs",
               ("optimize", "-w", "{d}/w.yaml", "-c", "adam-2014", "-n", "5000", "--json"),
               "--minibatch", {"w.yaml": dump(WORKLOAD)})
    yield Case("local-ranks", "huge-inputs",
               ("run", "-w", "mlp:32-16-4", "-P", "1", "-R", "1000", "--sync", "allreduce",
                "--local", "--json"), "config")
    yield Case("allreduce-peers", "huge-inputs",
               ("calibrate", "--local", "--allreduce-peers", "2,100000", "-o", "{d}/p.yaml"),
               "--allreduce-peers")
    yield Case("mlp-widths", "huge-inputs",
               ("describe", "mlp:784-" + "-".join(["4"] * (MAX_LAYERS + 1)), "--json"),
               "workload.layers")
    yield Case("input-values", "huge-inputs", ("describe", "{d}/w.yaml", "--json"),
               "workload.input_shape",
               {"w.yaml": dump({**WORKLOAD, "input_shape": [2**20, 2**20, 2**20]})})
    yield Case("node-limit", "huge-inputs", ("describe", "{d}/w.yaml", "--json"), "workload",
               {"w.yaml": "input_shape: [" + ", ".join(["1"] * (MAX_NODES + 1)) + "]\n"})


# -- output paths -------------------------------------------------------------------------------

def output_cases() -> Iterator[Case]:
    writers = {
        "describe": (("describe", "adam-mnist", "-o", "{o}", "--json"), "--output"),
        "optimize-plot": (("optimize", "-w", "adam-mnist", "-c", "adam-2014", "-M", "8",
                           "--plot", "{o}", "--json"), "--plot"),
        "run": (("run", "-w", "mlp:32-16-4", *PLAN_FLAGS, "--local", "-o", "{o}", "--json"),
                "--output"),
        "calibrate": (("calibrate", "--local", "--quick", "-o", "{o}"), "--output"),
        "testbed-check": (("testbed", "check", "--description", "{d}/none.yaml", "-o", "{o}",
                           "--json"), "--output"),
    }
    places = {"missing-folder": ("{d}/no/such/folder/out.file", {}),
              "onto-folder": ("{d}/adir", {"adir": None}),
              "under-a-file": ("{d}/afile/out.file", {"afile": "x"}),
              "empty-name": ("", {})}
    for writer, (argv, expected) in writers.items():
        for place, (path, files) in places.items():
            yield Case(f"{writer}-{place}", "output-paths",
                       tuple(a.replace("{o}", path) for a in argv), expected, dict(files))
    for place, (path, files) in (("missing-parent", ("{d}/no/such/out", {})),
                                 ("onto-file", ("{d}/afile", {"afile": "x"}))):
        yield Case(f"validate-{place}", "output-paths",
                   ("validate", "--testbed", "tb", "--configs", "{d}/g.yaml", "-o", path,
                    "--json"), "--output", dict(files))
    # bad input never touches an existing output file
    existing = "previous contents\n"
    for writer, argv in (
            ("describe", ("describe", "{d}/bad.yaml", "-o", "{d}/keep.yaml", "--json")),
            ("run", ("run", "-w", "{d}/bad.yaml", *PLAN_FLAGS, "--local", "-o", "{d}/keep.yaml",
                     "--json")),
            ("optimize-plot", ("optimize", "-w", "{d}/bad.yaml", "-c", "adam-2014", "--plot",
                               "{d}/keep.yaml", "--json")),
            ("calibrate", ("calibrate", "--local", "--kinds", "pooling", "-o", "{d}/keep.yaml"))):
        yield Case(f"{writer}-keeps-existing", "output-paths", argv,
                   "--kinds" if writer == "calibrate" else "workload",
                   {"bad.yaml": "input_shape: [3]\nlayers: [\n", "keep.yaml": existing},
                   keep=("keep.yaml",))


# -- command-line parse errors ------------------------------------------------------------------

def usage_cases() -> Iterator[Case]:
    table: list[tuple[str, tuple[str, ...], str]] = [
        ("predict-unknown-option", ("predict", "--gpus", "8"), "--gpus"),
        ("predict-misspelt-option", ("predict", "--replica", "3"), "--replica"),
        ("predict-missing-workload", ("predict", "-c", "adam-2014"), "--workload"),
        ("predict-missing-cluster", ("predict", "-w", "adam-mnist"), "--cluster"),
        ("predict-int-text", ("predict", "-w", "adam-mnist", "-c", "adam-2014", "-R", "x"),
         "--replicas"),
        ("predict-int-float", ("predict", "-w", "adam-mnist", "-c", "adam-2014", "-P", "1.5"),
         "--partitions"),
        ("predict-no-value", ("predict", "-w", "adam-mnist", "-c"), "--cluster"),
        ("predict-extra-argument", ("predict", "-w", "adam-mnist", "-c", "adam-2014", "extra"),
         "arguments"),
        ("predict-bool-value", ("predict", "-w", "adam-mnist", "-c", "adam-2014", "--overlap",
                                "yes"), "arguments"),
        ("optimize-machines-text", ("optimize", "-w", "adam-mnist", "-c", "adam-2014", "-M",
                                    "many"), "--machines"),
        ("optimize-top-missing", ("optimize", "-w", "adam-mnist", "-c", "adam-2014", "--top"),
         "--top"),
        ("optimize-epoch-fraction-text", ("optimize", "-w", "adam-mnist", "-c", "adam-2014",
                                          "--epoch-fraction", "most"), "--epoch-fraction"),
        ("optimize-unknown", ("optimize", "--fast"), "--fast"),
        ("describe-two-workloads", ("describe", "adam-mnist", "alexnet"), "arguments"),
        ("describe-samples-text", ("describe", "--torch", "m:f", "--samples-per-epoch", "lots"),
         "--samples-per-epoch"),
        ("run-steps-text", ("run", "-w", "adam-mnist", "--local", "--steps", "ten"), "--steps"),
        ("run-timeout-text", ("run", "-w", "adam-mnist", "--local", "--timeout", "soon"),
         "--timeout"),
        ("run-missing-workload", ("run", "--local"), "--workload"),
        ("calibrate-missing-output", ("calibrate", "--local"), "--output"),
        ("validate-missing-configs", ("validate", "--testbed", "tb", "-o", "x"), "--configs"),
        ("testbed-up-hosts-text", ("testbed", "up", "--hosts", "x"), "--hosts"),
        ("testbed-unknown-command", ("testbed", "fly"), "command"),
        ("unknown-command", ("train",), "command"),
        ("unknown-global-option", ("--verbose", "predict"), "--verbose"),
    ]
    for name, argv, expected in table:
        yield Case(name, "usage-errors", argv, expected)
    semantic = [
        ("run-steps-zero", ("run", "-w", "mlp:32-16-4", *PLAN_FLAGS, "--local", "--steps", "0"),
         "--steps"),
        ("run-warmup-over", ("run", "-w", "mlp:32-16-4", *PLAN_FLAGS, "--local", "--steps", "3",
                             "--warmup", "3"), "--warmup"),
        ("run-timeout-nan", ("run", "-w", "mlp:32-16-4", *PLAN_FLAGS, "--local", "--timeout",
                             "nan"), "--timeout"),
        ("run-lr-inf", ("run", "-w", "mlp:32-16-4", *PLAN_FLAGS, "--local", "--lr", "inf"),
         "--lr"),
        ("run-no-mode", ("run", "-w", "mlp:32-16-4", *PLAN_FLAGS), "run"),
        ("optimize-epoch-fraction-nan", ("optimize", "-w", "adam-mnist", "-c", "adam-2014",
                                         "--epoch-fraction", "nan", "--json"),
         "--epoch-fraction"),
        ("optimize-top-zero", ("optimize", "-w", "adam-mnist", "-c", "adam-2014", "--top", "0",
                               "--json"), "--top"),
        ("optimize-modes-bad", ("optimize", "-w", "adam-mnist", "-c", "adam-2014", "--modes",
                                "gossip", "--json"), "--modes"),
        ("optimize-minibatch-text", ("optimize", "-w", "adam-mnist", "-c", "adam-2014", "-n",
                                     "16,x", "--json"), "--minibatch"),
        ("optimize-machines-zero", ("optimize", "-w", "adam-mnist", "-c", "adam-2014", "-M", "0",
                                    "--json"), "--machines"),
        ("describe-nothing", ("describe", "--json"), "workload"),
        ("describe-shape-without-torch", ("describe", "adam-mnist", "--input-shape", "3"),
         "--input-shape"),
    ]
    for name, argv, expected in semantic:
        yield Case(name, "usage-errors", argv, expected)


# -- names and paths that are not what they seem ------------------------------------------------

def name_cases() -> Iterator[Case]:
    long_name = "w" * 5000
    table: list[tuple[str, tuple[str, ...], str, dict[str, "str | bytes | None"]]] = [
        ("workload-unknown", ("describe", "no-such-net", "--json"), "workload", {}),
        ("workload-long-name", ("describe", long_name, "--json"), "workload", {}),
        ("workload-long-yaml", ("describe", long_name + ".yaml", "--json"), "workload", {}),
        ("workload-missing-yaml", ("describe", "{d}/missing.yaml", "--json"), "workload", {}),
        ("workload-folder", ("describe", "{d}/adir", "--json"), "workload", {"adir": None}),
        ("workload-dev-null", ("describe", "/dev/null", "--json"), "workload", {}),
        ("workload-dev-zero", ("describe", "/dev/zero", "--json"), "workload", {}),
        ("workload-mlp-bad", ("describe", "mlp:784-x-10", "--json"), "workload", {}),
        ("workload-mlp-zero", ("describe", "mlp:784-0-10", "--json"), "workload", {}),
        ("workload-zoo-argument", ("describe", "alexnet:3", "--json"), "workload", {}),
        ("cluster-unknown", ("predict", "-w", "adam-mnist", "-c", "no-such-cluster",
                             *PLAN_FLAGS, "--json"), "cluster", {}),
        ("cluster-long-name", ("predict", "-w", "adam-mnist", "-c", long_name, *PLAN_FLAGS,
                               "--json"), "cluster", {}),
        ("cluster-dev-zero", ("predict", "-w", "adam-mnist", "-c", "/dev/zero", *PLAN_FLAGS,
                              "--json"), "cluster", {}),
        ("config-missing", ("predict", "-w", "adam-mnist", "-c", "adam-2014", "--config",
                            "{d}/none.yaml", "--json"), "config", {}),
        ("config-folder", ("predict", "-w", "adam-mnist", "-c", "adam-2014", "--config",
                           "{d}/adir", "--json"), "config", {"adir": None}),
        ("testbed-missing", ("run", "-w", "mlp:32-16-4", *PLAN_FLAGS, "--testbed",
                             "{d}/none.yaml", "--json"), "testbed", {}),
    ]
    for name, argv, expected, files in table:
        yield Case(name, "names-and-paths", argv, expected, files)
    yield Case("workload-fifo", "names-and-paths", ("describe", "{d}/pipe.yaml", "--json"),
               "workload", {"pipe.yaml": FIFO})
    yield Case("cluster-fifo", "names-and-paths", ("predict", "-w", "adam-mnist", "-c",
                                                    "{d}/pipe.yaml", *PLAN_FLAGS, "--json"),
               "cluster", {"pipe.yaml": FIFO})


# -- describe --torch ---------------------------------------------------------------------------

TORCH_MODULES = {
    "raises-on-import": ("raise RuntimeError('broken at import')\n", "f"),
    "syntax-error": ("def f(:\n", "f"),
    "exits-on-import": ("import sys\nsys.exit(3)\n", "f"),
    "factory-raises": ("def f():\n    raise ValueError('no model today')\n", "f"),
    "factory-needs-args": ("def f(width):\n    return width\n", "f"),
    "factory-not-module": ("def f():\n    return 42\n", "f"),
    "missing-attribute": ("def f():\n    pass\n", "g"),
    "not-callable": ("f = 3\n", "f"),
    "imports-missing": ("import no_such_package_xyz\n", "f"),
}


def torch_cases() -> Iterator[Case]:
    for index, (name, (source, attr)) in enumerate(TORCH_MODULES.items()):
        module = f"fuzz_torch_{index}_{name.replace('-', '_')}"
        yield Case(name, "torch-import",
                   ("describe", "--torch", f"{module}:{attr}", "--input-shape", "4", "--json"),
                   "--torch" if name in ("raises-on-import", "syntax-error", "exits-on-import",
                                         "missing-attribute", "not-callable", "imports-missing")
                   else "torch", {f"{module}.py": source})
    yield Case("bad-spec", "torch-import", ("describe", "--torch", "nocolon", "--input-shape",
                                            "4", "--json"), "--torch")
    yield Case("missing-shape", "torch-import", ("describe", "--torch", "m:f", "--json"),
               "--input-shape")
    yield Case("bad-shape", "torch-import", ("describe", "--torch", "m:f", "--input-shape",
                                             "3,-1", "--json"), "--input-shape")
    yield Case("bad-dtype", "torch-import", ("describe", "--torch", "m:f", "--input-shape",
                                             "3:complex512", "--json"), "--input-shape")


# -- transformer inputs: Hugging Face config.json and gpt: names ---------------------------------

GPT2_CONFIG = {"model_type": "gpt2", "n_ctx": 64, "n_embd": 64, "n_head": 4, "n_layer": 2,
               "n_positions": 64, "vocab_size": 100}
HF_FILES: dict[str, tuple[str, "str | bytes | None"]] = {
    # name: (expected field, config.json content)
    "not-utf8": ("--hf-config", b'{"model_type": "gpt2\xff"}'),
    "binary": ("--hf-config", bytes(range(256))),
    "deep-nesting": ("--hf-config", "[" * 100_000 + "]" * 100_000),
    "nan": ("--hf-config", '{"model_type": "gpt2", "attn_pdrop": NaN}'),
    "infinity": ("--hf-config", '{"n_layer": Infinity}'),
    "huge-integer-text": ("--hf-config", '{"n_layer": 1' + "0" * 5000 + "}"),
    "top-list": ("--hf-config", "[1, 2]"),
    "not-json": ("--hf-config", "{model_type: gpt2"),
    "empty": ("--hf-config", ""),
    "over-size": ("--hf-config", " " * (MAX_FILE_BYTES + 1)),
    "folder": ("--hf-config", None),
    "layers-billion": ("transformer.layers", json.dumps({**GPT2_CONFIG, "n_layer": 10**9})),
    "hidden-huge": ("hf_config.n_embd", json.dumps({**GPT2_CONFIG, "n_embd": 2**60,
                                                    "n_head": 1})),
    "layers-zero": ("hf_config.n_layer", json.dumps({**GPT2_CONFIG, "n_layer": 0})),
    "heads-not-dividing": ("hf_config.num_attention_heads",
                           json.dumps({**GPT2_CONFIG, "n_head": 5})),
    "vocab-missing": ("hf_config.vocab_size",
                      json.dumps({k: v for k, v in GPT2_CONFIG.items() if k != "vocab_size"})),
    "model-type-unknown": ("hf_config.model_type", json.dumps({**GPT2_CONFIG,
                                                               "model_type": "mamba"})),
    "dropout-one": ("hf_config.attn_pdrop", json.dumps({**GPT2_CONFIG, "attn_pdrop": 1.0})),
    "hidden-dropout-text": ("hf_config.resid_pdrop",
                            json.dumps({**GPT2_CONFIG, "resid_pdrop": "0.1"})),
    "layers-string": ("hf_config.n_layer", json.dumps({**GPT2_CONFIG, "n_layer": "2"})),
}

GPT_NAMES: dict[str, tuple[str, str]] = {
    # name: (expected field, the gpt: argument)
    "layers-billion": ("workload.gpt.layers", "layers=1000000000,hidden=64,heads=4,seq=8,vocab=10"),
    "layers-text": ("workload.gpt.layers", "layers=many,hidden=64,heads=4,seq=8,vocab=10"),
    "layers-digits": ("workload.gpt.layers", "layers=" + "9" * 5000 + ",hidden=64,heads=4,"
                      "seq=8,vocab=10"),
    "layers-missing": ("workload.gpt.layers", "hidden=64,heads=4,seq=8,vocab=10"),
    "hidden-huge": ("workload.gpt.hidden", f"layers=2,hidden={2**60},heads=1,seq=8,vocab=10"),
    "heads-not-dividing": ("workload.gpt.heads", "layers=2,hidden=64,heads=5,seq=8,vocab=10"),
    "seq-zero": ("workload.gpt.seq", "layers=2,hidden=64,heads=4,seq=0,vocab=10"),
    "unknown-key": ("workload.gpt.depth", "layers=2,hidden=64,heads=4,seq=8,vocab=10,depth=3"),
    "no-value": ("workload.gpt", "layers=2,hidden"),
    "bool-bad": ("workload.gpt.flash", "layers=2,hidden=64,heads=4,seq=8,vocab=10,flash=maybe"),
    "norm-bad": ("workload.gpt.norm", "layers=2,hidden=64,heads=4,seq=8,vocab=10,norm=batch"),
    "token-types-text": ("workload.gpt.token_types",
                         "layers=2,hidden=64,heads=4,seq=8,vocab=10,token_types=two"),
    "attention-dropout-bad": ("workload.gpt.attention_dropout",
                              "layers=2,hidden=64,heads=4,seq=8,vocab=10,attention_dropout=0.1"),
    "eager-bad": ("workload.gpt.eager", "layers=2,hidden=64,heads=4,seq=8,vocab=10,eager=op"),
}

TRANSFORMER_LAYERS: dict[str, tuple[str, dict[str, Any]]] = {
    "embedding-hidden-zero": ("layers.embedding1.hidden",
                              {"kind": "embedding", "hidden": 0, "vocab": 10, "seq": 8}),
    "embedding-vocab-huge": ("layers.embedding1.vocab",
                             {"kind": "embedding", "hidden": 8, "vocab": 10**30, "seq": 8}),
    "embedding-seq-text": ("layers.embedding1.seq",
                           {"kind": "embedding", "hidden": 8, "vocab": 10, "seq": "eight"}),
    "embedding-unknown": ("layers.embedding1.depth",
                          {"kind": "embedding", "hidden": 8, "vocab": 10, "seq": 8, "depth": 1}),
    "embedding-positions-negative": ("layers.embedding1.positions",
                                     {"kind": "embedding", "hidden": 8, "vocab": 10, "seq": 8,
                                      "positions": -1}),
}


def transformer_cases() -> Iterator[Case]:
    for name, (expected, content) in HF_FILES.items():
        files: dict[str, "str | bytes | None"] = {"m/config.json": content}
        yield Case(f"hf-{name}-describe", "transformer-inputs",
                   ("describe", "--hf-config", "{d}/m/config.json", "--json"), expected, files)
        # -w hf:FILE: what names the file is the flag typed, --workload (not --hf-config)
        yield Case(f"hf-{name}-predict", "transformer-inputs",
                   ("predict", "-w", "hf:{d}/m/config.json", "-c", "adam-2014", *PLAN_FLAGS,
                    "--json"), "--workload" if expected == "--hf-config" else expected, files)
    for name, (expected, argument) in GPT_NAMES.items():
        yield Case(f"gpt-{name}-describe", "transformer-inputs",
                   ("describe", f"gpt:{argument}", "--json"), expected)
        yield Case(f"gpt-{name}-optimize", "transformer-inputs",
                   ("optimize", "-w", f"gpt:{argument}", "-c", "adam-2014", "--json"), expected)
    for name, (expected, layer) in TRANSFORMER_LAYERS.items():
        text = dump({"name": "t", "input_shape": [8], "samples_per_epoch": 100,
                     "layers": [layer]})
        yield Case(f"yaml-{name}", "transformer-inputs", ("describe", "{d}/w.yaml", "--json"),
                   expected, {"w.yaml": text})


# -- everything ---------------------------------------------------------------------------------

def _wave3_generators() -> tuple[Callable[[], Iterator[Case]], ...]:
    """Issue 26's classes (and issue 27's gpu-network), one module per area (imported here,
    after Case exists)."""
    from tests import (fuzz_cases_export, fuzz_cases_flags, fuzz_cases_gpu, fuzz_cases_network,
                       fuzz_cases_outputs)

    return (fuzz_cases_outputs.cases, fuzz_cases_gpu.cases, fuzz_cases_flags.cases,
            fuzz_cases_export.cases, fuzz_cases_network.cases)


GENERATORS: tuple[Callable[[], Iterator[Case]], ...] = (
    structure_cases, bomb_cases, layer_cases, config_cases, cluster_cases, huge_cases,
    output_cases, usage_cases, name_cases, torch_cases, transformer_cases)


def all_cases() -> list[Case]:
    cases = [case for generate in GENERATORS + _wave3_generators() for case in generate()]
    ids = [case.id for case in cases]
    assert len(ids) == len(set(ids)), "case names must be unique"
    return cases

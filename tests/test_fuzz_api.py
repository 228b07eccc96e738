"""The Python API never raises TypeError, AttributeError, KeyError or ZeroDivisionError on bad
input (issue 26): every public function and plan object validates what it is given and raises
InputError naming the field, exactly.

Groups (the first word of each case id): api-arguments (wrong types and unknown arguments of
predict and optimize), api-objects (ParallelPlan and its parts, System and Workload objects),
api-mappings (plan and config mappings), absurd-answers (a global batch beyond the epoch).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest

import dnnscale
from dnnscale.errors import InputError
from dnnscale.plan import (Batch, Collective, DataParallel, MemoryPolicy, ParallelPlan,
                           ParameterServer, Pipeline, Precision, TensorSplit)
from dnnscale.system import load_system
from dnnscale.workload import load_workload

GPT = "gpt:layers=4,hidden=64,heads=4,seq=32,vocab=100"
NODE = "dgx-a100-80g:1"
PLAN = {"tp": 1, "dp": 1, "global_batch": 8}


_VALID = object()


def _predict(config: Any = _VALID, workload: Any = GPT, cluster: Any = NODE,
             **kwargs: Any) -> Callable[[], Any]:
    return lambda: dnnscale.predict(workload, cluster, PLAN if config is _VALID else config,
                                    **kwargs)


def _optimize(**kwargs: Any) -> Callable[[], Any]:
    arguments = {"global_batch": 8, **kwargs}
    return lambda: dnnscale.optimize(GPT, NODE, **arguments)


def _plan(**parts: Any) -> ParallelPlan:
    """A valid Megatron-style plan with `parts` replaced."""
    fields: dict[str, Any] = dict(tensor=TensorSplit(1, "megatron"), pipeline=Pipeline(1),
                                  data=DataParallel(1, Collective("ring", 0)),
                                  batch=Batch(1, 8), precision=Precision("bf16", 2, 4, 4, 2, True),
                                  optimizer="adam")
    fields.update(parts)
    return ParallelPlan(**fields)


def _system(**changes: Any) -> Any:
    return dataclasses.replace(load_system(NODE), **changes)


def _device(**changes: Any) -> Any:
    system = load_system(NODE)
    return dataclasses.replace(system, machine=dataclasses.replace(system.machine, **changes))


def _workload(**changes: Any) -> Any:
    return dataclasses.replace(load_workload(GPT), **changes)


def _shape(**changes: Any) -> Any:
    workload = load_workload(GPT)
    return dataclasses.replace(workload, transformer=dataclasses.replace(workload.transformer,
                                                                         **changes))


def _cases() -> dict[str, tuple[Callable[[], Any], str]]:
    """id -> (the call, the field its InputError must name)."""
    cases: dict[str, tuple[Callable[[], Any], str]] = {}
    # -- api-arguments: what predict and optimize are given ------------------------------------
    for label, value in {"int": 3, "none": None, "list": [GPT], "dict": {"name": GPT},
                         "float": 1.5, "bytes": b"gpt3-125m"}.items():
        cases[f"api-arguments:predict-workload-{label}"] = (_predict(workload=value), "workload")
        cases[f"api-arguments:predict-cluster-{label}"] = (_predict(cluster=value), "cluster")
        cases[f"api-arguments:optimize-workload-{label}"] = (
            lambda value=value: dnnscale.optimize(value, NODE, global_batch=8), "workload")
    for label, value in {"none": None, "list": [1], "int": 3, "float": 2.0,
                         "set": {"tp"}}.items():
        cases[f"api-arguments:predict-config-{label}"] = (_predict(config=value), "config")
    cases["api-arguments:predict-unknown-keyword"] = (_predict(gpus=8), "gpus")
    cases["api-arguments:predict-extra-positional"] = (
        lambda: dnnscale.predict(GPT, NODE, PLAN, "extra"), "predict")  # type: ignore[call-arg]
    cases["api-arguments:optimize-unknown-keyword"] = (_optimize(experts=8), "experts")
    cases["api-arguments:optimize-extra-positional"] = (
        lambda: dnnscale.optimize(GPT, NODE, *range(20)), "optimize")
    optimize_bad: dict[str, tuple[dict[str, Any], str]] = {
        "top-float": ({"top": 1.5}, "top"), "top-zero": ({"top": 0}, "top"),
        "top-text": ({"top": "5"}, "top"), "curve-text": ({"curve": "no"}, "curve"),
        "pareto-text": ({"pareto": "yes"}, "pareto"),
        "sequence-parallel-number": ({"sequence_parallel": 1}, "sequence_parallel"),
        "overlap-dp-text": ({"overlap_dp": "no"}, "overlap_dp"),
        "precision-list": ({"precision": ["bf16"]}, "precision"),
        "precision-unknown": ({"precision": "int4"}, "precision"),
        "objective-list": ({"objective": ["time"]}, "objective"),
        "objective-unknown": ({"objective": "speed"}, "objective"),
        "schedules-int": ({"schedules": 3}, "schedules"),
        "schedules-unknown": ({"schedules": ["zb"]}, "schedules"),
        "schedules-mixed": ({"schedules": ["1f1b", 2]}, "schedules"),
        "recompute-int": ({"recompute": 3}, "recompute"),
        "recompute-unknown": ({"recompute": "most"}, "recompute"),
        "tp-text": ({"tp": "2"}, "tp"), "tp-dict": ({"tp": {2: 1}}, "tp"),
        "tp-float": ({"tp": 2.0}, "tp"), "tp-bool": ({"tp": True}, "tp"),
        "tp-list-text": ({"tp": ["2"]}, "tp"), "tp-empty": ({"tp": []}, "tp"),
        "tp-many": ({"tp": list(range(1, 200))}, "tp"),
        "tp-not-dividing": ({"tp": 3}, "tp"), "pp-not-dividing": ({"pp": 3}, "pp"),
        "pp-zero": ({"pp": 0}, "pp"), "micro-batch-nan": ({"micro_batch": math.nan},
                                                           "micro_batch"),
        "micro-batch-not-dividing": ({"micro_batch": 3}, "micro_batch"),
        "zero-four": ({"zero": 4}, "zero"), "zero-negative": ({"zero": -1}, "zero"),
        "global-batch-float": ({"global_batch": 8.0}, "global_batch"),
        "global-batch-none": ({"global_batch": None}, "global_batch"),
        "global-batch-zero": ({"global_batch": 0}, "global_batch"),
        "global-batch-huge": ({"global_batch": 10**30}, "global_batch"),
        "machines-float": ({"machines": 2.5}, "machines"),
        "machines-text": ({"machines": "8"}, "machines"),
        "gpus-zero": ({"gpus": 0}, "gpus"), "gpus-over-cluster": ({"gpus": 16}, "gpus"),
        "gpus-and-machines": ({"gpus": 4, "machines": 8}, "gpus"),
        "price-text": ({"price_per_device_hour": "1"}, "price_per_device_hour"),
        "price-nan": ({"price_per_device_hour": math.nan}, "price_per_device_hour"),
        "method-list": ({"method": ["fast"]}, "method"),
        "method-exhaustive": ({"method": "exhaustive"}, "method"),
        "modes-on-gpu": ({"modes": "allreduce"}, "modes"),
        "minibatch-on-gpu": ({"minibatch": 8}, "minibatch"),
        "choose-overlap-text": ({"choose_overlap": "yes"}, "choose_overlap"),
    }
    for name, (kwargs, field) in optimize_bad.items():
        cases[f"api-arguments:optimize-{name}"] = (_optimize(**kwargs), field)
    cases["api-arguments:optimize-adam-modes-int"] = (
        lambda: dnnscale.optimize("adam-mnist", "adam-2014", machines=8, modes=3), "modes")
    cases["api-arguments:optimize-adam-top-float"] = (
        lambda: dnnscale.optimize("adam-mnist", "adam-2014", machines=8, top=2.5), "top")
    cases["api-arguments:optimize-adam-ps-on-gpu"] = (
        lambda: dnnscale.optimize("adam-mnist", NODE, modes="ps-async"), "modes")
    # -- api-mappings: plan and config mappings ------------------------------------------------
    mappings: dict[str, tuple[dict[Any, Any], str]] = {
        "mixed-keys": ({1: 2, "tp": 2}, "plan[1]"), "float-key": ({2.5: 1, "tp": 1}, "plan[2.5]"),
        "none-key": ({None: 1, "dp": 1}, "plan[None]"),
        "tuple-key": ({("tp",): 2, "dp": 1}, "plan[('tp',)]"),
        "config-mixed-keys": ({1: 2, "replicas": 2}, "config[1]"),
        "only-sequence-parallel-text": ({"sequence_parallel": "false"}, "plan.sequence_parallel"),
        "only-overlap-dp-text": ({"overlap_dp": "yes"}, "plan.overlap_dp"),
        "grad-bytes-three": ({**PLAN, "grad_bytes": 3}, "plan.grad_bytes"),
        "tp-huge": ({**PLAN, "tp": 10**30}, "plan.tp"), "tp-nan": ({**PLAN, "tp": math.nan},
                                                                   "plan.tp"),
        "schedule-dict": ({**PLAN, "schedule": {"a": 1}}, "plan.schedule"),
        "precision-list": ({**PLAN, "precision": ["bf16"]}, "plan.precision"),
        "adam-field-mixed": ({**PLAN, "replicas": 2}, "plan.replicas"),
        "ps-config-on-gpu": ({"partitions": 1, "replicas": 2, "ps_shards": 1}, "config.sync"),
        "global-batch-over-epoch": ({"global_batch": 2**40}, "plan.global_batch"),
    }
    for name, (mapping, field) in mappings.items():
        cases[f"api-mappings:{name}"] = (_predict(config=mapping), field)
    # -- api-objects: ParallelPlan and its parts -----------------------------------------------
    plans: dict[str, tuple[Callable[[], ParallelPlan], str]] = {
        "ps-aggregation": (lambda: _plan(data=DataParallel(1, ParameterServer(1))),
                           "plan.data.aggregation"),
        "ps-aggregation-async": (lambda: _plan(data=DataParallel(2, ParameterServer(2, True)),
                                               batch=Batch(1, 4)), "plan.data.aggregation"),
        "aggregation-none": (lambda: _plan(data=DataParallel(1, None)),  # type: ignore[arg-type]
                             "plan.data.aggregation"),
        "algorithm-unknown": (lambda: _plan(data=DataParallel(1, Collective("butterfly"))),
                              "plan.data.aggregation.algorithm"),
        "algorithm-list": (lambda: _plan(data=DataParallel(1, Collective(["ring"]))),  # type: ignore[arg-type]
                           "plan.data.aggregation.algorithm"),
        "zero-five": (lambda: _plan(data=DataParallel(1, Collective("ring", 5))), "plan.zero"),
        "zero-float": (lambda: _plan(data=DataParallel(1, Collective("ring", 1.0))),  # type: ignore[arg-type]
                       "plan.zero"),
        "overlap-dp-text": (lambda: _plan(data=DataParallel(1, Collective("ring", 0, "no"))),  # type: ignore[arg-type]
                            "plan.overlap_dp"),
        "zero-stage-four-with-pipeline": (
            lambda: _plan(pipeline=Pipeline(2), data=DataParallel(1, Collective("ring", 4))),
            "plan.zero"),
        "tensor-none": (lambda: _plan(tensor=None), "plan.tensor"),
        "tensor-int": (lambda: _plan(tensor=2), "plan.tensor"),
        "pipeline-dict": (lambda: _plan(pipeline={"stages": 2}), "plan.pipeline"),
        "data-none": (lambda: _plan(data=None), "plan.data"),
        "batch-tuple": (lambda: _plan(batch=(1, 8)), "plan.batch"),
        "memory-text": (lambda: _plan(memory="full"), "plan.memory"),
        "precision-text": (lambda: _plan(precision="bf16"), "plan.precision"),
        "adam-rules": (lambda: _plan(tensor=TensorSplit(1, "adam")), "plan.tensor.rules"),
        "rules-list": (lambda: _plan(tensor=TensorSplit(1, ["megatron"])),  # type: ignore[arg-type]
                       "plan.tensor.rules"),
        "tp-negative": (lambda: _plan(tensor=TensorSplit(-1, "megatron")), "plan.tp"),
        "tp-zero": (lambda: _plan(tensor=TensorSplit(0, "megatron")), "plan.tp"),
        "tp-float": (lambda: _plan(tensor=TensorSplit(1.0, "megatron")), "plan.tp"),  # type: ignore[arg-type]
        "tp-bool": (lambda: _plan(tensor=TensorSplit(True, "megatron")), "plan.tp"),
        "tp-huge": (lambda: _plan(tensor=TensorSplit(10**30, "megatron")), "plan.tp"),
        "tp-text": (lambda: _plan(tensor=TensorSplit("2", "megatron")), "plan.tp"),  # type: ignore[arg-type]
        "tp-not-dividing": (lambda: _plan(tensor=TensorSplit(3, "megatron")), "plan.tp"),
        "sequence-parallel-text": (lambda: _plan(tensor=TensorSplit(2, "megatron", "yes")),  # type: ignore[arg-type]
                                   "plan.sequence_parallel"),
        "pp-nan": (lambda: _plan(pipeline=Pipeline(math.nan)), "plan.pp"),  # type: ignore[arg-type]
        "pp-not-dividing": (lambda: _plan(pipeline=Pipeline(3)), "plan.pp"),
        "schedule-unknown": (lambda: _plan(pipeline=Pipeline(1, "zb")), "plan.schedule"),
        "schedule-list": (lambda: _plan(pipeline=Pipeline(1, ["1f1b"])),  # type: ignore[arg-type]
                          "plan.schedule"),
        "virtual-stages-zero": (lambda: _plan(pipeline=Pipeline(1, "1f1b", 0)),
                                "plan.virtual_stages"),
        "virtual-stages-1f1b": (lambda: _plan(pipeline=Pipeline(2, "1f1b", 2)),
                                "plan.virtual_stages"),
        "interleaved-one-stage": (lambda: _plan(pipeline=Pipeline(1, "interleaved", 2)),
                                  "plan.schedule"),
        "dp-zero": (lambda: _plan(data=DataParallel(0, Collective())), "plan.dp"),
        "dp-huge": (lambda: _plan(data=DataParallel(10**30, Collective())), "plan.dp"),
        "devices-over-cluster": (lambda: _plan(data=DataParallel(16, Collective()),
                                               batch=Batch(1, 1)), "plan"),
        "micro-batch-zero": (lambda: _plan(batch=Batch(0, 8)), "plan.micro_batch"),
        "micro-batch-nan": (lambda: _plan(batch=Batch(math.nan, 8)), "plan.micro_batch"),  # type: ignore[arg-type]
        "micro-batch-huge": (lambda: _plan(batch=Batch(10**30, 1)), "plan.micro_batch"),
        "accumulation-zero": (lambda: _plan(batch=Batch(1, 0)), "plan.batch.accumulation"),
        "accumulation-float": (lambda: _plan(batch=Batch(1, 2.5)),  # type: ignore[arg-type]
                               "plan.batch.accumulation"),
        "global-batch-over-max": (lambda: _plan(batch=Batch(2**30, 2**30)), "plan.global_batch"),
        "global-batch-over-epoch": (lambda: _plan(batch=Batch(2**20, 2**20)),
                                    "plan.global_batch"),
        "recompute-unknown": (lambda: _plan(memory=MemoryPolicy("most")), "plan.recompute"),
        "recompute-bool": (lambda: _plan(memory=MemoryPolicy(True)), "plan.recompute"),  # type: ignore[arg-type]
        "precision-unknown": (lambda: _plan(precision=Precision("int4")), "plan.precision"),
        "precision-fp8-on-a100": (lambda: _plan(precision=Precision("fp8", 2, 2, 4, 2, True)),
                                  "plan.precision"),
        "param-bytes-three": (lambda: _plan(precision=Precision("bf16", 3)),
                              "plan.precision.param_bytes"),
        "grad-bytes-float": (lambda: _plan(precision=Precision("bf16", 2, 2.0)),  # type: ignore[arg-type]
                             "plan.precision.grad_bytes"),
        "state-bytes-zero": (lambda: _plan(precision=Precision("bf16", 2, 2, 0)),
                             "plan.precision.optimizer_state_bytes"),
        "activation-bytes-text": (lambda: _plan(precision=Precision("bf16", 2, 2, 4, "2")),  # type: ignore[arg-type]
                                  "plan.precision.activation_bytes"),
        "master-weights-text": (lambda: _plan(precision=Precision("bf16", 2, 2, 4, 2, "yes")),  # type: ignore[arg-type]
                                "plan.precision.master_weights"),
        "optimizer-unknown": (lambda: _plan(optimizer="lion"), "plan.optimizer"),
        "optimizer-list": (lambda: _plan(optimizer=["adam"]), "plan.optimizer"),
        "overlap-text": (lambda: _plan(overlap="no"), "plan.overlap"),
        "epoch-fraction-nan": (lambda: _plan(epoch_fraction=math.nan), "plan.epoch_fraction"),
        "epoch-fraction-zero": (lambda: _plan(epoch_fraction=0.0), "plan.epoch_fraction"),
        "epoch-fraction-two": (lambda: _plan(epoch_fraction=2), "plan.epoch_fraction"),
        "epoch-fraction-bool": (lambda: _plan(epoch_fraction=True), "plan.epoch_fraction"),
    }
    for name, (build, field) in plans.items():
        cases[f"api-objects:plan-{name}"] = (
            lambda build=build: dnnscale.predict(GPT, NODE, build()), field)
    systems: dict[str, tuple[Callable[[], Any], str]] = {
        "network-bandwidth-zero": (lambda: _system(network=dataclasses.replace(
            load_system(NODE).network, bandwidth_bytes_per_s=0.0)), "cluster.network.bandwidth"),
        "intra-node-bandwidth-nan": (lambda: _system(intra_node=dataclasses.replace(
            load_system(NODE).intra_node, bandwidth_bytes_per_s=math.nan)),
            "cluster.intra_node.bandwidth"),
        "intra-node-latency-negative": (lambda: _system(intra_node=dataclasses.replace(
            load_system(NODE).intra_node, latency_s=-1.0)), "cluster.intra_node.latency"),
        "machines-zero": (lambda: _system(machines=0), "cluster.machines"),
        "machines-float": (lambda: _system(machines=8.0), "cluster.machines"),
        "devices-per-node-zero": (lambda: _system(devices_per_node=0),
                                  "cluster.devices_per_node"),
        "calibrated-text": (lambda: _system(calibrated="false"), "cluster.calibrated"),
        "name-int": (lambda: _system(name=3), "cluster.name"),
        "collective-call-negative": (lambda: _system(collective_call_s=-1.0),
                                     "cluster.collective_call_s"),
        "price-zero": (lambda: _system(price_per_device_hour=0.0),
                       "cluster.price_per_device_hour"),
        "machine-none": (lambda: _system(machine=None), "cluster.machine"),
        "network-text": (lambda: _system(network="100Gbit/s"), "cluster.network"),
        "peak-zero": (lambda: _device(peak_flops_per_s={"bf16": 0.0}),
                      "cluster.machine.peak_flops.bf16"),
        "peak-inf": (lambda: _device(peak_flops_per_s={"bf16": math.inf}),
                     "cluster.machine.peak_flops.bf16"),
        "peaks-empty": (lambda: _device(peak_flops_per_s={}), "cluster.machine.peak_flops"),
        "memory-zero": (lambda: _device(memory_bytes=0.0), "cluster.machine.memory_bytes"),
        "launch-negative": (lambda: _device(launch_s=-1e-5), "cluster.machine.launch_s"),
        "efficiency-text": (lambda: _device(efficiency={"gemm": 0.5}),
                            "cluster.machine.efficiency.gemm"),
    }
    for name, (build, field) in systems.items():
        cases[f"api-objects:system-{name}"] = (
            lambda build=build: dnnscale.predict(GPT, build(), PLAN), field)
    workloads: dict[str, tuple[Callable[[], Any], str]] = {
        "transformer-text": (lambda: _workload(transformer="gpt"), "workload.transformer"),
        "transformer-layers-inconsistent": (lambda: _shape(layers=8),
                                            "workload.transformer.layers"),
        "samples-zero": (lambda: _workload(samples_per_epoch=0), "workload.samples_per_epoch"),
        "samples-float": (lambda: _workload(samples_per_epoch=1e6),
                          "workload.samples_per_epoch"),
        "layers-empty": (lambda: _workload(layers=()), "workload.layers"),
        "layer-not-a-layer": (lambda: _workload(layers=(*load_workload(GPT).layers[:-1], "x")),
                              f"workload.layers[{len(load_workload(GPT).layers) - 1}]"),
    }
    for name, (build, field) in workloads.items():
        cases[f"api-objects:workload-{name}"] = (
            lambda build=build: dnnscale.predict(build(), NODE, PLAN), field)
    # -- absurd-answers ------------------------------------------------------------------------
    few = GPT + ",samples=64"
    cases["absurd-answers:api-predict-batch-over-epoch"] = (
        _predict(config={"global_batch": 128}, workload=few), "plan.global_batch")
    cases["absurd-answers:api-optimize-batch-over-epoch"] = (
        lambda: dnnscale.optimize(few, NODE, global_batch=128), "global_batch")
    cases["absurd-answers:api-plan-object-batch-over-epoch"] = (
        lambda: dnnscale.predict(few, NODE, _plan(batch=Batch(1, 65))), "plan.global_batch")
    cases["absurd-answers:api-issue-batch-2e53"] = (
        _predict(config={"dp": 8, "global_batch": 2**53}, workload="gpt3-125m"),
        "plan.global_batch")
    return cases


CASES = _cases()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(CASES))
def test_api_raises_input_error_naming_the_field(name: str) -> None:
    call, field = CASES[name]
    with pytest.raises(InputError) as caught:
        call()
    assert caught.value.field == field, str(caught.value)


def test_valid_plan_objects_are_priced_as_given() -> None:
    """A valid ParallelPlan is priced as it is: its collective algorithm and optimizer are read,
    not replaced by a mapping's defaults (the old round trip priced every plan as ring and
    Adam)."""
    ring = dnnscale.predict(GPT, NODE, _plan(data=DataParallel(8, Collective("ring")),
                                             batch=Batch(1, 1)))
    tree = dnnscale.predict(GPT, NODE, _plan(data=DataParallel(8, Collective("tree")),
                                             batch=Batch(1, 1)))
    assert ring.plan.data.aggregation.algorithm == "ring"
    assert tree.plan.data.aggregation.algorithm == "tree"
    sgd = dnnscale.predict(GPT, NODE, _plan(optimizer="sgd"))
    adam = dnnscale.predict(GPT, NODE, _plan())
    assert sum(p.bytes for p in sgd.memory) < sum(p.bytes for p in adam.memory)
    same = dnnscale.predict(GPT, NODE, dict(tp=1, dp=1, global_batch=8))
    assert same.step_time_s == pytest.approx(adam.step_time_s, rel=1e-12)


def test_the_api_cases_cover_every_group() -> None:
    groups = {name.split(":")[0] for name in CASES}
    assert groups == {"api-arguments", "api-mappings", "api-objects", "absurd-answers"}
    assert len(CASES) >= 150

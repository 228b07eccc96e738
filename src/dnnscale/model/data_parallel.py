"""Data-parallel aggregation by collectives: the traffic of plain all-reduce and of ZeRO's stages,
the exposed part when it overlaps the backward pass, and the optimizer step on an accelerator
(performance-model.md §4, §9)."""

from __future__ import annotations

import math
from typing import NamedTuple

from dnnscale.model.network import chunked_exposed_s

DEFAULT_BUCKET_BYTES = 25e6
"""Gradient bucket for overlapped all-reduce: PyTorch DDP's default bucket_cap_mb = 25."""


def deferred_gradient_sync(zero_stage: int, pipeline_stages: int) -> bool:
    """Whether ZeRO-2/3 run as a pipeline runs them: with pp > 1 the only engine that shards
    gradients, torch.distributed.pipelining (torchtitan's FSDP2 + PP), accumulates whole
    gradients over the step's micro-batches and reduce-scatters them once after the last
    (backward_maybe_with_nosync turns gradient sync and the reshard after backward off,
    perform_reduce_grad runs the post-backward once): whole gradients, and the parameters that
    a backward gathered stay whole until the next forward ends, so a member holds whole
    weights and gradients at its peak and only the optimizer state stays sharded.
    Source: PyTorch 2.13, torch/distributed/pipelining/stage.py."""
    return zero_stage >= 2 and pipeline_stages > 1


def memory_zero_stage(zero_stage: int, pipeline_stages: int) -> int:
    """The ZeRO stage whose sharding a member's memory follows: ZeRO-1's where the gradient
    sync is deferred (deferred_gradient_sync: whole weights and gradients, the state sharded),
    else the plan's own."""
    return 1 if deferred_gradient_sync(zero_stage, pipeline_stages) else zero_stage


FORWARD, BACKWARD, AFTER_STEP = "forward", "backward", "after_step"
"""Where a data-parallel collective runs: beside a micro-batch's forward pass (ZeRO-3's
parameter all-gathers), beside its backward pass (the gradients' reduction, ZeRO-3's
re-gathers), or after the optimizer step, with nothing left to compute beside it."""


class Traffic(NamedTuple):
    """One data-parallel collective of a step: `operation` on `payload_bytes`, `times` times,
    each beside the `phase` (FORWARD, BACKWARD, AFTER_STEP) of a micro-batch it can travel under when the plan
    overlaps (Collective.overlap). `calls`: the payload travels as that many equal collectives
    one after another (ZeRO-3's FSDP units), each paying its own latency and call cost."""

    operation: str
    payload_bytes: float
    times: int
    phase: str = BACKWARD
    calls: int = 1


def zero_traffic(zero_stage: int, grad_bytes: float, param_bytes: float,
                 micro_batches: int, pipelined: bool = False,
                 units: int = 1, reduce_units: int | None = None) -> tuple[Traffic, ...]:
    """The collectives one data-parallel member runs per step.

    Formula: ZeRO-0 (plain data parallelism): all-reduce of the gradients once;
    ZeRO-1: reduce-scatter of the gradients + all-gather of the updated parameters, once (the
    same volume as an all-reduce); ZeRO-2: the gradients' reduce-scatter after every
    micro-batch's backward (the partitioned gradients cannot accumulate whole) + one all-gather;
    ZeRO-3 / FSDP: every micro-batch all-gathers the parameters in forward and again in backward
    and reduce-scatters the gradients (1.5x the volume of ZeRO-1/2 per micro-batch).
    `pipelined` (pp > 1, see deferred_gradient_sync): ZeRO-2/3 reduce-scatter once per step;
    ZeRO-2 all-gathers once, ZeRO-3 m + 1 times (the first forward, then every backward that
    follows a forward: in 1F1B and GPipe order m + 1 whatever the warm-up).
    ZeRO-1/2's all-gather runs after the optimizer step (AFTER_STEP): Megatron's
    distributed optimizer gathers the updated parameters when the step ends unless
    --overlap-param-gather defers it into the next forward (which export does not emit), and
    DeepSpeed's stage 1/2 overlap_comm overlaps only the gradient reduction. ZeRO-3's gathers
    run inside the forward (FORWARD) and backward (BACKWARD) passes, each unit's gathered
    while the one before it computes (FSDP's forward and backward prefetch, DeepSpeed's
    stage-3 prefetch); its reduce-scatters follow each unit's backward.
    ZeRO-3 gathers each of the stage's `units` on its own (`calls`) and reduce-scatters
    `reduce_units` (default: `units`): FSDP's blocks, or DeepSpeed's prefetch and reduce
    buckets (model/zero3_fetch.py), so every collective's latency, which grows with the group
    (collectives.py), is paid per call; ZeRO-1/2 move their whole shard at once.
    Units: bytes, bytes, count -> Traffic.
    Source: Rajbhandari et al. SC'20 §5, §7 (ZeRO stages and their communication volume);
    DeepSpeed's stage-2 engine reduces partitioned gradients during each backward
    (deepspeed/runtime/zero/stage_1_and_2.py); Megatron-LM's DistributedOptimizer
    (megatron/core/optimizer/distrib_optimizer.py, overlap_param_gather); PyTorch's
    torch/distributed/pipelining/stage.py (2.13) for the pipelined case.
    """
    if zero_stage == 0:
        return (Traffic("allreduce", grad_bytes, 1),)
    if zero_stage == 1 or (zero_stage == 2 and pipelined):
        return (Traffic("reduce_scatter", grad_bytes, 1),
                Traffic("allgather", param_bytes, 1, AFTER_STEP))
    reduces = units if reduce_units is None else reduce_units
    if pipelined:
        return (Traffic("allgather", param_bytes, 1, FORWARD, calls=units),
                Traffic("allgather", param_bytes, micro_batches, BACKWARD, calls=units),
                Traffic("reduce_scatter", grad_bytes, 1, calls=reduces))
    if zero_stage == 2:
        return (Traffic("reduce_scatter", grad_bytes, micro_batches),
                Traffic("allgather", param_bytes, 1, AFTER_STEP))
    return (Traffic("allgather", param_bytes, micro_batches, FORWARD, calls=units),
            Traffic("allgather", param_bytes, micro_batches, BACKWARD, calls=units),
            Traffic("reduce_scatter", grad_bytes, micro_batches, calls=reduces))


def overlapped_traffic_s(pieces: list[tuple[str, int, float]], forward_s: float,
                         backward_s: float, chunks: int) -> tuple[float, float]:
    """(exposed, hidden) seconds of a step's data-parallel collectives when they travel beside
    the passes they belong to (Collective.overlap).

    Formula: the pieces (phase, times, seconds) of one phase and count are one collective of
    c = seconds / times per occurrence, beside one micro-batch's pass of that phase (the
    forward's T_f; the backward's T_b, its recompute included) cut in k chunks (FSDP units,
    gradient buckets): exposed = times · max(c / k, c − T · (k − 1)/k) (chunked_exposed_s:
    every chunk but one travels while the pass computes another), hidden = the rest; after
    the optimizer step nothing computes, so all of it is exposed.
    Units: s, s, s, count -> (s, s).
    Source: Li et al., "PyTorch Distributed", VLDB 2020 (bucketed all-reduce beside the
    backward pass); Zhao et al., "PyTorch FSDP", VLDB 2023 §3.3 (each unit's all-gather
    prefetched while the previous unit computes, in forward and backward; reduce-scatter
    after each unit's backward).
    """
    totals: dict[tuple[str, int], float] = {}
    for phase, times, seconds in pieces:
        totals[(phase, times)] = totals.get((phase, times), 0.0) + seconds
    exposed = hidden = 0.0
    for (phase, times), seconds in totals.items():
        beside = {FORWARD: forward_s, BACKWARD: backward_s}.get(phase)
        if beside is None or times <= 0:
            exposed += seconds
            continue
        shown = times * chunked_exposed_s(seconds / times, beside, chunks)
        exposed += shown
        hidden += seconds - shown
    return exposed, hidden


def buckets_for(grad_bytes: float, bucket_bytes: float = DEFAULT_BUCKET_BYTES) -> int:
    return max(1, math.ceil(grad_bytes / bucket_bytes))


def optimizer_step_bytes(params: float, grad_bytes: float, param_bytes: float,
                         state_bytes_per_param: float) -> float:
    """Bytes an accelerator's optimizer step reads and writes for `params` parameters.

    Formula: Ψ · (3·b_g + 2·s + b_p): the gradients are read for the global norm (clipping),
    for the overflow check of loss scaling and by the update; the state (fp32 master weights
    and Adam's m, v: s = 12 bytes per parameter) is read and written; the low-precision
    weights are written.
    Units: parameters, bytes per value -> bytes.
    Source: Megatron-LM's mixed-precision optimizer (clip_grad_norm_fp32, the inf/nan check,
    then the fused Adam step of NVIDIA Apex); Rajbhandari et al. SC'20 §3.1 (2+2+12 bytes).
    """
    return params * (3 * grad_bytes + 2 * state_bytes_per_param + param_bytes)

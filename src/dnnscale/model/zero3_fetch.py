"""How many collectives ZeRO-3 runs to gather and reduce a stage's sharded parameters, in the
granularity the plan names (plan/plan.py ZERO3_FETCH; issue 23).

FSDP ('blocks') gathers each transformer block as one unit and reduce-scatters its gradients
as one (model/stage.unit_count). DeepSpeed's stage 3 ('buckets'; deepspeed 0.19.8, the version
export targets, deepspeed/runtime/zero/) works on parameter tensors:

- parameters below stage3_param_persistence_threshold elements are never partitioned (every
  rank keeps them whole), so they are never gathered;
- ahead of use, its coordinator gathers the next parameters in the step's recorded order in
  one coalesced all-gather per call, adding parameters until the call holds at least
  stage3_prefetch_bucket_size elements (`prefetch_calls`);
- gradients are reduce-scattered in buckets: a bucket is sent when the next gradient would
  take it past reduce_bucket_size elements (`reduce_calls`).

So a model of small tensors (GPT 1.3B: 50 M parameters per block) gathers about one block per
call, like FSDP, while one of large tensors (GPT-3 175B: 151-604 M per weight) gathers every
weight on its own, four calls per block: four times the collectives, each paying its latency
through the whole data-parallel group (model/collectives.py).

Each layer of the workload counts as one tensor (a linear layer's bias rides with its weight;
DeepSpeed keeps biases, which are far below the threshold, whole), of its parameters over the
stage's tensor-parallel degree (the shard DeepSpeed sees under Megatron-DeepSpeed). Blocks of
different kinds in one stage are taken kind by kind, in the order of the stage's template.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

DEEPSPEED_PERSISTENCE_THRESHOLD = 100_000
"""stage3_param_persistence_threshold's default, 1e5 elements (deepspeed/runtime/zero/config.py:
"Do not partition parameters smaller than this threshold")."""

DEEPSPEED_PREFETCH_BUCKET = 50_000_000
"""stage3_prefetch_bucket_size's default, 5e7 elements (zero/config.py: "Maximum number of
parameter elements to fetch ahead of use"); partitioned_param_coordinator.py's
fetch_sub_module adds parameters to one prefetch while fewer than it are in the call, then
gathers them with one all_gather_coalesced."""

DEEPSPEED_REDUCE_BUCKET = 500_000_000
"""reduce_bucket_size's default, 5e8 elements (zero/config.py); stage3.py's
reduce_independent_p_g_buckets_and_remove_grads sends the bucket when the next gradient would
take it past this size, one reduce_scatter_coalesced per bucket."""


class TensorRun(NamedTuple):
    """A stage's parameter tensors in forward order: the layers before its blocks (`head`),
    each kind of block's tensors with how many such blocks the stage holds (`blocks`), then the
    layers after them (`tail`). Whole-layer parameter counts (not yet split over tp)."""

    head: tuple[int, ...] = ()
    blocks: tuple[tuple[tuple[int, ...], int], ...] = ()
    tail: tuple[int, ...] = ()

    def tensors(self, partitions: int) -> list[int]:
        """The member's tensors in forward order: each layer's parameters over `partitions`
        (rounded up), layers without parameters left out."""
        whole = list(self.head)
        for kind, count in self.blocks:
            whole.extend(kind * count)
        whole.extend(self.tail)
        return [-(-params // partitions) for params in whole if params > 0]


def prefetch_groups(tensors: list[int], threshold: int = DEEPSPEED_PERSISTENCE_THRESHOLD,
                    bucket: int = DEEPSPEED_PREFETCH_BUCKET) -> list[int]:
    """The elements of each all-gather DeepSpeed's stage 3 runs over `tensors` (in order) in
    one pass.

    Formula: the tensors of at least `threshold` elements, taken in order into calls; a call
    takes tensors until it holds at least `bucket` elements, the next starts a new one.
    Units: elements -> elements per call ([] where every tensor persists).
    Source: DEEPSPEED_PERSISTENCE_THRESHOLD, DEEPSPEED_PREFETCH_BUCKET.
    """
    groups: list[int] = []
    held = 0
    for size in tensors:
        if size < threshold:
            continue
        held += size
        if held >= bucket:
            groups.append(held)
            held = 0
    return groups + ([held] if held else [])


def prefetch_calls(tensors: list[int], threshold: int = DEEPSPEED_PERSISTENCE_THRESHOLD,
                   bucket: int = DEEPSPEED_PREFETCH_BUCKET) -> int:
    """All-gathers DeepSpeed's stage 3 runs over `tensors` in one pass: len(prefetch_groups)."""
    return len(prefetch_groups(tensors, threshold, bucket))


def reduce_calls(tensors: list[int], bucket: int = DEEPSPEED_REDUCE_BUCKET) -> int:
    """Reduce-scatters DeepSpeed's stage 3 runs over the gradients of `tensors` in one
    backward pass (they arrive in reverse order).

    Formula: each gradient joins the open bucket unless that would take it past `bucket`
    elements, in which case the open bucket is sent first; the last bucket is sent at the end.
    Units: elements -> calls (at least 1 where there are tensors).
    Source: DEEPSPEED_REDUCE_BUCKET.
    """
    calls = held = 0
    for size in reversed(tensors):
        if held and held + size > bucket:
            calls += 1
            held = 0
        held += size
    return calls + (1 if held else 0)


@functools.lru_cache(maxsize=4096)
def _bucketed(run: TensorRun, partitions: int) -> tuple[tuple[int, ...], int]:
    """(each all-gather's elements, reduce-scatters) of `run` split over `partitions`."""
    tensors = run.tensors(partitions)
    return tuple(prefetch_groups(tensors)), reduce_calls(tensors)


def bucket_calls(run: TensorRun, partitions: int) -> tuple[int, int]:
    """(all-gathers per pass, reduce-scatters per backward) of a stage whose tensors are `run`
    split over `partitions` (tp) under DeepSpeed's stage 3, each at least 1.
    Units: -> (calls, calls). Source: prefetch_groups, reduce_calls."""
    groups, reduces = _bucketed(run, partitions)
    return max(1, len(groups)), max(1, reduces)


def largest_gather(run: TensorRun, partitions: int) -> int:
    """The elements of a stage's largest all-gather under DeepSpeed's stage 3: what a member
    holds whole at once beyond its shards, per call (model/memory.gathered_unit_bytes holds it
    and the call prefetched after it). Units: elements. Source: prefetch_groups."""
    return max(_bucketed(run, partitions)[0], default=0)

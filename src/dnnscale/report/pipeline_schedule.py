"""The order in which pipeline stages run their micro-batches, laid out in time for a picture.

The model prices a pipeline with a closed formula (model/schedule.py, `pipeline_time_s`); to
draw one step per stage the report needs the schedule itself. This module lays out the model's
own per-micro-batch times under the schedule's rules — GPipe (all forwards, then all
backwards), 1F1B (p − d − 1 warm-up forwards on device d, then one forward, one backward) and
Megatron's interleaved 1F1B (v model chunks per device) — by list scheduling: each device runs
its operations in that order, an operation starts when its device is free and its input has
arrived (the forward of the previous virtual stage, the backward of the next one). It is the
model's schedule drawn out, not a trace; for equal stages its makespan is (m + p − 1)·t, the
formula's.

Sources: Huang et al. 2019 (GPipe); Narayanan et al. SC'21 §2.2 (1F1B and the interleaved
schedule, whose operation order Megatron-LM's schedules.py follows: warm-up
(p − d − 1)·2 + (v − 1)·p forwards, forward op k on chunk ⌊k/p⌋ mod v).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FORWARD, BACKWARD = "F", "B"


@dataclass(frozen=True)
class ScheduledOp:
    """One forward or backward pass of one micro-batch through one chunk on one device."""

    device: int
    kind: str
    micro_batch: int
    chunk: int
    start_s: float
    seconds: float

    @property
    def end_s(self) -> float:
        return self.start_s + self.seconds


def interleaving_applies(stages: int, micro_batches: int, chunks: int) -> bool:
    """Megatron's interleaved order needs m to be a multiple of p (and v > 1)."""
    return chunks > 1 and micro_batches % stages == 0


def op_order(schedule: str, device: int, stages: int, micro_batches: int,
             chunks: int = 1) -> list[tuple[str, int, int]]:
    """(kind, micro-batch, chunk) of every operation device `device` runs, in order."""
    m, p, d = micro_batches, stages, device
    if schedule == "gpipe":
        return [(FORWARD, i, 0) for i in range(m)] + [(BACKWARD, i, 0) for i in range(m)]
    if schedule == "interleaved" and interleaving_applies(p, m, chunks):
        v = chunks
        total = m * v

        def forward(k: int) -> tuple[str, int, int]:
            return FORWARD, (k // (p * v)) * p + k % p, (k // p) % v

        def backward(k: int) -> tuple[str, int, int]:
            return BACKWARD, (k // (p * v)) * p + k % p, v - 1 - (k // p) % v

        warmup = min((p - d - 1) * 2 + (v - 1) * p, total)
    else:
        total = m

        def forward(k: int) -> tuple[str, int, int]:
            return FORWARD, k, 0

        def backward(k: int) -> tuple[str, int, int]:
            return BACKWARD, k, 0

        warmup = min(p - d - 1, total)
    order = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [forward(warmup + k), backward(k)]
    order += [backward(k) for k in range(total - warmup, total)]
    return order


def simulate(schedule: str, stages: int, micro_batches: int, chunks: int,
             forward_s: Sequence[float], backward_s: Sequence[float]) -> list[ScheduledOp]:
    """Lay out every operation in time. forward_s[d], backward_s[d]: one micro-batch's pass
    through one chunk of device d (sends included). Virtual stage of chunk c on device d:
    c·p + d. Raises ValueError if the order deadlocks (it does not for these schedules)."""
    p = stages
    v = chunks if schedule == "interleaved" and interleaving_applies(p, micro_batches,
                                                                      chunks) else 1
    last = p * v - 1
    orders = [op_order(schedule, d, p, micro_batches, v) for d in range(p)]
    position = [0] * p
    free = [0.0] * p
    done: dict[tuple[str, int, int], float] = {}  # (kind, micro-batch, virtual stage) -> end
    ops: list[ScheduledOp] = []
    remaining = sum(len(order) for order in orders)
    while remaining:
        progressed = False
        for d in range(p):
            while position[d] < len(orders[d]):
                kind, mb, chunk = orders[d][position[d]]
                stage = chunk * p + d
                if kind == FORWARD:
                    needs = [(FORWARD, mb, stage - 1)] if stage > 0 else []
                else:
                    needs = [(FORWARD, mb, stage)]
                    if stage < last:
                        needs.append((BACKWARD, mb, stage + 1))
                if any(need not in done for need in needs):
                    break
                start = max([free[d]] + [done[need] for need in needs])
                seconds = forward_s[d] if kind == FORWARD else backward_s[d]
                ops.append(ScheduledOp(d, kind, mb, chunk, start, seconds))
                free[d] = done[(kind, mb, stage)] = start + seconds
                position[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError(f"the {schedule} order deadlocks with p={p}, m={micro_batches}")
    return ops

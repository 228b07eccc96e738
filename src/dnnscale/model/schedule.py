"""Pipeline schedules: which layers each stage holds, how long m micro-batches take, and how
many micro-batches' activations a stage keeps in flight (performance-model.md §9).

Stages (Megatron-LM): the L blocks are divided evenly, L/p consecutive blocks per stage (L/(p·v)
per chunk, v chunks per device, with the interleaved schedule); the layers before the first
block (the embedding) go to the first stage, those after the last (final norm, logits, loss) to
the last.
"""

from __future__ import annotations

from dnnscale.workload.layer import Layer


def block_of(layer: Layer) -> int | None:
    block = layer.hyper.get("block")
    return block if isinstance(block, int) else None


def stage_layers(layers: tuple[Layer, ...], stages: int, virtual_stages: int = 1) -> list[list[int]]:
    """Indices of the layers each of `stages` devices holds (all its chunks), in order.

    Blocks go to chunk c = floor(block · p·v / L), chunk c to device c mod p; layers before the
    first block go with the first block's device, layers after the last with the last's. A
    workload without blocks (a CNN) is split by layer count.
    """
    blocks = [block_of(layer) for layer in layers]
    known = [b for b in blocks if b is not None]
    chunks = stages * virtual_stages
    if not known:  # no transformer blocks: split the layers evenly
        total = len(layers)
        return [[i for i in range(total) if (i * stages) // max(1, total) == s]
                for s in range(stages)]
    count = max(known) + 1
    first = blocks.index(known[0])
    device_of_block = [min(chunks - 1, (b * chunks) // count) % stages for b in range(count)]
    devices: list[list[int]] = [[] for _ in range(stages)]
    for index, block in enumerate(blocks):
        if block is None:
            device = 0 if index < first else (chunks - 1) % stages
        else:
            device = device_of_block[block]
        devices[device].append(index)
    return devices


def pipeline_time_s(stage_seconds: tuple[float, ...], micro_batches: int,
                    virtual_stages: int = 1) -> float:
    """Time for every stage to run `micro_batches` forward and backward passes (1F1B or GPipe;
    interleaved with v virtual stages).

    Formula: T = m · t_max + (Σ_i t_i − t_max) / v, t_i one micro-batch's forward + backward on
    stage i; for equal stages (m + (p−1)/v) · t, i.e. a bubble of (p−1)/(v·m) of the ideal
    time; one stage and one micro-batch: t.
    Units: s, count -> s.
    Source: Narayanan et al. SC'21 §2.2 (bubble (p−1)/m for GPipe and 1F1B, (p−1)/(v·m)
    interleaved); Huang et al. 2019 (GPipe).
    """
    slowest = max(stage_seconds)
    return micro_batches * slowest + (sum(stage_seconds) - slowest) / virtual_stages


def in_flight_micro_batches(schedule: str, stage: int, stages: int, micro_batches: int,
                            virtual_stages: int = 1) -> float:
    """Micro-batches whose activations stage `stage` (from 0) holds at once.

    Formula: GPipe m; 1F1B min(m, p − i); interleaved min(m, p − i)·(1 + (p−1)/(p·v)) (the first
    stage's extra warm-up micro-batches of the other chunks).
    Units: count.
    Source: Narayanan et al. SC'21 §2.2; Korthikanti et al. 2022 §4.2.3.
    """
    if schedule == "gpipe":
        return float(micro_batches)
    held = float(min(micro_batches, stages - stage))
    if schedule == "interleaved" and virtual_stages > 1:
        held *= 1 + (stages - 1) / (stages * virtual_stages)
    return held

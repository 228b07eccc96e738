"""Collective-communication costs: a registry keyed by (operation, library).

Each entry is a pure function ``(payload_bytes, members) -> Transfer`` giving what one member
puts on its link: wire bytes and messages (sequential steps). The time of a transfer on a link
tier is the α-β form bytes / B + messages · α (`transfer_time_s`); a tier that carries a
calibrated fit for the operation and group size uses the fitted (B, α) instead.

`payload_bytes` is the size of the whole tensor each member ends with: the gathered tensor for
an all-gather, the tensor before it is scattered for a reduce-scatter, the reduced tensor for an
all-reduce. Library quirks live here and nowhere else: gloo (torch 2.13) runs reduce_scatter as
a whole all-reduce; NCCL's is a true ring reduce-scatter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from dnnscale.model.network import transfer_time_s
from dnnscale.model.registry import cost_formula
from dnnscale.system.topology import LinkTier

LIBRARIES = ("gloo", "nccl")
OPERATIONS = ("allgather", "reduce_scatter", "allreduce", "halo")


class Transfer(NamedTuple):
    """What one member sends over its link: wire bytes, in `messages` sequential messages."""

    bytes: float
    messages: float


CollectiveCost = Callable[[float, int], Transfer]
COLLECTIVE_COSTS: dict[tuple[str, str], CollectiveCost] = {}


def collective_cost(operation: str, *libraries: str) -> Callable[[CollectiveCost], CollectiveCost]:
    """Register `func` as the cost of `operation` under each of `libraries`; its docstring must
    state Formula, Units and Source (it is a cost formula too)."""

    def decorate(func: CollectiveCost) -> CollectiveCost:
        cost_formula(func)
        for library in libraries:
            COLLECTIVE_COSTS[(operation, library)] = func
        return func

    return decorate


@collective_cost("allgather", "gloo", "nccl")
def ring_allgather(payload_bytes: float, members: int) -> Transfer:
    """Ring all-gather: each member ends with the whole tensor of `payload_bytes`.

    Formula: bytes = (g−1)/g · x, messages = g−1, for g members and a tensor of x bytes.
    Units: bytes, count -> bytes, count.
    Source: Thakur, Rabenseifner & Gropp, IJHPCA 2005 (ring all-gather); Patarasuk & Yuan 2009.
    """
    if members <= 1:
        return Transfer(0.0, 0.0)
    return Transfer((members - 1) / members * payload_bytes, float(members - 1))


@collective_cost("reduce_scatter", "nccl")
def ring_reduce_scatter(payload_bytes: float, members: int) -> Transfer:
    """Ring reduce-scatter of a tensor of `payload_bytes` into g shards.

    Formula: bytes = (g−1)/g · x, messages = g−1.
    Units: bytes, count -> bytes, count.
    Source: Thakur, Rabenseifner & Gropp, IJHPCA 2005; NCCL's ring reduce-scatter.
    """
    return ring_allgather(payload_bytes, members)


@collective_cost("allreduce", "gloo", "nccl")
def ring_allreduce(payload_bytes: float, members: int) -> Transfer:
    """Ring all-reduce (reduce-scatter then all-gather) of a tensor of `payload_bytes`.

    Formula: bytes = 2·(g−1)/g · x, messages = 2·(g−1).
    Units: bytes, count -> bytes, count.
    Source: Patarasuk & Yuan, JPDC 2009; performance-model.md §4.
    """
    if members <= 1:
        return Transfer(0.0, 0.0)
    return Transfer(2 * (members - 1) / members * payload_bytes, 2.0 * (members - 1))


@collective_cost("reduce_scatter", "gloo")
def gloo_reduce_scatter(payload_bytes: float, members: int) -> Transfer:
    """gloo's reduce_scatter, which torch 2.13 runs as an all-reduce of the whole tensor.

    Formula: bytes = 2·(g−1)/g · x, messages = 2·(g−1) (ring all-reduce).
    Units: bytes, count -> bytes, count.
    Source: measured on the testbed (wave 1): a 1 MB reduce_scatter among 2 hosts took as long
    as a 2 MB all-reduce.
    """
    return ring_allreduce(payload_bytes, members)


@collective_cost("halo", "gloo", "nccl")
def halo_exchange(payload_bytes: float, neighbours: int) -> Transfer:
    """Halo exchange: `payload_bytes` to each of `neighbours` neighbours (stripe-split convs).

    Formula: bytes = m · x, messages = m, for m neighbours (here `members` is m).
    Units: bytes, count -> bytes, count.
    Source: performance-model.md §2 (⌊K/2⌋ halo rows above and below a stripe).
    """
    if payload_bytes <= 0:
        return Transfer(0.0, 0.0)
    return Transfer(neighbours * payload_bytes, float(neighbours))


def collective_transfer(operation: str, library: str, payload_bytes: float,
                        members: int) -> Transfer:
    """The registered cost of `operation` under `library` (KeyError names both if missing)."""
    try:
        cost = COLLECTIVE_COSTS[(operation, library)]
    except KeyError:
        raise KeyError(f"no collective cost registered for {operation!r} under {library!r}") from None
    return cost(payload_bytes, members)


def collective_time_s(operation: str, library: str, payload_bytes: float, members: int,
                      tier: LinkTier) -> float:
    """Seconds one member spends in the collective on `tier`: bytes / B + messages · α, with a
    calibrated all-reduce fit for this group size replacing (B, α) where the tier has one."""
    transfer = collective_transfer(operation, library, payload_bytes, members)
    bandwidth, latency = tier.bandwidth_bytes_per_s, tier.latency_s
    if operation == "allreduce":
        fit = tier.allreduce_fit(members)
        if fit is not None:
            bandwidth, latency = fit
    return transfer_time_s(transfer.bytes, transfer.messages, bandwidth, latency)

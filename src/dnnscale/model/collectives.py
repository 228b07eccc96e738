"""Collective-communication costs: a registry keyed by (operation, library, algorithm).

Algorithms are the plan's (plan.Collective.algorithm): 'ring' (the default, and what every
collective was priced as before the key had an algorithm), 'hierarchical' and 'tree'. 'ring'
and 'hierarchical' move the same bytes: rings on each tier a group spans, run two-level when it
spans several nodes with several members in each (`group_collective_time_s`; NCCL's ring spans
the nodes the same way, every GPU's NIC carrying a share). They differ in latency: NCCL's ring
is one flat ring through every member, so it also pays the hops inside every node
(`flat_ring_extra_hops`), a latency that grows with the group. 'tree' is NCCL's double binary tree
all-reduce (`tree_allreduce`). Point-to-point patterns (halo, the PS's held pulls) are the same
under every algorithm. Adding an algorithm is one registered function here (and, for a new
name, its entry in plan.ALGORITHMS).

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

import functools

from collections.abc import Callable
from typing import NamedTuple

from dnnscale.errors import InputError
from dnnscale.model.network import measured_time_s, transfer_time_s
from dnnscale.plan.plan import ALGORITHMS
from dnnscale.system.topology import GroupSpan, LinkTier, Topology

LIBRARIES = ("gloo", "nccl")
OPERATIONS = ("allgather", "reduce_scatter", "allreduce", "halo", "ps_sync_pull", "alltoall")
FIT_OF = {("reduce_scatter", "gloo"): "allreduce"}
"""Operations priced with another's calibrated fit: gloo runs reduce_scatter as an all-reduce."""


class Transfer(NamedTuple):
    """What one member sends over its link: wire bytes, in `messages` sequential messages."""

    bytes: float
    messages: float


CollectiveCost = Callable[[float, int], Transfer]
class CostRegistry(dict[tuple[str, str, str], CollectiveCost]):
    """The registry: a dict that counts its item assignments and deletions (`version`: the
    registering decorator's, a test's monkeypatch), so that a cached price
    (group_collective_time_s) is never read after a cost was registered or replaced. Change it
    only that way (not by update() or pop())."""

    version = 0

    def __setitem__(self, key: tuple[str, str, str], value: CollectiveCost) -> None:
        super().__setitem__(key, value)
        self.version += 1

    def __delitem__(self, key: tuple[str, str, str]) -> None:
        super().__delitem__(key)
        self.version += 1


COLLECTIVE_COSTS: CostRegistry = CostRegistry()
"""(operation, library, algorithm) -> cost: the lookup every collective's price goes through."""
DEFAULT_ALGORITHM = "ring"
RINGS = ("ring", "hierarchical")
"""Algorithms priced as rings on each tier (module docstring)."""
NCCL_OPERATIONS = ("allgather", "reduce_scatter", "allreduce")
"""The collectives NCCL runs as rings or trees, whose protocol it picks by size
(NCCL_PROTOCOLS)."""
NCCL_PROTOCOLS: dict[str, dict[str, tuple[float, dict[str, float]]]] = {
    "ring": {"LL": (0.5, {"nvlink": 0.6e-6, "pci": 1.0e-6, "net": 2.7e-6}),
             "LL128": (0.92, {"nvlink": 1.9e-6, "pci": 2.5e-6, "net": 4.0e-6}),
             "Simple": (1.0, {"nvlink": 3.4e-6, "pci": 5.7e-6, "net": 14.0e-6})},
    "tree": {"LL": (1 / 3.8, {"nvlink": 0.6e-6, "pci": 1.0e-6, "net": 5.0e-6}),
             "LL128": (120 / 128, {"nvlink": 1.25e-6, "pci": 1.9e-6, "net": 8.5e-6}),
             "Simple": (1.0, {"nvlink": 4.0e-6, "pci": 4.0e-6, "net": 14.0e-6})},
}
"""NCCL's protocols per algorithm: (the share of the link's bandwidth a protocol carries, its
latency per hop on each class of link). LL sends 4 bytes of data with each 4-byte flag (half
the bandwidth) and needs no fence, so its hops are fastest; LL128 carries 120 of every 128
bytes; Simple moves whole buffers behind a fence, at full bandwidth and the slowest hops. NCCL
prices each (algorithm, protocol) pair by this table and runs the quickest for the message's
size, so a small message travels on LL, a large one on Simple; LL128 is enabled where the GPUs
of a node share NVLink. 'hierarchical' rings are rings. Source: NVIDIA/nccl
src/graph/tuning.cc: hwLatencies (Ring: NVLink 0.6 / 1.9 / 3.4 us, PCI 1.0 / 2.5 / 5.7, NET
2.7 / 4.0 / 14.0; Tree: NVLink 0.6 / 1.25 / 4.0, PCI 1.0 / 1.9 / 4.0, NET 5.0 / 8.5 / 14) and
the busBw factors (ring LL 0.5, LL128 0.92; tree LL 1/3.8, LL128 120/128 across nodes; Simple
1). A tier's own per-hop latency is LL's on a ring; what it adds to the table's LL figure
(RoCE's 2.9 µs against 2.7, a slower link given by the user) is added to every protocol's
hop (protocol_link). Not priced: the per-call base latencies (the system's call cost stands
for them), the per-architecture caps on LL and LL128's bandwidth and the tree pattern's
0.85."""
PROTOCOL_TABLE_OF = {"ring": "ring", "hierarchical": "ring", "tree": "tree"}
EVERY_ALGORITHM = ALGORITHMS
"""Every algorithm a plan may name (plan.ALGORITHMS): point-to-point patterns register for all."""


def collective_cost(operation: str, *libraries: str, algorithms: tuple[str, ...] = RINGS
                    ) -> Callable[[CollectiveCost], CollectiveCost]:
    """Register `func` as the cost of `operation` under each of `libraries` and `algorithms`;
    its docstring must state Formula, Units and Source."""

    def decorate(func: CollectiveCost) -> CollectiveCost:
        doc = func.__doc__ or ""
        missing = [word for word in ("Formula", "Units", "Source") if word not in doc]
        if missing:
            raise TypeError(f"collective cost {func.__name__} lacks {', '.join(missing)} in its "
                            f"docstring")
        for library in libraries:
            for algorithm in algorithms:
                COLLECTIVE_COSTS[(operation, library, algorithm)] = func
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


@collective_cost("allreduce", "nccl", algorithms=("tree",))
def tree_allreduce(payload_bytes: float, members: int) -> Transfer:
    """NCCL's double binary tree all-reduce: a reduce up, then a broadcast down, two binary trees
    each carrying half the tensor, pipelined in chunks, every member a leaf in one of them.

    Formula: bytes = 2·(g−1)/g · x (the same wire bytes per member as a ring: NCCL states both
    algorithms' bus bandwidth as 2·(g−1)/g times the algorithm bandwidth), messages =
    2·⌊log₂ g⌋ (up and down a tree of depth ⌊log₂ g⌋, where a ring takes 2·(g−1) steps).
    Units: bytes, count -> bytes, count.
    Source: Sanders, Speck & Träff, "Two-tree algorithms for full bandwidth broadcast,
    reduction and scan", Parallel Computing 35(12), 2009; Jeaugey, "Massively scale your deep
    learning training with NCCL 2.4" (NVIDIA, 2019); NCCL src/graph/tuning.cc (the tree
    latency 2·(intra-node chain + log2i(nNodes)·inter-node latency)); nccl-tests
    doc/PERFORMANCE.md (all-reduce bus bandwidth factor 2·(n−1)/n).
    """
    if members <= 1:
        return Transfer(0.0, 0.0)
    return Transfer(2 * (members - 1) / members * payload_bytes,
                    2.0 * (members.bit_length() - 1))


@collective_cost("reduce_scatter", "gloo")
def gloo_reduce_scatter(payload_bytes: float, members: int) -> Transfer:
    """gloo's reduce_scatter, which torch 2.13 runs as an all-reduce of the whole tensor.

    Formula: bytes = 2·(g−1)/g · x, messages = 2·(g−1) (ring all-reduce).
    Units: bytes, count -> bytes, count.
    Source: measured on the testbed (wave 1): a 1 MB reduce_scatter among 2 hosts took as long
    as a 2 MB all-reduce.
    """
    return ring_allreduce(payload_bytes, members)


@collective_cost("halo", "gloo", "nccl", algorithms=EVERY_ALGORITHM)
def halo_exchange(payload_bytes: float, neighbours: int) -> Transfer:
    """Halo exchange: `payload_bytes` to each of `neighbours` neighbours (stripe-split convs).

    Formula: bytes = m · x, messages = m, for m neighbours (here `members` is m).
    Units: bytes, count -> bytes, count.
    Source: performance-model.md §2 (⌊K/2⌋ halo rows above and below a stripe).
    """
    if payload_bytes <= 0:
        return Transfer(0.0, 0.0)
    return Transfer(neighbours * payload_bytes, float(neighbours))


@collective_cost("ps_sync_pull", "gloo", "nccl", algorithms=EVERY_ALGORITHM)
def held_pull_convoy(payload_bytes: float, members: int) -> Transfer:
    """A synchronous parameter server's held pulls, answered one worker after another.

    Each shard holds the pulls of step t until it has applied the step's update, then answers
    them in their order of arrival with blocking sends; every worker asked every shard at
    once, so all shards answer the same worker first: one worker's link receives all its
    shards' pieces while the others wait (a convoy). On the workers' tier the members' pulls
    follow one another instead of overlapping.
    Formula: bytes = g · x, messages = g, for g workers served (R·P) each pulling x bytes; the
    shards' own links are priced apart (R·share·pull / B_ps). A tier's calibrated fit
    (`dnnscale calibrate` on a testbed: the pspull microbenchmark, whose shards reply as
    runtime/ps.py does) replaces (B, α), and its measured points, where kept, price it before
    the fit (held_pull_convoy_s): socket buffers let a shard move on before a reply has
    drained, so the measured convoy is partial.
    Units: bytes, count -> bytes, count.
    Source: runtime/ps.py (ShardServer answers held pulls in arrival order, dist.send);
    measured on the testbed (wave 1 validation: P=1 R=3 S=3 ps-sync pulled in 0.57 s against
    0.26 s predicted without this term); calibrate/netbench.py pspull.
    """
    if members <= 0 or payload_bytes <= 0:
        return Transfer(0.0, 0.0)
    return Transfer(members * payload_bytes, float(members))


@collective_cost("alltoall", "gloo", "nccl", algorithms=EVERY_ALGORITHM)
def pairwise_alltoall(payload_bytes: float, members: int) -> Transfer:
    """All-to-all: each member holds a tensor of `payload_bytes` cut into g equal pieces and
    sends piece j to member j (the expert dispatch and combine of a mixture of experts, the
    Ulysses head/sequence swap), one message to each of the g − 1 others.

    Formula: bytes = (g−1)/g · x, messages = g − 1 (the piece it keeps stays local).
    Units: bytes, count -> bytes, count.
    Source: Thakur, Rabenseifner & Gropp, IJHPCA 2005 (pairwise-exchange all-to-all); NCCL
    runs it as grouped point-to-point sends and receives (nccl-tests doc/PERFORMANCE.md:
    alltoall bus bandwidth = algorithm bandwidth · (n−1)/n).
    """
    if members <= 1 or payload_bytes <= 0:
        return Transfer(0.0, 0.0)
    return Transfer((members - 1) / members * payload_bytes, float(members - 1))


PULL_PIECE_CURVE = "ps_sync_pull/piece"
"""The LinkTier curve key of a testbed's measured held pulls, per piece: (x / S_m, t / S_m) of
each point measured with S_m shards (validate/profile.apply_profile)."""


def held_pull_convoy_s(library: str, pull_bytes: float, members: int, shards: int,
                       tier: LinkTier) -> float:
    """Seconds until the last of `members` workers has its `pull_bytes` from `shards` shards,
    the held pulls answered one worker after another (held_pull_convoy).

    Formula: with the tier's measured held pulls among these members (a testbed's pspull
    microbenchmark), t = S · f(x / S), f the measured seconds per shard at a piece of x / S
    bytes (network.measured_time_s): a shard moves on to the next worker once all but a
    socket buffer of its piece has left, so how much of the convoy is serial depends on the
    piece against the buffer, and each worker's link carries S such pieces. Without one, the
    registry's α-β (collective_time_s).
    Units: bytes, count, count -> s.
    Source: calibrate/netbench.py pspull on the testbed (issue 22): at 100 Mbit/s 3 workers
    pulling 1 MiB each from 3 shards took 0.105 s, 16 MiB 3.13 s, where a serial convoy is
    0.26 s and 4.2 s; the α-β line through those points priced 1 MiB at 0.19 s.
    """
    if members <= 0 or pull_bytes <= 0:
        return 0.0
    curve = tier.curve(PULL_PIECE_CURVE, members)
    if curve and shards >= 1:
        return shards * measured_time_s(curve, pull_bytes / shards)
    return collective_time_s("ps_sync_pull", library, pull_bytes, members, tier)


def collective_transfer(operation: str, library: str, payload_bytes: float, members: int,
                        algorithm: str = DEFAULT_ALGORITHM) -> Transfer:
    """The registered cost of `operation` under `library` and `algorithm`: KeyError naming both
    when the library has no such operation, InputError naming the plan's algorithm field when
    it has the operation but not under `algorithm`."""
    cost = COLLECTIVE_COSTS.get((operation, library, algorithm))
    if cost is None:
        known = sorted(a for (o, lib, a) in COLLECTIVE_COSTS if (o, lib) == (operation, library))
        if not known:
            raise KeyError(f"no collective cost registered for {operation!r} under {library!r}")
        raise InputError("plan.data.aggregation.algorithm", f"{library} has no {algorithm} "
                         f"{operation} (it runs it as: {', '.join(known)})")
    return cost(payload_bytes, members)


def nccl_protocols(operation: str, library: str, algorithm: str,
                   *tiers: LinkTier) -> tuple[str | None, ...]:
    """The NCCL protocols a collective over `tiers` may run on (those every tier enables,
    NCCL_PROTOCOLS), or (None,): one protocol at each tier's own latency (other libraries and
    operations, tiers without a protocol model, calibrated tiers)."""
    if (library != "nccl" or algorithm not in PROTOCOL_TABLE_OF
            or operation not in NCCL_OPERATIONS):
        return (None,)
    return _common_protocols(tiers)


@functools.lru_cache(maxsize=256)
def _common_protocols(tiers: tuple[LinkTier, ...]) -> tuple[str | None, ...]:
    common = [p for p in tiers[0].protocols if all(p in tier.protocols for tier in tiers)]
    if not common or any(tier.allreduce_fits or tier.fits or tier.curves for tier in tiers):
        return (None,)
    return tuple(common)


@functools.lru_cache(maxsize=1024)
def protocol_link(tier: LinkTier, protocol: str | None,
                  algorithm: str = DEFAULT_ALGORITHM) -> tuple[float, float]:
    """(bandwidth, per-hop latency) of `tier` under an NCCL `protocol` of `algorithm`: the
    protocol's share of the bandwidth, and its hop latency on the tier's class of link plus
    what the tier's own latency adds to the ring's LL figure (a preset's latency is that
    figure, so nothing; a slower link, RoCE's 2.9 µs or a user's --inter-node-latency, adds its
    difference to every protocol's hop); the tier's own under None."""
    ring_ll = NCCL_PROTOCOLS["ring"]["LL"][1]
    if protocol is None or tier.hardware not in ring_ll:
        return tier.bandwidth_bytes_per_s, tier.latency_s
    share, latencies = NCCL_PROTOCOLS[PROTOCOL_TABLE_OF[algorithm]][protocol]
    extra = tier.latency_s - ring_ll[tier.hardware]
    return tier.bandwidth_bytes_per_s * share, max(0.0, latencies[tier.hardware] + extra)


def collective_time_s(operation: str, library: str, payload_bytes: float, members: int,
                      tier: LinkTier, algorithm: str = DEFAULT_ALGORITHM,
                      protocol: str | None = None) -> float:
    """Seconds one member spends in the collective on `tier`: bytes / B + messages · α, with a
    calibrated fit for this group size replacing (B, α) where the tier has one: the
    operation's own (a testbed's partition exchanges, validate/profile.apply_profile), else
    the one it runs as (FIT_OF). Where the tier holds the operation's measured times for this
    group size (a testbed's partition exchanges), those interpolated instead
    (network.measured_time_s). A calibrated fit or curve measured a ring: it prices the ring
    algorithms only. Without a `protocol`, NCCL picks the quickest of the tier's
    (nccl_protocols); with one, (B, α) are that protocol's (protocol_link)."""
    transfer = collective_transfer(operation, library, payload_bytes, members, algorithm)
    if algorithm in RINGS:
        curve = tier.curve(operation, members)
        if curve and payload_bytes > 0:
            return measured_time_s(curve, payload_bytes)
        fit = tier.fit(operation, members)
        if fit is None and (operation, library) in FIT_OF:
            fit = tier.fit(FIT_OF[(operation, library)], members)
        if fit is not None:
            return transfer_time_s(transfer.bytes, transfer.messages, *fit)
    choices = (protocol,) if protocol is not None else nccl_protocols(
        operation, library, algorithm, tier)
    return min(transfer_time_s(transfer.bytes, transfer.messages,
                               *protocol_link(tier, choice, algorithm)) for choice in choices)


def alltoall_two_tier_s(library: str, payload_bytes: float, span: GroupSpan, intra: LinkTier,
                        inter: LinkTier) -> float:
    """An all-to-all among k members in each of N > 1 nodes: the pieces for the k − 1 members
    of its own node go over the intra-node tier while the pieces for the g − k members in
    other nodes leave through its NIC, at once; the slower of the two sets the time.

    Formula: with g = N·k and x the member's tensor, t = max(t_intra, t_inter), t_intra =
    (k−1)/g · x / B_intra + (k−1)·α_intra, t_inter = (g−k)/g · x / B_inter + (g−k)·α_inter
    (the registry's pairwise_alltoall wire bytes, (g−1)/g · x, split by where the pieces go).
    Units: bytes, counts -> s.
    Source: NCCL's all-to-all is grouped point-to-point sends, each over the path to its peer
    (NCCL user guide, "Point-to-point communication": all-to-all); DGX nodes give each GPU its
    own NIC, so a GPU's inter-node pieces share one NIC (NVIDIA DGX H100 user guide).
    """
    whole = collective_transfer("alltoall", library, payload_bytes, span.size)
    if whole.messages <= 0:
        return 0.0
    members, per_node = span.size, span.per_node
    near, far = per_node - 1, members - per_node
    piece = whole.bytes / whole.messages
    return max(transfer_time_s(near * piece, near, intra.bandwidth_bytes_per_s, intra.latency_s),
               transfer_time_s(far * piece, far, inter.bandwidth_bytes_per_s, inter.latency_s))


@functools.lru_cache(maxsize=1024)
def flat_ring_extra_hops(operation: str, library: str, nodes: int, per_node: int) -> float:
    """The hops inside the nodes that one flat ring through N·k members takes beyond the
    two-level form's (a ring across the N nodes plus one inside a node).

    Formula: m(N·k) − m(N) − m(k), m the ring's sequential messages for the operation
    (the registry's ring entry): (N−1)(k−1) for an all-gather or reduce-scatter, 2(N−1)(k−1)
    for an all-reduce; each costs the intra-node tier's per-hop latency.
    Units: counts -> count.
    Source: NCCL src/graph/tuning.cc, the ring's latency: (nsteps − nInterSteps) · intraLat +
    nInterSteps · interLat, with nsteps = nRanks − 1 (all-gather, reduce-scatter) or
    2(nRanks − 1) (all-reduce) and nInterSteps = nNodes − 1 or 2(nNodes − 1): every member of
    the group is a hop, so the latency grows with the ranks, not the nodes.
    """
    def messages(members: int) -> float:
        return collective_transfer(operation, library, 1.0, members, "ring").messages

    return max(0.0, messages(nodes * per_node) - messages(nodes) - messages(per_node))


def span_members(operation: str, members: int) -> int:
    """How many members of its group a collective's span holds: its `members`, and for a halo
    exchange (whose `members` counts neighbours, halo_exchange) the member and its neighbours.

    A halo with one neighbour (P = 2) crosses the link to that neighbour like any exchange
    between two members; sized by its neighbour count alone it spanned one member and cost
    nothing (issue 22: the stripe-split convs of every P = 2 row were priced without halos).
    """
    return members + 1 if operation == "halo" else members


def group_collective_time_s(operation: str, library: str, payload_bytes: float,
                            span: GroupSpan, topology: Topology, call_s: float = 0.0,
                            algorithm: str = DEFAULT_ALGORITHM) -> float:
    """Seconds one member of a group placed as `span` (plan/mesh.placement: `span.size`
    members, `span.per_node` of them in each node) spends in the collective, on the tiers the
    group spans, plus a fixed `call_s`.

    Formula: a halo exchange: to the span's size − 1 neighbours, on the tier the span lies on.
    Inside one node, or one member per node: the operation on that tier. A group of
    k members in each of N > 1 nodes runs hierarchically (NCCL's inter-node rings use every
    GPU's NIC): all-reduce = reduce-scatter inside the node (k) + all-reduce across nodes (N) of
    x/k + all-gather inside the node (k); all-gather = across nodes (N) of x/k + inside (k);
    reduce-scatter = inside (k) + across nodes (N) of x/k.
    The 'ring' algorithm adds the hops of a flat ring inside every node
    (`flat_ring_extra_hops` · α_intra); 'hierarchical' runs the two levels as written.
    Units: bytes, counts, s -> s.
    Source: Jeaugey, "Massively scale your deep learning training with NCCL 2.4" (NVIDIA, 2019)
    and Sanders et al. 2009 on two-level collectives; performance-model.md §9 (a hierarchical
    collective keeps TP=16 on NVLink inside each node; Calculon puts it all on InfiniBand).
    `algorithm` prices a one-tier group's collective and a two-level one's step across nodes;
    the steps inside the nodes are rings (NCCL's tree, too, chains the GPUs of a node and builds
    its trees across nodes: src/graph/tuning.cc).
    """
    return _group_collective_time_s(COLLECTIVE_COSTS.version, operation, library,
                                    payload_bytes, span, topology, call_s, algorithm)


@functools.lru_cache(maxsize=1 << 16)
def _group_collective_time_s(version: int, operation: str, library: str,
                             payload_bytes: float, span: GroupSpan, topology: Topology,
                             call_s: float, algorithm: str) -> float:
    """group_collective_time_s, remembered (a search asks the same collective of the same group
    many times) for the registry's `version`."""
    members = span.size
    if payload_bytes <= 0 or members <= 1:
        return 0.0
    per_node, nodes = span.per_node, span.nodes
    intra = topology.intra_node or topology.inter_node
    if operation == "halo":  # the span holds a member and its neighbours (span_members)
        tier = intra if nodes == 1 else topology.inter_node
        return collective_time_s(operation, library, payload_bytes, members - 1, tier,
                                 algorithm) + call_s
    if nodes == 1:
        return collective_time_s(operation, library, payload_bytes, members, intra,
                                 algorithm) + call_s
    inter = topology.inter_node
    if operation == "alltoall" and per_node > 1:
        return alltoall_two_tier_s(library, payload_bytes, span, intra, inter) + call_s
    if per_node == 1:
        return collective_time_s(operation, library, payload_bytes, members, inter,
                                 algorithm) + call_s
    levels = _two_levels(operation, payload_bytes, span, intra, inter, algorithm)
    hops = (flat_ring_extra_hops(operation, library, span.nodes, span.per_node)
            if algorithm == DEFAULT_ALGORITHM else 0.0)
    protocols = nccl_protocols(operation, library, algorithm, intra, inter)
    if protocols == (None,):  # each level on its tier's own figures, a calibrated fit if any
        return (sum(collective_time_s(op, library, x, members, tier, level_algorithm)
                    for op, x, members, tier, level_algorithm in levels)
                + hops * intra.latency_s + call_s)
    # one protocol end to end (NCCL runs a collective on one), the quickest
    transfers = [(collective_transfer(op, library, x, members, level_algorithm), tier,
                  level_algorithm) for op, x, members, tier, level_algorithm in levels]
    return min(hops * protocol_link(intra, protocol)[1]
               + sum(transfer_time_s(transfer.bytes, transfer.messages,
                                     *protocol_link(tier, protocol, level_algorithm))
                     for transfer, tier, level_algorithm in transfers)
               for protocol in protocols) + call_s


def _two_levels(operation: str, payload_bytes: float, span: GroupSpan, intra: LinkTier,
                inter: LinkTier, algorithm: str
                ) -> tuple[tuple[str, float, int, LinkTier, str], ...]:
    """The steps of a group of k members in each of N > 1 nodes, as (operation, payload,
    members, tier, algorithm): all-reduce = reduce-scatter inside (k) + all-reduce across the
    nodes (N) of x/k + all-gather inside (k); all-gather = across (N) of x/k + inside (k);
    reduce-scatter = inside (k) + across (N) of x/k. The steps inside the nodes are rings,
    whatever the group's algorithm (group_collective_time_s)."""
    per_node, nodes = span.per_node, span.nodes
    shard, inside = payload_bytes / per_node, DEFAULT_ALGORITHM
    if operation == "allreduce":
        return (("reduce_scatter", payload_bytes, per_node, intra, inside),
                ("allreduce", shard, nodes, inter, algorithm),
                ("allgather", payload_bytes, per_node, intra, inside))
    if operation == "allgather":
        return (("allgather", shard, nodes, inter, algorithm),
                ("allgather", payload_bytes, per_node, intra, inside))
    return ((operation, payload_bytes, per_node, intra, inside),
            (operation, shard, nodes, inter, algorithm))

"""Point-to-point transfer time and the overlap of two activities (performance-model.md §2, §4).

Collectives (all-reduce, all-gather, ...) are priced in collectives.py on top of these."""

from __future__ import annotations

import functools


def transfer_time_s(bytes_moved: float, messages: float, bandwidth_bytes_per_s: float,
                    latency_s: float) -> float:
    """Time to move data over one NIC direction in several messages.

    Formula: T = bytes / B + messages · α
    Units: bytes, B in bytes/s, α in s -> seconds.
    Source: the α-β (Hockney) model; performance-model.md §2.
    """
    if bytes_moved <= 0 and messages <= 0:
        return 0.0
    return bytes_moved / bandwidth_bytes_per_s + messages * latency_s


@functools.lru_cache(maxsize=256)
def _merged_curve(points: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
    """`points` sorted by payload, the times at one payload averaged (once per curve)."""
    merged: dict[float, list[float]] = {}
    for x, t in points:
        merged.setdefault(float(x), []).append(float(t))
    return tuple(sorted((x, sum(ts) / len(ts)) for x, ts in merged.items()))


def measured_time_s(points: tuple[tuple[float, float], ...], payload_bytes: float) -> float:
    """An operation's time at `payload_bytes` from its measured (payload, seconds) points.

    Formula: linear interpolation between the two measured payloads around x; below the
    smallest, the smallest's time; beyond the largest, the line through the last two points,
    never below the last (an extrapolation). Points at the same payload are averaged.
    Units: bytes, (bytes, s) -> s.
    Source: measured on the testbed (issue 22): gloo's reduce-scatter among 3-4 ranks at 100
    Mbit/s took 29-59 ms at 1 KiB and 30-35 ms at 256 KiB, so the α-β line through the small
    messages' time and the large ones' slope priced 256 KiB at twice its measured time.
    """
    curve = _merged_curve(points)
    if payload_bytes <= curve[0][0] or len(curve) == 1:
        return curve[0][1]
    for (x0, t0), (x1, t1) in zip(curve, curve[1:]):
        if payload_bytes <= x1:
            return t0 + (t1 - t0) * (payload_bytes - x0) / (x1 - x0)
    (x0, t0), (x1, t1) = curve[-2], curve[-1]
    return max(t1, t1 + (t1 - t0) * (payload_bytes - x1) / (x1 - x0))


def overlapped_time_s(first_s: float, second_s: float, gamma: float) -> float:
    """Combined time of two activities that overlap imperfectly.

    Formula: (a^γ + b^γ)^(1/γ); γ = 1 is no overlap (a + b), γ → ∞ full overlap (max(a, b)).
    Units: seconds -> seconds.
    Source: performance-model.md §4 (γ-norm overlap coefficient, calibrated per cluster).
    """
    if gamma == float("inf"):
        return max(first_s, second_s)
    if first_s <= 0 or second_s <= 0:
        return max(first_s, second_s, 0.0)
    top = max(first_s, second_s)
    combined: float = top * ((first_s / top) ** gamma + (second_s / top) ** gamma) ** (1.0 / gamma)
    return combined


def overlap_contention_s(hidden_s: float, slowdown: float) -> float:
    """The extra time of compute that ran beside `hidden_s` seconds of communication on a
    device whose compute is `slowdown` (κ) slower under a concurrent collective.

    Formula: over the hidden stretch the compute advances hidden / (1 + κ) of its work, so the
    rest of it finishes κ / (1 + κ) · hidden later: hidden · κ / (1 + κ).
    Units: s, ratio -> s.
    Source: Lee et al., arXiv 2507.03114 (2025), compute slowed 18.9 % on average while a
    collective overlaps it (system/gpu.GPU_OVERLAP_SLOWDOWN).
    """
    if hidden_s <= 0 or slowdown <= 0:
        return 0.0
    return hidden_s * slowdown / (1.0 + slowdown)


def exposed_with_contention_s(communication_s: float, exposed_s: float,
                              slowdown: float) -> float:
    """What an overlapped collective of `communication_s` costs the step when `exposed_s` of
    it outlasts the compute beside it: the exposed part, plus the compute's slowdown over the
    hidden rest (overlap_contention_s). Every overlap the model prices (data-parallel buckets
    and ZeRO-3 prefetch, tensor-parallel chunks, ring attention, pipeline sends) goes through
    here, and the contention is counted in the part of the collective that causes it."""
    return exposed_s + overlap_contention_s(communication_s - exposed_s, slowdown)


def chunked_exposed_s(communication_s: float, compute_s: float, chunks: int) -> float:
    """Communication left exposed when it runs in `chunks` pieces beside a computation cut
    the same way, each piece travelling while the computation works on another.

    Formula: max(T_c / k, T_c − T_x · (k − 1)/k) for k chunks (T_c / k at least: one piece
    always waits, the last of a bucketed backward's gradients or the first of a chunked
    all-gather); T_c for k ≤ 1.
    Units: s, s, count -> s.
    Source: Li et al., "PyTorch Distributed", VLDB 2020 (bucketed all-reduce beside the
    backward pass); Wang et al., "Overlap Communication with Dependent Computation via
    Decomposition", ASPLOS 2023 (a collective and its GEMM decomposed into tp chunks, as
    Transformer Engine's userbuffers and PyTorch's async tensor parallelism run them).
    """
    if chunks <= 1:
        return communication_s
    return max(communication_s / chunks,
               communication_s - compute_s * (chunks - 1) / chunks)


"""Point-to-point transfer time and the overlap of two activities (performance-model.md §2, §4).

Collectives (all-reduce, all-gather, ...) are priced in collectives.py on top of these."""

from __future__ import annotations


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

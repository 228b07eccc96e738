"""What every calibration benchmark rank does first, and the one compute step two of them time.

A rank (netbench, overlap, stragglers; started by calibrate/network.run_ranks) imports torch,
then joins its testbed host's cgroup if the placement deferred the join (so torch's import is
not throttled by the quota; runtime/placement.join_cgroup), runs one thread, and joins the gloo
group of the ranks that run_ranks started.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any


def start_rank(timeout_s: float) -> tuple[Any, Any]:
    """(torch, torch.distributed) once this process is in its cgroup, on one thread, in the
    gloo process group (rendezvous from the environment run_ranks sets)."""
    import torch
    import torch.distributed as dist

    from dnnscale.runtime.placement import join_cgroup

    join_cgroup()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    return torch, dist


def linear_sgd_step(width: int, batch: int) -> Callable[[], None]:
    """One replica-like compute step: forward, backward and an SGD update (lr 1e-3) of a
    width × width linear layer on `batch` random samples, loss mean(y²)."""
    import torch

    layer = torch.nn.Linear(width, width)
    x = torch.randn(batch, width)

    def step() -> None:
        layer.zero_grad()
        layer(x).square().mean().backward()
        with torch.no_grad():
            for p in layer.parameters():
                p.add_(p.grad, alpha=-1e-3)

    return step

"""Vertical partitioning: P = 2 and 3 workers give the unpartitioned network's output and
gradients, with conv layers split by channels, by row stripes, and mixed (3 real gloo
processes; the P = 2 runs use ranks 0-1 of the same world)."""

from __future__ import annotations

import multiprocessing
import os
from datetime import timedelta
from pathlib import Path

import pytest

from dnnscale.runtime.launch import free_port
from dnnscale.workload.splits import split_sizes
from dnnscale.runtime.layout import split_offsets
from dnnscale.workload import build_workload

LAYERS = [  # uneven splits over 2 and 3 workers; windows that cross stripe boundaries
    {"kind": "conv2d", "name": "c1", "out_channels": 6, "kernel": 3, "padding": 1},  # 6x12x12
    {"kind": "relu"}, {"kind": "maxpool2d", "kernel": 3, "stride": 2, "padding": 1},  # 6x6x6
    {"kind": "conv2d", "name": "c2", "out_channels": 5, "kernel": 3, "padding": 1},  # 5x6x6
    {"kind": "relu"}, {"kind": "avgpool2d", "kernel": 3, "stride": 1, "padding": 1},
    {"kind": "flatten"},
    {"kind": "linear", "name": "fc1", "out_features": 7}, {"kind": "relu"},
    {"kind": "linear", "name": "fc2", "out_features": 4}, {"kind": "softmax_loss"},
]
SPLITS = {"channels": "channels", "rows": "rows", "rows-then-channels":
          {"c1": "rows", "c2": "channels"}, "channels-then-rows": {"c1": "channels", "c2": "rows"}}
SEED = 3


def _workload():  # type: ignore[no-untyped-def]
    return build_workload("tinyconv", [2, 12, 12], LAYERS, samples_per_epoch=100)


def _inputs():  # type: ignore[no-untyped-def]
    import torch

    generator = torch.Generator().manual_seed(11)
    return torch.randn(5, 2, 12, 12, generator=generator), torch.tensor([0, 1, 2, 3, 1])


def _rank(rank: int, port: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from dnnscale.runtime.netplan import weighted_schemes
    from dnnscale.runtime.network import PartitionComm, PartitionedNet

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=3, timeout=timedelta(seconds=30))
    groups = {2: dist.new_group([0, 1]), 3: dist.new_group([0, 1, 2])}
    x, y = _inputs()
    for parts, group in groups.items():
        if rank >= parts:
            continue
        for name, split in SPLITS.items():
            comm = PartitionComm(group, rank, parts, list(range(parts)))
            net = PartitionedNet(_workload(), comm, SEED, weighted_schemes(_workload(), split))
            logits = net(x)
            torch.nn.functional.cross_entropy(logits, y).backward()
            net.sync_shared_grads()
            torch.save({"logits": logits.detach(), "grads": [p.grad for p in net.parameters()],
                        "comm_s": comm.seconds},
                       os.path.join(out_dir, f"{name}_p{parts}_r{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_partitioned_forward_and_backward_equal_the_whole_network(tmp_path: Path) -> None:
    import torch

    from dnnscale.runtime.netplan import weighted_schemes
    from dnnscale.runtime.network import PartitionComm, PartitionedNet

    ctx = multiprocessing.get_context("spawn")
    port = free_port("127.0.0.1")
    procs = [ctx.Process(target=_rank, args=(r, port, str(tmp_path))) for r in range(3)]
    try:
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(75)
        assert [proc.exitcode for proc in procs] == [0, 0, 0]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()

    torch.set_num_threads(1)
    whole = PartitionedNet(_workload(), PartitionComm(None, 0, 1), SEED)
    x, y = _inputs()
    logits = whole(x)
    torch.nn.functional.cross_entropy(logits, y).backward()
    whole_grads = [p.grad for p in whole.parameters()]  # c1.w, c1.b, c2.w, c2.b, fc1.w, ...
    extents = [6, 6, 5, 5, 7, 7, 4, 4]
    conv_params = {0: "c1", 1: "c1", 2: "c2", 3: "c2"}  # parameter index -> conv layer
    for name, split in SPLITS.items():
        schemes = weighted_schemes(_workload(), split)
        for parts in (2, 3):
            for rank in range(parts):
                got = torch.load(tmp_path / f"{name}_p{parts}_r{rank}.pt")
                where = f"{name}, P={parts}, worker {rank}"
                torch.testing.assert_close(got["logits"], logits, atol=1e-5, rtol=0, msg=where)
                assert got["comm_s"] > 0
                assert len(got["grads"]) == len(whole_grads)
                for i, (grad, full, extent) in enumerate(zip(got["grads"], whole_grads, extents)):
                    if schemes.get(conv_params.get(i, "")) == "rows":
                        expected = full  # whole kernel on every worker, gradients summed
                    else:
                        sizes = split_sizes(extent, parts)
                        start = split_offsets(sizes)[rank]
                        expected = full[start:start + sizes[rank]]
                    torch.testing.assert_close(grad, expected, atol=1e-5, rtol=0,
                                               msg=f"{where}, parameter {i}")

"""The tiny two-layer workload and cluster whose every model term the tests compute by hand.

Workload: input 1x4x4 -> conv2d 1->2, 3x3, pad 1 (output 2x4x4) -> flatten (32) -> linear 32->3.
  params: conv 2·1·3·3 + 2 = 20, linear 32·3 + 3 = 99, W = 119
  FLOPs per sample: conv fwd 2·2·4·4·3·3·1 = 576, conv input-grad 0 (first layer), conv
  weight-grad 576; linear fwd = input-grad = weight-grad = 2·32·3 = 192.
System: 1 core at a constant 1 GFLOP/s, memory bandwidth 1 TB/s (compute bound everywhere),
  NIC 1 MB/s with 100 µs latency, 1 µs per parameter update, 1 GB memory, 16 machines.
"""

from __future__ import annotations

from dnnscale.system import System, Device, LinkTier, RateCurve
from dnnscale.workload import Workload, build_workload

FLOPS_PER_S = 1e9
BANDWIDTH_BYTES_PER_S = 1e6
LATENCY_S = 1e-4
UPDATE_S_PER_PARAM = 1e-6


def tiny_workload() -> Workload:
    return build_workload("tiny", [1, 4, 4], [
        {"kind": "conv2d", "name": "conv", "out_channels": 2, "kernel": 3, "padding": 1},
        {"kind": "flatten", "name": "flatten"},
        {"kind": "linear", "name": "fc", "out_features": 3},
    ], samples_per_epoch=1000)


def tiny_machine(cores: float = 1.0, update_s_per_param: float = UPDATE_S_PER_PARAM,
                 flops_per_s: float = FLOPS_PER_S) -> Device:
    return Device(cores=cores, memory_bytes=1e9, memory_bandwidth_bytes_per_s=1e12,
                       flops_per_s_per_core={"default": RateCurve.constant(flops_per_s)},
                       update_s_per_param=update_s_per_param)


def tiny_cluster(machines: int = 16, ps_machine: Device | None = None,
                 bandwidth_bytes_per_s: float = BANDWIDTH_BYTES_PER_S,
                 gamma: float = float("inf")) -> System:
    return System(name="tiny", machines=machines, machine=tiny_machine(),
                   network=LinkTier(bandwidth_bytes_per_s, LATENCY_S), ps_machine=ps_machine,
                   overlap_gamma=gamma)

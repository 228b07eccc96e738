"""The device layer of the GPU calibration: tensors, a timer and synchronisation.

The measuring code (calibrate/gpu.py) sees only this interface, so the whole pipeline runs on
any of three devices:

- `CudaDevice`: the real one. Device time per call from CUDA events around back-to-back calls;
  before each sample a `torch.cuda._sleep` spin kernel holds the GPU while the host queues the
  calls, so the events time the kernels alone and not the host's launch rate (without
  `_sleep`, plain back-to-back calls). The fastest of several samples counts (noise only slows
  a sample down; calibrate/timing.py's rule).
- `CpuDevice`: the same kernels on the CPU, wall clock (calibrate/timing.py `call_time_s`);
  for the CPU dry run of benchmarks/gpu_check.py.
- `SyntheticDevice`: tensors on torch's "meta" device (shapes, no data: every kernel's code
  runs at full size in no time) and times from a known roofline, max(F / (peak·η(F)),
  Q / (B·η_mem(Q))) — the tests check that calibration recovers the η it was given.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from dnnscale.calibrate.gpu_kernels import COMPUTE_CLASSES, OPTIMIZER, Kernel
from dnnscale.errors import InputError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32,
          "fp32": torch.float32}
MAX_CALLS = 100
"""Calls per timing sample at most (the CUDA launch queue holds about a thousand kernels)."""
MAX_SLEEP_S = 0.5


class TorchDevice:
    """A tensor factory on `device` in the precision being measured (`use`)."""

    def __init__(self, device: Any, name: str) -> None:
        self.device = torch.device(device)
        self.name = name
        self.dtype = torch.bfloat16
        self.timing = "wall clock"

    def use(self, precision: str) -> None:
        if precision not in DTYPES:
            raise InputError("calibrate.precision", f"must be one of {', '.join(DTYPES)}, got "
                             f"{precision!r}")
        self.dtype = DTYPES[precision]

    def tensor(self, shape: tuple[int, ...], requires_grad: bool = False,
               dtype: Any = None) -> Any:
        out = torch.randn(shape, device=self.device, dtype=dtype or self.dtype)
        return out.requires_grad_(True) if requires_grad else out

    def tokens(self, high: int, shape: tuple[int, ...]) -> Any:
        return torch.randint(0, high, shape, device=self.device)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def host_time_s(self, fn: Callable[[], object], calls: int) -> float:
        """Host seconds per call of `fn` over `calls` calls in a row (the fastest of 3)."""
        fn()
        self.synchronize()
        best = math.inf
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - start) / calls)
            self.synchronize()
        return best

    def device_time_s(self, kernel: Kernel, fn: Callable[[], object], samples: int,
                      sample_s: float) -> float:
        raise NotImplementedError

    def free_memory_bytes(self) -> float | None:
        return None


class CpuDevice(TorchDevice):
    """The kernels on this machine's CPU (fp32), wall-clock timed."""

    def __init__(self) -> None:
        import platform

        super().__init__("cpu", platform.processor() or "cpu")

    def device_time_s(self, kernel: Kernel, fn: Callable[[], object], samples: int,
                      sample_s: float) -> float:
        from dnnscale.calibrate.timing import call_time_s

        return call_time_s(fn, samples=samples, sample_s=sample_s, warmup=1,
                           clock=time.perf_counter)


class CudaDevice(TorchDevice):
    """One CUDA device; times from CUDA events with the queue filled ahead (see module doc)."""

    def __init__(self, device: Any) -> None:
        super().__init__(device, torch.cuda.get_device_name(device))
        torch.cuda.set_device(self.device)
        self._sleep = getattr(torch.cuda, "_sleep", None)
        self.cycles_per_s = self._clock() if self._sleep is not None else None
        self.timing = ("cuda events, queue filled behind a spin kernel" if self.cycles_per_s
                       else "cuda events, back-to-back calls")

    def _clock(self) -> float | None:
        """Cycles per second of `torch.cuda._sleep` (the GPU's clock), timed with events."""
        cycles = 2_000_000
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        assert self._sleep is not None
        self._sleep(cycles)
        start.record()
        self._sleep(cycles)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
        return cycles / seconds if seconds > 0 else None

    def _hold(self, seconds: float) -> None:
        if self._sleep is not None and self.cycles_per_s:
            self._sleep(int(min(seconds, MAX_SLEEP_S) * self.cycles_per_s))

    def device_time_s(self, kernel: Kernel, fn: Callable[[], object], samples: int,
                      sample_s: float) -> float:
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        fn()
        self.synchronize()
        begin = time.perf_counter()
        fn()
        host_s = time.perf_counter() - begin          # queued on an idle device: host time
        self.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        single_s = max(start.elapsed_time(end) / 1e3, 1e-7)
        calls = max(1, min(MAX_CALLS, int(sample_s / single_s)))
        best = math.inf
        for _ in range(samples):
            self._hold(1.5 * host_s * calls + 1e-4)
            start.record()
            begin = time.perf_counter()
            for _ in range(calls):
                fn()
            host_s = max(host_s, (time.perf_counter() - begin) / calls)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3 / calls)
        return best

    def free_memory_bytes(self) -> float | None:
        free, _ = torch.cuda.mem_get_info(self.device)
        return float(free)


@dataclass
class Roofline:
    """The synthetic device's truth: peak FLOP/s and bandwidth, η per kernel class over FLOPs,
    η of memory traffic and of the optimizer step over bytes, host seconds per launch."""

    peak_flops_per_s: float
    bandwidth_bytes_per_s: float
    efficiency: dict[str, Callable[[float], float]]
    memory_efficiency: Callable[[float], float]
    optimizer_efficiency: Callable[[float], float]
    launch_s: float
    calls: list[str] = field(default_factory=list)

    def seconds(self, kernel: Kernel) -> float:
        memory = self.optimizer_efficiency if kernel.kernel_class == OPTIMIZER else \
            self.memory_efficiency
        memory_s = (kernel.bytes_moved / (self.bandwidth_bytes_per_s * memory(kernel.bytes_moved))
                    if kernel.bytes_moved > 0 else 0.0)
        if kernel.kernel_class in COMPUTE_CLASSES and kernel.flops > 0:
            eta = self.efficiency[kernel.kernel_class](kernel.flops)
            return max(kernel.flops / (self.peak_flops_per_s * eta), memory_s)
        return memory_s


class SyntheticDevice(TorchDevice):
    """Meta tensors and `roofline`'s times: every kernel's code runs (on shapes only), its time
    is the roofline's."""

    def __init__(self, roofline: Roofline) -> None:
        super().__init__("meta", "synthetic roofline")
        self.roofline = roofline
        self.timing = "synthetic roofline"

    def tokens(self, high: int, shape: tuple[int, ...]) -> Any:
        return torch.empty(shape, device=self.device, dtype=torch.long)

    def host_time_s(self, fn: Callable[[], object], calls: int) -> float:
        fn()
        return self.roofline.launch_s

    def device_time_s(self, kernel: Kernel, fn: Callable[[], object], samples: int,
                      sample_s: float) -> float:
        fn()
        self.roofline.calls.append(kernel.label)
        return self.roofline.seconds(kernel)


FORM_FACTOR_WORDS = frozenset({"PCIE", "NVL"})
"""Form factors NVIDIA's CUDA names state ('NVIDIA H100 PCIe', 'NVIDIA H100 NVL'); an SXM
part's name states none ('NVIDIA H100 80GB HBM3'), so a preset of one of these form factors
is the GPU only when its name says so."""


def device_preset_for(torch_name: str, memory_bytes: float, known: list[str]) -> str:
    """The devices.yaml name of a GPU torch calls `torch_name` ('NVIDIA H200' ->
    'H200-SXM-141GB'): among the known devices whose model (the name up to its first '-') is
    a word of `torch_name` and whose form factor (FORM_FACTOR_WORDS) the name states if they
    have one, the one with the most name parts among its words, then the fewest parts not
    among them ('Tesla V100-SXM3-32GB' is not V100-SXM3-32GB-H), then the closest in memory
    size; InputError when none is."""
    words = set(torch_name.replace("-", " ").upper().split())
    matches = [name for name in known if name.split("-")[0].upper() in words
               and FORM_FACTOR_WORDS & set(name.upper().split("-")) <= words]
    if not matches:
        raise InputError("--as", f"cannot tell which of {', '.join(sorted(known))} the GPU "
                         f"{torch_name!r} is; name it with --as")
    if len(matches) == 1:
        return matches[0]
    from dnnscale.system.gpu import gpu_device

    def rank(name: str) -> tuple[int, int, float]:
        parts = name.upper().split("-")
        found = sum(part in words for part in parts)
        return (-found, len(parts) - found,
                abs(gpu_device(name, None).memory_bytes - memory_bytes))

    return min(matches, key=rank)

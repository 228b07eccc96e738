"""GPU clusters from node presets: `dgx-a100-80g:64` is 64 DGX A100 nodes.

A node preset (presets/nodes/NAME.yaml) names a device (presets/devices.yaml), the link inside
the node and the one between nodes (presets/interconnects.yaml), and how many compute NICs a
node has. The System it becomes has one Device per GPU, an intra-node tier at the GPU's NVLink
bandwidth and an inter-node tier at each GPU's share of the node's NICs (all GPUs of a node
send at once in data- and pipeline-parallel traffic). Achieved efficiencies come from a GPU
profile (system/gpu_profile.py): the device's own under presets/profiles/, else none — then the
system is marked uncalibrated and a documented default efficiency applies.
"""

from __future__ import annotations

import functools
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from dnnscale.errors import InputError, require_int, short_repr
from dnnscale.system.curve import RateCurve
from dnnscale.system.device import Device, device_family
from dnnscale.system.gpu_profile import GpuProfile, curve_key, load_gpu_profile
from dnnscale.system.microbenchmarks import published_efficiency
from dnnscale.system.preset_files import (device_peaks, preset_table, presets_folder,
                                          read_preset)
from dnnscale.system.system import System
from dnnscale.system.topology import LinkTier
from dnnscale.units import parse_quantity

MAX_NODES = 1_000_000

GEMM_START_UP_S = 15e-6
"""The fixed time a GEMM kernel pays beyond its FLOPs at its large-size rate: a GEMM of F FLOPs
takes F / (peak · η) + GEMM_START_UP_S, i.e. η(F) = η · F / (F + F_½) with
F_½ = GEMM_START_UP_S · peak · η (system/curve.saturating). Launch, the first wave's ramp and
the last wave's tail do not shrink with the GEMM.
Source: the calibrated A100 profile (presets/profiles/A100-SXM4.yaml, fitted by
benchmarks/vtrain.py on vTrain's single-node rows): η_max 0.859 at F_½ = 10^9.606 FLOP, i.e.
4.04e9 / (0.859 · 312e12 FLOP/s) = 15.1 µs. Checked against DeepBench's V100 GEMMs (CUDA 10.1,
baidu-research/DeepBench results/train/DeepBench_NV_V100.xlsx, FP16 sheet): with V100's
published 76 %, it gives 0.33 / 0.41 / 0.57 / 0.59 of peak at 1.1 / 1.7 / 4.3 / 5.0 GFLOP where
DeepBench measured 0.28 / 0.37 / 0.51 / 0.54 (2048x128x2048, 2560x128x2560, 4096x128x4096,
7680x128x2560), and 0.74 at 43 GFLOP against 0.72-0.78 (1760x7000x1760)."""

GPU_SPEED_SPREAD = 0.08 / 5.396
"""σ of ln(speed) across GPUs of one SKU: 1.48 %. Sinha et al., "Not All GPUs Are Created
Equal: Characterizing Variability in Large-Scale, Accelerator-Rich Systems", SC'22 (arXiv
2208.11035): 8 % average performance variation across the V100s of Summit, Vortex and
Longhorn (max 22 %, outliers up to 1.5x slower than the median GPU), where their artifact's
analysis script defines the variation as the box plot's whisker span over the median,
(Q3 + 1.5 IQR − (Q1 − 1.5 IQR)) / median = 4 IQR / median (hal-uw/gpu_variability_sc22_artifact,
plot_script/plot_aggregated.py); for a normal spread 4 IQR = 4 · 1.349 σ = 5.396 σ. Outliers are
left out (an operator drains them), so this is the body of the spread only."""

GPU_OVERLAP_SLOWDOWN = 0.189
"""κ: compute on a GPU runs 18.9 % longer while a collective overlaps it. Lee et al.,
"Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning:
Performance and Power Implications" (arXiv 2507.03114, 2025): across GPT and LLaMA training on
4 A100s, H100s, MI250s and MI210s, overlapping computation with communication slowed the
computation by 18.9 % on average (40.0 % at most) against the same computation alone; run one
after the other instead, the step was 10.2 % slower on average than overlapped."""

DEFAULT_GEMM_FRACTION = 0.6
"""The achieved fraction of peak of a large GEMM on a device no benchmark has measured."""

DEFAULT_EFFICIENCY = GpuProfile(
    device="(default)", efficiency={"gemm": RateCurve.constant(DEFAULT_GEMM_FRACTION),
                                    "attention": RateCurve.constant(0.4)},
    memory_efficiency=RateCurve.constant(0.7), launch_s=1e-5, launch_contention=0.0,
    intra_node_efficiency=0.8, inter_node_efficiency=0.9, collective_latency_s=1e-5,
    source=f"UNCALIBRATED defaults: 60 % of peak for large GEMMs (a smaller one pays a "
           f"{GEMM_START_UP_S * 1e6:.0f} us start-up), 40 % for attention matmuls, 70 % of HBM "
           "bandwidth, 10 us to launch a kernel, 80 % / 90 % of the NVLink / NIC rate in "
           "collectives")
"""What an uncalibrated device achieves: round figures, flagged wherever they are used."""

GEMM_CURVE_FLOPS = (1e6, 1e13)
"""The FLOP range a published GEMM curve is sampled over (as calibrate/gpu_fit.FitSpace's)."""


def published_gemm_curve(fraction: float, peak_flops_per_s: float) -> RateCurve:
    """η of a GEMM by its FLOPs on a device whose large GEMMs reach `fraction` of its
    `peak_flops_per_s`: saturating at `fraction`, half of it at F_½ = GEMM_START_UP_S · peak ·
    fraction, so that the GEMM takes F / (peak · fraction) + GEMM_START_UP_S on that device.
    Units: fraction, FLOP/s -> RateCurve over FLOP per call."""
    half_flops = GEMM_START_UP_S * peak_flops_per_s * fraction
    return RateCurve.saturating(fraction, half_flops, *GEMM_CURVE_FLOPS)


@functools.cache
def uncalibrated_profile(device_name: str) -> GpuProfile:
    """What an uncalibrated `device_name` achieves: DEFAULT_EFFICIENCY, with the GEMM
    efficiency of each precision and the memory efficiency a published microbenchmark measured
    on its family where there is one (system/microbenchmarks.py). Each precision's GEMM
    efficiency (the published one; else the base precision's times a published side-by-side
    ratio, as FP8 over BF16 on H100; else DEFAULT_GEMM_FRACTION) is the large-size rate of a
    curve that falls for small GEMMs (`published_gemm_curve`)."""
    published = published_efficiency(device_name)
    peaks = device_peaks(device_name)
    fractions = {precision: (published.gemm if published else {}).get(
        precision, DEFAULT_GEMM_FRACTION) for precision in peaks}
    base = published.relative_base if published else None
    relative = ({} if published is None or base not in fractions else
                {precision: ratio for precision, ratio in published.relative_gemm.items()
                 if precision in fractions and precision not in published.gemm})
    fractions.update({precision: fractions[str(base)] * ratio
                      for precision, ratio in relative.items()})
    curves = dict(DEFAULT_EFFICIENCY.efficiency)
    curves.update({curve_key("gemm", precision): published_gemm_curve(eta, peaks[precision])
                   for precision, eta in sorted(fractions.items())})
    if published is None:
        return replace(DEFAULT_EFFICIENCY, efficiency=curves)
    memory = (RateCurve.constant(published.memory) if published.memory is not None
              else DEFAULT_EFFICIENCY.memory_efficiency)
    figures = [f"large GEMMs at {100 * eta:.0f} % in {precision}"
               for precision, eta in sorted(published.gemm.items())]
    figures += [f"{precision} GEMMs at {ratio:.3f} x the {base} fraction of peak (their "
                "published speeds side by side)" for precision, ratio in sorted(relative.items())]
    if published.memory is not None:
        figures.append(f"memory-bound kernels at {100 * published.memory:.0f} % of HBM "
                       "bandwidth")
    return replace(
        DEFAULT_EFFICIENCY, device=f"(published, {published.family})", efficiency=curves,
        memory_efficiency=memory,
        source=f"UNCALIBRATED published figures: a microbenchmark of {published.measured_on} "
               f"puts {'; '.join(figures)}; otherwise {DEFAULT_EFFICIENCY.source}")


def node_preset_names() -> list[str]:
    folder = presets_folder() / "nodes"
    return sorted(item.name[:-5] for item in folder.iterdir() if item.name.endswith(".yaml"))


def inter_node_link_names() -> list[str]:
    """The interconnects of presets/interconnects.yaml that join nodes (IB, RoCE, TCP)."""
    return sorted(key for key, facts in preset_table("interconnects").items()
                  if isinstance(facts, dict) and facts.get("kind") == "inter_node")


@functools.cache
def _node(name: str) -> dict[str, Any]:
    data = read_preset(presets_folder() / "nodes" / f"{name}.yaml")
    if not isinstance(data, dict):
        raise ValueError(f"node preset {name!r}: the file is not a mapping")
    return data


def default_profile_path(device: str) -> Path | None:
    """The packaged GPU profile of `device` (e.g. A100-SXM4-80GB), else of its family
    (device_family: A100-SXM4, the same chip in either memory size), if one exists."""
    for name in (device, device_family(device)):
        item = presets_folder() / "profiles" / f"{name}.yaml"
        if name and item.is_file():
            return Path(str(item))
    return None


def gpu_device(device_name: str, profile: GpuProfile | None) -> Device:
    """A Device for one accelerator of presets/devices.yaml with `profile`'s efficiencies."""
    devices = preset_table("devices")
    if device_name not in devices:
        raise InputError("cluster.device", f"unknown device {device_name!r} (known: "
                         f"{', '.join(sorted(devices))})")
    facts = devices[device_name]
    where = f"devices.{device_name}"
    peaks = device_peaks(device_name)
    eff = profile or uncalibrated_profile(device_name)
    return Device(cores=1.0,
                  memory_bytes=parse_quantity(facts.get("memory_reported", facts["memory"]),
                                              "bytes", f"{where}.memory"),
                  memory_bandwidth_bytes_per_s=parse_quantity(facts["memory_bandwidth"],
                                                              "bandwidth", f"{where}.bandwidth"),
                  flops_per_s_per_core={"default": RateCurve.constant(peaks.get("fp32", 1.0))},
                  update_s_per_param=0.0, kind="gpu", name=device_name, peak_flops_per_s=peaks,
                  efficiency=dict(eff.efficiency), memory_efficiency=eff.memory_efficiency,
                  launch_s=eff.launch_s, launch_contention=eff.launch_contention,
                  pipeline_step_s=eff.pipeline_step_s, speed_spread=GPU_SPEED_SPREAD,
                  overlap_slowdown=GPU_OVERLAP_SLOWDOWN)


def _link_facts(key: str, where: str) -> tuple[float, float]:
    """(bandwidth in bytes/s per direction, latency in s) of interconnect `key` as the spec
    gives it: one GPU's NVLink total inside a node, one NIC port between nodes."""
    links = preset_table("interconnects")
    if key not in links:
        raise InputError(where, f"unknown interconnect {key!r} (known: {', '.join(sorted(links))})")
    facts = links[key]
    bandwidth = parse_quantity(facts["bandwidth"], "bandwidth", f"interconnects.{key}.bandwidth")
    latency = parse_quantity(facts.get("latency", 0), "time", f"interconnects.{key}.latency")
    return bandwidth, latency


def _tier(bandwidth_bytes_per_s: float, latency_s: float, name: str, efficiency: float,
          share: float = 1.0, hardware: str = "",
          protocols: tuple[str, ...] = ()) -> LinkTier:
    """The tier one device sees: its `share` of the links' line rate at the achieved
    `efficiency` (the one place a link's spec becomes the model's bandwidth), with NCCL's
    class of the link and the protocols its rings may pick (model/collectives.NCCL_PROTOCOLS)."""
    return LinkTier(bandwidth_bytes_per_s * share * efficiency, latency_s, name,
                    hardware=hardware, protocols=protocols)


def intra_node_hardware(intra_node_key: str) -> str:
    """NCCL's class of a node's GPU-to-GPU link (model/collectives.NCCL_PROTOCOLS): 'nvlink'
    for the NVLink interconnects (their keys say so), else 'pci'."""
    return "nvlink" if intra_node_key.startswith("nvlink") else "pci"


def enabled_nccl_protocols(intra_hardware: str) -> tuple[str, ...]:
    """The protocols NCCL's rings may run on a node whose GPUs are joined by `intra_hardware`:
    LL, LL128 and Simple where the GPUs share NVLink, LL and Simple otherwise (NVIDIA/nccl
    src/graph/tuning.cc enables LL128 only where the intra-node path is NVLink)."""
    return ("LL", "LL128", "Simple") if intra_hardware == "nvlink" else ("LL", "Simple")


def gpu_system(preset: str, nodes: int, profile: GpuProfile | None = None,
               inter_node: str | None = None, nics_per_node: int | None = None,
               inter_node_bandwidth_bytes_per_s: float | None = None,
               inter_node_latency_s: float | None = None, name: str | None = None) -> System:
    """`nodes` nodes of node preset `preset`; `profile` overrides the device's packaged one;
    `inter_node` (an interconnect key) / `nics_per_node` replace the preset's network between
    nodes, and `inter_node_bandwidth_bytes_per_s` (one NIC port's line rate, per direction) /
    `inter_node_latency_s` (per hop) replace that interconnect's figures. Each GPU gets its
    share (nics_per_node / devices_per_node) of the node's ports at the profile's
    inter-node efficiency, as for the presets' own links."""
    if preset not in node_preset_names():
        raise InputError("cluster", f"unknown GPU node preset {preset!r} (known: "
                         f"{', '.join(node_preset_names())})")
    nodes = require_int("cluster.nodes", nodes)
    if nodes > MAX_NODES:
        raise InputError("cluster.nodes", f"at most {MAX_NODES:,} nodes, got {nodes:,}")
    facts = _node(preset)
    device_name = str(facts["device"])
    calibrated = profile is not None
    if profile is None:
        path = default_profile_path(device_name)
        if path is not None:
            profile, calibrated = load_gpu_profile(path), True
    eff = profile or uncalibrated_profile(device_name)
    per_node = int(facts["devices_per_node"])
    nics = nics_per_node if nics_per_node is not None else int(facts.get("nics_per_node", per_node))
    intra_key = str(facts["intra_node"])
    hardware = intra_node_hardware(intra_key)
    protocols = enabled_nccl_protocols(hardware)
    intra = _tier(*_link_facts(intra_key, "cluster.intra_node"), intra_key,
                  eff.intra_node_efficiency, hardware=hardware, protocols=protocols)
    key = inter_node or str(facts["inter_node"])
    bandwidth, latency = _link_facts(key, "cluster.inter_node")
    if inter_node_bandwidth_bytes_per_s is not None:
        bandwidth = inter_node_bandwidth_bytes_per_s
    if inter_node_latency_s is not None:
        latency = inter_node_latency_s
    custom = inter_node_bandwidth_bytes_per_s is not None or inter_node_latency_s is not None
    inter = _tier(bandwidth, latency, "custom" if custom else key,
                  eff.inter_node_efficiency, share=nics / per_node, hardware="net",
                  protocols=protocols)
    price = facts.get("price_per_device_hour")
    label = name if name is not None else f"{preset}:{nodes}"
    network = (f"; between nodes {nics} NIC ports of {bandwidth * 8 / 1e9:.4g} Gbit/s per node, "
               f"{latency * 1e6:.3g} us per hop" if custom or nics_per_node is not None
               or inter_node is not None else "")
    return System(name=label, machines=nodes * per_node, machine=gpu_device(device_name, profile),
                  network=inter, devices_per_node=per_node, intra_node=intra,
                  collective_library="nccl", collective_call_s=eff.collective_latency_s,
                  calibrated=calibrated,
                  description=f"{nodes} x {facts.get('description', preset)}" + network
                  + ("" if calibrated else " (efficiencies UNCALIBRATED: " + eff.source + ")"),
                  profile_source=eff.source,
                  price_per_device_hour=float(price) if price is not None else None)


def preset_devices_per_node(name: str) -> int:
    """The GPUs in one node of the node preset `name`."""
    return int(_node(name)["devices_per_node"])


def bare_preset_note(text: str) -> str | None:
    """The note for a GPU node preset named without its node count ('dgx-a100-80g' is one
    node), else None."""
    if ":" in text or text not in node_preset_names():
        return None
    return f"{text} means 1 node ({preset_devices_per_node(text)} GPUs); write {text}:N for N nodes"


def parse_gpu_cluster(text: str) -> tuple[str, int] | None:
    """'dgx-a100-80g:64' -> ('dgx-a100-80g', 64); a bare node preset name -> (name, 1); None when
    `text` names no node preset."""
    name, colon, count = text.partition(":")
    if name not in node_preset_names():
        return None
    if not colon:
        return name, 1
    if not re.fullmatch(r"-?[0-9]{1,30}", count):  # int() would take '1_0', ' 8', '+8', '８'
        raise InputError("cluster", f"{short_repr(text)}: the number of nodes after ':' must "
                         f"be an integer in decimal digits")
    return name, int(count)

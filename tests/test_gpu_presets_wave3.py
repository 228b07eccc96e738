"""Issue 23's spec-sheet presets: V100 16 GB (DGX-1), the DGX-2 and DGX-2H V100 SXM3, P100
(DGX-1 Pascal), H100 PCIe, H100 NVL and H800, their node presets and new intra-node links,
checked against figures computed by hand from the spec sheets, and run through the model.

The schema, units and sources of every preset are tests/test_gpu_preset_data.py's; this file
holds the arithmetic of the new ones (per-direction NVLink = links x per-link rate, dense =
half the sparse figure, DGX-2/2H per-GPU peaks from the system totals) and what the model
makes of them (tiers, refused precisions, the CLI).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import dnnscale
from dnnscale.cli import app
from dnnscale.errors import InputError
from dnnscale.system.attention_kernels import kernel_figures
from dnnscale.system.gpu import DEFAULT_EFFICIENCY, gpu_system
from dnnscale.units import parse_quantity

PRESETS = Path(__file__).resolve().parents[1] / "src" / "dnnscale" / "system" / "presets"
DEVICES = yaml.safe_load((PRESETS / "devices.yaml").read_text())
LINKS = yaml.safe_load((PRESETS / "interconnects.yaml").read_text())
GiB = 2**30
MiB = 2**20


def _flops(device: str, precision: str) -> float:
    return parse_quantity(DEVICES[device]["peak_flops"][precision], "flops", precision)


def _bw(entry: dict[str, Any], field: str) -> float:
    return parse_quantity(entry[field], "bandwidth", field)


# --- devices.yaml: the arithmetic of the spec sheets ----------------------------------------------


def test_nvlink_per_direction_is_links_times_the_link_rate() -> None:
    # P100: NVLink 1, 4 links x 20 GB/s = 80 GB/s per direction (datasheet 160 GB/s both ways);
    # V100 SXM2/SXM3: 6 x 25 = 150 (300); H100 PCIe / NVL bridge: 12 x 25 = 300 (600);
    # H800: 400 GB/s both ways = 200 per direction = 8 x 25.
    for device, links, per_link, bidirectional in (
            ("P100-SXM2-16GB", 4, 20e9, 160e9), ("V100-SXM2-16GB", 6, 25e9, 300e9),
            ("V100-SXM3-32GB", 6, 25e9, 300e9), ("V100-SXM3-32GB-H", 6, 25e9, 300e9),
            ("H100-PCIe-80GB", 12, 25e9, 600e9), ("H100-NVL-94GB", 12, 25e9, 600e9),
            ("H800-SXM5-80GB", 8, 25e9, 400e9)):
        entry = DEVICES[device]
        assert entry["nvlink_links"] == links, device
        assert _bw(entry, "nvlink_bandwidth") == links * per_link == bidirectional / 2, device
    # the H800's link count is not published: only its 400 GB/s total is
    assert DEVICES["H800-SXM5-80GB"]["estimated"] == ["nvlink_links"]


def test_pascal_fp16_is_twice_fp32_on_cuda_cores() -> None:
    # P100 SXM2 datasheet: 5.3 / 10.6 / 21.2 TFLOPS; no Tensor Cores, no TF32/BF16/FP8.
    assert _flops("P100-SXM2-16GB", "fp16") == 2 * _flops("P100-SXM2-16GB", "fp32") == 21.2e12
    assert _flops("P100-SXM2-16GB", "fp64") == 5.3e12
    p100 = DEVICES["P100-SXM2-16GB"]["peak_flops"]
    assert (p100["tf32"], p100["bf16"], p100["fp8"]) == (None, None, None)
    assert _bw(DEVICES["P100-SXM2-16GB"], "memory_bandwidth") == 732e9


def test_v100_16gb_is_the_32gb_part_with_half_the_memory() -> None:
    small, large = DEVICES["V100-SXM2-16GB"], DEVICES["V100-SXM2-32GB"]
    assert small["peak_flops"] == large["peak_flops"]
    assert small["memory_bandwidth"] == large["memory_bandwidth"] == "900GB/s"
    assert parse_quantity(small["memory_reported"], "bytes", "m") == 16 * GiB == 17_179_869_184


def test_dgx2_and_dgx2h_per_gpu_peaks_from_the_system_totals() -> None:
    # DGX-2: 2 PFLOPS of Tensor Core for 16 GPUs = 125 TFLOPS, the SXM2 V100's own figure.
    assert _flops("V100-SXM3-32GB", "fp16") == 2e15 / 16 == 125e12
    assert _flops("V100-SXM3-32GB", "fp32") == _flops("V100-SXM2-32GB", "fp32")
    # DGX-2H: 2.1 PFLOPS / 16 = 131.25 TFLOPS, 5 % above; FP32 and FP64 at the same clock ratio:
    # 15.7 x 1.05 = 16.485 -> 16.5, 7.8 x 1.05 = 8.19 -> 8.2 (TFLOPS).
    assert _flops("V100-SXM3-32GB-H", "fp16") == 2.1e15 / 16 == 131.25e12
    ratio = _flops("V100-SXM3-32GB-H", "fp16") / _flops("V100-SXM3-32GB", "fp16")
    assert ratio == pytest.approx(1.05)
    assert _flops("V100-SXM3-32GB-H", "fp32") == pytest.approx(15.7e12 * ratio, abs=0.05e12)
    assert _flops("V100-SXM3-32GB-H", "fp64") == pytest.approx(7.8e12 * ratio, abs=0.05e12)
    # derived, not printed per GPU: both say so
    for device in ("V100-SXM3-32GB", "V100-SXM3-32GB-H"):
        assert "peak_flops" in DEVICES[device]["estimated"], device
        assert DEVICES[device]["peak_flops"]["bf16"] is None, device
    assert (DEVICES["V100-SXM3-32GB"]["tdp_watts"], DEVICES["V100-SXM3-32GB-H"]["tdp_watts"]) \
        == (350, 450)


def test_h100_pcie_and_nvl_dense_figures_are_half_the_sparse_ones() -> None:
    # H100 datasheet, starred (2:4 sparsity) figures: PCIe TF32 756, BF16/FP16 1,513, FP8 3,026;
    # NVL per GPU TF32 835, BF16/FP16 1,671, FP8 3,341. Dense = half.
    for device, tf32, bf16, fp8 in (("H100-PCIe-80GB", 756e12, 1513e12, 3026e12),
                                    ("H100-NVL-94GB", 835e12, 1671e12, 3341e12)):
        assert _flops(device, "tf32") == tf32 / 2, device
        assert _flops(device, "bf16") == _flops(device, "fp16") == bf16 / 2, device
        assert _flops(device, "fp8") == fp8 / 2, device
        assert _flops(device, "bf16") < _flops("H100-SXM5-80GB", "bf16"), device
    assert _flops("H100-PCIe-80GB", "fp32") == 51e12 and _flops("H100-NVL-94GB", "fp32") == 60e12
    assert parse_quantity(DEVICES["H100-NVL-94GB"]["memory_reported"], "bytes", "m") \
        == 95830 * MiB
    assert _bw(DEVICES["H100-NVL-94GB"], "memory_bandwidth") == 3.9e12
    assert _bw(DEVICES["H100-PCIe-80GB"], "memory_bandwidth") == 2e12


def test_h800_is_h100_compute_with_fp64_and_nvlink_cut() -> None:
    h800, h100 = DEVICES["H800-SXM5-80GB"]["peak_flops"], DEVICES["H100-SXM5-80GB"]["peak_flops"]
    assert {p: v for p, v in h800.items() if p != "fp64"} == \
        {p: v for p, v in h100.items() if p != "fp64"}
    assert _flops("H800-SXM5-80GB", "fp64") == 1e12
    assert _bw(DEVICES["H800-SXM5-80GB"], "nvlink_bandwidth") \
        < _bw(DEVICES["H100-SXM5-80GB"], "nvlink_bandwidth") / 2


def test_grand_teton_h100_is_the_sxm5_die_on_slower_memory() -> None:
    """torchtitan's hosts (grand-teton-h100): 8 H100 with 96 GB HBM2e at 2.4 TB/s and a 500 W
    limit; the compute peaks are the SXM5 80 GB's (an upper bound), so a memory-bound pass is
    3.35 / 2.4 = 1.396x as long as on h100-roce, at the same family fraction of HBM, and a
    large GEMM is as fast; the reported memory is 98304 MiB x 81559 / 81920 = 97871 MiB."""
    from dnnscale.model.gpu_compute import memory_pass_s

    part = DEVICES["H100-SXM5-96GB"]
    assert part["peak_flops"] == DEVICES["H100-SXM5-80GB"]["peak_flops"]
    assert _bw(part, "memory_bandwidth") == 2.4e12 and part["tdp_watts"] == 500
    assert round(98304 * 81559 / 81920) == 97871
    teton, roce = gpu_system("grand-teton-h100", 2), gpu_system("h100-roce", 2)
    assert (teton.devices_per_node, teton.machines, teton.machine.name) == \
        (8, 16, "H100-SXM5-96GB")
    assert teton.machine.memory_bytes == 97871 * MiB
    assert memory_pass_s(teton.machine, 1e9) / memory_pass_s(roce.machine, 1e9) == \
        pytest.approx(3.35 / 2.4, rel=1e-12)
    assert teton.machine.efficiency["gemm@bf16"].at(1e13) == \
        roce.machine.efficiency["gemm@bf16"].at(1e13)
    assert teton.network.bandwidth_bytes_per_s == roce.network.bandwidth_bytes_per_s


def test_new_intra_node_links() -> None:
    # NVLink 1 cube-mesh: 4 x 20 GB/s, no switch; DGX-2's NVSwitch: 6 x 25 GB/s, switched;
    # PCIe Gen5 x16: 32 GT/s x 16 lanes / 8 bits = 64 GB/s per direction, one link.
    cube, dgx2, pcie = (LINKS[k] for k in ("nvlink1-cubemesh", "nvlink2-nvswitch", "pcie5-x16"))
    assert _bw(cube, "bandwidth") == 4 * 20e9 and cube["switched"] is False
    assert _bw(dgx2, "bandwidth") == 6 * 25e9 and dgx2["switched"] is True
    assert _bw(pcie, "bandwidth") == 32e9 * 16 / 8 == 64e9 and pcie["links_per_device"] == 1
    assert _bw(LINKS["nvlink4-nvswitch-h800"], "bandwidth") == 8 * 25e9
    lat = {key: parse_quantity(LINKS[key]["latency"], "time", key) for key in LINKS}
    # NCCL's per-hop model: NVLink 0.6 us < PCI 1.0 us < NET 2.7 us
    assert lat["nvlink2-nvswitch"] == 0.6e-6 < lat["pcie5-x16"] == 1e-6 < lat["ib-edr"]


# --- the node presets through the model -----------------------------------------------------------


def test_tiers_of_the_new_nodes_by_hand() -> None:
    # Uncalibrated (no profile for these devices): DEFAULT_EFFICIENCY's 80 % of the intra-node
    # link and 90 % of each GPU's share of the node's NIC ports.
    intra, inter = DEFAULT_EFFICIENCY.intra_node_efficiency, DEFAULT_EFFICIENCY.inter_node_efficiency
    assert (intra, inter) == (0.8, 0.9)
    cases = {  # preset: (GPUs per node, intra link B/s, NIC port B/s, NICs per node)
        "dgx-2": (16, 150e9, 12.5e9, 8), "dgx-2h": (16, 150e9, 12.5e9, 8),
        "dgx-1-v100-16g": (8, 150e9, 12.5e9, 4), "dgx-1-p100": (8, 80e9, 12.5e9, 4),
        "h100-pcie": (8, 64e9, 25e9, 8), "h100-nvl": (8, 64e9, 25e9, 8),
        "hgx-h800": (8, 200e9, 50e9, 8)}
    for preset, (per_node, link, port, nics) in cases.items():
        system = gpu_system(preset, 2)
        assert (system.devices_per_node, system.machines) == (per_node, 2 * per_node), preset
        assert system.intra_node is not None, preset
        assert system.intra_node.bandwidth_bytes_per_s == pytest.approx(link * intra), preset
        assert system.network.bandwidth_bytes_per_s == pytest.approx(
            port * nics / per_node * inter), preset
        assert not system.calibrated and "UNCALIBRATED" in system.description, preset
    # DGX-2: 8 EDR ports for 16 GPUs -> 12.5e9 * 8 / 16 * 0.9 = 5.625e9 B/s per GPU, the same
    # share as a DGX-1's 4 ports for 8 GPUs
    assert gpu_system("dgx-2", 1).network.bandwidth_bytes_per_s == pytest.approx(5.625e9)
    assert gpu_system("dgx-2h", 1).machine.peak_flops_per_s["fp16"] == 131.25e12
    # the old preset is unchanged: a DGX-1 with V100 32GB
    old = gpu_system("dgx-v100", 1)
    assert (old.machine.name, old.devices_per_node) == ("V100-SXM2-32GB", 8)


@pytest.mark.parametrize("preset", ["dgx-2", "dgx-2h", "dgx-1-v100-16g", "dgx-1-p100"])
def test_volta_and_pascal_refuse_bf16_as_dgx_v100_does(preset: str) -> None:
    plan = {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 8}
    with pytest.raises(InputError, match="has no bf16 units"):
        dnnscale.predict("gpt3-125m", f"{preset}:1", {**plan, "precision": "bf16"})
    with pytest.raises(InputError, match="has no bf16 units"):
        dnnscale.predict("gpt3-125m", "dgx-v100:1", {**plan, "precision": "bf16"})
    fp16 = dnnscale.predict("gpt3-125m", f"{preset}:1", {**plan, "precision": "fp16"})
    assert fp16.step_time_s > 0


def test_fused_attention_figures_follow_the_die_and_clocks() -> None:
    # H800 SXM5 = H100 SXM5's die and clocks: FlashAttention-2's published H100 speed applies;
    # the PCIe / NVL cards run lower clocks and V100/P100 have no published figure.
    h100 = kernel_figures("fa2", "H100-SXM5-80GB")
    assert h100 is not None and kernel_figures("fa2", "H800-SXM5-80GB") is h100
    for device in ("H100-PCIe-80GB", "H100-NVL-94GB", "V100-SXM3-32GB-H", "P100-SXM2-16GB"):
        assert kernel_figures("fa2", device) is None, device


def test_cli_predicts_gpt3_on_two_dgx2() -> None:
    result = CliRunner().invoke(app, [
        "predict", "-w", "gpt3-1.3b", "-c", "dgx-2:2", "--tp", "1", "--dp", "32",
        "--global-batch", "512", "--micro-batch", "1", "--recompute", "full",
        "--precision", "fp16", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["mesh"]["devices"] == 32 and out["plan"]["precision"]["compute"] == "fp16"
    assert out["fits"] is True and out["throughput_samples_per_s"] > 0
    # 32 replicas over two 16-GPU nodes: the data-parallel all-reduce crosses nodes
    assert out["breakdown_s"]["dp_comm"] > 0
    refused = CliRunner().invoke(app, [
        "predict", "-w", "gpt3-1.3b", "-c", "dgx-2:2", "--tp", "1", "--dp", "32",
        "--global-batch", "512", "--precision", "bf16"])
    assert refused.exit_code == 2 and "--precision" in refused.stderr

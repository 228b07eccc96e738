"""The GPU preset data files: schema, units, sources, and hand-checked spec-sheet facts.

Reads src/dnnscale/system/presets/{devices,interconnects}.yaml and nodes/*.yaml with
yaml.safe_load (no loader code from dnnscale.system), so the data can be checked on its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dnnscale.units import parse_quantity

PRESETS = Path(__file__).resolve().parents[1] / "src" / "dnnscale" / "system" / "presets"
PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")

# field -> parse_quantity dimension; "count" = positive int, "number" = positive plain number.
DEVICE_FIELDS = {"memory": "bytes", "memory_reported": "bytes", "memory_bandwidth": "bandwidth",
                 "nvlink_bandwidth": "bandwidth", "nvlink_links": "count", "tdp_watts": "number"}
LINK_FIELDS = {"bandwidth": "bandwidth", "latency": "time"}
INTRA_LINK_FIELDS = {"link_bandwidth": "bandwidth", "links_per_device": "count"}
NODE_FIELDS = {"devices_per_node": "count", "nics_per_node": "count", "host_memory": "bytes",
               "price_per_device_hour": "number"}
# Fields that are names, prose or bookkeeping, not facts needing a citation.
NO_SOURCE = {"name", "description", "calibrated", "estimated", "sources", "vendor", "architecture",
             "technology", "kind", "price_unit"}


def _load(path: Path) -> dict:
    with path.open() as handle:
        data = yaml.safe_load(handle)
    assert isinstance(data, dict), path
    return data


DEVICES = _load(PRESETS / "devices.yaml")
LINKS = _load(PRESETS / "interconnects.yaml")
NODES = {path.stem: _load(path) for path in sorted((PRESETS / "nodes").glob("*.yaml"))}


def _si(value: object, dimension: str, field: str) -> float:
    if dimension == "count":
        assert isinstance(value, int) and not isinstance(value, bool) and value > 0, (field, value)
        return float(value)
    if dimension == "number":
        assert isinstance(value, (int, float)) and not isinstance(value, bool), (field, value)
        return float(value)
    return parse_quantity(value, dimension, field)


def _check_sources(entry: dict, where: str) -> None:
    sources = entry.get("sources")
    assert isinstance(sources, dict) and sources, f"{where}: no sources mapping"
    for field in entry:
        if field not in NO_SOURCE:
            text = sources.get(field)
            assert isinstance(text, str) and len(text) >= 20, f"{where}.{field}: no source"
    for field in sources:
        assert field in entry, f"{where}: source for unknown field {field!r}"
    estimated = entry.get("estimated")
    assert isinstance(estimated, list), f"{where}: `estimated` must be a list of field names"
    for field in estimated:
        assert field in entry and field in sources, f"{where}: estimated field {field!r} unknown"
        words = sources[field].upper()
        assert "ESTIMATE" in words or "ASSUMPTION" in words, \
            f"{where}.{field}: an estimated value must say it is one and from what"


def test_the_expected_presets_exist() -> None:
    assert set(DEVICES) == {"V100-SXM2-32GB", "A100-SXM4-40GB", "A100-SXM4-80GB",
                            "H100-SXM5-80GB", "H200-SXM-141GB",
                            # issue 23's spec-sheet presets (tests/test_gpu_presets_wave3.py)
                            "V100-SXM2-16GB", "V100-SXM3-32GB", "V100-SXM3-32GB-H",
                            "P100-SXM2-16GB", "H100-PCIe-80GB", "H100-NVL-94GB",
                            "H800-SXM5-80GB",
                            # torchtitan's Grand Teton part (docs/performance.md at d4c86e37)
                            "H100-SXM5-96GB"}
    assert {"nvlink2-cubemesh", "nvlink3-nvswitch", "nvlink4-nvswitch", "ib-hdr", "ib-ndr",
            "roce-100", "roce-200", "roce-400", "eth-25-tcp", "eth-100-tcp", "nvlink1-cubemesh",
            "nvlink2-nvswitch", "nvlink4-nvswitch-h800", "pcie5-x16"} <= set(LINKS)
    assert {"dgx-v100", "dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "hgx-h200",
            "a100-80g-roce", "a100-80g-eth", "dgx-1-v100-16g", "dgx-2", "dgx-2h", "dgx-1-p100",
            "h100-pcie", "h100-nvl", "hgx-h800"} <= set(NODES)


@pytest.mark.parametrize("key", sorted(DEVICES))
def test_device_schema_units_and_sources(key: str) -> None:
    device = DEVICES[key]
    for field, dimension in DEVICE_FIELDS.items():
        assert _si(device[field], dimension, f"{key}.{field}") > 0
    flops = device["peak_flops"]
    assert set(flops) == set(PRECISIONS), key
    present = [p for p in PRECISIONS if flops[p] is not None]
    assert {"fp32", "fp16"} <= set(present), key
    for precision in present:
        assert parse_quantity(flops[precision], "flops", f"{key}.peak_flops.{precision}") > 0
    _check_sources(device, key)


@pytest.mark.parametrize("key", sorted(LINKS))
def test_interconnect_schema_units_and_sources(key: str) -> None:
    link = LINKS[key]
    assert link["kind"] in ("intra_node", "inter_node"), key
    assert isinstance(link["switched"], bool) and isinstance(link["rdma"], bool), key
    fields = dict(LINK_FIELDS, **(INTRA_LINK_FIELDS if link["kind"] == "intra_node" else {}))
    for field, dimension in fields.items():
        assert _si(link[field], dimension, f"{key}.{field}") > 0
    _check_sources(link, key)
    # No interconnect latency is a spec-sheet fact: every one must be marked as an estimate.
    assert "latency" in link["estimated"], key


@pytest.mark.parametrize("stem", sorted(NODES))
def test_node_schema_references_and_sources(stem: str) -> None:
    node = NODES[stem]
    assert node["name"] == stem
    assert node["calibrated"] is False  # spec-sheet presets; calibrated curves come later
    assert node["device"] in DEVICES, node["device"]
    assert LINKS[node["intra_node"]]["kind"] == "intra_node"
    assert LINKS[node["inter_node"]]["kind"] == "inter_node"
    for field, dimension in NODE_FIELDS.items():
        assert _si(node[field], dimension, f"{stem}.{field}") > 0
    assert node["price_unit"] == "USD per device-hour"
    assert "price_per_device_hour" in node["estimated"]  # cloud prices are never spec facts
    _check_sources(node, stem)


def _flops(device: str, precision: str) -> float:
    return parse_quantity(DEVICES[device]["peak_flops"][precision], "flops", precision)


def _bw(entry: dict, field: str) -> float:
    return parse_quantity(entry[field], "bandwidth", field)


def test_hand_checked_compute_facts() -> None:
    # A100 datasheet: BF16/FP16 Tensor Core 312 TFLOPS dense (624 is the sparsity figure).
    assert _flops("A100-SXM4-80GB", "bf16") == 312e12
    assert _flops("A100-SXM4-40GB", "tf32") == 156e12
    # The 40GB and 80GB A100 differ only in memory (same datasheet compute column).
    assert DEVICES["A100-SXM4-40GB"]["peak_flops"] == DEVICES["A100-SXM4-80GB"]["peak_flops"]
    # H100 SXM: 989 TFLOP/s dense bf16 (whitepaper 989.4; the datasheet's 1,979 is sparse).
    assert _flops("H100-SXM5-80GB", "bf16") == pytest.approx(989e12, rel=1e-3)
    assert _flops("H100-SXM5-80GB", "bf16") < 1000e12
    # FP8 is twice BF16 on Hopper: 1978.9 = 2 x 989.4 (+-0.05 rounding in the whitepaper).
    assert _flops("H100-SXM5-80GB", "fp8") == pytest.approx(2 * 989.4e12, rel=1e-4)
    # H200 is the same GH100 compute as H100; only the memory differs.
    assert DEVICES["H200-SXM-141GB"]["peak_flops"] == DEVICES["H100-SXM5-80GB"]["peak_flops"]
    # V100: 125 TFLOPS FP16 Tensor Core, no TF32/BF16/FP8 units; fp64 7.8 (no FP64 Tensor Core).
    v100 = DEVICES["V100-SXM2-32GB"]["peak_flops"]
    assert (v100["tf32"], v100["bf16"], v100["fp8"]) == (None, None, None)
    assert _flops("V100-SXM2-32GB", "fp16") == 125e12
    assert _flops("V100-SXM2-32GB", "fp64") == 7.8e12
    assert DEVICES["A100-SXM4-80GB"]["peak_flops"]["fp8"] is None


def test_hand_checked_memory_facts() -> None:
    a100 = DEVICES["A100-SXM4-80GB"]
    assert _bw(a100, "memory_bandwidth") == 2039e9
    assert _bw(DEVICES["A100-SXM4-40GB"], "memory_bandwidth") == 1555e9
    assert _bw(DEVICES["H100-SXM5-80GB"], "memory_bandwidth") == 3.35e12
    assert _bw(DEVICES["H200-SXM-141GB"], "memory_bandwidth") == 4.8e12
    # A100 80GB is 80 GiB: nvidia-smi 81920 MiB = 81920 * 2**20 = 85,899,345,920 bytes,
    # 7.4 % more than the decimal reading of "80GB".
    assert parse_quantity(a100["memory_reported"], "bytes", "m") == 81920 * 2**20 == 85_899_345_920
    assert parse_quantity(a100["memory"], "bytes", "m") == 80e9
    # H200 "141GB": nvidia-smi 143771 MiB = 150.755e9 bytes.
    h200 = parse_quantity(DEVICES["H200-SXM-141GB"]["memory_reported"], "bytes", "m")
    assert h200 == pytest.approx(150.755e9, rel=1e-5)


def test_nvlink_is_stored_per_direction() -> None:
    # Spec sheets give bidirectional totals 300 / 600 / 900 GB/s; per direction is half,
    # and equals links x 25 GB/s: V100 6 x 25 = 150, A100 12 x 25 = 300, H100 18 x 25 = 450.
    for device, bidirectional, links in (("V100-SXM2-32GB", 300e9, 6),
                                         ("A100-SXM4-80GB", 600e9, 12),
                                         ("H100-SXM5-80GB", 900e9, 18),
                                         ("H200-SXM-141GB", 900e9, 18)):
        entry = DEVICES[device]
        assert entry["nvlink_links"] == links
        assert _bw(entry, "nvlink_bandwidth") == bidirectional / 2 == links * 25e9


def test_each_node_link_matches_its_devices() -> None:
    # An NVLink fabric's per-GPU bandwidth is the device's NVLink bandwidth; a PCIe tier (PCIe
    # cards, whose NVLink bridges join pairs only) is each GPU's one x16 slot.
    for stem, node in NODES.items():
        link = LINKS[node["intra_node"]]
        device = DEVICES[node["device"]]
        assert _bw(link, "bandwidth") == link["links_per_device"] * _bw(link, "link_bandwidth"), stem
        if node["intra_node"].startswith("pcie"):
            assert link["links_per_device"] == 1, stem
            continue
        assert _bw(link, "bandwidth") == _bw(device, "nvlink_bandwidth"), stem
        assert link["links_per_device"] == device["nvlink_links"], stem


def test_hand_checked_network_facts() -> None:
    # HDR 200 Gbit/s = 200e9 / 8 = 25e9 B/s per port; NDR 400 Gbit/s = 50e9 B/s; EDR 12.5e9.
    assert _bw(LINKS["ib-hdr"], "bandwidth") == 25e9
    assert _bw(LINKS["ib-ndr"], "bandwidth") == 50e9
    assert _bw(LINKS["ib-edr"], "bandwidth") == 12.5e9
    assert _bw(LINKS["eth-25-tcp"], "bandwidth") == 3.125e9
    assert not LINKS["eth-100-tcp"]["rdma"] and LINKS["roce-200"]["rdma"]
    assert LINKS["nvlink2-cubemesh"]["switched"] is False  # DGX-1 has no NVSwitch
    # DGX A100: 8 HDR NICs -> 8 x 25e9 = 200e9 B/s out of a node; DGX H100: 8 x 50e9 = 400e9.
    for stem, total in (("dgx-a100-80g", 200e9), ("dgx-h100", 400e9), ("dgx-v100", 4 * 12.5e9)):
        node = NODES[stem]
        assert node["nics_per_node"] * _bw(LINKS[node["inter_node"]], "bandwidth") == total
    # The TCP paths are slower per hop than RDMA, and RDMA slower than NVLink.
    lat = {key: parse_quantity(LINKS[key]["latency"], "time", key) for key in LINKS}
    assert lat["nvlink3-nvswitch"] < lat["ib-hdr"] <= lat["roce-200"] < lat["eth-100-tcp"]


def test_hand_checked_prices() -> None:
    # p4d.24xlarge 32.7726 USD/h / 8 GPUs = 4.0966 -> 4.10; p5.48xlarge 98.32 / 8 = 12.29.
    assert NODES["dgx-a100-40g"]["price_per_device_hour"] == pytest.approx(32.7726 / 8, abs=0.005)
    assert NODES["dgx-h100"]["price_per_device_hour"] == pytest.approx(98.32 / 8, abs=0.005)
    assert NODES["dgx-a100-80g"]["price_per_device_hour"] == pytest.approx(40.9657 / 8, abs=0.005)

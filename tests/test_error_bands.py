"""Error bands keyed by the regime they were measured in (issue 27): the regime key and the band
lookup by hand, the committed bands against the rows they come from, and the outputs that show
a band (predict on H100 FP8 and on DGX-A100 fp16 in a real process; the CPU flow on an
uncalibrated preset for the chosen and the rejected plans alike)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import dnnscale
from dnnscale.model.error_band import (FORMAT, MIN_ROWS, Regime, band_for, load_bands, regime_for,
                                       regime_of)
from dnnscale.plan.plan import (Batch, Collective, DataParallel, ParallelPlan, ParameterServer,
                                Pipeline, Precision, TensorSplit)
from dnnscale.system import load_system
from dnnscale.system.device import device_family
from dnnscale.system.gpu import gpu_system

ROOT = Path(__file__).resolve().parents[1]
GPT3 = ["-w", "gpt3-175b", "--tp", "8", "--pp", "8", "--dp", "8", "--global-batch", "1536",
        "--recompute", "full"]


def _benchmark():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("error_bands_bench",
                                                  ROOT / "benchmarks" / "error_bands.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _plan(tp: int = 1, pp: int = 1, dp: int = 1, zero: int = 0, precision: str = "fp16",
          ps: bool = False) -> ParallelPlan:
    aggregation = ParameterServer(2, asynchronous=False) if ps else Collective("ring", zero)
    return ParallelPlan(tensor=TensorSplit(tp, "megatron"), pipeline=Pipeline(pp, "1f1b"),
                        data=DataParallel(dp, aggregation), batch=Batch(1, 8),
                        precision=Precision(precision))


# --- the regime key, by hand ---------------------------------------------------------------------

def test_device_family_drops_only_the_memory_size() -> None:
    assert device_family("A100-SXM4-80GB") == device_family("A100-SXM4-40GB") == "A100-SXM4"
    assert device_family("H200-SXM-141GB") == "H200-SXM"
    assert device_family("MI300X") == "MI300X" and device_family("") == ""


@pytest.mark.parametrize("plan,label", [
    (_plan(8, 8, 8), "A100-SXM4 / fp16 / calibrated / allreduce / tp+pp+dp"),
    (_plan(8, 1, 4, zero=1), "A100-SXM4 / fp16 / calibrated / ZeRO-1 / tp+dp"),
    (_plan(1, 4, 1, precision="bf16"), "A100-SXM4 / bf16 / calibrated / allreduce / pp"),
    (_plan(), "A100-SXM4 / fp16 / calibrated / allreduce / one device"),
])
def test_gpu_regime_key(plan: ParallelPlan, label: str) -> None:
    system = gpu_system("dgx-a100-40g", 8)  # the packaged A100-SXM4 profile: calibrated
    regime = regime_for(system, plan, "bubble")
    assert regime.label == label
    assert regime.device == "A100-SXM4" and regime.calibrated and regime.bottleneck_class is None
    assert Regime.from_dict(json.loads(json.dumps(regime.to_dict()))) == regime


def test_h100_fp8_regime_is_uncalibrated() -> None:
    regime = regime_for(gpu_system("dgx-h100", 64), _plan(8, 8, 8, zero=1, precision="fp8"),
                        "bubble")
    assert regime == Regime("H100-SXM5", "fp8", False, "allreduce", 1, ("tp", "pp", "dp"))
    assert regime.label == "H100-SXM5 / fp8 / uncalibrated / ZeRO-1 / tp+pp+dp"


def test_cpu_regime_key_from_adam_flags() -> None:
    plan = dnnscale.Config(4, 8, 4, "ps-sync", 32).to_plan()  # P=4 → tp, R=8 → dp
    regime = regime_for(load_system("adam-2014"), plan, "ps network")
    assert regime == Regime("cpu", "fp32", False, "ps-sync", 0, ("tp", "dp"), "aggregation")
    assert regime.label == "cpu / fp32 / uncalibrated / ps-sync / tp+dp / aggregation"
    calibrated = load_system(str(ROOT / "tests" / "snapshots" / "clusters"
                                 / "calibrated-100mbit.yaml"))
    one = regime_for(calibrated, dnnscale.Config(1, 1, 1, "ps-async", 16).to_plan(),
                     "worker compute")
    assert one.label == "cpu / fp32 / calibrated / ps-async / one device / compute"
    assert regime_of(plan, "ps network", "cpu", True, accelerator=False).calibrated


# --- the lookup, from hand-made rows ------------------------------------------------------------

A = Regime("A100-SXM4", "fp16", True, "allreduce", 0, ("tp", "pp", "dp"))
B = Regime("A100-SXM4", "fp16", True, "allreduce", 0, ("dp",))
ERRORS_A = [0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.10]
ERRORS_B = [0.2, 0.1, 0.4]


def _hand_bands() -> dict[str, object]:
    rows = [(A, e) for e in ERRORS_A] + [(B, e) for e in ERRORS_B]
    return {"format": FORMAT, "source": "hand", "regimes":
            _benchmark().bands([(rows, "hand-made rows", "the hand-made rows")])}


def test_band_is_median_and_p90_of_exactly_its_rows() -> None:
    bands = _hand_bands()
    entry = bands["regimes"][A.label]  # type: ignore[index]
    # median of 0.01..0.10 = (0.05 + 0.06) / 2; p90 by linear interpolation at position
    # 0.9 · 9 = 8.1: 0.09 + 0.1 · (0.10 - 0.09) = 0.091; max 0.10
    assert entry["median_relative_error"] == pytest.approx(0.055)
    assert entry["p90_relative_error"] == pytest.approx(0.091)
    assert entry["max_relative_error"] == pytest.approx(0.10)
    assert entry["rows"] == 10 == MIN_ROWS and entry["regime"] == A.to_dict()
    band = band_for(A, bands)
    assert band.validated and band.rows == 10
    assert band.median_relative_error == pytest.approx(0.055)
    assert band.p90_relative_error == pytest.approx(0.091)
    assert band.text() == ("±6 % median, ±9 % p90 (10 validated rows, "
                           "A100-SXM4 / fp16 / calibrated / allreduce / tp+pp+dp; "
                           "the hand-made rows)")
    data = band.to_dict()
    assert data["name"] == "the hand-made rows"
    assert data["regime"] == A.label and data["regime_key"] == A.to_dict()
    assert data["validated"] is True and data["min_rows"] == MIN_ROWS and "reason" not in data


def test_too_few_rows_give_no_band_but_say_how_many() -> None:
    bands = _hand_bands()
    entry = bands["regimes"][B.label]  # type: ignore[index]
    assert entry["rows"] == 3 and entry["median_relative_error"] == pytest.approx(0.2)
    band = band_for(B, bands)
    assert not band.validated and band.median_relative_error is None and band.rows == 3
    assert band.reason == ("only 3 validated rows of this regime (the hand-made rows); a p90 "
                           f"needs at least {MIN_ROWS}")
    assert band.source == "hand-made rows"
    assert band.text().startswith("no validated band for this regime: only 3 validated rows")
    assert band.to_dict()["validated"] is False


def test_rows_of_one_regime_from_two_sources_make_one_band() -> None:
    """Pooled, not overwritten: 7 rows of A from one source and 3 from another are 10 rows, a
    band, whose median and p90 are those of all ten, and which names both sources."""
    first = [(A, e) for e in ERRORS_A[:7]] + [(B, 0.5)]
    second = [(A, e) for e in ERRORS_A[7:]]
    regimes = _benchmark().bands([(first, "first.json", "the first rows"),
                                  (second, "second.json", "the second rows")])
    entry = regimes[A.label]
    assert entry["rows"] == 10 and entry["median_relative_error"] == pytest.approx(0.055)
    assert entry["p90_relative_error"] == pytest.approx(0.091)
    assert entry["source"] == "first.json; second.json"
    assert entry["name"] == "the first rows and the second rows"
    assert regimes[B.label]["rows"] == 1 and regimes[B.label]["source"] == "first.json"
    band = band_for(A, {"format": FORMAT, "source": "x", "regimes": regimes})
    assert band.validated and band.text().endswith("; the first rows and the second rows)")


def test_unmeasured_regime_names_the_nearest_and_how_it_differs() -> None:
    h100 = Regime("H100-SXM5", "fp8", False, "allreduce", 0, ("tp", "pp", "dp"))
    band = band_for(h100, _hand_bands())
    assert not band.validated and band.rows == 0 and band.source == "none measured"
    assert band.reason == (
        "nothing was measured in it; the nearest measured regime is A100-SXM4 / fp16 / "
        "calibrated / allreduce / tp+pp+dp (10 rows of the hand-made rows), which differs in "
        "device (A100-SXM4 there, H100-SXM5 here); precision (fp16 there, fp8 here); "
        "calibration (calibrated there, uncalibrated here)")
    zero1 = Regime("A100-SXM4", "fp16", True, "allreduce", 1, ("dp",))
    assert band_for(zero1, _hand_bands()).reason.endswith(
        "allreduce / dp (3 rows of the hand-made rows), which differs in ZeRO stage (0 there, 1 "
        "here)")
    assert "missing" in band_for(A, {}).reason


# --- the committed bands --------------------------------------------------------------------------

def test_committed_vtrain_bands_are_the_recorded_rows() -> None:
    """The 3D and TP×DP bands, recomputed from vTrain's rows with TP/PP/DP read off their labels
    (not through regime_of)."""
    import numpy as np

    rows = json.loads((ROOT / "results" / "vtrain" / "multi_node_rows.json").read_text())
    groups: dict[str, list[float]] = {}
    for row in rows:
        tp, dp, pp = map(int, re.search(r"TP(\d+) DP(\d+) PP(\d+)", row["label"]).groups())  # type: ignore[union-attr]
        used = "+".join(d for d, n in (("tp", tp), ("pp", pp), ("dp", dp)) if n > 1)
        groups.setdefault(used, []).append(row["relative_error"])
    assert sum(len(v) for v in groups.values()) == 109
    # rows of the same regime from the public development measurements are pooled with them
    for path, listed in ((ROOT / "results" / "published_dev" / "rows.json", None),
                         (ROOT / "results" / "moe_context" / "summary.json", "rows")):
        data = json.loads(path.read_text())
        for row in data[listed] if listed else data:
            key = row.get("regime_key")
            if key and "relative_error" in row and key["device"] == "A100-SXM4" \
                    and key["precision"] == "fp16" and key["calibrated"] \
                    and key["aggregation"] == "allreduce" and key["zero_stage"] == 0:
                groups.setdefault("+".join(key["parallel"]), []).append(row["relative_error"])
    regimes = load_bands()["regimes"]
    for used, errors in groups.items():
        entry = regimes[f"A100-SXM4 / fp16 / calibrated / allreduce / {used or 'one device'}"]
        assert entry["rows"] == len(errors)
        assert entry["median_relative_error"] == pytest.approx(float(np.median(errors)))
        assert entry["p90_relative_error"] == pytest.approx(float(np.percentile(errors, 90)))
    assert len(groups["tp+pp+dp"]) >= MIN_ROWS


def test_every_committed_cpu_regime_is_calibrated_testbed_rows() -> None:
    regimes = load_bands()["regimes"]
    cpu = [e for e in regimes.values() if e["regime"]["device"] == "cpu"]
    assert cpu and all(e["regime"]["calibrated"] for e in cpu)
    # the corpus's evaluated rows as benchmarks/rescore.py scored them (calibration rows fit
    # the baselines and are left out)
    scored = json.loads((ROOT / "results" / "validation" / "rows.json").read_text())
    evaluated = [r for r in scored if r["split"] != "calibration"]
    assert sum(e["rows"] for e in cpu) == len(evaluated) > 35


# --- what the outputs show ------------------------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "dnnscale", *args], capture_output=True,
                          text=True, timeout=240, env=env, check=True)


def test_predict_on_h100_fp8_shows_no_a100_band() -> None:
    args = ["predict", *GPT3, "-c", "dgx-h100:64", "--precision", "fp8"]
    band = json.loads(_cli(*args, "--json").stdout)["error_band"]
    assert band["validated"] is False and band["median_relative_error"] is None
    assert band["regime_key"]["device"] == "H100-SXM5" and band["regime_key"]["precision"] == "fp8"
    # the nearest measured regime is an H100 FP8 one (the public development rows), never an
    # A100 band
    assert "nearest measured regime is H100-SXM5 / fp8 /" in band["reason"]
    assert "development data" in band["reason"]
    text = _cli(*args).stdout
    assert "no validated band for this regime" in text and "±" not in text


def test_predict_a100_fp16_3d_on_dgx_a100_shows_the_vtrain_band() -> None:
    args = ["predict", *GPT3, "-c", "dgx-a100-80g:64", "--precision", "fp16"]
    band = json.loads(_cli(*args, "--json").stdout)["error_band"]
    entry = load_bands()["regimes"]["A100-SXM4 / fp16 / calibrated / allreduce / tp+pp+dp"]
    assert band["validated"] is True and band["rows"] == entry["rows"] >= MIN_ROWS
    assert band["median_relative_error"] == entry["median_relative_error"]
    assert band["p90_relative_error"] == entry["p90_relative_error"]
    assert "vTrain" in band["source"]
    assert f"±{100 * entry['p90_relative_error']:.0f} % p90" in _cli(*args).stdout


def test_cpu_flow_on_an_uncalibrated_preset_shows_no_testbed_band_anywhere() -> None:
    result = json.loads(_cli("optimize", "-w", "adam-imagenet22k", "-c", "adam-2014",
                             "--json").stdout)
    bands = [result["best"]["prediction"]["error_band"]]
    bands += [entry["prediction"]["error_band"] for entry in result["top"]]
    bands += [entry["prediction"]["error_band"] for entry in result["best_per_mode"].values()]
    assert len(bands) >= 5
    for band in bands:
        assert band["validated"] is False and band["median_relative_error"] is None
        assert band["regime_key"]["calibrated"] is False
        assert "calibration (calibrated there, uncalibrated here)" in band["reason"]
    text = _cli("optimize", "-w", "adam-imagenet22k", "-c", "adam-2014").stdout
    assert "no validated band for this regime" in text and "±" not in text


def test_cpu_bands_follow_each_plans_own_regime_on_a_calibrated_cluster() -> None:
    """Chosen and rejected plans alike: each band is the lookup of its own regime."""
    cluster = str(ROOT / "tests" / "snapshots" / "clusters" / "calibrated-100mbit.yaml")
    result = dnnscale.optimize("adam-cifar10", cluster)
    system = load_system(cluster)
    for prediction in [result.best, *result.top]:
        regime = regime_for(system, prediction.plan, prediction.bottleneck)
        assert prediction.error_band == band_for(regime)
        assert regime.calibrated and regime.device == "cpu"


def test_predict_h100_bf16_fsdp_shows_the_development_band() -> None:
    """An H100 bf16 ZeRO-3 data-parallel plan (llm-foundry's MPT regime, and torchtitan's
    eager FSDP rows) is given the band of the public development rows of exactly that regime,
    which says they are development data."""
    rows = json.loads((ROOT / "results" / "published_dev" / "rows.json").read_text())
    rows += json.loads((ROOT / "results" / "moe_context" / "summary.json").read_text())["rows"]
    key = {"device": "H100-SXM5", "precision": "bf16", "calibrated": False,
           "aggregation": "allreduce", "zero_stage": 3, "parallel": ["dp"],
           "bottleneck_class": None}
    errors = [r["relative_error"] for r in rows if r.get("regime_key") == key]
    assert len(errors) >= MIN_ROWS
    args = ["predict", "-w", "gpt3-1.3b", "-c", "dgx-h100:1", "--tp", "1", "--pp", "1", "--dp",
            "8", "--zero", "3", "--precision", "bf16", "--global-batch", "64"]
    band = json.loads(_cli(*args, "--json").stdout)["error_band"]
    assert band["validated"] is True and band["regime_key"] == key
    assert band["rows"] == len(errors)
    assert band["median_relative_error"] == pytest.approx(statistics.median(errors))
    assert "published_dev" in band["source"] and "development data" in band["name"]
    assert "(development data)" in re.sub(r"[\s│]+", " ", _cli(*args).stdout)


def test_report_page_cites_the_bands_measurements() -> None:
    from dnnscale.report.page import error_band_text

    band = {"median_relative_error": 0.035, "p90_relative_error": 0.134, "source": "rows.json",
            "name": "the public development measurements (development data)"}
    assert error_band_text(band) == (
        "Error band of this regime (predicted vs measured): median ±3.5 %, p90 ±13.4 % — "
        "the public development measurements (development data): rows.json", True)
    del band["name"]
    assert error_band_text(band)[0].endswith("p90 ±13.4 % — rows.json")


# --- dnnscale bands ---------------------------------------------------------------------------

def test_bands_json_lists_exactly_the_stored_bands() -> None:
    regimes = load_bands()["regimes"]
    banded = sorted(label for label, e in regimes.items() if e["rows"] >= MIN_ROWS)
    data = json.loads(_cli("bands", "--json").stdout)
    assert data["min_rows"] == MIN_ROWS
    assert [r["regime"] for r in data["regimes"]] == banded
    assert data["left_out"] == len(regimes) - len(banded) > 0
    for row in data["regimes"]:
        entry = regimes[row["regime"]]
        assert row["validated"] is True and row["rows"] == entry["rows"]
        assert row["p90_relative_error"] == entry["p90_relative_error"]
        assert row["max_relative_error"] == entry["max_relative_error"]
        assert row["regime_key"] == entry["regime"] and row["name"] == entry["name"]
    everything = json.loads(_cli("bands", "--all", "--json").stdout)
    assert len(everything["regimes"]) == len(regimes) and everything["left_out"] == 0


def test_bands_device_filter_and_table() -> None:
    data = json.loads(_cli("bands", "--device", "h100", "--all", "--json").stdout)
    assert data["regimes"] and all(r["regime_key"]["device"] == "H100-SXM5"
                                   for r in data["regimes"])
    h100 = [r for r in data["regimes"] if r["regime"] == "H100-SXM5 / bf16 / uncalibrated / "
            "ZeRO-3 / dp"]
    assert len(h100) == 1 and h100[0]["validated"] and "development data" in h100[0]["name"]
    text = re.sub(r"[\s│┃]+", " ", _cli("bands", "--device", "H100").stdout)
    assert "H100-SXM5 / bf16 / uncalibrated / ZeRO-3 / dp" in text and "A100" not in text
    assert f"{h100[0]['rows']} {100 * h100[0]['median_relative_error']:.1f} %" in text
    assert "with fewer than 10 rows (no band): --all lists them" in text


@pytest.mark.parametrize("value, says", [
    ("tpu", "no measured regime on a device matching 'tpu'; measured devices: A100-SXM4"),
    ("  ", "give part of a device name")])
def test_bands_bad_device_is_one_line_exit_2(value: str, says: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run([sys.executable, "-m", "dnnscale", "bands", "--device", value],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: --device: ") and says in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_measured_regimes_reads_every_entry_of_a_hand_file() -> None:
    from dnnscale.model.error_band import measured_regimes

    regimes = measured_regimes(_hand_bands())
    assert [r.regime for r in regimes] == sorted([A, B], key=lambda r: r.label)
    by = {r.regime: r for r in regimes}
    assert by[A].validated and by[A].rows == 10 and by[A].max_relative_error == 0.10
    assert not by[B].validated and by[B].median_relative_error == pytest.approx(0.2)
    assert by[B].to_dict()["name"] == "the hand-made rows"
    assert measured_regimes({}) == []

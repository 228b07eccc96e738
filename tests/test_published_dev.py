"""Issue 23: the published development rows (data/published-dev) as workload, system and plan,
read by hand from their columns, and the benchmark that re-predicts them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dnnscale.validate.published_dev import (Case, Unexpressed, case_of, load_rows,
                                             speedup_pairs)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rows() -> dict[str, dict[str, str]]:
    return {row["id"]: row for row in load_rows()}


def test_an_mpt_row_by_hand(rows) -> None:
    # PM0320: MPT-125m, 12 x 768, 12 heads, vocab 50368, seq 2048, 128 A100-40GB (16 nodes),
    # FSDP FULL_SHARD, mixed_precision=PURE, no checkpointing, micro-batch 26, 3328 sequences,
    # 15,863,837 tokens/s
    case = case_of(rows["PM0320"])
    assert isinstance(case, Case) and case.source == "llm-foundry"
    # MPTConfig's defaults, which the benchmark's yamls keep: a learned position table of
    # max_seq_len rows, biases, no dropout
    assert case.workload == ("gpt:layers=12,hidden=768,heads=12,seq=2048,vocab=50368,"
                             "positional=learned,positions=2048,flash=true,"
                             "attention_kernel=triton,tied=true,bias=true,dropout=false,"
                             "metrics=2")
    assert case.system == "dgx-a100-40g:16"
    assert case.plan == {"tp": 1, "pp": 1, "dp": 128, "zero": 3, "micro_batch": 26,
                         "global_batch": 3328, "recompute": "none", "precision": "bf16",
                         "grad_bytes": 2, "overlap_dp": True, "grad_accumulation": "add",
                         "loss": "fused"}
    assert case.measured_samples_per_s == pytest.approx(15_863_837 / 2048)
    # PM0262: MPT-70b on 64 H100, DEFAULT mixed precision (fp32 reduction), checkpointing on
    h100 = case_of(rows["PM0262"])
    assert isinstance(h100, Case) and h100.system == "dgx-h100:8"
    assert h100.plan["recompute"] == "full" and h100.plan["grad_bytes"] == 4
    assert h100.plan["micro_batch"] == 8 and h100.plan["global_batch"] == 2048


def test_every_mpt_workload_has_the_parameters_the_readme_prints(rows) -> None:
    # llm-foundry's README prints each run's parameter count (0.13B-64.86B); the workload
    # built from MPTConfig's defaults has that count, rounded, at every size and sequence:
    # MPT-30b at 2,048 tokens 29.98B needs the biases (29.97B without), MPT-7b at 65,536
    # tokens 6.92B the learned position table (6.65B without)
    from dnnscale.workload.transformer_zoo import gpt_from_name
    checked = 0
    for row in rows.values():
        if not row["model"].startswith("MPT"):
            continue
        case = case_of(row)
        assert isinstance(case, Case)
        printed = float(re.search(r"([\d.]+)B params", row["model_details"]).group(1))
        params = gpt_from_name(case.workload.removeprefix("gpt:")).params
        assert round(params / 1e9, 2) == printed, (row["id"], params)
        checked += 1
    assert checked == 63
    # MPT-7b by hand at 65,536 tokens: 32 blocks of 12·4096² weights, 4·4096 + 4·4·4096
    # biases (Q|K|V, out, up, down) and two norms of 2·4096; the final norm; the tied
    # 50,368-word table and the 65,536-row position table
    seven = case_of(rows["PM0294"])
    assert isinstance(seven, Case)
    h = 4096
    block = 12 * h * h + (3 * h + h + 4 * h + h) + 2 * 2 * h
    expected = 32 * block + 2 * h + 50368 * h + 65536 * h
    assert gpt_from_name(seven.workload.removeprefix("gpt:")).params == expected == 6_918_905_856


def test_a_bert_row_by_hand(rows) -> None:
    # PM0082: 8 A100-80GB, seq 128, 256 per GPU, global 65,536, FP16 AMP, 4,553 sequences/s
    case = case_of(rows["PM0082"])
    assert isinstance(case, Case) and case.source == "dle" and case.seq == 128
    assert case.system == "dgx-a100-80g:1" and not case.closest_preset
    assert case.plan == {"tp": 1, "pp": 1, "dp": 8, "zero": 0, "micro_batch": 256,
                         "global_batch": 65536, "precision": "fp16", "grad_accumulation": "add",
                         "loss": "torch16"}
    # its fp16 runs cast the model to fp16 (run_pretraining.sh's allreduce_post_accumulation_fp16
    # under torch.distributed.launch: model.half(), autocast off), so no amp key; its TF32 row
    # computes the loss on fp32 logits
    assert case_of(rows["PM0083"]).plan["loss"] == "torch"
    assert "amp" not in case_of(rows["PM0083"]).plan
    # TensorFlow 1's BERT clips each micro-batch into fp32 accumulators (optimization.py); its
    # fp16 runs are TF-AMP's graph rewrite with an fp32 log-softmax (its black list), its TF32
    # runs neither
    tf_fp16, tf_tf32 = case_of(rows["PM0130"]), case_of(rows["PM0131"])
    assert tf_fp16.plan["grad_accumulation"] == "clip_add"
    assert (tf_fp16.plan["precision"], tf_fp16.plan["amp"], tf_fp16.plan["loss"]) == (
        "fp16", "tf-amp", "torch")
    assert tf_tf32.plan["precision"] == "tf32" and "amp" not in tf_tf32.plan
    assert case.measured_samples_per_s == 4553
    # the zoo's BERT-Large (post-norm, 2 token types, 512 positions) at the row's sequence and
    # masked positions, with Q, K and V as three Linear modules, as both BERTs' code has them
    from dataclasses import replace
    from dnnscale.workload import load_workload
    bert = load_workload(case.workload).transformer
    assert bert == replace(load_workload("bert-large").transformer, seq=128, predictions=19,
                           separate_projections=True)
    # the V100 SXM3 rows run on the DGX-2H the table names (4 nodes of 16 GPUs: dgx-2h:4), and
    # its single-node rows, which its notes say are the README's DGX-2 values, on dgx-2
    dgx2h = case_of(rows["PM0116"])
    assert isinstance(dgx2h, Case) and not dgx2h.closest_preset and dgx2h.system == "dgx-2h:4"
    assert rows["PM0116"]["num_nodes"] == "4" and "DGX-2H" in rows["PM0116"]["source"]
    dgx2 = case_of(rows["PM0114"])
    assert isinstance(dgx2, Case) and not dgx2.closest_preset and dgx2.system == "dgx-2:1"
    assert "DGX-2 single-node" in rows["PM0114"]["notes"]
    items = [case_of(row) for row in rows.values()]
    assert not any(isinstance(c, Case) and c.closest_preset for c in items)


def test_pytorch_phase_2_is_priced_at_lddl_binned_length(rows) -> None:
    from dnnscale.validate.published_dev import lddl_padded_seq

    # LDDL's figure: 2,565 s unbinned, 1,483 s at bin size 64 -> 512 x 1483 / 2565 = 296.02
    assert lddl_padded_seq(512) == 296
    # PM0094: PyTorch 21.11, seq 512, 8 A100-80GB, 32 per GPU: priced at 296 tokens, the row
    # still one 512-token sample per sequence (positions 512), its measured 1,648 sequences/s
    binned = case_of(rows["PM0094"])
    assert isinstance(binned, Case) and binned.seq == 512
    assert binned.workload.startswith("gpt:layers=24,hidden=1024,heads=16,seq=296,")
    assert "positions=512" in binned.workload and "LDDL" in binned.notes
    assert binned.measured_samples_per_s == 1648
    # TF1's phase 2 (PM0122, tfrecords padded to 512) and PyTorch's phase 1 (PM0082) are not
    for rid, seq in (("PM0122", 512), ("PM0082", 128)):
        case = case_of(rows[rid])
        assert isinstance(case, Case) and f",seq={seq}," in case.workload and not case.notes


def test_v100_rows_map_to_the_hardware_their_text_names(rows) -> None:
    from dnnscale.validate.published_dev import _node

    # MXNet ResNet-50 on 'NVIDIA DGX-2 (16x V100 32GB)', Transformer-XL on '8x NVIDIA DGX-2H',
    # DGX-1 16GB rows on the V100 16 GB DGX-1
    assert _node(rows["PM0192"]) == ("dgx-2", False)
    assert _node(rows["PM0148"]) == ("dgx-2h", False)
    assert _node(rows["PM0174"]) == ("dgx-1-v100-16g", False)
    resnet = case_of(rows["PM0174"])
    assert isinstance(resnet, Case) and resnet.workload == "resnet50:layout=nchw"  # FP32: NCHW
    assert resnet.system == "dgx-1-v100-16g:1" and not resnet.closest_preset


def test_a_transformer_xl_row_by_hand(rows) -> None:
    # PM0160: base, 16 x 512, 8 heads of 64, d_inner 2048, tgt_len 192, mem_len 192, 8 A100-40GB,
    # 32 per GPU, global 256, FP16 AMP, 449,890 tokens/s
    case = case_of(rows["PM0160"])
    assert isinstance(case, Case) and case.source == "dle" and case.seq == 192
    # base's dropatt is 0 (wt103_base.yaml): no attention dropout, the hidden one kept; the
    # attention's projections have no biases (qkv_net, o_net: bias=False), the MLP's have
    assert case.workload == ("gpt:layers=16,hidden=512,heads=8,ffn=2048,seq=192,memory=192,"
                             "vocab=267735,positional=relative,norm_position=post,tied=true,"
                             "attention_dropout=false,attention_bias=false")
    assert case.system == "dgx-a100-40g:1"
    assert case.plan == {"tp": 1, "pp": 1, "dp": 8, "zero": 0, "micro_batch": 32,
                         "global_batch": 256, "precision": "fp16", "grad_accumulation": "add",
                         "loss": "torch16"}
    assert case.measured_samples_per_s == pytest.approx(449_890 / 192)
    assert "full softmax" in case.notes
    # large on 128 V100 SXM3 (8 DGX-2H): tgt_len and mem_len 384, 4 per GPU, 512 segments
    large = case_of(rows["PM0152"])
    assert isinstance(large, Case) and not large.closest_preset and large.system == "dgx-2h:8"
    assert "layers=18,hidden=1024,heads=16,ffn=4096,seq=384,memory=384" in large.workload
    assert large.workload.endswith("attention_dropout=true,attention_bias=false")  # dropatt 0.2
    assert large.plan["micro_batch"] == 4 and large.plan["global_batch"] == 512


def test_a_resnet_row_by_hand(rows) -> None:
    # PM0173: PyTorch DDP + DALI, 8 A100-80GB, 256 per GPU, global 2048, AMP, 16,621 images/s
    case = case_of(rows["PM0173"])
    assert isinstance(case, Case) and case.workload == "resnet50" and case.seq == 1
    assert case.system == "dgx-a100-80g:1"
    # its AMP is torch.autocast over the fp32 model (training.py since 097c7ff9)
    assert case.plan == {"tp": 1, "pp": 1, "dp": 8, "zero": 0, "micro_batch": 256,
                         "global_batch": 2048, "precision": "fp16", "grad_accumulation": "add",
                         "amp": "autocast"}
    assert case.measured_samples_per_s == 16_621 and "not modelled" in case.notes
    # MXNet on one A100, TF32, 512 per GPU; its fp16 AMP is not modelled ('half')
    mxnet = case_of(rows["PM0179"])
    assert isinstance(mxnet, Case) and mxnet.plan["precision"] == "tf32"
    assert "amp" not in mxnet.plan and "amp" not in case_of(rows["PM0192"]).plan
    assert mxnet.plan["micro_batch"] == mxnet.plan["global_batch"] == 512


def test_what_is_not_expressed_says_why(rows) -> None:
    # every row is expressed; a device with no preset would say so
    items = [case_of(row) for row in rows.values()]
    assert sum(isinstance(c, Case) for c in items) == 183 and len(items) == 183
    unknown = case_of({**rows["PM0174"], "device": "NVIDIA T4 16GB"})
    assert isinstance(unknown, Unexpressed) and "no preset for NVIDIA T4 16GB" in unknown.reason


def test_fp8_rows_pair_with_their_bf16_twins(rows) -> None:
    cases = [c for c in map(case_of, rows.values()) if isinstance(c, Case)]
    pairs = speedup_pairs(cases)
    assert {(a.id, b.id) for a, b in pairs} == {("PM0270", "PM0283"), ("PM0272", "PM0284"),
                                                ("PM0278", "PM0286")}
    for bf16, fp8 in pairs:
        assert (bf16.precision, fp8.precision) == ("bf16", "fp8")
        assert bf16.workload == fp8.workload and bf16.system == fp8.system


@pytest.mark.timeout(120)
def test_the_benchmark_writes_its_summary(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "published_dev.py"),
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rows_in_data"] == 183 and summary["rows_expressed"] == 183
    assert set(summary["per_source"]) == {"dle", "llm-foundry"}
    for figures in (summary["overall"], *summary["per_source"].values()):
        assert figures["median_relative_error"] <= figures["p90_relative_error"] \
            <= figures["max_relative_error"]
        assert figures["bias"] > 0
    assert len(summary["fp8_over_bf16"]) == 3
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert len(rows) == 183 and all("relative_error" in r or "error" in r for r in rows)


@pytest.mark.timeout(60)
def test_bad_data_gets_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("id,model\nX,MPT\n")
    for data in (tmp_path / "missing.csv", bad):
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "published_dev.py"),
                               "--data", str(data), "--out", str(tmp_path / "out")],
                              capture_output=True, text=True, timeout=50)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "--data" in done.stderr

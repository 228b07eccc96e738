"""The published development measurements (data/published-dev, issue 23) as rows the model
predicts: each row's workload, system preset and plan, read from its columns, or the reason the
model cannot express it yet.

Two sources (data/published-dev/SOURCE.md): NVIDIA DeepLearningExamples (BERT-Large
pretraining by data parallelism with gradient accumulation; Transformer-XL; ResNet-50) and
MosaicML llm-foundry (MPT 125M-70B under FSDP FULL_SHARD). What each row becomes (precision:
fp16 for AMP or FP16 mixed precision, else tf32 or fp32, as the row says):

- MPT: ``gpt:`` with the row's layers, d_model, heads, vocab and sequence, as the
  benchmark's models are built (`mpt_workload`): a learned position table of max_seq_len
  (the row's sequence) rows, tied embeddings, biases in every linear and norm, no dropout,
  flash attention by the Triton kernel (on H100 its speed is derived from A100's,
  presets/attention_kernels.yaml says why); the plan dp = the GPUs,
  ZeRO-3 (FSDP FULL_SHARD), the row's micro-batch and global batch, full recompute where activation
  checkpointing is on, bf16 or fp8 (``amp_fp8``), and gradients reduced in fp32 under
  ``mixed_precision=DEFAULT`` (llm-foundry's FSDP default reduces in float32) or bf16 under
  ``PURE``; ``overlap_dp`` on, as FSDP runs it: each unit's all-gather issued while the unit
  before it computes, in forward and backward (FSDP's prefetch; Composer's default
  ``backward_prefetch`` is BACKWARD_POST), its reduce-scatter beside the next unit's backward;
  its two training metrics recompute the loss over the logits after every micro-batch
  (``metrics=2``, LLM_FOUNDRY_TRAIN_METRICS).
- BERT-Large: ``gpt:`` 24 x 1024, 16 heads, the row's sequence (128 or 512), vocab 30,522,
  bidirectional, learned positions (512) and 2 token types, post-norm (a norm after the
  embedding and after each residual add: the zoo's ``bert-large``), tied decoder, its
  masked-LM head on the masked
  positions only (`bert_predictions`: TensorFlow's 20 / 80 max_predictions_per_seq, PyTorch's
  15 % of the priced tokens, LDDL's static masking); dp = the GPUs, ZeRO-0, the row's
  per-GPU batch as the micro-batch, its global batch (the accumulation in between), fp16 for
  AMP, else tf32 or fp32. PyTorch's phase 2 (sequence 512) runs LDDL's sequence binning,
  which pads each micro-batch only to its bin: it is priced at the mean padded length the
  LDDL README's figure implies (`lddl_padded_seq`, 296 tokens); TF1's tfrecords pad to 512.
- Transformer-XL base and large (PyTorch DDP): ``gpt:`` with the row's layers, d_model, heads,
  d_inner, tgt_len as the sequence and mem_len as the memory, relative positions, post-norm
  (its reference code's pre_lnorm false), attention dropout for large only (base's dropatt is
  0, `XL_DROPATT`), tied embeddings, WikiText-103's vocabulary of
  267,735 words (Merity et al. 2016); dp = the GPUs, ZeRO-0, the row's per-GPU batch and
  global batch. Its adaptive softmax and adaptive input (cutoffs 19,997, 39,997, 199,997;
  div_val 1 for base, 4 for large: wt103_base.yaml and wt103_large.yaml) are not expressed:
  the output is priced as a full softmax over the 267,735 words and the input as one table
  of 267,735 x d_model, which over-counts the output layer (each token's logits over the
  20,000-word head, the tail clusters only for the tokens whose target is in them) and, for
  large, the table's parameters; each case says so in its notes.
- ResNet-50 v1.5 (MXNet + Horovod, PyTorch DDP): the zoo's ``resnet50``, dp = the GPUs,
  ZeRO-0, the row's per-GPU batch and global batch. The input pipeline is not modelled: the
  MXNet figures include data loading and augmentation (DALI, on the GPU), the PyTorch ones
  load with DALI too; neither is priced (no factor stands in for it). MXNet's AMP runs fuse
  each batch norm with the ReLU after it and each block's last norm with the add and ReLU
  (``resnet50:fuse_bn=all``, `resnet50_bn_fusion`). The AMP runs keep their activations
  channels last (``resnet50``); the others run NCHW (``resnet50:layout=nchw``), whose Tensor
  Core convolutions (TF32 on A100) pay cuDNN's layout transposes (`resnet50_layout`).
- Systems: A100 40 GB -> dgx-a100-40g (8 x 200 Gb/s, the "1600 Gbps" of llm-foundry's
  tables); A100 80 GB -> a100-80g-roce where the row says RoCE, else dgx-a100-80g; H100 ->
  dgx-h100 (llm-foundry does not state its fabric); V100 SXM3 32 GB (DGX-2/2H) -> dgx-2h
  for the rows a DGX-2H measured, dgx-2 for those the row names a DGX-2 (the BERT table's
  single-node rows: its notes say they are the README's DGX-2 values, where the multi-node
  rows ran on DGX-2H; 16 V100 on NVSwitch, 8 x EDR between nodes, as the row's columns say);
  V100 SXM2 16 GB (DGX-1) -> dgx-1-v100-16g (8 on the NVLink cube-mesh, 4 x EDR). Each is
  the hardware the row names, so no row is flagged ``closest_preset`` today; the flag stays
  for a row that runs on a stand-in.
- Not expressed (each with its reason): the rows on a device no preset has, whatever their
  model (none today).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dnnscale.workload.zoo import zoo_name

DATA = Path(__file__).resolve().parents[3] / "data" / "published-dev" / "measurements.csv"
BERT_VOCAB = 30522
"""BERT's uncased WordPiece vocabulary (Devlin et al. 2019)."""
WIKITEXT103_VOCAB = 267_735
"""WikiText-103's word vocabulary (Merity et al. 2016, Table 1; n_token in NVIDIA
DeepLearningExamples' wt103_large.yaml)."""
XL_FULL_SOFTMAX_NOTE = ("adaptive softmax and adaptive input (cutoffs 19997, 39997, 199997) "
                        "not expressed: priced as a full softmax and one embedding table over "
                        "267,735 words; data loading not modelled")
RESNET_NOTE = "the input pipeline (DALI) is not modelled"
LDDL_UNBINNED_S = 2565.0
LDDL_BIN64_S = 1483.0
"""End-to-end latency of BERT phase-2 pretraining (sequence 512) on 32 Selene nodes without
sequence binning (bin size 512) and with LDDL's bin size 64, the 1.73x speed-up of LDDL's
README figure "Performance vs. Bin Size on BERT Phase 2 Pretraining" (NVIDIA/LDDL,
docs/images/binning_perf.gif; figures only). DeepLearningExamples' PyTorch BERT pretrains
phase 2 with LDDL at bin size 64 since its January 2022 release (21.11 container; README
changelog, scripts/run_pretraining.sh ``phase2_bin_size=64``): every iteration draws one bin
and pads each micro-batch only to its longest sample."""
LDDL_BIN64_NOTE = ("phase 2 with LDDL's sequence binning (bin size 64): priced at the mean "
                   "padded length, 512 x 1483 / 2565 = 296 tokens (LDDL README figure)")


def lddl_padded_seq(seq: int) -> int:
    """The mean padded tokens per sample of a phase-2 micro-batch under LDDL's bin size 64:
    the sequence scaled by the figure's latency ratio, time taken as proportional to padded
    tokens. The end-to-end latency also holds the per-step costs binning does not shrink
    (all-reduce, optimizer), so this overstates the padded length a little: conservative."""
    return round(seq * LDDL_BIN64_S / LDDL_UNBINNED_S)


@dataclass(frozen=True)
class Case:
    """One expressible row: what to predict, and the measured throughput in samples/s."""

    id: str
    source: str
    model: str
    workload: str
    system: str
    plan: dict[str, Any]
    seq: int
    measured_samples_per_s: float
    precision: str
    devices: int
    closest_preset: bool = False
    notes: str = ""


@dataclass(frozen=True)
class Unexpressed:
    """A row the model cannot express yet, and why."""

    id: str
    source: str
    model: str
    reason: str


def source_of(row: dict[str, str]) -> str:
    """The row's source: ``dle`` (NVIDIA DeepLearningExamples) or ``llm-foundry``."""
    return "llm-foundry" if "llm-foundry" in row["url_or_repo_path"] else "dle"


def _first_int(text: str, field_name: str, row_id: str) -> int:
    match = re.search(r"\d+", text.replace(",", ""))
    if match is None:
        raise ValueError(f"{row_id}: no number in {field_name} {text!r}")
    return int(match.group())


def _find(pattern: str, text: str, row_id: str, what: str) -> re.Match[str]:
    match = re.search(pattern, text)
    if match is None:
        raise ValueError(f"{row_id}: cannot read {what} from {text!r}")
    return match


def _samples_per_s(row: dict[str, str], seq: int) -> float:
    """The measured value in samples (sequences) per second, from the row's unit."""
    value, unit = float(row["measured_value"]), row["measured_unit"]
    if unit.startswith("tokens/sec (total)"):
        return value / seq
    if unit.startswith(("sequences/sec (total)", "sentences/sec (total)", "images/sec (total)")):
        return value
    raise ValueError(f"{row['id']}: unit {unit!r} is not one this benchmark converts")


def _node(row: dict[str, str]) -> tuple[str, bool]:
    """(node preset, closest_preset) of the row's device and fabric, or ('', False)."""
    device, fabric = row["device"], row["inter_node_network"]
    if "A100" in device and "40GB" in device:
        return "dgx-a100-40g", False
    if "A100" in device and "80GB" in device:
        return ("a100-80g-roce" if "RoCE" in fabric else "dgx-a100-80g"), False
    if "H100" in device:
        return "dgx-h100", False
    if "V100 SXM3" in device:
        return ("dgx-2" if _names_dgx2(row) else "dgx-2h"), False
    if "V100 SXM2 16GB" in device:
        return "dgx-1-v100-16g", False
    return "", False


def _names_dgx2(row: dict[str, str]) -> bool:
    """Whether a DGX-2/2H row says it is a plain DGX-2's value: its table or notes name a
    DGX-2 and not a DGX-2H ('DGX-2 (16x V100 32GB)'), or a single-node row's notes say the
    single-node value is the DGX-2's (the TF BERT table reuses the README's DGX-2 row in its
    DGX-2H multi-node table)."""
    text = f"{row['source']} {row['notes']}"
    if "DGX-2H" not in text:
        return "DGX-2" in text
    return row["num_nodes"] == "1" and "DGX-2 single-node" in row["notes"]


def _system(row: dict[str, str], node: str) -> str:
    """`node`:N, N the nodes of the preset's size that hold the row's GPUs."""
    from dnnscale.system.gpu import preset_devices_per_node

    devices = int(row["num_devices"])
    return f"{node}:{max(1, math.ceil(devices / preset_devices_per_node(node)))}"


def _precision(text: str) -> str:
    """fp16 for AMP or FP16 mixed precision, else tf32 or fp32, from the row's precision."""
    if "FP16" in text or "AMP" in text:
        return "fp16"
    return "tf32" if "TF32" in text else "fp32"


def grad_accumulation_of(framework: str) -> str:
    """How the row's code accumulates its micro-batches' gradients (plan/plan.py
    GRAD_ACCUMULATION): DeepLearningExamples' TensorFlow 1 BERT clips each micro-batch and adds
    it into fp32 accumulators (optimization.py: 'clip_add'); the PyTorch codes (DDP under
    no_sync, Composer's FSDP) and MXNet add through their autograd ('add')."""
    return "clip_add" if framework.startswith("TensorFlow") else "add"


def loss_of(framework: str, precision: str) -> str:
    """How a BERT row's code computes its masked-LM loss (workload/transformer_kinds.py
    LOSS_KERNELS). DeepLearningExamples' PyTorch BERT: torch's CrossEntropyLoss
    (run_pretraining.py BertPretrainingCriterion at 729963dd) on the logits as the model
    writes them; its fp16 runs cast the model to fp16 with autocast off
    (scripts/run_pretraining.sh's default allreduce_post_accumulation_fp16=true, then
    model.half()), so the loss runs on the 16-bit logits, 'torch16'; in tf32/fp32 the logits
    are fp32 ('torch', the same at 4 bytes). TensorFlow 1's: tf.nn.log_softmax, then the
    one-hot labels' product summed (run_pretraining.py get_masked_lm_output), and TF-AMP
    runs LogSoftmax on float32 (its black list), so an fp32 cast of the logits and an fp32
    log-softmax, 'torch' (the one-hot product's pass is not priced)."""
    if framework.startswith("PyTorch") and precision == "fp16":
        return "torch16"
    return "torch"


def amp_of(framework: str, precision: str) -> dict[str, str]:
    """How a BERT row's code runs its memory-bound kernels in fp16 (the plan's `amp`,
    workload/transformer_kinds.py AMP_MODES): TensorFlow 1 BERT's --amp is TF-AMP's graph
    rewrite ('tf-amp'; run_pretraining.py: amp defaults to True, the rows' fp16); the PyTorch
    BERT casts the model to fp16 ('half', the default: `loss_of`). Nothing for tf32/fp32."""
    if framework.startswith("TensorFlow") and precision == "fp16":
        return {"amp": "tf-amp"}
    return {}


def _data_parallel(row: dict[str, str], precision: str) -> dict[str, Any]:
    """dp = the row's GPUs, ZeRO-0, its per-GPU batch as the micro-batch, its global batch,
    its code's gradient accumulation (`grad_accumulation_of`)."""
    rid = row["id"]
    return {"tp": 1, "pp": 1, "dp": int(row["num_devices"]), "zero": 0,
            "micro_batch": _first_int(row["micro_batch"], "micro_batch", rid),
            "global_batch": _first_int(row["global_batch"], "global_batch", rid),
            "precision": precision,
            "grad_accumulation": grad_accumulation_of(row["framework"])}


LLM_FOUNDRY_LOSS = "fused"
"""llm-foundry's MPT loss: ComposerMPTCausalLM's loss_fn defaults to fused_crossentropy,
flash-attn's cross_entropy kernel (llmfoundry/models/mpt/modeling_mpt.py at 061f2c7c; the
benchmark YAMLs leave it unset)."""


LLM_FOUNDRY_TRAIN_METRICS = 2
"""The training metrics llm-foundry's MPT recomputes the loss for after every micro-batch:
ComposerMPTCausalLM's train_metrics, LanguageCrossEntropy and LanguagePerplexity (on by default,
``use_train_metrics``; llmfoundry/models/mpt/modeling_mpt.py at the data's commit), which
Composer's trainer updates from each micro-batch's logits (_train_microbatch ->
_eval_train_metrics), each a torch CrossEntropyLoss over every logit under the run's amp_bf16
autocast (TransformerShape.metrics)."""


def mpt_workload(layers: int, hidden: int, heads: int, vocab: int, seq: int) -> str:
    """The ``gpt:`` workload of an MPT of llm-foundry's benchmarks at sequence `seq`.

    The benchmark (scripts/train/benchmarking/submit_benchmarks.py at the data's commit)
    trains the pretraining yamls (scripts/train/yamls/pretrain/mpt-*.yaml), which give the
    shape and ``attn_impl: triton`` only; it sets max_seq_len to the row's sequence and
    norm_type low_precision_layernorm (16-bit norms, the default `amp`). The rest is
    MPTConfig's defaults (llmfoundry/models/mpt/configuration_mpt.py): learned_pos_emb true
    (a max_seq_len x d_model position table; alibi false), no_bias false (biases in every
    linear and norm), resid_pdrop, emb_pdrop and attn_pdrop 0.0 (no dropout, which PyTorch
    skips at p = 0), tied embeddings; its loss is LLM_FOUNDRY_LOSS and its two training
    metrics LLM_FOUNDRY_TRAIN_METRICS. The parameter counts the README prints with each row
    (0.13B to 64.86B) are this workload's, rounded, at every size and sequence (they grow
    with the position table: MPT-7b 6.65B at 1,024 tokens, 6.92B at 65,536)."""
    return (f"gpt:layers={layers},hidden={hidden},heads={heads},seq={seq},vocab={vocab},"
            f"positional=learned,positions={seq},flash=true,attention_kernel=triton,tied=true,"
            f"bias=true,dropout=false,metrics={LLM_FOUNDRY_TRAIN_METRICS}")


def _mpt(row: dict[str, str], node: str, closest: bool) -> Case:
    rid, details, config = row["id"], row["model_details"], row["parallel_config"]
    layers, hidden, heads, vocab, seq = (int(v) for v in _find(
        r"(\d+) layers, d_model (\d+), (\d+) heads, FFN 4x, vocab (\d+), seq len (\d+)",
        details, rid, "the MPT shape").groups())
    workload = mpt_workload(layers, hidden, heads, vocab, seq)
    checkpointing = "activation checkpointing=True" in config
    pure = "mixed_precision=PURE" in config
    precision = "fp8" if "fp8" in row["precision"] else "bf16"
    devices = int(row["num_devices"])
    plan = {"tp": 1, "pp": 1, "dp": devices, "zero": 3,
            "micro_batch": _first_int(row["micro_batch"], "micro_batch", rid),
            "global_batch": _first_int(row["global_batch"], "global_batch", rid),
            "recompute": "full" if checkpointing else "none", "precision": precision,
            "grad_bytes": 2 if pure else 4, "overlap_dp": True,
            "grad_accumulation": grad_accumulation_of(row["framework"]),
            "loss": LLM_FOUNDRY_LOSS}
    return Case(rid, "llm-foundry", row["model"], workload, _system(row, node), plan, seq,
                _samples_per_s(row, seq), precision, devices, closest)


TF_BERT_MAX_PREDICTIONS = {128: 20, 512: 80}
"""max_predictions_per_seq of DeepLearningExamples' TensorFlow BERT by sequence length
(scripts/run_pretraining_lamb_phase1.sh and _phase2.sh: max_pred_per_seq=20 and 80; its
tfrecords pad every sequence's masked positions to that many, which gather_indexes gathers)."""
LDDL_MASKED_LM_RATIO = 0.15
"""The share of a sequence's tokens LDDL's static masking labels for the masked-LM loss
(lddl/dask/bert/pretrain.py: masked_lm_ratio=0.15, num_to_predict = max(1, round(tokens x
ratio))), which DeepLearningExamples' PyTorch BERT runs (scripts/run_pretraining.sh:
masking=static)."""


def bert_predictions(framework: str, seq: int, priced_seq: int) -> int:
    """The positions per sequence DeepLearningExamples' BERT runs its masked-LM head on: the
    TensorFlow one gathers max_predictions_per_seq (TF_BERT_MAX_PREDICTIONS); the PyTorch one
    (dense sequence output, its default) index-selects the labelled positions, LDDL's
    max(1, round(0.15 x tokens)) of the priced tokens (under sequence binning the padded
    length stands in for the tokens, which counts the padding's share too)."""
    if framework.startswith("TensorFlow"):
        return TF_BERT_MAX_PREDICTIONS[seq]
    return max(1, round(priced_seq * LDDL_MASKED_LM_RATIO))


BERT_SEPARATE_PROJECTIONS = True
"""Both BERTs project Q, K and V with three Linear modules (separate_projections): the
TensorFlow one three tf.layers.dense (modeling.py attention_layer: query_layer, key_layer,
value_layer), the PyTorch one three nn.Linear (modeling.py BertSelfAttention: self.query,
self.key, self.value), at the data's commit 729963dd."""


def _bert(row: dict[str, str], node: str, closest: bool) -> Case:
    rid = row["id"]
    seq = int(_find(r"seq len (\d+)", row["model_details"], rid, "the sequence").group(1))
    binned = seq == 512 and row["framework"].startswith("PyTorch")
    priced = lddl_padded_seq(seq) if binned else seq
    predictions = bert_predictions(row["framework"], seq, priced)
    workload = (f"gpt:layers=24,hidden=1024,heads=16,seq={priced},vocab={BERT_VOCAB},"
                "causal=false,positional=learned,positions=512,token_types=2,"
                f"norm_position=post,tied=true,predictions={predictions},"
                f"separate_projections={str(BERT_SEPARATE_PROJECTIONS).lower()}")
    precision = _precision(row["precision"])
    return Case(rid, "dle", row["model"], workload, _system(row, node),
                {**_data_parallel(row, precision), "loss": loss_of(row["framework"], precision),
                 **amp_of(row["framework"], precision)}, seq,
                _samples_per_s(row, seq), precision, int(row["num_devices"]), closest,
                LDDL_BIN64_NOTE if binned else "")


XL_LOSS = "torch16"
"""How DeepLearningExamples' Transformer-XL computes its loss: F.log_softmax on the head's (and
each tail cluster's) logits as they are (utils/proj_adaptive_softmax.py), which apex's O2, its
default --amp_mode at the rows' container (train.py at f838cf32), leaves in fp16; fp32 rows
compute it in fp32 (the 'torch' kernel's bytes)."""


XL_DROPATT = {"base": 0.0, "large": 0.2}
"""Transformer-XL's attention dropout (dropatt) by model size, as wt103_base.yaml and
wt103_large.yaml set it (DeepLearningExamples' PyTorch Transformer-XL at f838cf32; both keep a
hidden dropout, 0.1 and 0.2). At 0.0 its nn.Dropout(0.0) runs no kernel."""


def xl_attention_dropout(row: dict[str, str]) -> str:
    """'true' when the row's Transformer-XL size drops its attention probabilities
    (XL_DROPATT), else 'false'."""
    size = _find(r"Transformer-XL (base|large)", row["model"], row["id"],
                 "the Transformer-XL size").group(1)
    return "true" if XL_DROPATT[size] > 0 else "false"


def _transformer_xl(row: dict[str, str], node: str, closest: bool) -> Case:
    rid = row["id"]
    layers, hidden, heads, head_dim, ffn, seq, memory = (int(v) for v in _find(
        r"(\d+) layers, d_model (\d+), (\d+) heads \(d_head (\d+)\), d_inner (\d+), "
        r"tgt_len (\d+), mem_len (\d+)", row["model_details"], rid,
        "the Transformer-XL shape").groups())
    if heads * head_dim != hidden:
        raise ValueError(f"{rid}: {heads} heads of {head_dim} are not d_model {hidden}")
    workload = (f"gpt:layers={layers},hidden={hidden},heads={heads},ffn={ffn},seq={seq},"
                f"memory={memory},vocab={WIKITEXT103_VOCAB},positional=relative,"
                f"norm_position=post,tied=true,attention_dropout={xl_attention_dropout(row)},"
                "attention_bias=false")
    precision = _precision(row["precision"])
    return Case(rid, "dle", row["model"], workload, _system(row, node),
                {**_data_parallel(row, precision), "loss": XL_LOSS}, seq,
                _samples_per_s(row, seq), precision, int(row["num_devices"]), closest,
                XL_FULL_SOFTMAX_NOTE)


def resnet50_layout(precision: str) -> str:
    """The activation layout DeepLearningExamples' ResNet-50 runs in at `precision`: channels
    last (nhwc) for its mixed-precision runs, NCHW otherwise. Sources: the PyTorch
    resnet50v1.5 configs.yml gives the AMP configurations memory_format nhwc and the others
    none (PyTorch's default, NCHW; the rows' notes say so); MXNet's RN50v1.5 `runner` passes
    --conv-layout NHWC (with --batchnorm-layout and --pooling-layout NHWC) only for float16,
    so float32 (TF32 on A100) runs its convolutions in train.py's default NCHW."""
    return "nhwc" if precision == "fp16" else "nchw"


def resnet50_bn_fusion(framework: str, precision: str) -> str:
    """The batch-norm fusions DeepLearningExamples' ResNet-50 runs with (the zoo's
    ``fuse_bn``): MXNet's `runner` passes --fuse-bn-relu 1 --fuse-bn-add-relu 1 for float16
    only ('all'); its float32 runs and PyTorch's (eager batch norm, then ReLU and add as
    kernels of their own) fuse nothing ('none')."""
    return "all" if framework.startswith("MXNet") and precision == "fp16" else "none"


def resnet50_amp(framework: str, precision: str) -> dict[str, str]:
    """How DeepLearningExamples' ResNet-50 runs fp16 (the plan's `amp`): the PyTorch one under
    torch.cuda.amp.autocast over its fp32 model since its 20.12 update (ConvNets
    image_classification/training.py at 097c7ff9, 2021-03-04: `with autocast(enabled=use_amp)`),
    which its 21.03 rows ran: 'autocast', fp32 weights with no master copy (no CNN kind runs in
    float32 under it). MXNet's AMP is not modelled: 'half'."""
    if framework.startswith("PyTorch") and precision == "fp16":
        return {"amp": "autocast"}
    return {}


def _resnet50(row: dict[str, str], node: str, closest: bool) -> Case:
    """One sample is one 224x224 image (Case.seq 1); the layout is `resnet50_layout`'s, the
    batch-norm fusions `resnet50_bn_fusion`'s, its ReLUs and adds in place (the zoo's default:
    DeepLearningExamples' PyTorch resnet.py runs nn.ReLU(inplace=True) and `out += residual`;
    MXNet's rows keep the default too, not checked against its memory planner: memory only, the
    time is the same either way), fp16 `resnet50_amp`'s."""
    precision = _precision(row["precision"])
    workload = zoo_name("resnet50", layout=resnet50_layout(precision),
                        fuse_bn=resnet50_bn_fusion(row["framework"], precision))
    return Case(row["id"], "dle", row["model"], workload, _system(row, node),
                {**_data_parallel(row, precision), **resnet50_amp(row["framework"], precision)},
                1, _samples_per_s(row, 1), precision, int(row["num_devices"]), closest,
                RESNET_NOTE)


def case_of(row: dict[str, str]) -> Case | Unexpressed:
    """The row as a Case, or why it is not one."""
    rid, source, model = row["id"], source_of(row), row["model"]
    node, closest = _node(row)
    if not node:
        return Unexpressed(rid, source, model, f"no preset for {row['device']}")
    if model.startswith("MPT"):
        return _mpt(row, node, closest)
    if model.startswith("BERT-Large"):
        return _bert(row, node, closest)
    if model.startswith("Transformer-XL"):
        return _transformer_xl(row, node, closest)
    if model.startswith("ResNet-50"):
        return _resnet50(row, node, closest)
    return Unexpressed(rid, source, model, "a model this benchmark does not map")


def load_rows(path: Path = DATA) -> list[dict[str, str]]:
    with open(path, newline="") as stream:
        return list(csv.DictReader(stream))


def speedup_pairs(cases: list[Case]) -> list[tuple[Case, Case]]:
    """(bf16, fp8) pairs of rows that differ in precision alone (model, system, plan)."""
    def key(case: Case) -> tuple[Any, ...]:
        plan = {k: v for k, v in case.plan.items() if k not in ("precision", "grad_bytes")}
        return case.workload, case.system, tuple(sorted(plan.items()))

    bf16 = {key(c): c for c in cases if c.precision == "bf16"}
    return [(bf16[key(c)], c) for c in cases if c.precision == "fp8" and key(c) in bf16]

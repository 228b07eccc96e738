"""Megatron-style plans from flags or YAML: tensor × pipeline × data parallelism, micro-batches,
schedule, ZeRO, recomputation and precision — the fields `--tp --pp --dp --micro-batch
--global-batch --schedule --virtual-stages --zero --recompute --precision` set.

Plan YAML (and `optimize --json`'s plans, `export`'s input) use these names::

    tp: 8               # tensor-parallel degree (Megatron column/row split)
    pp: 8               # pipeline stages
    dp: 8               # data-parallel replicas
    micro_batch: 1      # samples (sequences) per micro-batch
    global_batch: 1536  # samples per step: dp × micro_batch × micro-batches
    schedule: 1f1b      # gpipe | 1f1b | interleaved
    virtual_stages: 1   # chunks per device with the interleaved schedule
    zero: 0             # ZeRO stage 0-3 (3 = FSDP)
    zero3_fetch: blocks # ZeRO-3's gathers: blocks (FSDP, one per transformer block) | buckets
                        # (DeepSpeed stage 3: prefetch and reduce buckets)
    recompute: full     # none | selective | full | op
    amp: half           # how a 16-bit plan's memory-bound kernels run: half (the model cast
                        # to 16 bits: Megatron, DeepSpeed, torchtitan, the default) | autocast
                        # (torch.autocast over fp32 weights: norms, residual stream and
                        # softmax in fp32) | tf-amp (TensorFlow's AMP graph rewrite: every
                        # elementwise op of BERT's in fp32)
    loss: inplace       # how the loss is computed, which sets its memory: inplace (Megatron's
                        # vocabulary-parallel cross-entropy, the default) | torch (torch's
                        # cross_entropy on an fp32 cast: torchtitan) | torch16 (the same on
                        # 16-bit logits, no cast: apex O2) | fused (flash-attn's kernel:
                        # llm-foundry)
    precision: bf16     # fp32 | tf32 | bf16 | fp16 | fp8
    sequence_parallel: false
    overlap_dp: false   # data-parallel gradients overlap the backward pass in buckets
    overlap_tp: false   # tensor-parallel exchanges in tp chunks under the GEMMs (needs
                        # sequence_parallel; Megatron's --tp-comm-overlap)
    overlap_tp_method: userbuffers  # how: userbuffers (Transformer Engine, Megatron: every
                        # exchange) | micro_pipeline (torch's async TP, torchtitan: not the
                        # backward reduce-scatters of gradients summed over several Linears)
    overlap_pp: true    # pipeline sends overlap compute (interleaved only; default: on there,
                        # Megatron's overlap_p2p_comm)
    pp_scatter_gather: false  # each tensor member sends 1/tp of the boundary tensor it holds
                        # and the receivers all-gather it (DeepSpeed's pipe_partitioned, on in
                        # DeepSpeed; Megatron-LM before Megatron-Core); false: the tensor it
                        # holds whole (Megatron-Core), s/tp of it under sequence parallelism
    grad_bytes: 4       # bytes per gradient value accumulated and reduced (default: 4 under
                        # bf16/fp8, Megatron's fp32 main grads; 2 under fp16; 4 under fp32/tf32)
    grad_accumulation: fused  # how micro-batches' gradients accumulate: fused (Megatron's
                        # gradient-accumulation fusion, the default) | add (autograd: DDP,
                        # FSDP, DeepSpeed, torchtitan) | clip_add (TensorFlow 1 BERT)
    ep: 8               # expert parallelism: experts split over ep devices (MoE workloads)
    cp: 2               # context parallelism: each sample's sequence split over cp devices
    cp_algorithm: ring  # ring (ring attention) | alltoall (DeepSpeed-Ulysses)
    expert_imbalance: 1.0  # busiest ep member's routed tokens / the mean (1: uniform)
    etp: 1              # expert tensor parallelism, a divisor of tp (default: tp)

The mesh is pp × dp × ep × cp × tp devices; dp · ep members take different samples, so
global_batch is a multiple of dp × ep × micro_batch.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from dnnscale.boundary import require_bool, require_mapping
from dnnscale.errors import InputError, require_int, short_repr
from dnnscale.plan.plan import (ALGORITHMS, CP_ALGORITHMS, GRAD_ACCUMULATION, OPTIMIZERS,
                                MICRO_PIPELINE, RECOMPUTE, SCHEDULES, TP_OVERLAP_METHODS,
                                USERBUFFERS, ZERO3_FETCH, Batch, Collective,
                                ContextParallel, DataParallel, ExpertParallel, MemoryPolicy,
                                ParallelPlan, ParameterServer, Pipeline, Precision, TensorSplit)
from dnnscale.plan.rules import (amp_needs_16_bit, batch_divides, expert_tensor_divides,
                                 imbalance_within_experts, interleaved_micro_batches,
                                 megatron_aggregation, overlap_method_needs_overlap,
                                 pipeline_overlap_needs_interleaving, require, schedule_virtual_stages,
                                 tensor_overlap_needs_sequence_parallel, zero3_fetch_needs_zero3)
from dnnscale.workload.transformer_kinds import AMP_MODES, FP32_BYTES, LOSS_KERNELS

PRECISION_PRESETS = {
    "fp32": Precision("fp32", 4, 4, 4, 4, False),
    "tf32": Precision("tf32", 4, 4, 4, 4, False),
    "bf16": Precision("bf16", 2, 4, 4, 2, True),
    "fp16": Precision("fp16", 2, 2, 4, 2, True),
    "fp8": Precision("fp8", 2, 4, 4, 2, True),
}
"""Bytes per value of (parameters, gradients, optimizer-state values, activations) and the fp32
master copy, per precision, as Megatron-LM runs them by default: mixed precision keeps 16-bit
weights and activations with fp32 Adam state and master weights (Micikevicius et al. 2018;
Rajbhandari et al. SC'20: 12 bytes of state per parameter); gradients are accumulated and
reduced in fp32 under bf16 (and fp8, whose weights are bf16) and in fp16 under fp16
(megatron/training/arguments.py: "bfloat16 requires gradient accumulation and all-reduce to be
done in fp32" sets accumulate_allreduce_grads_in_fp32 unless --grad-reduce-in-bf16; fp16 leaves
it off): 2 + 4 + 12 = 18 bytes per parameter under bf16, Megatron's distributed-optimizer
table. fp8 computes the GEMMs in fp8 and keeps bf16 weights (Transformer Engine). A plan's
grad_bytes (predict --grad-bytes) overrides the width."""

MODERN_FIELDS = ("tp", "pp", "dp", "micro_batch", "global_batch", "schedule", "virtual_stages",
                 "zero", "recompute", "precision", "sequence_parallel", "overlap_dp",
                 "grad_bytes", "ep", "cp", "cp_algorithm", "expert_imbalance", "etp",
                 "overlap_tp", "overlap_pp", "zero3_fetch", "grad_accumulation", "loss",
                 "amp", "overlap_tp_method", "pp_scatter_gather")
MAX_DEGREE = 1 << 20
"""The largest tp, pp or dp a plan may name (a million devices per dimension; MAX_MACHINES)."""
MAX_VIRTUAL_STAGES = 1024


GRAD_BYTES = (1, 2, 4)
"""Bytes per value a plan may store or send (fp8/int8, 16-bit, fp32)."""


def is_modern(data: dict[str, Any]) -> bool:
    """Whether a plan mapping uses the Megatron-style fields (rather than Adam's; the two sets
    of names are disjoint, so any one of MODERN_FIELDS decides)."""
    return any(key in data for key in MODERN_FIELDS)


def _one_of(field: str, value: object, allowed: tuple[str, ...]) -> str:
    """`value` if it is one of the names `allowed` (a list or mapping is not a name)."""
    if not isinstance(value, str) or value not in allowed:
        raise InputError(field, f"must be one of {', '.join(allowed)}, got {short_repr(value)}")
    return value


def _choice(data: dict[str, Any], key: str, allowed: tuple[str, ...], default: str,
            where: str) -> str:
    return _one_of(f"{where}.{key}", data.get(key, default), allowed)


def _flag(data: dict[str, Any], key: str, where: str) -> bool:
    return require_bool(f"{where}.{key}", data.get(key, False))


def _plan_rules(plan: ParallelPlan, where: str) -> ParallelPlan:
    """The rules a plan obeys with no workload or system (plan/rules.py), for plans from a
    mapping and from objects alike: the schedule's virtual stages, the interleaved schedule's
    micro-batches, a collective's aggregation (which engines run the plan is
    plan/engines.py's)."""
    pp = plan.pipeline.stages
    require(schedule_virtual_stages(plan.pipeline.schedule, pp, plan.pipeline.virtual_stages),
            where)
    require(interleaved_micro_batches(plan.pipeline.schedule, plan.batch.accumulation, pp), where)
    aggregation = plan.data.aggregation
    require(megatron_aggregation(isinstance(aggregation, ParameterServer)), where)
    if isinstance(aggregation, Collective):
        require(zero3_fetch_needs_zero3(aggregation.fetch, aggregation.zero_stage), where)
    require(imbalance_within_experts(plan.expert.imbalance, plan.expert.degree), where)
    require(expert_tensor_divides(plan.expert.tensor, plan.tensor.degree), where)
    require(tensor_overlap_needs_sequence_parallel(plan.tensor.overlap, plan.tensor.degree,
                                                   plan.tensor.sequence_parallel), where)
    require(overlap_method_needs_overlap(plan.tensor.overlap_method, plan.tensor.overlap), where)
    require(pipeline_overlap_needs_interleaving(plan.pipeline.overlap_p2p,
                                                plan.pipeline.schedule, pp), where)
    require(amp_needs_16_bit(plan.precision.amp, plan.precision.compute,
                             plan.precision.activation_bytes), where)
    return plan


def _imbalance(field: str, value: object) -> float:
    """A load imbalance: a finite number >= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < 1:
        raise InputError(field, f"must be a number >= 1 (1: uniform routing), got "
                         f"{short_repr(value)}")
    return float(value)


def modern_plan_from_dict(data: dict[str, Any], where: str = "plan") -> ParallelPlan:
    """Validate a mapping of MODERN_FIELDS into a ParallelPlan (Megatron rules, Adam optimizer);
    the rules that need no workload are plan/rules.py's, the ones `predict` and the search use.

    global_batch defaults to dp × micro_batch (one micro-batch per step); it must be a multiple
    of dp × micro_batch.
    """
    unknown = sorted(set(require_mapping(data, where)) - set(MODERN_FIELDS))
    if unknown:
        raise InputError(f"{where}.{unknown[0]}", f"unknown field (known: "
                         f"{', '.join(MODERN_FIELDS)})")
    values = {k: v for k, v in data.items() if v is not None}
    tp = require_int(f"{where}.tp", values.get("tp", 1), maximum=MAX_DEGREE)
    pp = require_int(f"{where}.pp", values.get("pp", 1), maximum=MAX_DEGREE)
    dp = require_int(f"{where}.dp", values.get("dp", 1), maximum=MAX_DEGREE)
    ep = require_int(f"{where}.ep", values.get("ep", 1), maximum=MAX_DEGREE)
    cp = require_int(f"{where}.cp", values.get("cp", 1), maximum=MAX_DEGREE)
    cp_algorithm = _choice(values, "cp_algorithm", CP_ALGORITHMS, "ring", where)
    imbalance = _imbalance(f"{where}.expert_imbalance", values.get("expert_imbalance", 1.0))
    etp = require_int(f"{where}.etp", values.get("etp", tp), maximum=MAX_DEGREE)
    micro = require_int(f"{where}.micro_batch", values.get("micro_batch", 1))
    global_batch = require_int(f"{where}.global_batch",
                               values.get("global_batch", dp * ep * micro))
    require(batch_divides(global_batch, dp * ep, micro), where)
    micro_batches = global_batch // (dp * ep * micro)
    schedule = _choice(values, "schedule", SCHEDULES, "1f1b", where)
    accumulate = _choice(values, "grad_accumulation", GRAD_ACCUMULATION, "fused", where)
    virtual = require_int(f"{where}.virtual_stages", values.get("virtual_stages", 1),
                          maximum=MAX_VIRTUAL_STAGES)
    zero = require_int(f"{where}.zero", values.get("zero", 0), minimum=0, maximum=3)
    recompute = _choice(values, "recompute", RECOMPUTE, "none", where)
    loss = _choice(values, "loss", LOSS_KERNELS, "inplace", where)
    precision = PRECISION_PRESETS[_choice(values, "precision", tuple(PRECISION_PRESETS), "bf16",
                                          where)]
    if "grad_bytes" in values:
        precision = replace(precision,
                            grad_bytes=_value_bytes(f"{where}.grad_bytes", values["grad_bytes"]))
    precision = amp_precision(precision, _choice(values, "amp", AMP_MODES, "half", where))
    overlap_pp = (require_bool(f"{where}.overlap_pp", values["overlap_pp"])
                  if "overlap_pp" in values else None)
    return _plan_rules(ParallelPlan(
        tensor=TensorSplit(tp, "megatron", _flag(values, "sequence_parallel", where),
                           _flag(values, "overlap_tp", where),
                           _choice(values, "overlap_tp_method", TP_OVERLAP_METHODS,
                                   USERBUFFERS, where)),
        pipeline=Pipeline(pp, schedule, virtual, overlap_pp,
                          _flag(values, "pp_scatter_gather", where)),
        data=DataParallel(dp, Collective("ring", zero, _flag(values, "overlap_dp", where),
                                         _choice(values, "zero3_fetch", ZERO3_FETCH, "blocks",
                                                 where))),
        batch=Batch(micro, micro_batches, accumulate), memory=MemoryPolicy(recompute, loss),
        precision=precision,
        optimizer="adam", expert=ExpertParallel(ep, imbalance, None if etp == tp else etp),
        context=ContextParallel(cp, cp_algorithm)), where)


def amp_precision(precision: Precision, amp: str) -> Precision:
    """`precision` run in the mixed-precision mode `amp` (workload/transformer_kinds.py
    AMP_MODES): itself for 'half'; under 'autocast' and 'tf-amp' the weights stay float32 and
    the optimizer updates them directly (torch.autocast casts them per use; TF-AMP inserts a
    cast after each float32 variable), so 4 bytes a weight and no master copy. The gradients
    keep the precision's width (autocast's .grad is float32 as the weights are: say grad_bytes
    4; TensorFlow 1 BERT all-reduces them compressed to fp16, Horovod's Compression.fp16)."""
    if amp == "half":
        return precision
    return replace(precision, amp=amp, param_bytes=FP32_BYTES, master_weights=False)


def _value_bytes(field: str, value: object) -> int:
    """Bytes per value: 1, 2 or 4."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in GRAD_BYTES:
        raise InputError(field, f"must be 1, 2 or 4, got {short_repr(value)}")
    return value


_PARTS = (("tensor", TensorSplit), ("pipeline", Pipeline), ("data", DataParallel),
          ("batch", Batch), ("memory", MemoryPolicy), ("precision", Precision),
          ("expert", ExpertParallel), ("context", ContextParallel))


def check_parallel_plan(plan: object, where: str = "plan") -> ParallelPlan:
    """Validate a ParallelPlan object (a Python caller's) field by field, by the rules its
    mapping obeys, and return it as it is: every field it has is priced as given (its
    optimizer, collective algorithm, bytes per value), none replaced by a default. Fields
    with a mapping name are named by it (`plan.tp`, `plan.global_batch`), the rest by their
    path (`plan.data.aggregation`, `plan.batch.accumulation`). Project Adam's plans (its
    split rules, a parameter server) are given as a Config."""
    if not isinstance(plan, ParallelPlan):
        raise InputError(where, f"must be a ParallelPlan, got {type(plan).__name__}")
    for name, kind in _PARTS:
        part = getattr(plan, name)
        if not isinstance(part, kind):
            raise InputError(f"{where}.{name}", f"must be a {kind.__name__}, got "
                             f"{short_repr(part)}")
    if plan.tensor.rules != "megatron":
        raise InputError(f"{where}.tensor.rules", "give Project Adam's plans as a Config (its "
                         "flags build the plan); a ParallelPlan's tensor split has rules "
                         "'megatron'")
    require_int(f"{where}.tp", plan.tensor.degree, maximum=MAX_DEGREE)
    require_bool(f"{where}.sequence_parallel", plan.tensor.sequence_parallel)
    require_bool(f"{where}.overlap_tp", plan.tensor.overlap)
    _one_of(f"{where}.overlap_tp_method", plan.tensor.overlap_method, TP_OVERLAP_METHODS)
    require_int(f"{where}.pp", plan.pipeline.stages, maximum=MAX_DEGREE)
    if plan.pipeline.overlap_p2p is not None:
        require_bool(f"{where}.overlap_pp", plan.pipeline.overlap_p2p)
    require_bool(f"{where}.pp_scatter_gather", plan.pipeline.scatter_gather)
    _one_of(f"{where}.schedule", plan.pipeline.schedule, SCHEDULES)
    require_int(f"{where}.virtual_stages", plan.pipeline.virtual_stages,
                maximum=MAX_VIRTUAL_STAGES)
    require_int(f"{where}.dp", plan.data.replicas, maximum=MAX_DEGREE)
    require_int(f"{where}.ep", plan.expert.degree, maximum=MAX_DEGREE)
    _imbalance(f"{where}.expert_imbalance", plan.expert.imbalance)
    if plan.expert.tensor is not None:
        require_int(f"{where}.etp", plan.expert.tensor, maximum=MAX_DEGREE)
    require_int(f"{where}.cp", plan.context.degree, maximum=MAX_DEGREE)
    _one_of(f"{where}.cp_algorithm", plan.context.algorithm, CP_ALGORITHMS)
    aggregation = plan.data.aggregation
    if isinstance(aggregation, Collective):
        _one_of(f"{where}.data.aggregation.algorithm", aggregation.algorithm, ALGORITHMS)
        require_int(f"{where}.zero", aggregation.zero_stage, minimum=0, maximum=3)
        require_bool(f"{where}.overlap_dp", aggregation.overlap)
        _one_of(f"{where}.zero3_fetch", aggregation.fetch, ZERO3_FETCH)
    elif not isinstance(aggregation, ParameterServer):
        raise InputError(f"{where}.data.aggregation", f"must be a Collective, got "
                         f"{short_repr(aggregation)}")
    require_int(f"{where}.micro_batch", plan.batch.micro_batch)
    require_int(f"{where}.batch.accumulation", plan.batch.accumulation)
    _one_of(f"{where}.grad_accumulation", plan.batch.grad_accumulation, GRAD_ACCUMULATION)
    require_int(f"{where}.global_batch", plan.samples_per_step)
    _one_of(f"{where}.recompute", plan.memory.recompute, RECOMPUTE)
    _one_of(f"{where}.loss", plan.memory.loss, LOSS_KERNELS)
    precision = plan.precision
    _one_of(f"{where}.precision", precision.compute, tuple(PRECISION_PRESETS))
    for name in ("param_bytes", "grad_bytes", "optimizer_state_bytes", "activation_bytes"):
        if getattr(precision, name) is not None:
            _value_bytes(f"{where}.precision.{name}", getattr(precision, name))
    require_bool(f"{where}.precision.master_weights", precision.master_weights)
    _one_of(f"{where}.amp", precision.amp, AMP_MODES)
    _one_of(f"{where}.optimizer", plan.optimizer, tuple(OPTIMIZERS))
    require_bool(f"{where}.overlap", plan.overlap)
    fraction = plan.epoch_fraction
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) \
            or not 0 < fraction <= 1:
        raise InputError(f"{where}.epoch_fraction", f"must be in (0, 1], got "
                         f"{short_repr(fraction)}")
    return _plan_rules(plan, where)


def modern_plan_to_dict(plan: ParallelPlan) -> dict[str, Any]:
    """The plan as MODERN_FIELDS (the inverse of modern_plan_from_dict)."""
    aggregation = plan.data.aggregation
    zero = aggregation.zero_stage if isinstance(aggregation, Collective) else 0
    overlap = aggregation.overlap if isinstance(aggregation, Collective) else False
    fetch = aggregation.fetch if isinstance(aggregation, Collective) else "blocks"
    return {"tp": plan.tensor.degree, "pp": plan.pipeline.stages, "dp": plan.data.replicas,
            "micro_batch": plan.batch.micro_batch, "global_batch": plan.samples_per_step,
            "schedule": plan.pipeline.schedule, "virtual_stages": plan.pipeline.virtual_stages,
            "zero": zero, **({"zero3_fetch": fetch} if zero == 3 else {}),
            "recompute": plan.memory.recompute, "loss": plan.memory.loss,
            "precision": plan.precision.compute,
            **({"amp": plan.precision.amp} if plan.precision.amp != "half" else {}),
            "sequence_parallel": plan.tensor.sequence_parallel, "overlap_dp": overlap,
            "grad_bytes": plan.precision.grad_bytes,
            "grad_accumulation": plan.batch.grad_accumulation, "ep": plan.expert.degree,
            "cp": plan.context.degree, "cp_algorithm": plan.context.algorithm,
            "expert_imbalance": plan.expert.imbalance,
            **({"etp": plan.expert.tensor} if plan.expert.tensor is not None else {}),
            "overlap_tp": plan.tensor.overlap,
            **({"overlap_tp_method": plan.tensor.overlap_method}
               if plan.tensor.overlap else {}),
            **({"overlap_pp": plan.pipeline.overlap_p2p}
               if plan.pipeline.overlap_p2p is not None else {}),
            **({"pp_scatter_gather": True} if plan.pipeline.scatter_gather else {})}


def plan_label(plan: ParallelPlan) -> str:
    d = modern_plan_to_dict(plan)
    extras = [f"zero{d['zero']}" if d["zero"] else "",
              "ds-buckets" if d.get("zero3_fetch") == "buckets" else "",
              d["recompute"] if d["recompute"] != "none" else "",
              "sp" if d["sequence_parallel"] else "",
              f"v{d['virtual_stages']}" if d["virtual_stages"] > 1 else "",
              "overlap" if d["overlap_dp"] and d["dp"] > 1 else "",
              ("async-tp" if d.get("overlap_tp_method") == MICRO_PIPELINE else "tp-overlap")
              if d["overlap_tp"] else "",
              f"grad{d['grad_bytes']}B" if d["grad_bytes"] is not None and
              d["grad_bytes"] != PRECISION_PRESETS[d["precision"]].grad_bytes else "",
              f"grad-{d['grad_accumulation']}" if d["grad_accumulation"] != "fused" else "",
              f"loss-{d['loss']}" if d["loss"] != "inplace" else "",
              d.get("amp", ""),
              "no-pp-overlap" if d["schedule"] == "interleaved"
              and not plan.pipeline.overlaps_p2p else "",
              "pp-scatter-gather" if d.get("pp_scatter_gather") else ""]
    mesh = (f" EP{d['ep']}" if d["ep"] > 1 else "") + (
        f" ETP{d['etp']}" if "etp" in d else "") + (
        f" CP{d['cp']}{'' if d['cp_algorithm'] == 'ring' else '-a2a'}" if d["cp"] > 1 else "")
    imbalance = (f" imbalance{d['expert_imbalance']:g}" if d["ep"] > 1
                 and d["expert_imbalance"] != 1 else "")
    return (f"TP{d['tp']} PP{d['pp']} DP{d['dp']}{mesh} mb{d['micro_batch']} "
            f"GBS{d['global_batch']} {d['schedule']} {d['precision']}"
            + "".join(f" {e}" for e in extras if e) + imbalance)

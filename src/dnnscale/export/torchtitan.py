"""A plan as a torchtitan job config (TOML, read with ``--job.config_file FILE``).

Sections and keys as torchtitan 0.2's JobConfig defines them (pytorch/torchtitan,
torchtitan/config/job_config.py; docs/export.md gives the lines). torchtitan 0.3 replaced the
TOML file by Python config registries; its command-line overrides keep these section and key
names (``--parallelism.tensor_parallel_degree 8``).

- [parallelism] tensor_parallel_degree, pipeline_parallel_degree, pipeline_parallel_schedule
  (torch.distributed.pipelining's names: 1F1B, GPipe, Interleaved1F1B),
  pipeline_parallel_microbatch_size, pipeline_parallel_layers_per_stage (with the first and
  last stage's "less layers" set to 0, every stage gets the same number of layers, as the
  plan assumes), and the data-parallel degrees: ZeRO-0 is DDP
  (data_parallel_replicate_degree = DP), ZeRO-2 and ZeRO-3 are FSDP2
  (data_parallel_shard_degree = DP, fsdp_reshard_after_forward "never" keeps the gathered
  weights for the backward pass, as FSDP's SHARD_GRAD_OP = ZeRO-2 does; "always" re-gathers
  them, ZeRO-3). What torchtitan cannot run (no ZeRO-1, DDP only as the sole parallelism,
  no fp16 or TF32) and what it always does (fp32 reduction, overlap, sequence-parallel norms)
  are plan/engines.py's.
- expert and context parallelism, [parallelism]: expert_parallel_degree = ep with
  expert_tensor_parallel_degree = the plan's etp (tp, the experts split over the tensor group,
  or 1, whole experts with ep members one rank apart; plan/engines.py refuses others), ep
  borrowed from the FSDP2 degree, which therefore holds every sample-taking member:
  data_parallel_shard_degree = dp · ep; context_parallel_degree = cp with
  context_parallel_rotate_method "alltoall" (torch's _AllToAllRotater: each step passes the
  K/V shard to the next rank, ring attention as priced;
  "allgather", the default, gathers every shard at once) and the default "headtail" load
  balancer (the 2 · cp chunks the plan prices). DDP with ep or cp > 1, the all-to-all (Ulysses)
  algorithm, a capacity factor and shared experts narrower than a multiple of a routed one are
  refused (plan/engines.py).
- overlap_tp: [parallelism] enable_async_tensor_parallel = true with [compile] enable = true,
  components = ["model"] (async TP is an Inductor pass); the interleaved schedule's sends always
  overlap compute in torch.distributed.pipelining, so overlap_pp false is a note. [compile] is
  written too for every workload priced with fused element-wise kernels (eager false): only the
  compiler fuses torchtitan's RMSNorm, SwiGLU and RoPE.
- [training] local_batch_size (per DP rank and gradient-accumulation step; with a pipeline it
  holds all the step's micro-batches, which the pipeline splits), global_batch_size, seq_len,
  mixed_precision_param, mixed_precision_reduce.
- [activation_checkpoint] mode none | full, or selective with selective_ac_option "op" for
  recompute op (per-op checkpointing: the matmuls' and the attention kernel's outputs kept,
  except every second matmul's) and for recompute selective, which it runs as op (a note).
- [model] name, flavor (the shape is a registered flavor, not options), converters
  (["quantize.linear.float8"] for fp8). A mixture of experts is named "llama4" (torchtitan's
  MoE decoder with pipelining, GQA and RoPE; qwen3 and gpt_oss have no pipelining_fn), whose
  flavor a note gives to register: no shipped flavor has a dense-attention Mixtral-style shape.
"""

from __future__ import annotations

from dnnscale.export.result import (EngineExport, ExportFile, check_exportable,
                                    elementwise_notes, expert_notes, mesh_product, zero_stage)
from dnnscale.export.toml_text import TomlValue, toml_text
from dnnscale.plan.engines import engine_differences, plan_facts, require_engine
from dnnscale.plan.modern import plan_label
from dnnscale.plan.plan import ParallelPlan
from dnnscale.workload.transformer_shape import TransformerShape

ENGINE = "torchtitan"
CONFIG_NAME = "torchtitan.toml"
SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B"}
"""dnnscale schedule -> torch.distributed.pipelining schedule name (get_schedule_class)."""
RESHARD_AFTER_FORWARD = {2: "never", 3: "always"}
LLAMA3_FLAVORS = {
    "8B": (32, 4096, 32, 8, 14336),
    "70B": (80, 8192, 64, 8, 28672),
    "405B": (126, 16384, 128, 8, 53248),
}
"""torchtitan 0.2's llama3 flavors (torchtitan/models/llama3/__init__.py) as (layers, dim,
heads, kv_heads, ffn). Its FFN width is 2/3·4·dim, times ffn_dim_multiplier, rounded up to
multiple_of: 8B 4096 → 10922 · 1.3 → 14336 (multiple of 1024); 70B 8192 → 21845 · 1.3 → 28672
(4096); 405B 16384 → 43690 · 1.2 → 53248 (4096)."""
LLAMA3_ROPE_THETA = 500_000.0
"""The RoPE base every llama3 flavor sets (rope_theta=500000, same file)."""
CP_ROTATE_METHOD = "alltoall"
"""context_parallel_rotate_method for ring attention: torch's _AllToAllRotater passes each K/V
shard on to the next rank at every step (a ring); "allgather" gathers them all at once."""
MODEL_COMPILE: dict[str, TomlValue] = {"enable": True, "components": ["model"]}
"""[compile], written for overlap_tp and for every workload priced with fused element-wise
kernels (TransformerShape.eager false, the default): torchtitan's async tensor parallelism
(parallelism.enable_async_tensor_parallel) is an Inductor pass, so the model must be compiled
(llama3/infra/parallelize.py raises "Async TP requires torch.compile" otherwise), and only the
compiler fuses the RMSNorms, SwiGLU and RoPE the workload priced as fused kernels (eager, each
is a chain of PyTorch operations: torchtitan/models/llama3/model.py). An eager workload without
async TP is exported without it."""
MOE_MODEL = "llama4"
"""torchtitan's model for a mixture of experts (models/llama4: RMSNorm, SwiGLU, GQA, RoPE, MoE
blocks, with pipelining)."""
MOE_BALANCING = ("torchtitan balances the experts by an auxiliary-loss-free per-expert router "
                 "bias, load_balance_coeff 1e-3 by default")


def _llama3_flavor(shape: TransformerShape) -> str | None:
    """The registered llama3 flavor with this shape and RoPE base, if any (a Llama: RMSNorm,
    SwiGLU, RoPE, no biases, untied output)."""
    if not _is_llama(shape):
        return None
    key = (shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.ffn)
    if shape.rotary_base != LLAMA3_ROPE_THETA:
        return None
    return next((name for name, dims in LLAMA3_FLAVORS.items() if dims == key), None)


def _is_llama(shape: TransformerShape) -> bool:
    return (shape.gated and shape.norm == "rmsnorm" and shape.positional == "rope"
            and not shape.bias and not shape.tied_embeddings)


def _parallelism(plan: ParallelPlan, shape: TransformerShape) -> dict[str, TomlValue]:
    # zero 0, 2 or 3, and zero 0 only without ep and cp (plan/engines.py); the ep members take
    # different samples, so they are data parallel to torchtitan (ep borrows from dp_shard).
    zero, dp = zero_stage(plan), plan.batch_replicas
    section: dict[str, TomlValue] = {
        "data_parallel_replicate_degree": 1 if zero else dp,
        "data_parallel_shard_degree": dp if zero else 1,
    }
    if zero:
        section["fsdp_reshard_after_forward"] = RESHARD_AFTER_FORWARD[zero]
    section["tensor_parallel_degree"] = plan.tensor.degree
    pipeline = plan.pipeline
    section["pipeline_parallel_degree"] = pipeline.stages
    if pipeline.stages > 1:
        section["pipeline_parallel_schedule"] = SCHEDULES[pipeline.schedule]
        section["pipeline_parallel_microbatch_size"] = plan.batch.micro_batch
        section["pipeline_parallel_layers_per_stage"] = \
            shape.layers // (pipeline.stages * pipeline.virtual_stages)
        section["pipeline_parallel_first_stage_less_layers"] = 0
        section["pipeline_parallel_last_stage_less_layers"] = 0
    if plan.context.degree > 1:  # ring attention (plan/engines.py refuses the all-to-all)
        section["context_parallel_degree"] = plan.context.degree
        section["context_parallel_rotate_method"] = CP_ROTATE_METHOD
    if plan.expert.degree > 1:
        section["expert_parallel_degree"] = plan.expert.degree
        section["expert_tensor_parallel_degree"] = plan.expert_tensor  # tp or 1 (engines.py)
    if plan.tensor.overlap:  # async TP: the compiler chunks all-gather + matmul pairs
        section["enable_async_tensor_parallel"] = True
    return section


def _training(plan: ParallelPlan, shape: TransformerShape) -> dict[str, TomlValue]:
    compute = plan.precision.compute  # fp32, bf16 or fp8 (plan/engines.py)
    micro = plan.batch.micro_batch
    # With a pipeline, one local batch is the whole step's micro-batches (the pipeline splits
    # it into pipeline_parallel_microbatch_size pieces); without one, the micro-batches are
    # gradient-accumulation steps of local_batch_size each.
    local = micro * plan.batch.accumulation if plan.pipeline.stages > 1 else micro
    return {"local_batch_size": local, "global_batch_size": plan.samples_per_step,
            "seq_len": shape.seq,
            "mixed_precision_param": "float32" if compute == "fp32" else "bfloat16",
            "mixed_precision_reduce": "float32"}


def _activation_checkpoint(plan: ParallelPlan) -> dict[str, TomlValue]:
    recompute = plan.memory.recompute
    if recompute in ("op", "selective"):  # selective: an engine difference, noted
        return {"mode": "selective", "selective_ac_option": "op"}
    return {"mode": recompute}


def moe_flavor_args(shape: TransformerShape) -> tuple[dict[str, object], dict[str, object]]:
    """The llama4 TransformerModelArgs and MoEArgs keywords of a mixture of experts: MoE blocks
    every layer (interleave_moe_layer_step 1; plan/engines.py refuses dense blocks); each
    expert of width int(8 · dim / 3 · ffn_dim_multiplier) rounded up to multiple_of
    (auto_scale_hidden_dim False), so multiple_of = the routed width, with a multiplier only
    where 8 · dim / 3 exceeds it; shared experts as
    num_shared_experts MLPs of the routed width; a softmax router over normalised top-k scores
    (torchtitan/models/llama4/model/model.py, models/moe/moe.py)."""
    width, base = shape.routed_ffn, int(8 * shape.hidden / 3)
    model: dict[str, object] = {
        "dim": shape.hidden, "n_layers": shape.layers, "n_heads": shape.heads,
        "n_kv_heads": shape.kv_heads, "rope_theta": shape.rotary_base,
        "interleave_moe_layer_step": 1, "auto_scale_hidden_dim": False, "multiple_of": width,
        "ffn_dim_multiplier": None if base <= width else width / base}
    moe: dict[str, object] = {"num_experts": shape.experts,
                              "num_shared_experts": shape.shared_ffn // width,
                              "top_k": shape.top_k, "score_func": "softmax", "route_norm": True}
    return model, moe


def moe_flavor_note(shape: TransformerShape, workload: str) -> str:
    """How to register the llama4 flavor of a mixture of experts (`moe_flavor_args`)."""
    model, moe = moe_flavor_args(shape)

    def call(name: str, keywords: dict[str, object]) -> str:
        return f"{name}({', '.join(f'{k}={v!r}' for k, v in keywords.items())})"

    return (f"no torchtitan flavor has {workload}'s shape: register a {MOE_MODEL} flavor named "
            f"{workload!r} in torchtitan/models/llama4/__init__.py: "
            f"{call('TransformerModelArgs', model)[:-1]}, moe_args={call('MoEArgs', moe)}) "
            f"(experts of width {shape.routed_ffn})")


def _notes(plan: ParallelPlan, shape: TransformerShape, workload: str,
           flavor: str | None) -> list[str]:
    notes = []
    if shape.is_moe:
        notes.append(moe_flavor_note(shape, workload))
        if not _is_llama(shape):
            notes.append(f"torchtitan's {MOE_MODEL} is RMSNorm + SwiGLU + RoPE, untied, no "
                         f"biases; {workload} is not, so the flavor is only an approximation "
                         f"of it")
    elif flavor is None:
        if _is_llama(shape):
            notes.append(f"no torchtitan llama3 flavor has {workload}'s shape: register one "
                         f"named {workload!r} (dim={shape.hidden}, n_layers={shape.layers}, "
                         f"n_heads={shape.heads}, n_kv_heads={shape.kv_heads}, FFN width "
                         f"{shape.ffn}, rope_theta={shape.rotary_base:.0f}) in "
                         f"torchtitan/models/llama3/__init__.py")
        else:
            notes.append(f"torchtitan has no model for {workload}'s shape (its llama3 is "
                         f"RMSNorm + SwiGLU + RoPE, untied, no biases); [model] names a flavor "
                         f"{workload!r} that a model of yours must provide")
    notes.append(f"the vocabulary ({shape.vocab}) comes from the tokenizer at "
                 f"model.hf_assets_path")
    notes += [d.message for d in engine_differences("torchtitan", plan_facts(plan))]
    notes += elementwise_notes(plan, shape, "torchtitan")
    notes += expert_notes(plan, shape, ENGINE, MOE_BALANCING)
    notes.append(f"launch {mesh_product(plan)} processes: torchtitan checks that the degrees "
                 f"multiply to the world size"
                 + (f" (data_parallel_shard_degree dp·ep = {plan.batch_replicas}: ep borrows "
                    f"from it)" if plan.expert.degree > 1 else ""))
    return notes


def export_torchtitan(plan: ParallelPlan, shape: TransformerShape | None,
                      workload: str) -> EngineExport:
    """torchtitan's TOML job config for `plan` training `workload`."""
    shape = check_exportable(plan, shape, workload, ENGINE)
    require_engine("torchtitan", plan, shape=shape)  # torchtitan's limits: plan/engines.py
    flavor = None if shape.is_moe else _llama3_flavor(shape)
    model: dict[str, TomlValue] = {"name": MOE_MODEL if shape.is_moe else "llama3",
                                   "flavor": flavor or workload}
    if plan.precision.compute == "fp8":
        model["converters"] = ["quantize.linear.float8"]
    tables = {"job": {"description": f"{workload}: {plan_label(plan)} (exported by dnnscale)"},
              "model": model, "training": _training(plan, shape),
              "parallelism": _parallelism(plan, shape),
              "activation_checkpoint": _activation_checkpoint(plan)}
    if plan.tensor.overlap or not shape.eager:
        tables["compile"] = dict(MODEL_COMPILE)
    notes = _notes(plan, shape, workload, flavor)
    header = (f"torchtitan job config for {workload}, exported by dnnscale",
              "run: torchrun --nproc-per-node ... -m torchtitan.train --job.config_file FILE",
              *notes)
    return EngineExport(ENGINE, (ExportFile(CONFIG_NAME, toml_text(tables, header)),),
                        tuple(notes), plan.workers)

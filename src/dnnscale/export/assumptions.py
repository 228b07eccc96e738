"""What a plan's price assumed that the engine's flags do not show: the gradients' width, the
attention kernel, the kernels a mixed-precision mode runs in float32, how the loss is
computed, and the memory no tensor can use. An export lists
these beside its files (`EngineExport.assumptions`, printed as ``assumes:`` lines and in
``--json``), so the engineer who launches the plan knows what the prediction took for
granted."""

from __future__ import annotations

from dataclasses import replace

from dnnscale.export.result import EngineExport
from dnnscale.model.memory import parallel_groups, plan_reserve_bytes
from dnnscale.plan.plan import ParallelPlan
from dnnscale.units import format_si
from dnnscale.workload.transformer_kinds import AMP_FP32_KINDS, AMP_NAMES, LOSS_KERNEL_NAMES
from dnnscale.workload.transformer_shape import TransformerShape


ACCUMULATION_TEXT = {
    "fused": "{m} micro-batches' weight gradients accumulated inside the weight-gradient GEMMs "
             "(gradient-accumulation fusion), the norms' and embeddings' added by a hook",
    "add": "{m} micro-batches' gradients added into the ones held, each after the first (3 "
           "passes over the gradients per micro-batch)",
    "clip_add": "{m} micro-batches' gradients each norm-clipped and added into fp32 "
                "accumulators"}
"""The assumption line of each Batch.grad_accumulation (model/accumulation.py prices it)."""

RECOMPUTE_TEXT = {
    "selective": "selective recomputation: {core} of every block run forward again in the "
                 "backward pass, nothing else",
    "full": "full recomputation: every block's forward run again in the backward pass from "
            "its kept input",
    "op": "per-operation checkpointing: every block's norms, activation and residual adds, "
          "its tensor-parallel all-gathers and every second matmul run again in the backward "
          "pass, {core} kept"}
"""The assumption line of each recomputation (model/stage.py prices it): what runs again."""


LOSS_MEMORY_TEXT = {
    "inplace": "an fp32 softmax kept per logit, the 16-bit logits or their gradient beside it "
               "at its peak",
    "torch": "the log-softmax kept in fp32, two more fp32 values per logit at its backward's "
             "peak",
    "torch16": "the log-softmax kept at their width, two more such values per logit at its "
               "backward's peak",
    "fused": "the 16-bit logits kept, their gradient beside them at its peak"}
"""What each MemoryPolicy.loss holds, for its assumption line (model/memory.loss_bytes prices
it)."""
VOCAB_PARALLEL_LOSS_TEXT = {
    "torch": "torch's loss_parallel on the vocabulary-split logits, the log-softmax kept in "
             "fp32, three more fp32 values per logit at its backward's peak",
    "torch16": "torch's loss_parallel on the vocabulary-split logits, the log-softmax kept at "
               "their width, three fp32 values more per logit at its forward's peak"}
"""What the torch kernels hold under tensor parallelism (model/memory.loss_bytes_per_logit's
vocab_parallel)."""
SEPARATE_PROJECTIONS_TEXT = ("Q, K and V projected by three GEMMs, and a gated MLP's gate and "
                             "up by two, their input gradients summed by one more kernel "
                             "(separate_projections), where Megatron-LM fuses each into one")
EAGER_TEXT = ("element-wise code run op by op, as PyTorch runs it without torch.compile "
              "(eager): RMSNorms in fp32 between two casts, each keeping an fp32 copy of its "
              "input, SwiGLU as silu, then the product, and RoPE as an fp32 complex product")


AMP_KIND_WORDS = {"embedding": "the embedding's output", "layernorm": "the norms",
                  "rmsnorm": "the norms", "residual_add": "the residual adds",
                  "attn_softmax": "the attention softmax", "mlp_act": "the MLP activation",
                  "lm_positions": "the gathered positions"}
"""The memory-bound kinds a mixed-precision mode may run in float32, in words, in the order
the assumption line names them."""


def _fp32_kernels(amp: str, shape: TransformerShape) -> str:
    """What `amp` runs in float32 in a model of `shape` (AMP_FP32_KINDS less the kinds it
    has none of: one norm kind, the softmax only unfused, the positions only with
    predictions), in words."""
    absent = {"rmsnorm" if shape.norm == "layernorm" else "layernorm"}
    absent |= {"attn_softmax"} if shape.flash_attention else set()
    absent |= set() if shape.predictions else {"lm_positions"}
    words = [AMP_KIND_WORDS[kind] for kind in AMP_KIND_WORDS
             if kind in AMP_FP32_KINDS[amp] and kind not in absent]
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]


def plan_assumptions(plan: ParallelPlan, shape: TransformerShape | None) -> tuple[str, ...]:
    """The priced assumptions of `plan` on the workload of `shape`, one sentence each."""
    grad = plan.precision.grad_bytes
    out = []
    if grad is not None:
        width = {4: "fp32", 2: "16-bit", 1: "8-bit"}.get(grad, f"{grad}-byte")
        out.append(f"gradients accumulated and reduced in {width} ({grad} bytes per value)")
    if plan.batch.accumulation > 1:
        out.append(ACCUMULATION_TEXT[plan.batch.grad_accumulation].format(
            m=plan.batch.accumulation))
    if shape is not None:
        out.append(f"attention fused ({shape.attention_kernel}, priced by its published speed, "
                   "or on a GPU with none by an estimate derived from another's)"
                   if shape.flash_attention else
                   "attention unfused (scores, softmax and context kernels, the s x s scores in "
                   "memory)")
    if plan.memory.recompute in RECOMPUTE_TEXT:
        fused = shape is not None and shape.flash_attention
        out.append(RECOMPUTE_TEXT[plan.memory.recompute].format(
            core="the fused attention kernel" if fused else "the scores, softmax and context"))
    if shape is not None and plan.precision.amp != "half":
        out.append(f"{AMP_NAMES[plan.precision.amp]}: {_fp32_kernels(plan.precision.amp, shape)} "
                   "on float32 values, the rest in 16 bits")
    if shape is not None:
        loss = plan.memory.loss
        held = (VOCAB_PARALLEL_LOSS_TEXT[loss] if plan.tensor.degree > 1
                and loss in VOCAB_PARALLEL_LOSS_TEXT else LOSS_MEMORY_TEXT[loss])
        out.append(f"the loss computed {'as' if loss == 'inplace' else 'by'} "
                   f"{LOSS_KERNEL_NAMES[loss]}: {held}")
    if shape is not None and shape.eager:
        out.append(EAGER_TEXT)
    if shape is not None and shape.separate_projections:
        out.append(SEPARATE_PROJECTIONS_TEXT)
    groups = parallel_groups(plan)
    out.append(f"{format_si(plan_reserve_bytes(plan), 'B')} per GPU held back for the CUDA "
               f"context, cuBLAS's workspace and NCCL's buffers of {groups} parallel "
               f"group{'s' if groups != 1 else ''}; allocator fragmentation not counted")
    return tuple(out)


def with_assumptions(result: EngineExport, plan: ParallelPlan,
                     shape: TransformerShape | None) -> EngineExport:
    """`result` with the plan's priced assumptions (plan_assumptions)."""
    return replace(result, assumptions=plan_assumptions(plan, shape))

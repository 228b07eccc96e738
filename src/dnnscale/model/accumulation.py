"""Gradient accumulation on an accelerator: the passes over the gradients that join each
micro-batch's weight gradients to the step's (issue 23: per-micro-batch costs).

A step of m micro-batches forms m weight gradients per parameter and keeps one. How the engine
joins them is plan/plan.py GRAD_ACCUMULATION; each way streams the gradients through memory a
fixed number of times per micro-batch, memory-bound work that the forward and backward kernels
do not include (their weight-gradient GEMM writes its own output once):

- 'fused' (Megatron-LM's --gradient-accumulation-fusion, its default; megatron/core/
  tensor_parallel/layers.py, LinearWithGradAccumulationAndAsyncCommunication): the
  weight-gradient GEMM of every linear layer accumulates into the fp32 main gradient itself
  (beta = 1), so those weights cost nothing more. The other parameters (norms, embeddings:
  the layers whose kind is not a GEMM, StageCosts.hooked_params) get an ordinary gradient that
  the data-parallel wrapper's backward hook adds into the main gradient
  (megatron/core/distributed/distributed_data_parallel.py, _make_backward_post_hook:
  param.main_grad.add_(param.grad)) on every micro-batch, the first too (the main gradients
  are zeroed at the step's start): the main gradient read and written (grad_bytes each) and
  the new gradient read in the parameter's width (param_bytes).
- 'add' (autograd's AccumulateGrad: PyTorch DDP under no_sync, FSDP's sharded gradients,
  DeepSpeed, torchtitan): the first micro-batch's gradient becomes .grad as it is; every later
  one is added into it, grad += new, reading both and writing one: 3 × grad_bytes per
  parameter per micro-batch after the first.
- 'clip_add' (DeepLearningExamples' TensorFlow 1 BERT, optimization.py with
  num_accumulation_steps > 1): every micro-batch's gradients go through tf.global_norm (one
  read), tf.clip_by_global_norm (a read and a write) and, under fp16 loss scaling, an
  is_finite check (one read), then into float32 accumulators (accum_vars, dtype tf.float32):
  assign on the first micro-batch (a read and a write), assign_add after it (two reads and a
  write). The graph's ops are counted as written; its XLA clusters may fuse some of them,
  which is not modelled. Without accumulation (m = 1) the optimizer takes another branch that
  accumulates nothing.

Under ZeRO-2 and ZeRO-3 each micro-batch's gradients are reduce-scattered before they
accumulate, so a member accumulates its shard (Ψ / d) in the step's gradients: autograd's
sharded .grad (PyTorch FSDP) or the ZeRO optimizer's gradient partition (DeepSpeed), added
into after the first micro-batch. Megatron's fused GEMMs and hook still write the whole
gradients of each micro-batch first, into the buffer the reduce-scatter reads, so under 'fused'
the hook's passes stay whole and the shard's accumulation comes on top.
"""

from __future__ import annotations

CLIP_ADD_BYTES_PER_VALUE = 4
"""TensorFlow BERT's accumulators and gradients are float32 whatever the compute precision
(accum_vars dtype tf.float32; mixed precision by graph rewrite keeps float32 variables)."""


def accumulation_bytes_per_step(mode: str, micro_batches: int, params: float,
                                hooked_params: float, grad_bytes: float, param_bytes: float,
                                loss_scaled: bool, shard: float = 1.0) -> float:
    """Bytes a member reads and writes per step to accumulate its gradients over
    `micro_batches` micro-batches (module docstring).

    Formula, m micro-batches, Ψ the member's parameters, Ψ_h its hooked ones, d the shard
    count (1 unless its gradients are reduce-scattered every micro-batch, ZeRO-2/3):
      fused:    m · Ψ_h · (2 · grad_bytes + param_bytes), + (m − 1) · (Ψ / d) · 3 · grad_bytes
                when d > 1
      add:      (m − 1) · (Ψ / d) · 3 · grad_bytes
      clip_add: (Ψ / d) · 4 · (first + (m − 1) · later), first = c + 1 + 2 + 2,
                later = c + 1 + 2 + 3, c = 1 under fp16 loss scaling, else 0; 0 when m = 1.
    Units: micro-batches, parameters, bytes per value, members -> bytes per step.
    Source: module docstring (Megatron-LM, PyTorch autograd, DeepLearningExamples' TF BERT).
    """
    held = params / shard
    added = (micro_batches - 1) * held * 3 * grad_bytes
    if mode == "fused":
        hook = micro_batches * hooked_params * (2 * grad_bytes + param_bytes)
        return hook + (added if shard > 1 else 0.0)
    if micro_batches <= 1:
        return 0.0
    if mode == "add":
        return added
    if mode == "clip_add":
        check = 1 if loss_scaled else 0
        first, later = check + 1 + 2 + 2, check + 1 + 2 + 3
        return held * CLIP_ADD_BYTES_PER_VALUE * (first + (micro_batches - 1) * later)
    raise ValueError(f"unknown gradient accumulation {mode!r}")

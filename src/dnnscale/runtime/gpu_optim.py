"""The optimizer step of single-GPU training: AdamW with gradient clipping, in the precision
the plan prices.

`MasterAdamW` is mixed precision as dnnscale's `bf16` plan prices it (plan/modern.py
PRECISION_PRESETS; model/data_parallel.py `optimizer_step_bytes`): the model's weights and
gradients are bf16, an fp32 master copy of the weights and AdamW's two moments are the
optimizer's state (Micikevicius et al. 2018; Rajbhandari et al. SC'20 §3.1: 2 + 2 + 12 bytes
per parameter). The weights live in one flat bf16 buffer (each parameter a view of it) and the
master copy in one flat fp32 tensor, so a step is a few large kernels: the gradients gathered
into one bf16 buffer and cast to fp32, the global norm and clip, one fused AdamW update, the
master weights cast back.

`PlainAdamW` is the same step over the parameters themselves (fp32 weights, also under bf16
autocast). The GPU calibration times `step()` of the same classes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

LR = 3e-4
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
MAX_GRAD_NORM = 1.0
"""AdamW settings of GPT-3's training (Brown et al. 2020, §B: β = (0.9, 0.95), weight decay
0.1, gradients clipped at global norm 1.0)."""


def _adamw(params: list[torch.Tensor], lr: float, device: torch.device) -> torch.optim.AdamW:
    options: dict[str, Any] = {"lr": lr, "betas": BETAS, "weight_decay": WEIGHT_DECAY}
    if device.type == "cuda":
        options["fused"] = True      # one multi-tensor kernel (CUDA since torch 2.0)
    elif device.type == "meta":
        options["foreach"] = False   # the per-tensor path has meta kernels everywhere
    return torch.optim.AdamW(params, **options)


class PlainAdamW:
    """AdamW over the parameters as they are, gradients clipped at MAX_GRAD_NORM."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = LR) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.device = self.params[0].device
        self.optimizer = _adamw(self.params, lr, self.device)

    def step(self) -> None:
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.device.type != "meta":
            torch.nn.utils.clip_grad_norm_(self.params, MAX_GRAD_NORM)
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)


class MasterAdamW:
    """bf16 weights and gradients, fp32 master weights and AdamW state (see the module doc).

    Turns every parameter into a view of one flat bf16 buffer (done once, before training)."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = LR) -> None:
        self.params = [p for p in params if p.requires_grad]
        first = self.params[0]
        self.device = first.device
        total = sum(p.numel() for p in self.params)
        self.flat = torch.empty(total, dtype=torch.bfloat16, device=self.device)
        offset = 0
        for p in self.params:
            view = self.flat[offset:offset + p.numel()].view_as(p)
            view.copy_(p.detach())
            p.data = view
            offset += p.numel()
        self.flat_grad = torch.empty_like(self.flat)
        self.master = self.flat.detach().float()
        self.master.requires_grad_(True)
        self.master.grad = torch.zeros_like(self.master)
        self.optimizer = _adamw([self.master], lr, self.device)

    def step(self) -> None:
        grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                 for p in self.params]
        grad = self.master.grad
        assert grad is not None
        # Gathered in bf16 first: a same-dtype cat is a few batched kernels, a casting one a
        # copy per tensor. (The backward pass made each gradient its own tensor: the first
        # micro-batch's are taken as they are, with no accumulation kernel.)
        torch.cat(grads, out=self.flat_grad)
        grad.copy_(self.flat_grad)
        if self.device.type != "meta":
            torch.nn.utils.clip_grad_norm_([self.master], MAX_GRAD_NORM)
        self.optimizer.step()
        with torch.no_grad():
            self.flat.copy_(self.master)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

"""Mixture-of-experts layer kinds: the router, the token dispatch, the routed experts' MLP and the
combine, which replace a block's dense MLP when its shape has experts (workload/transformer.py).

Notation as in workload/transformer_kinds.py (s tokens per sequence, h hidden, b bytes per
value), plus E routed experts, k experts per token (top-k), f_e each expert's inner width
(f_in = 2·f_e for a gated expert: its gate and up projections fused). Every count is per
sequence and at uniform routing: the s·k token copies the router sends spread over the experts,
so the experts' FLOPs per sequence are those of one MLP over s·k tokens, whatever E. Which
member computes which expert, the per-expert GEMM size, the load imbalance and the capacity
factor's cap are the model's (model/expert_parallel.py): they depend on the plan's ep.

Sources: Shazeer et al. 2017 (top-k gating), Fedus et al. 2022 (Switch Transformer: capacity
factor, token dropping), Jiang et al. 2024 (Mixtral: 8 experts, top-2, SwiGLU experts),
DeepSeek-AI 2024 (DeepSeek-V3: shared experts); Megatron-Core's MoE layer (router, token
dispatcher permute / all-to-all / unpermute, grouped expert MLP).
"""

from __future__ import annotations

from dnnscale.errors import InputError, short_repr
from dnnscale.workload.kind_record import KernelClass
from dnnscale.workload.kinds import register_kind
from dnnscale.workload.layer import Layer
from dnnscale.workload.transformer_kinds import (TOKEN_ID_BYTES, _dims, _Dims, _expect, _flag,
                                                 _layer, activation_values_per_row, megatron,
                                                 token_linear_flops)
from dnnscale.workload.transformer_shape import check_capacity_factor

ROUTER_PROBABILITY_BYTES = 4
"""The router keeps its top-k probabilities in fp32 (Megatron-Core's router computes the
softmax in fp32)."""


def _experts(name: str, experts: object, top_k: object, capacity_factor: object
             ) -> tuple[int, int, float | None]:
    for key, value in (("experts", experts), ("top_k", top_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"layers.{name}.{key}", f"must be an integer >= 1, got "
                             f"{short_repr(value)}")
    assert isinstance(experts, int) and isinstance(top_k, int)
    if top_k > experts:
        raise InputError(f"layers.{name}.top_k", f"{top_k} experts per token, but only "
                         f"{experts} experts")
    return experts, top_k, check_capacity_factor(capacity_factor,
                                                 f"layers.{name}.capacity_factor")


def _moe_hyper(name: str, kind: str, shape: dict[str, object], needs: tuple[str, ...],
               experts: object, top_k: object, capacity_factor: object
               ) -> tuple[_Dims, dict[str, object], int, int]:
    dims, hyper = _dims(kind, name, shape, needs)
    e, k, cf = _experts(name, experts, top_k, capacity_factor)
    hyper.update(experts=e, top_k=k, capacity_factor=cf)
    return dims, hyper, e, k


def routed_tokens(seq: int, top_k: int) -> int:
    """Token copies the router sends per sequence: s · k (each token to k experts)."""
    return seq * top_k


@register_kind("moe_router", kernel=KernelClass.GEMM, splits=megatron("replicated"))
def moe_router(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
               needs_input_grad: bool, experts: int = 8, top_k: int = 2,
               capacity_factor: float | None = None, **shape: object) -> Layer:
    """The router: a linear h -> E on every token, softmax and top-k. The token stream passes
    through unchanged ((s, h) -> (s, h)); the routing decision rides beside it.

    FLOPs per phase 2·s·h·E (`token_linear_flops`); params h·E (no bias; replicated over the
    tensor group, as Megatron-Core keeps it). Bytes per phase: read the tokens, write the E
    logits per token, (s·h + s·E)·b; top-k and the auxiliary load-balance loss are a few
    values per token and not counted.
    """
    dims, hyper, e, _ = _moe_hyper(name, "moe_router", shape, ("hidden",), experts, top_k,
                                   capacity_factor)
    s, h = dims.s, dims.h
    assert h is not None
    _expect("moe_router", name, input_shape, (s, h), "(seq, hidden)")
    flops = token_linear_flops(s, h, e)
    moved = float((s * h + s * e) * bytes_per_value)
    return _layer("moe_router", name, (s, h), (s, h), h * e, (flops, flops, flops),
                  (moved, moved, moved), needs_input_grad, hyper, in_features=h, out_features=e)


@register_kind("moe_dispatch", kernel=KernelClass.MEMORY, splits=megatron("replicated"),
               expert_exchange="dispatch")
def moe_dispatch(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
                 needs_input_grad: bool, experts: int = 8, top_k: int = 2,
                 capacity_factor: float | None = None, **shape: object) -> Layer:
    """The dispatch: each token copied to its k experts' rows, (s, h) -> (s·k, h), sorted by
    expert (Megatron-Core's permute); with expert parallelism an all-to-all over ep sends each
    copy to the member holding its expert (model/expert_parallel.py). 0 FLOP.

    Bytes: forward reads s·h and writes s·k·h values, plus the s·k int64 routing indices;
    input gradient reads s·k·h and writes s·h (the copies' gradients summed back).
    """
    dims, hyper, _, k = _moe_hyper(name, "moe_dispatch", shape, ("hidden",), experts, top_k,
                                   capacity_factor)
    s, h = dims.s, dims.h
    assert h is not None
    _expect("moe_dispatch", name, input_shape, (s, h), "(seq, hidden)")
    rows = routed_tokens(s, k)
    b = bytes_per_value
    moved = (float((s * h + rows * h) * b + rows * TOKEN_ID_BYTES),
             float((rows * h + s * h) * b), 0.0)
    return _layer("moe_dispatch", name, (s, h), (rows, h), 0, (0.0, 0.0, 0.0), moved,
                  needs_input_grad, hyper)


def _expert_inner(dims: _Dims) -> int:
    assert dims.f is not None
    return 2 * dims.f if dims.gated else dims.f


def _expert_linear(kind: str, name: str, input_shape: tuple[int, ...], b: int,
                   needs_input_grad: bool, shape: dict[str, object], experts: object,
                   top_k: object, capacity_factor: object, bias: bool, up: bool) -> Layer:
    dims, hyper, e, k = _moe_hyper(name, kind, shape, ("hidden", "ffn"), experts, top_k,
                                   capacity_factor)
    assert dims.h is not None
    rows = routed_tokens(dims.s, k)
    n_in, n_out = (dims.h, _expert_inner(dims)) if up else (dims.f, dims.h)
    assert n_in is not None
    _expect(kind, name, input_shape, (rows, n_in), f"(seq·top_k, {n_in})")
    hyper["bias"] = _flag(name, "bias", bias)
    flops = token_linear_flops(rows, n_in, n_out)
    moved = float((rows * n_in + rows * n_out) * b)
    params = e * (n_in * n_out + (n_out if bias else 0))
    return _layer(kind, name, input_shape, (rows, n_out), params, (flops, flops, flops),
                  (moved, moved, moved), needs_input_grad, hyper, in_features=n_in,
                  out_features=n_out)


@register_kind("expert_up", kernel=KernelClass.GEMM, splits=megatron("column"),
               tensor_extent_key="ffn", fp8_gemm=True, expert=True)
def expert_up(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
              needs_input_grad: bool, experts: int = 8, top_k: int = 2,
              capacity_factor: float | None = None, bias: bool = False,
              **shape: object) -> Layer:
    """The routed experts' first linear, h -> f_e (h -> 2·f_e gated), on the s·k routed token
    copies: FLOPs per phase 2·s·k·h·f_in; params E·h·f_in (+ E·f_in bias). Column parallel over
    the tensor group (Megatron-Core's expert tensor parallelism at the plan's tp)."""
    return _expert_linear("expert_up", name, input_shape, bytes_per_value, needs_input_grad,
                          shape, experts, top_k, capacity_factor, bias, up=True)


@register_kind("expert_act", kernel=KernelClass.MEMORY, splits=megatron("local"),
               tensor_extent_key="ffn")
def expert_act(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
               needs_input_grad: bool, experts: int = 8, top_k: int = 2,
               capacity_factor: float | None = None, eager: bool = False,
               **shape: object) -> Layer:
    """The experts' activation on s·k rows, bytes as `mlp_act`
    (transformer_kinds.activation_values_per_row per row; `eager`: a SwiGLU run op by op).
    0 FLOP."""
    dims, hyper, _, k = _moe_hyper(name, "expert_act", shape, ("ffn",), experts, top_k,
                                   capacity_factor)
    assert dims.f is not None
    rows, f = routed_tokens(dims.s, k), dims.f
    _expect("expert_act", name, input_shape, (rows, _expert_inner(dims)),
            "(seq·top_k, ffn x 2 if gated)")
    if _flag(name, "eager", eager) and dims.gated:
        hyper["eager"] = True
    forward, backward = activation_values_per_row(f, dims.gated, bool(hyper.get("eager")))
    b = bytes_per_value
    return _layer("expert_act", name, input_shape, (rows, f), 0, (0.0, 0.0, 0.0),
                  (float(forward * rows * b), float(backward * rows * b), 0.0),
                  needs_input_grad, hyper)


@register_kind("expert_down", kernel=KernelClass.GEMM, splits=megatron("row"),
               tensor_extent_key="ffn", fp8_gemm=True, expert=True)
def expert_down(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
                needs_input_grad: bool, experts: int = 8, top_k: int = 2,
                capacity_factor: float | None = None, bias: bool = False,
                **shape: object) -> Layer:
    """The routed experts' second linear, f_e -> h, on the s·k routed copies: FLOPs per phase
    2·s·k·f_e·h; params E·f_e·h (+ E·h bias); row parallel."""
    return _expert_linear("expert_down", name, input_shape, bytes_per_value, needs_input_grad,
                          shape, experts, top_k, capacity_factor, bias, up=False)


@register_kind("moe_combine", kernel=KernelClass.MEMORY, splits=megatron("replicated"),
               expert_exchange="combine")
def moe_combine(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
                needs_input_grad: bool, experts: int = 8, top_k: int = 2,
                capacity_factor: float | None = None, **shape: object) -> Layer:
    """The combine: the experts' outputs sent back (an all-to-all over ep) and each token's k
    copies summed, weighted by the router's probabilities: (s·k, h) -> (s, h). 0 FLOP.

    Bytes: forward reads s·k·h values and s·k fp32 probabilities, writes s·h; input gradient
    reads the s·h gradient and the s·k·h copies (for the probabilities' gradients) and writes
    the s·k·h copies' gradients.
    """
    dims, hyper, _, k = _moe_hyper(name, "moe_combine", shape, ("hidden",), experts, top_k,
                                   capacity_factor)
    s, h = dims.s, dims.h
    assert h is not None
    rows = routed_tokens(s, k)
    _expect("moe_combine", name, input_shape, (rows, h), "(seq·top_k, hidden)")
    b = bytes_per_value
    moved = (float((rows * h + s * h) * b + rows * ROUTER_PROBABILITY_BYTES),
             float((s * h + 2 * rows * h) * b), 0.0)
    return _layer("moe_combine", name, input_shape, (s, h), 0, (0.0, 0.0, 0.0), moved,
                  needs_input_grad, hyper)

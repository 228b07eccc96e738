"""The typed summary of a transformer workload's shape (`Workload.transformer`).

A transformer workload's layers (workload/transformer_kinds.py) carry every count per layer;
this summary keeps the few numbers a block-level formula needs (for example Korthikanti et al.
2022's activation memory per block, s·b·h·(34 + 5·a·s/h)) so that the model does not re-derive
them from the layer list. Validated on construction: a bad field raises `InputError` naming
``transformer.<field>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from dnnscale.errors import MAX_COUNT, InputError, short_repr

NORMS = ("layernorm", "rmsnorm")
POSITIONALS = ("learned", "rope", "relative", "none")
NORM_POSITIONS = ("pre", "post")
ATTENTION_KERNELS = ("fa2", "triton")
"""Fused attention kernels a workload may run: FlashAttention-2's CUDA kernels (Megatron,
PyTorch SDPA, Hugging Face) and the Triton implementation of FlashAttention (llm-foundry's
``attn_impl: triton``). Each is priced by its published speed, or where a GPU has none by an
estimate derived from another GPU's (system/attention_kernels.py)."""
ROPE_THETA_DEFAULT = 10_000.0
"""RoPE's base when a shape gives none: RoFormer's θ_i = 10000^(-2(i-1)/d) (Su et al. 2021,
eq. 15), which GPT-NeoX, Llama 1 and 2 keep and Hugging Face's configs default to."""
MAX_ROPE_THETA = 1e12
"""The largest base accepted: published models use 10^4 (Llama 2) to 10^6-10^7 (long-context
variants); 10^12 leaves room and rejects typing slips."""


@dataclass(frozen=True)
class TransformerShape:
    """Shape of a decoder (GPT, Llama) or encoder (BERT) stack; counts per sequence.

    layers L, hidden h, heads a, kv_heads (a for multi-head attention, fewer for grouped-query
    attention), ffn f (the MLP's inner width; a gated MLP has two h x f input matrices), vocab V,
    seq s (tokens per sample). `positions` is the number of rows of a learned position table
    (0 unless `positional == "learned"`), `token_types` the rows of BERT's segment table.
    `norm_position` "pre" (GPT-2 onwards: norm before each sub-layer, a final norm) or "post"
    (BERT: norm after each residual add, a norm after the embedding, no final norm).
    `rope_theta` is RoPE's base (Llama 3: 500,000), None for the conventional 10,000
    (`rotary_base`); only a RoPE shape has one. It changes no count, only the engines' options.
    `attention_kernel` is the fused attention kernel (ATTENTION_KERNELS) when
    `flash_attention` is on; it changes no count, only the kernel's speed. `eager`: the
    element-wise code between the GEMMs runs op by op, as PyTorch runs a model's Python code
    without torch.compile (torchtitan's, Hugging Face's): each RMSNorm as its operations in
    fp32 (transformer_kinds.rmsnorm), a gated MLP's activation as silu, then the product
    (mlp_act), RoPE's rotation as an fp32 complex product (rope); otherwise those are fused
    kernels (Megatron-LM, Transformer Engine, Apex, torch.compile). A LayerNorm and a GeLU are one kernel each in eager PyTorch too, so they
    price the same either way.
    `dropout` is the hidden dropout: each sub-layer's output before its residual add (and the
    embedding's output); `attention_dropout` the dropout of the attention probabilities (None
    on construction: the same as `dropout`). Models set them apart: OPT, Falcon and Mistral
    configs give attention_dropout 0 beside a hidden dropout, Transformer-XL base's dropatt is 0
    beside dropout 0.1 (wt103_base.yaml). A dropout of probability 0 runs no kernel (PyTorch's
    dropout returns its input when p is 0), so it is off here.
    `bias` gives every linear layer and norm a bias; `attention_bias` the attention's
    projections theirs (None on construction: as `bias`). Transformer-XL's reference code has
    none there beside biased MLP linears (mem_transformer.py: qkv_net, o_net and r_net are
    nn.Linear(..., bias=False)).
    `separate_projections`: Q, K and V are three Linear modules, and a gated MLP's gate and up
    projections two, as BERT's reference code and its ports, Hugging Face's Llama family and
    torchtitan write them; each phase runs their GEMMs one by one and sums their input
    gradients (model/gpu_compute.projection_shares, input_gradient_sum_values). Megatron,
    Transformer Engine and llm-foundry's MPT fuse them (the default, false).

    Transformer-XL (Dai et al. 2019, "Transformer-XL: Attentive Language Models Beyond a
    Fixed-Length Context"): `memory` (mem_len, 0: none) is the number of hidden states of the
    previous segment each block caches and attends over, so every query of the s-token segment
    scores k = s + memory keys; the memory is not back-propagated (a stop-gradient, §3.2).
    `positional: relative` is its relative positional encoding (§3.3): each block projects the
    k sinusoid position vectors by its own W_{k,R} (h x h) and adds a second score term
    (Q + v)·(W_{k,R} R)ᵀ to (Q + u)·Kᵀ, with two bias vectors u, v (a·d each) shared by all
    blocks. A memory needs relative positions (absolute ones cannot tell the memory's tokens
    from the segment's, §3.3) and the unfused attention kinds (no fused kernel computes the
    relative term).

    Mixture of experts (`experts` > 0; 0 is a dense MLP): every block's MLP is a router over
    `experts` routed experts, each token sent to `top_k` of them, each expert a (gated, as the
    dense MLP would be) MLP of inner width `expert_ffn` (0: `ffn`), plus shared experts of
    total inner width `shared_ffn` (0: none) that every token passes through. `capacity_factor`
    caps each expert's tokens at that multiple of the mean, dropping the rest (None: dropless).
    The router's auxiliary load-balancing loss is not priced (a few values per token).
    `dense_blocks` lists the blocks (counted from 0, ascending) whose MLP is instead the dense
    MLP of width `ffn`: DeepSeek-V3's first three (first_k_dense_replace), Qwen-MoE's
    mlp_only_layers, the dense half of an interleaved stack (Megatron's --moe-layer-freq).

    `predictions` (0: every position) is the number of positions per sequence the LM head
    (the output projection and the loss) runs on: a masked language model's pretraining
    gathers its masked positions before the head, as BERT's reference code does
    (`gather_indexes` over max_predictions_per_seq positions, 20 at seq 128 and 80 at 512 in
    DeepLearningExamples' scripts) and DeepLearningExamples' PyTorch BERT (its dense sequence
    output, the default, index-selects the labelled positions).

    `metrics` (0: none) is the number of training metrics that recompute the loss over the
    logits after every micro-batch, without gradients: Composer's trainer updates each train
    metric from the micro-batch's outputs (trainer.py, `_train_microbatch` ->
    `_eval_train_metrics`), and llm-foundry's MPT trains with two, LanguageCrossEntropy and
    LanguagePerplexity, each a torch CrossEntropyLoss over every logit (the cross_entropy kind
    prices them).
    """

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    gated: bool = False
    norm: str = "layernorm"
    flash_attention: bool = False
    tied_embeddings: bool = True
    causal: bool = True
    positional: str = "learned"
    positions: int = 0
    token_types: int = 0
    norm_position: str = "pre"
    bias: bool = True
    attention_bias: bool | None = None
    separate_projections: bool = False
    dropout: bool = True
    attention_dropout: bool | None = None
    rope_theta: float | None = None
    attention_kernel: str = "fa2"
    eager: bool = False
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    capacity_factor: float | None = None
    dense_blocks: tuple[int, ...] = ()
    memory: int = 0
    predictions: int = 0
    metrics: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.dense_blocks, list):  # YAML and JSON give a list
            object.__setattr__(self, "dense_blocks", tuple(self.dense_blocks))
        if self.attention_dropout is None:  # unset: the hidden dropout's
            object.__setattr__(self, "attention_dropout", self.dropout)
        if self.attention_bias is None:  # unset: every linear's
            object.__setattr__(self, "attention_bias", self.bias)
        for name in REQUIRED_FIELDS:
            _require_int(name, getattr(self, name), 1)
        for name in ("positions", "token_types", "experts", "top_k", "expert_ffn", "shared_ffn",
                     "memory", "predictions", "metrics"):
            _require_int(name, getattr(self, name), 0)
        if self.predictions > self.seq:
            raise InputError("transformer.predictions", f"the LM head runs on at most the seq = "
                             f"{self.seq} positions of a sequence, got {self.predictions}")
        for name in ("gated", "flash_attention", "tied_embeddings", "causal", "bias",
                     "attention_bias", "separate_projections", "dropout", "attention_dropout",
                     "eager"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"transformer.{name}", f"must be true or false, got "
                                 f"{getattr(self, name)!r}")
        for name, allowed in (("norm", NORMS), ("positional", POSITIONALS),
                              ("norm_position", NORM_POSITIONS),
                              ("attention_kernel", ATTENTION_KERNELS)):
            if getattr(self, name) not in allowed:
                raise InputError(f"transformer.{name}", f"must be one of {', '.join(allowed)}, "
                                 f"got {getattr(self, name)!r}")
        if self.hidden % self.heads:
            raise InputError("transformer.heads", f"{self.heads} heads do not divide hidden "
                             f"size {self.hidden}")
        if self.heads % self.kv_heads:
            raise InputError("transformer.kv_heads", f"{self.kv_heads} key/value heads do not "
                             f"divide {self.heads} query heads")
        if self.positional == "learned" and self.positions < self.seq:
            raise InputError("transformer.positions", f"a learned position table needs at least "
                             f"seq = {self.seq} rows, got {self.positions}")
        if self.positional != "learned" and self.positions:
            raise InputError("transformer.positions", f"must be 0 without learned positions, "
                             f"got {self.positions}")
        self._check_rope_theta()
        self._check_experts()
        self._check_relative()
        if self.attention_kernel != "fa2" and not self.flash_attention:
            raise InputError("transformer.attention_kernel", f"only fused attention has a "
                             f"kernel choice; {self.attention_kernel!r} needs flash attention on")

    def _check_experts(self) -> None:
        if not self.experts:
            for name in ("top_k", "expert_ffn", "shared_ffn"):
                if getattr(self, name):
                    raise InputError(f"transformer.{name}", f"only a mixture of experts has "
                                     f"one (experts is 0), got {getattr(self, name)!r}")
            if self.capacity_factor is not None:
                raise InputError("transformer.capacity_factor", "only a mixture of experts has "
                                 "one (experts is 0)")
            if self.dense_blocks:
                raise InputError("transformer.dense_blocks", "only a mixture of experts has "
                                 "dense blocks among its blocks (experts is 0)")
            return
        self._check_dense_blocks()
        if not 1 <= self.top_k <= self.experts:
            raise InputError("transformer.top_k", f"must be an integer in [1, experts = "
                             f"{self.experts}], got {short_repr(self.top_k)}")
        check_capacity_factor(self.capacity_factor)

    def _check_dense_blocks(self) -> None:
        blocks = self.dense_blocks
        if not isinstance(blocks, tuple) or any(
                isinstance(i, bool) or not isinstance(i, int) for i in blocks):
            raise InputError("transformer.dense_blocks", f"must be a list of block indices, got "
                             f"{short_repr(blocks)}")
        if any(not 0 <= i < self.layers for i in blocks):
            raise InputError("transformer.dense_blocks", f"block indices run from 0 to "
                             f"{self.layers - 1}, got {short_repr(list(blocks))}")
        if list(blocks) != sorted(set(blocks)):
            raise InputError("transformer.dense_blocks", f"must be ascending, each block once, "
                             f"got {short_repr(list(blocks))}")
        if len(blocks) == self.layers:
            raise InputError("transformer.dense_blocks", "every block is dense: give experts 0 "
                             "for a dense model")

    def _check_relative(self) -> None:
        if self.memory and self.positional != "relative":
            raise InputError("transformer.memory", f"a recurrence memory needs relative "
                             f"positions (positional: relative), got {self.positional!r}")
        if self.positional == "relative" and self.flash_attention:
            raise InputError("transformer.flash_attention", "no fused attention kernel computes "
                             "relative positions' second score term: give flash_attention false")

    @property
    def predicted(self) -> int:
        """The positions per sequence the LM head runs on: `predictions`, or every one."""
        return self.predictions or self.seq

    @property
    def drops_attention(self) -> bool:
        """Whether the attention probabilities go through dropout (`attention_dropout`, which
        construction resolves to a bool)."""
        return bool(self.attention_dropout)

    @property
    def eager_norms(self) -> bool:
        """Whether its norms run op by op (`eager` with RMSNorms; a LayerNorm is one kernel)."""
        return self.eager and self.norm == "rmsnorm"

    @property
    def eager_activation(self) -> bool:
        """Whether its MLP's activation runs op by op (`eager` with a gated MLP; a GeLU is one
        kernel)."""
        return self.eager and self.gated

    @property
    def keys(self) -> int:
        """k = seq + memory: the keys (and values) each query attends over."""
        return self.seq + self.memory

    @property
    def is_moe(self) -> bool:
        """Whether the blocks' MLPs are mixtures of experts (all but `dense_blocks`)."""
        return self.experts > 0

    def is_moe_block(self, block: int) -> bool:
        """Whether block `block` (from 0) has a mixture of experts for its MLP."""
        return self.experts > 0 and block not in self.dense_blocks

    @property
    def moe_blocks(self) -> int:
        """The number of blocks whose MLP is a mixture of experts."""
        return self.layers - len(self.dense_blocks) if self.experts else 0

    @property
    def routed_ffn(self) -> int:
        """Each routed expert's inner width: `expert_ffn`, or `ffn` when it gives none."""
        return self.expert_ffn or self.ffn

    def _check_rope_theta(self) -> None:
        if self.rope_theta is None:
            return
        check_rope_theta(self.rope_theta)
        if self.positional != "rope":
            raise InputError("transformer.rope_theta", f"only RoPE positions have a base; "
                             f"positional is {self.positional!r}")

    @property
    def tokens_per_sample(self) -> int:
        """One sample is one sequence of s tokens."""
        return self.seq

    @property
    def rotary_base(self) -> float:
        """RoPE's base θ: `rope_theta`, or ROPE_THETA_DEFAULT when the shape gives none."""
        return ROPE_THETA_DEFAULT if self.rope_theta is None else float(self.rope_theta)

    @property
    def head_dim(self) -> int:
        """d = h / a."""
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """h_kv = kv_heads · d: the width of K (and of V)."""
        return self.kv_heads * self.head_dim


def check_rope_theta(value: object, field: str = "transformer.rope_theta") -> float:
    """RoPE's base: a real number in (1, MAX_ROPE_THETA]; errors name `field`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or not 1 < value <= MAX_ROPE_THETA:
        raise InputError(field, f"must be a number in (1, {MAX_ROPE_THETA:.0e}], got "
                         f"{short_repr(value)}")
    return float(value)


MAX_CAPACITY_FACTOR = 64.0
"""The largest capacity factor accepted (published runs use 1.0-2.0; Fedus et al. 2022)."""


def check_capacity_factor(value: object, field: str = "transformer.capacity_factor"
                          ) -> float | None:
    """An expert capacity factor: None (dropless) or a number in (0, MAX_CAPACITY_FACTOR]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or not 0 < value <= MAX_CAPACITY_FACTOR:
        raise InputError(field, f"must be a number in (0, {MAX_CAPACITY_FACTOR:g}] or null "
                         f"(dropless), got {short_repr(value)}")
    return float(value)


TRANSFORMER_FIELDS = tuple(f.name for f in fields(TransformerShape))
REQUIRED_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq")


def _require_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_COUNT:
        raise InputError(f"transformer.{name}", f"must be an integer in [{minimum}, "
                         f"{MAX_COUNT:,}], got {short_repr(value)}")


def transformer_shape_from_dict(data: object) -> TransformerShape:
    """A `TransformerShape` from a YAML mapping of its fields; errors name the field."""
    if not isinstance(data, dict):
        raise InputError("workload.transformer", f"must be a mapping, got {short_repr(data)}")
    unknown = sorted(set(data) - set(TRANSFORMER_FIELDS))
    if unknown:
        raise InputError(f"workload.transformer.{unknown[0]}", f"unknown field (known: "
                         f"{', '.join(TRANSFORMER_FIELDS)})")
    for name in REQUIRED_FIELDS:
        if name not in data:
            raise InputError(f"workload.transformer.{name}", "missing")
    return TransformerShape(**data)

"""Transformer zoo entries with published shapes, and the parametric ``gpt:key=value,...`` name.

Names: gpt3-125m, gpt3-350m, gpt3-760m, gpt3-1.3b, gpt3-2.7b, gpt3-6.7b, gpt3-13b, gpt3-175b,
llama2-7b, llama2-13b, llama2-70b, llama3-8b, llama3-70b, bert-large, and the mixtures of
experts mixtral-8x7b, mixtral-8x22b, deepseek-v3-like. One sample is one sequence;
`samples_per_epoch` is the published training run's token budget in sequences (where none is
published, DEFAULT_SAMPLES_PER_EPOCH).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dnnscale.errors import InputError, short_repr
from dnnscale.workload.transformer import DEFAULT_SAMPLES_PER_EPOCH, transformer_workload
from dnnscale.workload.transformer_shape import (ATTENTION_KERNELS, NORM_POSITIONS,
                                                 POSITIONALS, ROPE_THETA_DEFAULT)
from dnnscale.workload.workload import Workload

GPT3_SEQ, GPT3_VOCAB = 2048, 50257
GPT3_TRAIN_TOKENS = 300_000_000_000
# Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1: n_layers, d_model,
# n_heads (d_head = d_model / n_heads); every model has d_ff = 4·d_model, a 2048-token context,
# GPT-2's 50,257-token BPE vocabulary (Radford et al. 2019), learned positions, pre-norm
# LayerNorm with biases, tied input/output embeddings, and was trained on 300 B tokens (§2.2).
GPT3_SHAPES = {
    "gpt3-125m": (12, 768, 12),
    "gpt3-350m": (24, 1024, 16),
    "gpt3-760m": (24, 1536, 16),
    # Table 2.1 prints 24 heads of d_head 128 with d_model 2048 (24 · 128 = 3072): 16 heads of
    # 128 are used here (the head count changes no parameter or FLOP, only a·s² softmax bytes).
    "gpt3-1.3b": (24, 2048, 16),
    "gpt3-2.7b": (32, 2560, 32),
    "gpt3-6.7b": (32, 4096, 32),
    # Table 2.1 prints d_model 5140 with 40 heads of 128; 40 · 128 = 5120, the width used here.
    "gpt3-13b": (40, 5120, 40),
    "gpt3-175b": (96, 12288, 96),
}

# The published configurations (config.json of meta-llama/Llama-2-{7,13,70}b-hf and
# Meta-Llama-3-{8,70}B; Touvron et al. 2023, "Llama 2", Table 1 and §2.2; Dubey et al. 2024,
# "The Llama 3 Herd of Models", Table 3): (layers, hidden, heads, kv_heads, ffn, vocab, seq,
# training tokens). All: RMSNorm, SwiGLU MLP, RoPE positions, no biases, untied output
# embedding, causal, no dropout, fused attention (Touvron et al. 2023, §2.2: "an efficient
# implementation of the causal multi-head attention", xformers' memory-efficient kernel; the
# engines that train Llama today run FlashAttention-2). GPT-3 and BERT keep the unfused
# attention they were published with (2020, 2019: before fused attention kernels).
LLAMA_SHAPES = {
    "llama2-7b": (32, 4096, 32, 32, 11008, 32000, 4096, 2_000_000_000_000),
    "llama2-13b": (40, 5120, 40, 40, 13824, 32000, 4096, 2_000_000_000_000),
    "llama2-70b": (80, 8192, 64, 8, 28672, 32000, 4096, 2_000_000_000_000),
    "llama3-8b": (32, 4096, 32, 8, 14336, 128256, 8192, 15_000_000_000_000),
    "llama3-70b": (80, 8192, 64, 8, 28672, 128256, 8192, 15_000_000_000_000),
}
LLAMA_ROPE_THETA = {"llama3-8b": 500_000.0, "llama3-70b": 500_000.0}
"""RoPE's base where it is not RoFormer's 10,000 (the shape's default, which Llama 2 keeps):
Llama 3 raised it to 500,000 (Dubey et al. 2024, §3.2; the configs' rope_theta)."""


def _gpt3(name: str) -> Callable[[], Workload]:
    layers, hidden, heads = GPT3_SHAPES[name]

    def build() -> Workload:
        return transformer_workload(name, layers, hidden, heads, GPT3_SEQ, GPT3_VOCAB,
                                    samples_per_epoch=GPT3_TRAIN_TOKENS // GPT3_SEQ,
                                    description=f"GPT-3 {name.removeprefix('gpt3-')} "
                                                f"(Brown et al. 2020, Table 2.1): {layers} "
                                                f"layers, d_model {hidden}, {heads} heads, "
                                                f"2048-token context")

    build.__doc__ = (f"GPT-3 {name} (Brown et al. 2020, Table 2.1): {layers} layers x "
                     f"{hidden}, {heads} heads, seq 2048, vocab 50257, learned positions, tied "
                     f"embeddings. 300 B training tokens = 146,484,375 sequences per epoch.")
    return build


def _llama(name: str) -> Callable[[], Workload]:
    layers, hidden, heads, kv_heads, ffn, vocab, seq, tokens = LLAMA_SHAPES[name]

    def build() -> Workload:
        return transformer_workload(name, layers, hidden, heads, seq, vocab, ffn=ffn,
                                    kv_heads=kv_heads, gated=True, norm="rmsnorm",
                                    tied_embeddings=False, positional="rope", bias=False,
                                    dropout=False, rope_theta=LLAMA_ROPE_THETA.get(name),
                                    flash_attention=True,
                                    samples_per_epoch=round(tokens / seq),
                                    description=f"{name}: {layers} layers x {hidden}, {heads} "
                                                f"heads ({kv_heads} key/value), SwiGLU "
                                                f"{ffn}, vocab {vocab}, seq {seq}")

    build.__doc__ = (f"{name} (published config): {layers} layers x {hidden}, {heads} heads, "
                     f"{kv_heads} key/value heads, SwiGLU ffn {ffn}, vocab {vocab}, seq {seq}, "
                     f"RMSNorm, RoPE (base {LLAMA_ROPE_THETA.get(name, ROPE_THETA_DEFAULT):,.0f}), "
                     f"untied output, flash attention; {tokens:.0e} training tokens per epoch.")
    return build


BERT_PREDICTIONS_AT_512 = 80
"""max_predictions_per_seq of BERT's sequence-512 pretraining: the masked positions its LM head
runs on (DeepLearningExamples' TensorFlow phase-2 script, max_pred_per_seq=80)."""


def bert_large() -> Workload:
    """BERT-Large (Devlin et al. 2019, §3: L = 24, H = 1024, A = 16, "340M" parameters).

    Post-norm encoder: learned positions (512) and 2 token types with a LayerNorm after the
    embedding, GeLU MLP of 4096, biases, bidirectional attention, seq 512, WordPiece vocabulary
    of 30,522 (uncased), decoder tied to the embedding. Not modelled: the pooler (1.05 M
    parameters) and the MLM head's transform and decoder bias (1.08 M); with them the encoder's
    334.09 M parameters become Hugging Face's 335.1 M (BertModel + pooler) and 336.2 M
    (BertForPreTraining). The masked-LM head runs on 80 positions of each sequence
    (`predictions`): the reference implementation gathers the max_predictions_per_seq masked
    positions before the head (run_pretraining.py's gather_indexes), 80 at sequence 512 in
    DeepLearningExamples' phase-2 scripts (20 at 128). Pre-training: 1 M steps of 256 sequences
    = 256,000,000 sequences per epoch (§A.2; the 128-token phase is ignored).
    """
    return transformer_workload("bert-large", 24, 1024, 16, 512, 30522, causal=False,
                                positional="learned", token_types=2, norm_position="post",
                                predictions=BERT_PREDICTIONS_AT_512,
                                samples_per_epoch=256_000_000,
                                description="BERT-Large (Devlin et al. 2019): 24 layers x 1024, "
                                            "16 heads, seq 512, vocab 30522, bidirectional")


# Mixtral (Jiang et al. 2024, "Mixtral of Experts"): the config.json values Mistral AI published
# for mistralai/Mixtral-8x7B-v0.1 and mistralai/Mixtral-8x22B-v0.1 on the Hugging Face Hub (as
# copied verbatim into public repositories; NVIDIA NeMo's MixtralConfig8x7B / 8x22B agree):
# (num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads,
# intermediate_size = each expert's SwiGLU width, vocab_size, max_position_embeddings). Both:
# num_local_experts 8, num_experts_per_tok 2, rope_theta 1,000,000, sliding_window null,
# tie_word_embeddings false, RMSNorm, no biases, no dropout, no shared expert. seq is
# max_position_embeddings, as for Llama (the pre-training context: 32k for 8x7B, Jiang et al.
# §2; 64k for 8x22B). Dropless: no capacity factor (Mixtral routes every token, as the
# Megablocks kernels it was released with do). The training token budget is not published.
MIXTRAL_SHAPES = {
    "mixtral-8x7b": (32, 4096, 32, 8, 14336, 32000, 32768),
    "mixtral-8x22b": (56, 6144, 48, 8, 16384, 32000, 65536),
}
MIXTRAL_EXPERTS, MIXTRAL_TOP_K, MIXTRAL_ROPE_THETA = 8, 2, 1_000_000.0
MIXTRAL_PUBLISHED = {"mixtral-8x7b": ("46.7B", "12.9B"), "mixtral-8x22b": ("141B", "39B")}
"""Total and active-per-token parameters as Mistral AI announced them (mistral.ai/news,
"Mixtral of experts", Dec. 2023, and the Mixtral 8x22B release, Apr. 2024)."""


def _mixtral(name: str) -> Callable[[], Workload]:
    layers, hidden, heads, kv_heads, ffn, vocab, seq = MIXTRAL_SHAPES[name]
    total, active = MIXTRAL_PUBLISHED[name]

    def build() -> Workload:
        return transformer_workload(name, layers, hidden, heads, seq, vocab, ffn=ffn,
                                    kv_heads=kv_heads, gated=True, norm="rmsnorm",
                                    tied_embeddings=False, positional="rope", bias=False,
                                    dropout=False, flash_attention=True,
                                    rope_theta=MIXTRAL_ROPE_THETA, experts=MIXTRAL_EXPERTS,
                                    top_k=MIXTRAL_TOP_K,
                                    description=f"{name}: {layers} layers x {hidden}, {heads} "
                                                f"heads ({kv_heads} key/value), 8 SwiGLU "
                                                f"experts of {ffn}, top-2, dropless, vocab "
                                                f"{vocab}, seq {seq}")

    build.__doc__ = (f"{name} (Mistral AI's published config.json): {layers} layers x {hidden}, "
                     f"{heads} heads, {kv_heads} key/value heads, 8 SwiGLU experts of inner "
                     f"width {ffn} per block, top-2 routing, no shared expert, dropless, vocab "
                     f"{vocab}, seq {seq} (max_position_embeddings), RMSNorm, RoPE (base "
                     f"1,000,000), untied output, flash attention. Published: {total} total, "
                     f"{active} active parameters per token. Training tokens unpublished: "
                     f"{DEFAULT_SAMPLES_PER_EPOCH:,} sequences per epoch.")
    return build


DEEPSEEK_V3 = {"layers": 61, "hidden": 7168, "heads": 128, "ffn": 18432, "vocab": 129280,
               "experts": 256, "top_k": 8, "expert_ffn": 2048, "shared_ffn": 2048, "seq": 4096}
"""DeepSeek-V3's published dimensions: deepseek-ai/DeepSeek-V3's config.json on the Hugging Face
Hub (num_hidden_layers 61, hidden_size 7168, num_attention_heads 128, num_key_value_heads 128,
intermediate_size 18432 (the dense blocks' width), vocab_size 129280, n_routed_experts 256,
num_experts_per_tok 8, moe_intermediate_size 2048, n_shared_experts 1, first_k_dense_replace
3, q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim
128, rope_theta 10000, tie_word_embeddings false), the same values as the GitHub repository's
inference/configs/config_671B.json (github.com/deepseek-ai/DeepSeek-V3 at 9b4e978). seq 4096:
the pre-training sequence length (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", §4.2; the
config's rope_scaling.original_max_position_embeddings), later extended to 128K with YaRN;
14.8 T pre-training tokens (ibid., abstract)."""
DEEPSEEK_V3_TRAIN_TOKENS = 14_800_000_000_000
DEEPSEEK_V3_DENSE_BLOCKS = 3
"""first_k_dense_replace: blocks 0-2 have dense MLPs of intermediate_size."""


def deepseek_v3_like() -> Workload:
    """DeepSeek-V3-like: DeepSeek-V3's published dimensions (DEEPSEEK_V3) priced as the blocks
    dnnscale has. NOT DeepSeek-V3 itself.

    Kept: 61 blocks x 7168, the first 3 (first_k_dense_replace) dense SwiGLU MLPs of 18,432,
    the other 58 mixtures of 256 routed SwiGLU experts of 2048, top-8, plus one shared expert
    of 2048 (shared_ffn 2048), dropless (DeepSeek-V3 drops no token in training), vocab
    129,280, untied output, RMSNorm, RoPE (base 10,000), no biases, no dropout, flash attention,
    seq 4096 (the pre-training length), 14.8 T tokens = 3,613,281,250 sequences per epoch.
    Changed: multi-head latent attention (MLA: low-rank query (1536) and key/value (512)
    projections, heads of 192 query/key and 128 value dims) is priced as multi-head attention
    with 128 heads of head dim 56 (hidden / heads), 4·h² parameters per block. Not modelled:
    the multi-token-prediction module (14 B more parameters), the sigmoid, group-limited
    routing and its bias terms (a few values a token).

    Parameters: 672.15 B here against the published 671 B (+0.2 %): MHA's 205.5 M attention
    parameters per block against MLA's 187.1 M add 1.12 B. Active per token: 38.7 B here
    (1.12 B of it MHA's excess) against the published 37 B. The attention products run at head dim 56 where MLA's run at
    192 (scores) and 128 (context): their s² FLOPs are about 0.35x DeepSeek-V3's, a fraction of
    a percent of a step's FLOPs at seq 4096.
    """
    d = DEEPSEEK_V3
    return transformer_workload(
        "deepseek-v3-like", d["layers"], d["hidden"], d["heads"], d["seq"], d["vocab"],
        ffn=d["ffn"], kv_heads=d["heads"], gated=True, norm="rmsnorm", tied_embeddings=False,
        positional="rope", bias=False, dropout=False, flash_attention=True,
        experts=d["experts"], top_k=d["top_k"], expert_ffn=d["expert_ffn"],
        shared_ffn=d["shared_ffn"], dense_blocks=tuple(range(DEEPSEEK_V3_DENSE_BLOCKS)),
        samples_per_epoch=DEEPSEEK_V3_TRAIN_TOKENS // d["seq"],
        description="DeepSeek-V3-like, not DeepSeek-V3: its published dimensions (61 layers x "
                    "7168, the first 3 dense MLPs of 18432, then 256 routed experts of 2048 "
                    "top-8 plus 1 shared of 2048, vocab 129280, seq 4096) with multi-head "
                    "latent attention priced as multi-head attention of 128 heads of 56; "
                    "672.1 B parameters (published 671 B), 38.7 B active (published 37 B)")


TRANSFORMER_ZOO: dict[str, Callable[[], Workload]] = {
    **{name: _gpt3(name) for name in GPT3_SHAPES},
    **{name: _llama(name) for name in LLAMA_SHAPES},
    "bert-large": bert_large,
    **{name: _mixtral(name) for name in MIXTRAL_SHAPES},
    "deepseek-v3-like": deepseek_v3_like,
}

# The parametric name: gpt:layers=24,hidden=1024,heads=16,seq=1024,vocab=51200[,...]
_GPT_INTS = ("layers", "hidden", "heads", "seq", "vocab", "ffn", "kv_heads", "positions",
             "token_types", "samples", "rope_theta", "experts", "top_k", "expert_ffn",
             "shared_ffn", "first_dense", "memory", "predictions", "metrics")
_GPT_NUMBERS = ("capacity",)
"""Keys whose value is a real number: capacity (the experts' capacity factor)."""
_GPT_BOOLS = {"gated": "gated", "flash": "flash_attention", "flash_attention": "flash_attention",
              "tied": "tied_embeddings", "causal": "causal", "bias": "bias",
              "attention_bias": "attention_bias", "separate_projections": "separate_projections",
              "dropout": "dropout", "attention_dropout": "attention_dropout", "eager": "eager"}
_GPT_CHOICES = {"norm": ("layernorm", "rmsnorm"), "positional": POSITIONALS,
                "attention_kernel": ATTENTION_KERNELS, "norm_position": NORM_POSITIONS}
GPT_REQUIRED = ("layers", "hidden", "heads", "seq", "vocab")
_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def parse_options(text: str, field: str, ints: tuple[str, ...], bools: dict[str, str],
                  choices: dict[str, tuple[str, ...]],
                  numbers: tuple[str, ...] = ()) -> dict[str, object]:
    """Parse ``key=value,key=value`` into builder arguments; errors name ``field.key``.

    `ints` are integer keys, `bools` map a key to its argument name (true/false, yes/no, 1/0),
    `choices` map a key to its allowed words, `numbers` are real-number keys (finite: nan and
    inf are refused here, ranges by the builder)."""
    known = sorted({*ints, *bools, *choices, *numbers})
    options: dict[str, object] = {}
    seen: set[str] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = (v.strip() for v in part.partition("="))
        if not sep or not key:
            raise InputError(field, f"expected key=value, got {short_repr(part)}")
        where = f"{field}.{key}"
        if key in seen:  # as a YAML key given twice: never a silent last-one-wins
            raise InputError(where, "given twice")
        seen.add(key)
        if key in ints:
            try:
                options[key] = int(value)
            except ValueError:
                raise InputError(where, f"must be an integer, got {short_repr(value)}") from None
        elif key in numbers:
            try:
                number = float(value)
            except ValueError:
                raise InputError(where, f"must be a number, got {short_repr(value)}") from None
            if not math.isfinite(number):
                raise InputError(where, f"must be a finite number, got {short_repr(value)}")
            options[key] = number
        elif key in bools:
            if value.lower() not in (*_TRUE, *_FALSE):
                raise InputError(where, f"must be true or false, got {short_repr(value)}")
            options[bools[key]] = value.lower() in _TRUE
        elif key in choices:
            if value not in choices[key]:
                raise InputError(where, f"must be one of {', '.join(choices[key])}, got "
                                 f"{short_repr(value)}")
            options[key] = value
        else:
            raise InputError(where, f"unknown key (known: {', '.join(known)})")
    return options


def gpt_from_name(argument: str) -> Workload:
    """The workload of ``gpt:<argument>``, e.g. ``layers=24,hidden=1024,heads=16,seq=1024,
    vocab=51200``; optional keys ffn, kv_heads, positions, token_types (the rows of BERT's
    segment table; default 0, none), samples (per epoch), rope_theta
    (RoPE's base, with positional=rope), gated, flash, tied, causal, bias, attention_bias (the
    attention projections'; default: as bias), separate_projections (Q, K, V and a gated MLP's
    gate and up as separate GEMMs; default false, fused), dropout (the hidden
    dropouts), attention_dropout (the attention probabilities'; default: as dropout) (each
    true/false), norm (layernorm|rmsnorm), positional (learned|rope|relative|none),
    attention_kernel (fa2|triton, with flash=true), norm_position (pre|post), eager (true: the
    RMSNorms, a gated activation and RoPE run op by op, as PyTorch runs torchtitan's and Hugging
    Face's modeling code without torch.compile; default false), memory (Transformer-XL's cached memory
    length, with positional=relative; default 0), predictions (the positions per sequence the
    LM head runs on, a masked language model's masked tokens; default 0, every position),
    metrics (training metrics that recompute the loss over the logits every micro-batch, as
    Composer's train metrics; default 0). A mixture of experts: experts (routed experts per block;
    0, the default, is a dense MLP), top_k (experts per token, needed with experts),
    expert_ffn (each routed expert's inner width; default ffn), shared_ffn (the shared
    experts' total inner width; default none), capacity (the capacity factor, a number;
    default dropless), first_dense (the first blocks that keep a dense MLP of width ffn, as
    DeepSeek's first_k_dense_replace; default 0). Defaults as `transformer_workload`."""
    options = parse_options(argument, "workload.gpt", _GPT_INTS, _GPT_BOOLS, _GPT_CHOICES,
                            _GPT_NUMBERS)
    if "capacity" in options:
        options["capacity_factor"] = options.pop("capacity")
    for key in GPT_REQUIRED:
        if key not in options:
            raise InputError(f"workload.gpt.{key}", f"missing (gpt: needs "
                             f"{', '.join(GPT_REQUIRED)})")
    if options.get("experts") and "top_k" not in options:
        raise InputError("workload.gpt.top_k", f"missing (experts={options['experts']} needs "
                         f"top_k, the experts each token is routed to)")
    if "samples" in options:
        options["samples_per_epoch"] = options.pop("samples")
    first_dense = options.pop("first_dense", 0)
    if first_dense:
        layers = options["layers"]
        if isinstance(layers, int) and first_dense >= layers:  # type: ignore[operator]
            raise InputError("workload.gpt.first_dense", f"{first_dense} of {layers} blocks "
                             f"dense leaves none a mixture of experts (give experts=0)")
        options["dense_blocks"] = tuple(range(first_dense))  # type: ignore[call-overload]
    try:
        return transformer_workload(f"gpt:{argument}", **options)  # type: ignore[arg-type]
    except InputError as exc:  # transformer.<field> -> the key the user wrote
        key = exc.field.rpartition(".")[2]
        key = {v: k for k, v in _GPT_BOOLS.items() if k != "flash_attention"}.get(key, key)
        key = {"samples_per_epoch": "samples", "capacity_factor": "capacity",
               "dense_blocks": "first_dense"}.get(key, key)
        raise InputError(f"workload.gpt.{key}", exc.problem) from None

"""Transformer zoo entries with published shapes, and the parametric ``gpt:key=value,...`` name.

Names: gpt3-125m, gpt3-350m, gpt3-760m, gpt3-1.3b, gpt3-2.7b, gpt3-6.7b, gpt3-13b, gpt3-175b,
llama2-7b, llama2-13b, llama2-70b, llama3-8b, llama3-70b, bert-large. One sample is one
sequence; `samples_per_epoch` is the published training run's token budget in sequences.
"""

from __future__ import annotations

from collections.abc import Callable

from dnnscale.errors import InputError, short_repr
from dnnscale.workload.transformer import transformer_workload
from dnnscale.workload.transformer_shape import ATTENTION_KERNELS, ROPE_THETA_DEFAULT
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
# embedding, causal, no dropout.
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
                                    samples_per_epoch=round(tokens / seq),
                                    description=f"{name}: {layers} layers x {hidden}, {heads} "
                                                f"heads ({kv_heads} key/value), SwiGLU "
                                                f"{ffn}, vocab {vocab}, seq {seq}")

    build.__doc__ = (f"{name} (published config): {layers} layers x {hidden}, {heads} heads, "
                     f"{kv_heads} key/value heads, SwiGLU ffn {ffn}, vocab {vocab}, seq {seq}, "
                     f"RMSNorm, RoPE (base {LLAMA_ROPE_THETA.get(name, ROPE_THETA_DEFAULT):,.0f}), "
                     f"untied output; {tokens:.0e} training tokens per epoch.")
    return build


def bert_large() -> Workload:
    """BERT-Large (Devlin et al. 2019, §3: L = 24, H = 1024, A = 16, "340M" parameters).

    Post-norm encoder: learned positions (512) and 2 token types with a LayerNorm after the
    embedding, GeLU MLP of 4096, biases, bidirectional attention, seq 512, WordPiece vocabulary
    of 30,522 (uncased), decoder tied to the embedding. Not modelled: the pooler (1.05 M
    parameters) and the MLM head's transform and decoder bias (1.08 M); with them the encoder's
    334.09 M parameters become Hugging Face's 335.1 M (BertModel + pooler) and 336.2 M
    (BertForPreTraining). The masked-LM loss is costed over all 512 positions, as the decoder
    is applied to every position in the reference implementation. Pre-training: 1 M steps of
    256 sequences = 256,000,000 sequences per epoch (§A.2; the 128-token phase is ignored).
    """
    return transformer_workload("bert-large", 24, 1024, 16, 512, 30522, causal=False,
                                positional="learned", token_types=2, norm_position="post",
                                samples_per_epoch=256_000_000,
                                description="BERT-Large (Devlin et al. 2019): 24 layers x 1024, "
                                            "16 heads, seq 512, vocab 30522, bidirectional")


TRANSFORMER_ZOO: dict[str, Callable[[], Workload]] = {
    **{name: _gpt3(name) for name in GPT3_SHAPES},
    **{name: _llama(name) for name in LLAMA_SHAPES},
    "bert-large": bert_large,
}

# The parametric name: gpt:layers=24,hidden=1024,heads=16,seq=1024,vocab=51200[,...]
_GPT_INTS = ("layers", "hidden", "heads", "seq", "vocab", "ffn", "kv_heads", "positions",
             "samples", "rope_theta")
_GPT_BOOLS = {"gated": "gated", "flash": "flash_attention", "flash_attention": "flash_attention",
              "tied": "tied_embeddings", "causal": "causal", "bias": "bias",
              "dropout": "dropout"}
_GPT_CHOICES = {"norm": ("layernorm", "rmsnorm"), "positional": ("learned", "rope", "none"),
                "attention_kernel": ATTENTION_KERNELS}
GPT_REQUIRED = ("layers", "hidden", "heads", "seq", "vocab")
_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def parse_options(text: str, field: str, ints: tuple[str, ...], bools: dict[str, str],
                  choices: dict[str, tuple[str, ...]]) -> dict[str, object]:
    """Parse ``key=value,key=value`` into builder arguments; errors name ``field.key``.

    `ints` are integer keys, `bools` map a key to its argument name (true/false, yes/no, 1/0),
    `choices` map a key to its allowed words."""
    known = sorted({*ints, *bools, *choices})
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
    vocab=51200``; optional keys ffn, kv_heads, positions, samples (per epoch), rope_theta
    (RoPE's base, with positional=rope), gated, flash, tied, causal, bias, dropout
    (true/false), norm (layernorm|rmsnorm), positional (learned|rope|none), attention_kernel
    (fa2|triton, with flash=true). Defaults as
    `transformer_workload`."""
    options = parse_options(argument, "workload.gpt", _GPT_INTS, _GPT_BOOLS, _GPT_CHOICES)
    for key in GPT_REQUIRED:
        if key not in options:
            raise InputError(f"workload.gpt.{key}", f"missing (gpt: needs "
                             f"{', '.join(GPT_REQUIRED)})")
    if "samples" in options:
        options["samples_per_epoch"] = options.pop("samples")
    try:
        return transformer_workload(f"gpt:{argument}", **options)  # type: ignore[arg-type]
    except InputError as exc:  # transformer.<field> -> the key the user wrote
        key = exc.field.rpartition(".")[2]
        key = {v: k for k, v in _GPT_BOOLS.items() if k != "flash_attention"}.get(key, key)
        key = "samples" if key == "samples_per_epoch" else key
        raise InputError(f"workload.gpt.{key}", exc.problem) from None

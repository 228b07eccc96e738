"""Read a local Hugging Face ``config.json`` as a transformer workload (no network).

Keys read (the first one present wins): hidden_size | n_embd, num_attention_heads | n_head,
num_key_value_heads (default: the heads), intermediate_size | n_inner (default 4·hidden),
num_hidden_layers | n_layer, vocab_size, max_position_embeddings | n_positions | n_ctx (the
sequence length unless `seq` overrides it, and the rows of a learned position table),
tie_word_embeddings, head_dim (must be hidden / heads), the dropout probabilities (the
attention probabilities' attention_dropout | attn_pdrop | attention_probs_dropout_prob, the
hidden ones hidden_dropout | resid_pdrop | embd_pdrop | hidden_dropout_prob; each kind is on
when any of its keys is above 0), RoPE's
base rope_theta | rotary_emb_base (GPT-NeoX's name; absent: 10,000, Hugging Face's default),
and model_type, which gives the rest:

    llama, mistral   RMSNorm, SwiGLU, RoPE, no biases (unless attention_bias / mlp_bias), untied
    gpt2             LayerNorm, GeLU, learned positions, biases, tied
    gpt_neox         LayerNorm, GeLU, RoPE, biases, untied (tie_word_embeddings default)
    bert             post-norm LayerNorm, GeLU, learned positions + type_vocab_size token types,
                     biases, bidirectional, tied
    mixtral          as llama (no biases), mixture of experts: num_local_experts routed experts
                     of intermediate_size, num_experts_per_tok each token, every block
    qwen2_moe        as llama, no biases (Qwen2's q/k/v biases, a few thousand parameters a
                     block, are ignored), mixture of experts: num_experts routed experts of
                     moe_intermediate_size, num_experts_per_tok each token, a shared expert of
                     shared_expert_intermediate_size (its sigmoid gate, h parameters, ignored);
                     block i is a mixture when (i + 1) % decoder_sparse_step == 0 (default 1)
                     and i is not in mlp_only_layers (default []); the others are dense MLPs of
                     intermediate_size
    qwen3_moe        as qwen2_moe without a shared expert (no biases unless attention_bias);
                     its published head_dim 128 differs from hidden / heads: refused
    deepseek_v2,     as llama (no biases unless attention_bias), mixture of experts:
    deepseek_v3      n_routed_experts routed experts of moe_intermediate_size,
                     num_experts_per_tok each token, n_shared_experts (absent or null: none)
                     shared experts of moe_intermediate_size each; blocks 0 to
                     first_k_dense_replace - 1 (default 0) and those with
                     i % moe_layer_freq != 0 (default 1) are dense MLPs of intermediate_size.
                     Multi-head latent attention is priced as multi-head attention of hidden /
                     heads per head (the zoo's deepseek-v3-like): q_lora_rank, kv_lora_rank,
                     qk_rope_head_dim, qk_nope_head_dim, v_head_dim and head_dim are not read;
                     nor are the multi-token-prediction module (num_nextn_predict_layers) and
                     the routing details (topk_method, scoring_func, n_group, topk_group,
                     routed_scaling_factor), which are not modelled

A mixture-of-experts family must give its experts key (absent or null is refused, where
Hugging Face would default to its own count); 0 is a dense model of intermediate_size; with
experts, num_experts_per_tok (and moe_intermediate_size, shared_expert_intermediate_size for
the Qwen families) must be given, top-k at most the experts, and at least one block must be
a mixture. Hugging Face's MoE models are dropless (no capacity factor); the router's
auxiliary loss and noise (router_aux_loss_coef, output_router_logits, router_jitter_noise,
norm_topk_prob) change no cost and are not read.
The other families refuse num_local_experts, num_experts or n_routed_experts > 0.

Attention is fused (flash attention) by default, as Hugging Face transformers runs these
families: its attn_implementation defaults to "sdpa", PyTorch's scaled_dot_product_attention,
which dispatches to a fused flash or memory-efficient kernel on A100/H100-class GPUs in 16-bit
(transformers' modeling_utils, PyTorch's SDPA backends); ``hf:PATH:flash=false`` prices the
unfused kernels ("eager"). Hugging Face's BertForPreTraining runs its LM head on every
position (the loss ignores the unmasked ones), the default here; ``hf:PATH:predictions=20``
prices a head on 20 positions per sequence, as BERT's reference code runs it.

Every key read is type-checked (counts are integers in [1, MAX_COUNT], never true/false, 2.0 or
"2"; flags real booleans; dropouts numbers in [0, 1); model_type a known name; mlp_only_layers
a list of block indices in [0, layers)), also an alias that a first key hides. A bad file
raises `InputError` naming ``hf_config.<key>`` (or the file). Keys not read (rope_scaling,
torch_dtype, text_config, ...) are not checked: they do not change the cost.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dnnscale.errors import MAX_COUNT, InputError, short_repr
from dnnscale.workload.transformer import DEFAULT_SAMPLES_PER_EPOCH, transformer_workload
from dnnscale.workload.transformer_shape import check_rope_theta
from dnnscale.workload.transformer_zoo import parse_options
from dnnscale.workload.workload import Workload

_LLAMA = {"norm": "rmsnorm", "gated": True, "positional": "rope", "tied_embeddings": False,
          "bias": False, "causal": True, "norm_position": "pre"}
FAMILIES: dict[str, dict[str, object]] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "gpt2": {"norm": "layernorm", "gated": False, "positional": "learned",
             "tied_embeddings": True, "bias": True, "causal": True, "norm_position": "pre"},
    "gpt_neox": {"norm": "layernorm", "gated": False, "positional": "rope",
                 "tied_embeddings": False, "bias": True, "causal": True, "norm_position": "pre"},
    "bert": {"norm": "layernorm", "gated": False, "positional": "learned",
             "tied_embeddings": True, "bias": True, "causal": False, "norm_position": "post"},
    "mixtral": _LLAMA,
    "qwen2_moe": _LLAMA,
    "qwen3_moe": _LLAMA,
    "deepseek_v2": _LLAMA,
    "deepseek_v3": _LLAMA,
}
ATTENTION_DROPOUT_KEYS = ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob")
HIDDEN_DROPOUT_KEYS = ("hidden_dropout", "resid_pdrop", "embd_pdrop", "hidden_dropout_prob")
"""The configs' names of the attention probabilities' dropout (Llama/Mistral/Falcon/OPT,
GPT-2, BERT) and of the hidden dropouts (Falcon/BLOOM, GPT-2's residual and embedding, BERT)."""
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
EXPERTS_KEY = {"mixtral": "num_local_experts", "qwen2_moe": "num_experts",
               "qwen3_moe": "num_experts", "deepseek_v2": "n_routed_experts",
               "deepseek_v3": "n_routed_experts"}
"""The mixture-of-experts families and the key giving their routed experts per block."""
_ATTENTION_BIAS = ("llama", "mistral", "qwen3_moe", "deepseek_v2", "deepseek_v3")
"""Families whose config has attention_bias (llama and mistral also mlp_bias)."""
_MLA = ("deepseek_v2", "deepseek_v3")
"""Multi-head latent attention: head_dim there is the RoPE part of a head (qk_rope_head_dim),
not hidden / heads, and is not read."""


def _field(key: str) -> str:
    return f"hf_config.{key}"


def _count(key: str, value: object, minimum: int = 1) -> int:
    """hf_config.<key>: an integer in [minimum, MAX_COUNT] (true/false, 2.0, "2", a list or a
    mapping are not)."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_COUNT:
        raise InputError(_field(key), f"must be an integer in [{minimum}, {MAX_COUNT:,}], got "
                         f"{short_repr(value)}")
    return value


def _integer(config: dict[str, Any], keys: tuple[str, ...], default: int | None = None) -> int:
    """The first of `keys` present (a positive integer), else `default`; every one present is
    checked (an alias the first hides is still part of the file); errors name it. null counts
    as absent (Hugging Face writes n_inner: null for 'the default')."""
    found = [_count(key, config[key]) for key in keys if config.get(key) is not None]
    if found:
        return found[0]
    if default is None:
        raise InputError(_field(keys[0]), "missing" + (f" (nor {', '.join(keys[1:])})"
                                                       if keys[1:] else ""))
    return default


def _flag(config: dict[str, Any], key: str, default: bool) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise InputError(_field(key), f"must be true or false, got {short_repr(value)}")
    return value


def _probability(config: dict[str, Any], key: str) -> float:
    """A dropout probability in [0, 1) (absent: 0); errors name the key."""
    value = config.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise InputError(_field(key), f"must be a probability in [0, 1), got {short_repr(value)}")
    return float(value)


def _rope_theta(config: dict[str, Any]) -> float | None:
    """RoPE's base: the first of rope_theta, rotary_emb_base present, else None (the shape's
    default, 10,000); errors name the key."""
    found = [check_rope_theta(config[key], _field(key))
             for key in ("rope_theta", "rotary_emb_base") if config.get(key) is not None]
    return found[0] if found else None


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """The JSON object of a config file; errors name the file."""
    from dnnscale.safe_yaml import read_limited

    path = Path(path)
    text = read_limited(path, "--hf-config")  # a regular UTF-8 file within the size limit

    def refuse(constant: str) -> None:
        raise InputError("--hf-config", f"{path.name} holds {constant}, which is not JSON")

    try:
        config = json.loads(text, parse_constant=refuse)
    except json.JSONDecodeError as exc:
        raise InputError("--hf-config", f"{path.name} is not JSON: {exc.msg} at line "
                         f"{exc.lineno}") from None
    except RecursionError:
        raise InputError("--hf-config", f"{path.name} nests too deeply") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise InputError("--hf-config", f"{path.name}: {' '.join(str(exc).split())[:120]}") \
            from None
    if not isinstance(config, dict):
        raise InputError("--hf-config", f"{path.name} must hold a JSON object, got "
                         f"{type(config).__name__}")
    return config


def workload_from_hf_config(config: dict[str, Any], name: str, seq: int | None = None,
                            flash_attention: bool = True,
                            samples_per_epoch: int = DEFAULT_SAMPLES_PER_EPOCH,
                            predictions: int = 0) -> Workload:
    """A transformer workload from a parsed ``config.json`` (see the module docstring);
    `predictions` > 0 runs the LM head on that many positions per sequence (TransformerShape)."""
    model_type = config.get("model_type")
    if model_type is None:
        raise InputError(_field("model_type"), f"missing (known: {', '.join(FAMILIES)})")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise InputError(_field("model_type"), f"{short_repr(model_type)} is not supported (known: "
                         f"{', '.join(FAMILIES)})")
    if model_type not in EXPERTS_KEY:
        for key in _MOE_KEYS:
            if config.get(key) is not None and _count(key, config[key], minimum=0) > 0:
                raise InputError(_field(key), f"mixture-of-experts models are not supported "
                                 f"for model_type {model_type!r} (they are for "
                                 f"{', '.join(EXPERTS_KEY)})")
    family = dict(FAMILIES[model_type])
    hidden = _integer(config, ("hidden_size", "n_embd"))
    heads = _integer(config, ("num_attention_heads", "n_head"))
    if hidden % heads:
        raise InputError(_field("num_attention_heads"), f"{heads} heads do not divide the "
                         f"hidden size {hidden}")
    head_dim = None if model_type in _MLA else config.get("head_dim")
    if head_dim is not None and _count("head_dim", head_dim) != hidden // heads:
        raise InputError(_field("head_dim"), f"{head_dim!r} differs from hidden / heads = "
                         f"{hidden // heads}; only d = hidden / heads is supported")
    kv_heads = _integer(config, ("num_key_value_heads",), heads)
    if heads % kv_heads:
        raise InputError(_field("num_key_value_heads"), f"{kv_heads} do not divide {heads} "
                         f"attention heads")
    ffn = _integer(config, ("intermediate_size", "n_inner"), 4 * hidden)
    layers = _integer(config, ("num_hidden_layers", "n_layer"))
    vocab = _integer(config, ("vocab_size",))
    max_positions = _integer(config, ("max_position_embeddings", "n_positions", "n_ctx"))
    if seq is None:
        seq = max_positions
    elif isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise InputError("--seq", f"must be a positive integer, got {short_repr(seq)}")
    elif family["positional"] == "learned" and seq > max_positions:
        raise InputError("--seq", f"{seq} is longer than the learned position table "
                         f"({max_positions} rows, max_position_embeddings)")
    family["tied_embeddings"] = _flag(config, "tie_word_embeddings",
                                      bool(family["tied_embeddings"]))
    if model_type in ("llama", "mistral"):
        family["bias"] = _flag(config, "attention_bias", False) or _flag(config, "mlp_bias",
                                                                          False)
    elif model_type in _ATTENTION_BIAS:
        family["bias"] = _flag(config, "attention_bias", False)
    experts, experts_text = _experts(config, model_type, layers, ffn)
    # every key is checked (a list, not a short-circuiting generator), then each kind is on
    # when any of its probabilities is above 0
    attention_dropout, dropout = (any([_probability(config, key) > 0 for key in keys])
                                  for keys in (ATTENTION_DROPOUT_KEYS, HIDDEN_DROPOUT_KEYS))
    token_types = (_integer(config, ("type_vocab_size",), 2) if model_type == "bert" else 0)
    rope_theta = _rope_theta(config) if family["positional"] == "rope" else None
    positions = max_positions if family["positional"] == "learned" else 0
    return transformer_workload(
        name, layers, hidden, heads, seq, vocab, ffn=ffn, kv_heads=kv_heads,
        flash_attention=flash_attention, samples_per_epoch=samples_per_epoch,
        positions=positions, token_types=token_types, dropout=dropout,
        attention_dropout=attention_dropout,
        rope_theta=rope_theta, predictions=predictions,
        description=f"from Hugging Face config ({model_type}): {layers} layers x {hidden}, "
                    f"{heads} heads ({kv_heads} key/value), ffn {ffn}, vocab {vocab}, seq {seq}"
                    f"{experts_text}"
                    + (f"; MLA priced as multi-head attention of {heads} heads of "
                       f"{hidden // heads}" if model_type in _MLA else ""),
        **experts, **family)  # type: ignore[arg-type]


def _blocks_text(blocks: tuple[int, ...]) -> str:
    """Block indices for a description: ``0-2`` for a run, a list of up to 8, else a count."""
    if blocks == tuple(range(blocks[0], blocks[0] + len(blocks))):
        return f"{blocks[0]}-{blocks[-1]}" if len(blocks) > 1 else str(blocks[0])
    if len(blocks) <= 8:
        return ", ".join(map(str, blocks))
    return f"{blocks[0]}, {blocks[1]}, ..., {blocks[-1]} ({len(blocks)} blocks)"


def _block_list(config: dict[str, Any], key: str, layers: int) -> set[int]:
    """hf_config.<key>: a list of block indices in [0, layers) (null or absent: none)."""
    value = config.get(key)
    if value is None:
        return set()
    if not isinstance(value, list) or any(isinstance(i, bool) or not isinstance(i, int)
                                          or not 0 <= i < layers for i in value):
        raise InputError(_field(key), f"must be a list of block indices in [0, {layers}), got "
                         f"{short_repr(value)}")
    return set(value)


def _some_moe(key: str, value: object, moe_blocks: set[int], experts_key: str,
              layers: int) -> None:
    """Refuse a layout that leaves no block a mixture of experts, naming the key that did."""
    if not moe_blocks:
        raise InputError(_field(key), f"{short_repr(value)} leaves none of the {layers} blocks "
                         f"a mixture of experts: every block is dense (give {experts_key} 0 for "
                         f"a dense model)")


def _experts(config: dict[str, Any], model_type: str, layers: int, ffn: int
             ) -> tuple[dict[str, object], str]:
    """The mixture of experts of a config (`transformer_workload`'s keyword arguments) and its
    words for the description; ({}, "") for a dense model. See the module docstring."""
    key = EXPERTS_KEY.get(model_type)
    if key is None:
        return {}, ""
    if config.get(key) is None:  # Hugging Face would default to its own count (Mixtral 8)
        raise InputError(_field(key), f"missing: the routed experts per block of a "
                         f"{model_type} model (0 for a dense one)")
    experts = _count(key, config[key], minimum=0)
    if not experts:
        return {}, ""
    top_k = _integer(config, ("num_experts_per_tok",))
    if top_k > experts:
        raise InputError(_field("num_experts_per_tok"), f"{top_k} is more than the {experts} "
                         f"experts ({key})")
    expert_ffn, shared_ffn, moe_blocks = ffn, 0, set(range(layers))  # mixtral: every block
    if model_type in ("qwen2_moe", "qwen3_moe"):
        expert_ffn = _integer(config, ("moe_intermediate_size",))
        if model_type == "qwen2_moe":
            if config.get("shared_expert_intermediate_size") is None:
                raise InputError(_field("shared_expert_intermediate_size"), "missing (0: no "
                                 "shared expert)")
            shared_ffn = _count("shared_expert_intermediate_size",
                                config["shared_expert_intermediate_size"], minimum=0)
        step = _integer(config, ("decoder_sparse_step",), 1)
        only = _block_list(config, "mlp_only_layers", layers)
        moe_blocks = {i for i in range(layers) if (i + 1) % step == 0}
        _some_moe("decoder_sparse_step", step, moe_blocks, key, layers)
        moe_blocks -= only
        _some_moe("mlp_only_layers", sorted(only), moe_blocks, key, layers)
    elif model_type in _MLA:
        expert_ffn = _integer(config, ("moe_intermediate_size",))
        shared = config.get("n_shared_experts")
        shared_ffn = 0 if shared is None else \
            _count("n_shared_experts", shared, minimum=0) * expert_ffn
        first = config.get("first_k_dense_replace")
        first = 0 if first is None else _count("first_k_dense_replace", first, minimum=0)
        moe_blocks = set(range(first, layers))
        _some_moe("first_k_dense_replace", first, moe_blocks, key, layers)
        freq = _integer(config, ("moe_layer_freq",), 1)
        moe_blocks = {i for i in moe_blocks if i % freq == 0}
        _some_moe("moe_layer_freq", freq, moe_blocks, key, layers)
    blocks = tuple(i for i in range(layers) if i not in moe_blocks)
    text = (f"; {experts} experts of {expert_ffn}, top-{top_k}"
            + (f", shared {shared_ffn}" if shared_ffn else "") + ", dropless"
            + (f", dense blocks {_blocks_text(blocks)} (MLP {ffn})" if blocks else ""))
    moe: dict[str, object] = {"experts": experts, "top_k": top_k, "shared_ffn": shared_ffn,
                              "dense_blocks": blocks, "capacity_factor": None}
    if expert_ffn != ffn:
        moe["expert_ffn"] = expert_ffn
    return moe, text


def _name(path: Path) -> str:
    folder = path.resolve().parent.name
    return f"hf:{folder}" if path.name == "config.json" and folder else f"hf:{path.stem}"


def load_hf_config(path: str | Path, seq: int | None = None, flash_attention: bool = True,
                   samples_per_epoch: int = DEFAULT_SAMPLES_PER_EPOCH,
                   predictions: int = 0) -> Workload:
    """Read ``config.json`` at `path` as a workload named ``hf:<its folder>``."""
    path = Path(path)
    return workload_from_hf_config(read_hf_config(path), _name(path), seq=seq,
                                   flash_attention=flash_attention,
                                   samples_per_epoch=samples_per_epoch,
                                   predictions=predictions)


def load_hf_source(source: str) -> Workload:
    """``hf:PATH`` or ``hf:PATH:seq=N,flash=true,samples=M,predictions=K`` (the
    `load_workload` form)."""
    body = source.removeprefix("hf:")
    head, sep, tail = body.rpartition(":")
    options: dict[str, object] = {}
    if sep and "=" in tail and not Path(body).is_file():
        body = head
        options = parse_options(tail, "workload.hf", ("seq", "samples", "predictions"),
                                {"flash": "flash_attention"}, {})
    if not body:
        raise InputError("workload", "hf: needs the path of a config.json, e.g. "
                         "hf:models/llama/config.json")
    return load_hf_config(body, seq=options.get("seq"),  # type: ignore[arg-type]
                          flash_attention=bool(options.get("flash_attention", True)),
                          samples_per_epoch=options.get("samples",  # type: ignore[arg-type]
                                                        DEFAULT_SAMPLES_PER_EPOCH),
                          predictions=options.get("predictions", 0))  # type: ignore[arg-type]

"""Read a local Hugging Face ``config.json`` as a transformer workload (no network).

Keys read (the first one present wins): hidden_size | n_embd, num_attention_heads | n_head,
num_key_value_heads (default: the heads), intermediate_size | n_inner (default 4·hidden),
num_hidden_layers | n_layer, vocab_size, max_position_embeddings | n_positions | n_ctx (the
sequence length unless `seq` overrides it, and the rows of a learned position table),
tie_word_embeddings, head_dim (must be hidden / heads), the dropout probabilities, RoPE's
base rope_theta | rotary_emb_base (GPT-NeoX's name; absent: 10,000, Hugging Face's default),
and model_type, which gives the rest:

    llama, mistral   RMSNorm, SwiGLU, RoPE, no biases (unless attention_bias / mlp_bias), untied
    gpt2             LayerNorm, GeLU, learned positions, biases, tied
    gpt_neox         LayerNorm, GeLU, RoPE, biases, untied (tie_word_embeddings default)
    bert             post-norm LayerNorm, GeLU, learned positions + type_vocab_size token types,
                     biases, bidirectional, tied

Every key read is type-checked (counts are integers in [1, MAX_COUNT], never true/false, 2.0 or
"2"; flags real booleans; dropouts numbers in [0, 1); model_type a known name), also an alias
that a first key hides. A bad file raises `InputError` naming ``hf_config.<key>`` (or the
file). Keys not read (rope_scaling, torch_dtype, text_config, ...) are not checked: they do not
change the cost.
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
}
_DROPOUT_KEYS = ("attention_dropout", "hidden_dropout", "attn_pdrop", "resid_pdrop",
                 "embd_pdrop", "attention_probs_dropout_prob", "hidden_dropout_prob")
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


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
                            flash_attention: bool = False,
                            samples_per_epoch: int = DEFAULT_SAMPLES_PER_EPOCH) -> Workload:
    """A transformer workload from a parsed ``config.json`` (see the module docstring)."""
    model_type = config.get("model_type")
    if model_type is None:
        raise InputError(_field("model_type"), f"missing (known: {', '.join(FAMILIES)})")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise InputError(_field("model_type"), f"{short_repr(model_type)} is not supported (known: "
                         f"{', '.join(FAMILIES)})")
    for key in _MOE_KEYS:
        if config.get(key) is not None and _count(key, config[key], minimum=0) > 0:
            raise InputError(_field(key), "mixture-of-experts models are not supported")
    family = dict(FAMILIES[model_type])
    hidden = _integer(config, ("hidden_size", "n_embd"))
    heads = _integer(config, ("num_attention_heads", "n_head"))
    if hidden % heads:
        raise InputError(_field("num_attention_heads"), f"{heads} heads do not divide the "
                         f"hidden size {hidden}")
    head_dim = config.get("head_dim")
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
    dropouts = []
    for key in _DROPOUT_KEYS:
        value = config.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise InputError(_field(key), f"must be a probability in [0, 1), got {short_repr(value)}")
        dropouts.append(value)
    token_types = (_integer(config, ("type_vocab_size",), 2) if model_type == "bert" else 0)
    rope_theta = _rope_theta(config) if family["positional"] == "rope" else None
    positions = max_positions if family["positional"] == "learned" else 0
    return transformer_workload(
        name, layers, hidden, heads, seq, vocab, ffn=ffn, kv_heads=kv_heads,
        flash_attention=flash_attention, samples_per_epoch=samples_per_epoch,
        positions=positions, token_types=token_types, dropout=any(dropouts),
        rope_theta=rope_theta,
        description=f"from Hugging Face config ({model_type}): {layers} layers x {hidden}, "
                    f"{heads} heads ({kv_heads} key/value), ffn {ffn}, vocab {vocab}, seq {seq}",
        **family)  # type: ignore[arg-type]


def _name(path: Path) -> str:
    folder = path.resolve().parent.name
    return f"hf:{folder}" if path.name == "config.json" and folder else f"hf:{path.stem}"


def load_hf_config(path: str | Path, seq: int | None = None, flash_attention: bool = False,
                   samples_per_epoch: int = DEFAULT_SAMPLES_PER_EPOCH) -> Workload:
    """Read ``config.json`` at `path` as a workload named ``hf:<its folder>``."""
    path = Path(path)
    return workload_from_hf_config(read_hf_config(path), _name(path), seq=seq,
                                   flash_attention=flash_attention,
                                   samples_per_epoch=samples_per_epoch)


def load_hf_source(source: str) -> Workload:
    """``hf:PATH`` or ``hf:PATH:seq=N,flash=true,samples=M`` (the `load_workload` form)."""
    body = source.removeprefix("hf:")
    head, sep, tail = body.rpartition(":")
    options: dict[str, object] = {}
    if sep and "=" in tail and not Path(body).is_file():
        body = head
        options = parse_options(tail, "workload.hf", ("seq", "samples"),
                                {"flash": "flash_attention"}, {})
    if not body:
        raise InputError("workload", "hf: needs the path of a config.json, e.g. "
                         "hf:models/llama/config.json")
    return load_hf_config(body, seq=options.get("seq"),  # type: ignore[arg-type]
                          flash_attention=bool(options.get("flash_attention", False)),
                          samples_per_epoch=options.get("samples",  # type: ignore[arg-type]
                                                        DEFAULT_SAMPLES_PER_EPOCH))

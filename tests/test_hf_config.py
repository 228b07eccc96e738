"""Hugging Face config.json import: published configs, --seq, bad files, the CLI and hf: names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dnnscale.cli import app
from dnnscale.errors import InputError
from dnnscale.workload import load_workload, zoo_workload
from dnnscale.workload.hf_config import load_hf_config

# Keys as published in the models' config.json files (the ones we read, plus a few we ignore).
LLAMA2_7B = {"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
             "intermediate_size": 11008, "max_position_embeddings": 4096,
             "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
             "num_key_value_heads": 32, "rms_norm_eps": 1e-05, "rope_scaling": None,
             "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": 32000}
LLAMA3_8B = {**LLAMA2_7B, "intermediate_size": 14336, "max_position_embeddings": 8192,
             "num_key_value_heads": 8, "rope_theta": 500000.0, "vocab_size": 128256,
             "attention_bias": False, "attention_dropout": 0.0, "torch_dtype": "bfloat16"}
GPT2 = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1, "embd_pdrop": 0.1, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
        "n_head": 12, "n_inner": None, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1,
        "vocab_size": 50257}
BERT_LARGE = {"architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1,
              "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 1024,
              "intermediate_size": 4096, "max_position_embeddings": 512, "model_type": "bert",
              "num_attention_heads": 16, "num_hidden_layers": 24, "type_vocab_size": 2,
              "vocab_size": 30522}
PYTHIA_160M = {"architectures": ["GPTNeoXForCausalLM"], "hidden_act": "gelu",
               "hidden_size": 768, "intermediate_size": 3072, "max_position_embeddings": 2048,
               "model_type": "gpt_neox", "num_attention_heads": 12, "num_hidden_layers": 12,
               "rotary_pct": 0.25, "tie_word_embeddings": False, "vocab_size": 50304}


def _write(tmp_path: Path, config: object, folder: str = "model") -> Path:
    path = tmp_path / folder / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    return path


def test_llama2_7b_config_equals_the_zoo_entry(tmp_path: Path) -> None:
    w = load_hf_config(_write(tmp_path, LLAMA2_7B, "Llama-2-7b-hf"))
    zoo = zoo_workload("llama2-7b")
    assert w.name == "hf:Llama-2-7b-hf"
    assert w.layers == zoo.layers and w.transformer == zoo.transformer
    assert w.params == 6_738_415_616


def test_llama3_8b_config_has_grouped_query_attention(tmp_path: Path) -> None:
    w = load_hf_config(_write(tmp_path, LLAMA3_8B))
    assert w.transformer == zoo_workload("llama3-8b").transformer
    assert w.params == 8_030_261_248
    qkv = next(l for l in w.layers if l.kind == "attn_qkv")
    assert qkv.output_shape == (8192, 4096 + 2 * 8 * 128)


def test_gpt2_config(tmp_path: Path) -> None:
    """GPT-2 small: 12·(12h² + 13h) + (50257 + 1024)·h + 2h = 124,439,808 with h = 768 (the
    count of Hugging Face's GPT2LMHeadModel, head tied); n_inner null means 4h; dropout 0.1."""
    w = load_hf_config(_write(tmp_path, GPT2))
    t = w.transformer
    assert (t.norm, t.gated, t.positional, t.tied_embeddings, t.ffn, t.seq, t.positions) == \
        ("layernorm", False, "learned", True, 3072, 1024, 1024)
    assert t.dropout and t.bias and t.causal
    assert w.params == 124_439_808


@pytest.mark.parametrize(("change", "hidden", "attention"), [
    ({}, True, True),                                          # GPT-2: 0.1 everywhere
    ({"attn_pdrop": 0.0}, True, False),                        # the attention's alone off
    ({"resid_pdrop": 0.0, "embd_pdrop": 0.0}, False, True),    # the hidden ones off
    ({"attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}, False, False),
])
def test_attention_and_hidden_dropouts_are_read_apart(tmp_path: Path, change: dict,
                                                      hidden: bool, attention: bool) -> None:
    """attn_pdrop drops the attention probabilities, resid_pdrop and embd_pdrop the hidden
    states (GPT-2's names); a probability 0 runs no dropout; the unfused softmax prices its
    dropout only when the attention's is on."""
    w = load_hf_config(_write(tmp_path, {**GPT2, **change}), flash_attention=False)
    assert (w.transformer.dropout, w.transformer.attention_dropout) == (hidden, attention)
    softmax = next(l for l in w.layers if l.kind == "attn_softmax")
    residual = next(l for l in w.layers if l.kind == "residual_add")
    assert (residual.hyper["dropout"], softmax.hyper["dropout"]) == (hidden, attention)


def test_llama_attention_dropout_zero_and_bert_both(tmp_path: Path) -> None:
    """Llama 3's attention_dropout 0.0 and no hidden key: no dropout at all (the zoo's entry);
    BERT's attention_probs_dropout_prob and hidden_dropout_prob 0.1: both on."""
    llama = load_hf_config(_write(tmp_path, LLAMA3_8B)).transformer
    assert (llama.dropout, llama.attention_dropout) == (False, False)
    bert = load_hf_config(_write(tmp_path, BERT_LARGE, "bert")).transformer
    assert (bert.dropout, bert.attention_dropout) == (True, True)


def test_bert_config(tmp_path: Path) -> None:
    """bert-large-uncased: the encoder's 334,092,288 parameters (HF's BertModel, 335,141,888,
    adds the 1,049,600-parameter pooler)."""
    w = load_hf_config(_write(tmp_path, BERT_LARGE))
    t = w.transformer
    assert (t.norm_position, t.causal, t.token_types, t.positional) == ("post", False, 2,
                                                                        "learned")
    assert w.params == 334_092_288 == 335_141_888 - 1_049_600


def test_gpt_neox_config(tmp_path: Path) -> None:
    """Pythia-160M: untied, RoPE: 12·(12h² + 13h) + 2·50304·h + 2h = 162,322,944, h = 768."""
    w = load_hf_config(_write(tmp_path, PYTHIA_160M))
    assert w.transformer.positional == "rope" and not w.transformer.tied_embeddings
    assert w.params == 162_322_944
    assert not w.transformer.dropout  # no dropout keys: probability 0


def test_seq_override(tmp_path: Path) -> None:
    """--seq changes the tokens per sample, not the parameters (RoPE has no table)."""
    path = _write(tmp_path, LLAMA2_7B)
    short = load_hf_config(path, seq=1024)
    assert short.transformer.seq == 1024 and short.input_shape == (1024,)
    assert short.params == 6_738_415_616
    with pytest.raises(InputError, match="--seq"):  # longer than GPT-2's position table
        load_hf_config(_write(tmp_path, GPT2, "gpt2"), seq=2048)


@pytest.mark.parametrize(("change", "field"), [
    ({"hidden_size": None}, "hf_config.hidden_size"),
    ({"num_attention_heads": "32"}, "hf_config.num_attention_heads"),
    ({"num_attention_heads": 30}, "hf_config.num_attention_heads"),
    ({"num_key_value_heads": 5}, "hf_config.num_key_value_heads"),
    ({"model_type": "t5"}, "hf_config.model_type"),
    ({"model_type": None}, "hf_config.model_type"),
    ({"vocab_size": 0}, "hf_config.vocab_size"),
    ({"tie_word_embeddings": "no"}, "hf_config.tie_word_embeddings"),
    ({"head_dim": 64}, "hf_config.head_dim"),
    ({"num_local_experts": 8}, "hf_config.num_local_experts"),
    ({"attention_dropout": 1.5}, "hf_config.attention_dropout"),
    ({"hidden_dropout": -0.1}, "hf_config.hidden_dropout"),
    ({"max_position_embeddings": None}, "hf_config.max_position_embeddings"),
])
def test_bad_keys_are_named(tmp_path: Path, change: dict, field: str) -> None:
    config = {k: v for k, v in {**LLAMA2_7B, **change}.items() if v is not None}
    with pytest.raises(InputError) as info:
        load_hf_config(_write(tmp_path, config))
    assert info.value.field == field


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        load_hf_config(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"model_type": "llama",')
    with pytest.raises(InputError, match="not JSON"):
        load_hf_config(broken)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(InputError, match="JSON object"):
        load_hf_config(listed)


def test_load_workload_hf_names(tmp_path: Path) -> None:
    path = _write(tmp_path, LLAMA2_7B)
    w = load_workload(f"hf:{path}")
    assert w.transformer.seq == 4096
    w = load_workload(f"hf:{path}:seq=512,flash=true,samples=10")
    assert (w.transformer.seq, w.transformer.flash_attention, w.samples_per_epoch) == \
        (512, True, 10)
    with pytest.raises(InputError, match="workload.hf.colour"):
        load_workload(f"hf:{path}:colour=red")
    with pytest.raises(InputError, match="--hf-config"):
        load_workload(f"hf:{tmp_path / 'nothing.json'}")


def test_cli_describe_hf_config(tmp_path: Path) -> None:
    path = _write(tmp_path, LLAMA3_8B)
    runner = CliRunner()
    result = runner.invoke(app, ["describe", "--hf-config", str(path), "--seq", "2048",
                                 "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["totals"]["params"] == 8_030_261_248
    assert data["layers"][0]["kind"] == "embedding"
    assert data["layers"][0]["output_shape"] == [2048, 4096]


@pytest.mark.parametrize(("args", "named"), [
    (["--hf-config", "missing.json"], "--hf-config"),
    (["--seq", "128", "gpt3-125m"], "--seq"),
    (["gpt3-125m", "--hf-config", "x.json"], "--hf-config"),
])
def test_cli_describe_hf_config_errors_exit_2(tmp_path: Path, args: list, named: str) -> None:
    result = CliRunner().invoke(app, ["describe", *args])
    assert result.exit_code == 2
    assert named in result.output
    bad = _write(tmp_path, {**LLAMA2_7B, "hidden_size": -1})
    result = CliRunner().invoke(app, ["describe", "--hf-config", str(bad)])
    assert result.exit_code == 2 and "hf_config.hidden_size" in result.output


def test_rope_base_is_read(tmp_path: Path) -> None:
    """rope_theta (Llama) or rotary_emb_base (GPT-NeoX) is RoPE's base; absent: 10,000."""
    llama3 = load_hf_config(_write(tmp_path, LLAMA3_8B, "llama3")).transformer
    assert (llama3.rope_theta, llama3.rotary_base) == (500000.0, 500000.0)
    llama2 = load_hf_config(_write(tmp_path, LLAMA2_7B, "llama2")).transformer
    assert (llama2.rope_theta, llama2.rotary_base) == (None, 10000.0)
    neox = load_hf_config(_write(tmp_path, {**PYTHIA_160M, "rotary_emb_base": 10000},
                                 "neox")).transformer
    assert neox.rope_theta == 10000.0
    gpt2 = load_hf_config(_write(tmp_path, {**GPT2, "rope_theta": 5.0}, "gpt2")).transformer
    assert gpt2.rope_theta is None                      # learned positions: not read


@pytest.mark.parametrize("value", ["500000", True, 1.0, 0, 1e13, [10000]])
def test_bad_rope_base_is_named(tmp_path: Path, value: object) -> None:
    with pytest.raises(InputError) as info:
        load_hf_config(_write(tmp_path, {**LLAMA3_8B, "rope_theta": value}))
    assert info.value.field == "hf_config.rope_theta"


def test_bert_config_with_its_head_on_the_masked_positions(tmp_path: Path) -> None:
    """hf:PATH:predictions=K runs the LM head on K positions per sequence (BERT's reference
    pretraining); Hugging Face's own BertForPreTraining runs it on all, the default."""
    path = _write(tmp_path, BERT_LARGE)
    every = load_workload(f"hf:{path}")
    masked = load_workload(f"hf:{path}:seq=128,predictions=20")
    assert every.transformer.predictions == 0 and every.layers[-2].kind == "logits"
    assert masked.transformer.predictions == 20 and masked.layers[-3].kind == "lm_positions"
    assert masked.layers[-2].fwd_flops == 2 * 20 * 1024 * 30522
    assert masked.params == every.params
    with pytest.raises(InputError) as raised:
        load_workload(f"hf:{path}:seq=128,predictions=129")
    assert raised.value.field == "transformer.predictions"

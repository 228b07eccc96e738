"""Mixture-of-experts Hugging Face configs (mixtral, qwen2_moe, qwen3_moe, deepseek_v2/v3) read
as workloads: parameters by hand, the dense blocks each family's keys give, bad keys named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dnnscale.errors import InputError
from dnnscale.workload import load_workload
from dnnscale.workload.hf_config import load_hf_config, workload_from_hf_config

# mistralai/Mixtral-8x7B-v0.1's config.json (the keys read, and a few that are not).
MIXTRAL_8X7B = {"architectures": ["MixtralForCausalLM"], "hidden_act": "silu",
                "hidden_size": 4096, "intermediate_size": 14336,
                "max_position_embeddings": 32768, "model_type": "mixtral",
                "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
                "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
                "rms_norm_eps": 1e-05, "rope_theta": 1e6, "router_aux_loss_coef": 0.02,
                "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 32000}
# deepseek-ai/DeepSeek-V3's config.json (MLA, MTP and routing keys are not read).
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
               "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
               "num_key_value_heads": 128, "intermediate_size": 18432,
               "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
               "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
               "vocab_size": 129280, "max_position_embeddings": 163840, "q_lora_rank": 1536,
               "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
               "v_head_dim": 128, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
               "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
               "num_nextn_predict_layers": 1, "rope_theta": 10000,
               "tie_word_embeddings": False, "attention_bias": False}
# Qwen/Qwen1.5-MoE-A2.7B's config.json, with decoder_sparse_step 2 and mlp_only_layers [0].
QWEN2_MOE = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
             "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
             "num_key_value_heads": 16, "intermediate_size": 5632,
             "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
             "num_experts": 60, "num_experts_per_tok": 4, "decoder_sparse_step": 2,
             "mlp_only_layers": [0], "norm_topk_prob": False, "vocab_size": 151936,
             "max_position_embeddings": 8192, "rope_theta": 1e6,
             "tie_word_embeddings": False}
# Qwen/Qwen3-30B-A3B's config.json: head_dim 128 but hidden / heads = 2048 / 32 = 64.
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                 "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
                 "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
                 "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
                 "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
                 "max_position_embeddings": 40960, "rope_theta": 1e6,
                 "tie_word_embeddings": False, "attention_bias": False}


def _params(workload) -> int:  # noqa: ANN001
    return sum(layer.params for layer in workload.layers)


def _write(tmp_path: Path, config: object, folder: str = "model") -> Path:
    path = tmp_path / folder / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    return path


def test_mixtral_8x7b_params_by_hand() -> None:
    w = workload_from_hf_config(MIXTRAL_8X7B, "hf:mixtral", seq=4096)
    t = w.transformer
    assert (t.experts, t.top_k, t.routed_ffn, t.shared_ffn, t.dense_blocks) == \
        (8, 2, 14336, 0, ())
    assert t.capacity_factor is None and t.moe_blocks == 32
    assert (t.norm, t.gated, t.positional, t.bias, t.tied_embeddings) == \
        ("rmsnorm", True, "rope", False, False)
    h, kv, f, e, v = 4096, 8 * 128, 14336, 8, 32000
    embeddings = 2 * v * h                       # untied: embedding and logits
    attention = h * (h + 2 * kv) + h * h         # q, k, v (grouped-query) and the output
    router = h * e
    experts = e * 3 * h * f                      # SwiGLU: gate, up and down per expert
    norms = 2 * h                                # two RMSNorms per block
    total = embeddings + 32 * (attention + router + experts + norms) + h  # + the final norm
    assert total == 46_702_792_704               # Mistral AI's published 46.7B
    assert _params(w) == total == load_workload("mixtral-8x7b").params
    assert "8 experts of 14336, top-2" in w.description


def test_deepseek_v3_layout_and_params_by_hand() -> None:
    w = workload_from_hf_config(DEEPSEEK_V3, "hf:deepseek-v3", seq=4096)
    t = w.transformer
    assert t.dense_blocks == (0, 1, 2) and t.moe_blocks == 58
    assert (t.experts, t.top_k, t.routed_ffn, t.shared_ffn, t.ffn) == (256, 8, 2048, 2048, 18432)
    assert t.head_dim == 56 and t.kv_heads == 128 and not t.bias  # MLA priced as MHA
    h, f_dense, f_e, e, v = 7168, 18432, 2048, 256, 129280
    attention = 4 * h * h                        # multi-head attention, no biases
    norms = 2 * h
    dense_block = attention + norms + 3 * h * f_dense
    moe_block = attention + norms + h * e + e * 3 * h * f_e + 3 * h * f_e  # router, routed, shared
    # untied embedding and logits, the final norm; 672.1 B (published 671 B, MLA's attention)
    total = 3 * dense_block + 58 * moe_block + 2 * v * h + h
    assert total == 672_149_632_000
    assert _params(w) == total == load_workload("deepseek-v3-like").params
    assert "MLA priced as multi-head attention" in w.description
    assert "dense blocks 0-2" in w.description


def test_deepseek_needs_no_mla_keys_and_v2_layout() -> None:
    """kv_lora_rank, q_lora_rank, qk_*_head_dim, v_head_dim are not read (absent: fine); v2's
    n_shared_experts null means none; moe_layer_freq 2 makes the odd blocks dense."""
    mla = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
    bare = {k: v for k, v in DEEPSEEK_V3.items() if k not in mla}
    assert _params(workload_from_hf_config(bare, "x", seq=4096)) == 672_149_632_000
    v2 = {**bare, "model_type": "deepseek_v2", "num_hidden_layers": 8, "first_k_dense_replace": 1,
          "moe_layer_freq": 2, "n_shared_experts": None, "head_dim": 192}
    t = workload_from_hf_config(v2, "x", seq=4096).transformer
    assert t.dense_blocks == (0, 1, 3, 5, 7) and t.shared_ffn == 0


def test_qwen2_moe_sparse_step_and_mlp_only_layers() -> None:
    """Block i is MoE when (i + 1) % 2 == 0 and i is not in [0]: blocks 1, 3, ..., 23; the
    others (0, 2, ..., 22) are dense MLPs of intermediate_size."""
    w = workload_from_hf_config(QWEN2_MOE, "hf:qwen", seq=4096)
    t = w.transformer
    assert t.dense_blocks == tuple(range(0, 24, 2)) and t.moe_blocks == 12
    assert (t.experts, t.top_k, t.routed_ffn, t.shared_ffn, t.ffn, t.bias) == \
        (60, 4, 1408, 5632, 5632, False)
    every = workload_from_hf_config({**QWEN2_MOE, "decoder_sparse_step": 1,
                                     "mlp_only_layers": [0, 5, 5]}, "x", seq=4096).transformer
    assert every.dense_blocks == (0, 5)
    h, v = 2048, 151936                          # Qwen1.5-MoE-A2.7B as published: every block MoE
    block = 4 * h * h + 2 * h + h * 60 + 60 * 3 * h * 1408 + 3 * h * 5632  # q/k/v biases ignored
    published = workload_from_hf_config({**QWEN2_MOE, "decoder_sparse_step": 1,
                                         "mlp_only_layers": []}, "x", seq=4096)
    assert _params(published) == 24 * block + 2 * v * h + h == 14_315_587_584  # published 14.3B


def test_qwen3_moe_head_dim_is_refused_and_dense_configs_are_dense() -> None:
    with pytest.raises(InputError) as info:
        workload_from_hf_config(QWEN3_30B_A3B, "x", seq=4096)
    assert info.value.field == "hf_config.head_dim" and "\n" not in str(info.value)
    fitting = {**QWEN3_30B_A3B, "head_dim": 64}
    t = workload_from_hf_config(fitting, "x", seq=4096).transformer
    assert (t.experts, t.top_k, t.routed_ffn, t.shared_ffn, t.dense_blocks) == (128, 8, 768, 0, ())
    for config in ({**fitting, "num_experts": 0}, {**MIXTRAL_8X7B, "num_local_experts": 0},
                   {**DEEPSEEK_V3, "n_routed_experts": 0}):
        dense = workload_from_hf_config(config, "x", seq=4096).transformer
        assert dense.experts == 0 and dense.dense_blocks == ()
    # absent: refused (Hugging Face would take its own default count, not a dense model)
    with pytest.raises(InputError) as info:
        workload_from_hf_config({k: v for k, v in DEEPSEEK_V3.items()
                                 if k != "n_routed_experts"}, "x", seq=4096)
    assert info.value.field == "hf_config.n_routed_experts" and "missing" in info.value.problem


def test_other_families_still_refuse_experts() -> None:
    llama = {**MIXTRAL_8X7B, "model_type": "llama"}
    with pytest.raises(InputError) as info:
        workload_from_hf_config(llama, "x", seq=4096)
    assert info.value.field == "hf_config.num_local_experts"
    with pytest.raises(InputError) as info:
        workload_from_hf_config({**MIXTRAL_8X7B, "model_type": "llama4"}, "x")
    assert info.value.field == "hf_config.model_type"


@pytest.mark.parametrize(("base", "change", "field"), [
    (MIXTRAL_8X7B, {"num_experts_per_tok": 0}, "num_experts_per_tok"),
    (MIXTRAL_8X7B, {"num_experts_per_tok": 9}, "num_experts_per_tok"),
    (MIXTRAL_8X7B, {"num_experts_per_tok": "2"}, "num_experts_per_tok"),
    (MIXTRAL_8X7B, {"num_experts_per_tok": True}, "num_experts_per_tok"),
    (MIXTRAL_8X7B, {"num_experts_per_tok": None}, "num_experts_per_tok"),
    (MIXTRAL_8X7B, {"num_local_experts": -1}, "num_local_experts"),
    (MIXTRAL_8X7B, {"num_local_experts": 8.0}, "num_local_experts"),
    (QWEN2_MOE, {"mlp_only_layers": [99]}, "mlp_only_layers"),
    (QWEN2_MOE, {"mlp_only_layers": "0"}, "mlp_only_layers"),
    (QWEN2_MOE, {"mlp_only_layers": [True]}, "mlp_only_layers"),
    (QWEN2_MOE, {"mlp_only_layers": list(range(1, 24, 2))}, "mlp_only_layers"),
    (QWEN2_MOE, {"decoder_sparse_step": 0}, "decoder_sparse_step"),
    (QWEN2_MOE, {"decoder_sparse_step": 25}, "decoder_sparse_step"),
    (QWEN2_MOE, {"moe_intermediate_size": None}, "moe_intermediate_size"),
    (QWEN2_MOE, {"shared_expert_intermediate_size": "5632"}, "shared_expert_intermediate_size"),
    (QWEN2_MOE, {"num_experts": "60"}, "num_experts"),
    (DEEPSEEK_V3, {"first_k_dense_replace": 61}, "first_k_dense_replace"),
    (DEEPSEEK_V3, {"first_k_dense_replace": -1}, "first_k_dense_replace"),
    (DEEPSEEK_V3, {"moe_layer_freq": 0}, "moe_layer_freq"),
    (DEEPSEEK_V3, {"n_shared_experts": 1.5}, "n_shared_experts"),
    (DEEPSEEK_V3, {"n_routed_experts": True}, "n_routed_experts"),
])
def test_bad_moe_keys_are_named(base: dict, change: dict, field: str) -> None:
    config = {k: v for k, v in {**base, **change}.items() if v is not None}
    with pytest.raises(InputError) as info:
        workload_from_hf_config(config, "x", seq=4096)
    assert info.value.field == f"hf_config.{field}"
    assert "\n" not in str(info.value)
    if change.get("first_k_dense_replace") == 61 or change.get("decoder_sparse_step") == 25:
        assert "every block is dense" in info.value.problem


def test_hf_source_with_seq(tmp_path: Path) -> None:
    path = _write(tmp_path, MIXTRAL_8X7B, "Mixtral-8x7B-v0.1")
    w = load_workload(f"hf:{path}:seq=4096")
    assert w.name == "hf:Mixtral-8x7B-v0.1" and w.transformer.seq == 4096
    assert load_hf_config(path).transformer.seq == 32768


# ------------------------------------------------------------------ the command line

def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dnnscale", *args], capture_output=True,
                          text=True, timeout=120)


def _predict(path: Path) -> subprocess.CompletedProcess[str]:
    return _cli("predict", "-w", f"hf:{path}:seq=4096", "-c", "dgx-h100:8", "--tp", "1",
                "--ep", "8", "--pp", "1", "--dp", "8", "--micro-batch", "1", "--json")


def test_cli_predicts_a_mixtral_config_with_expert_parallelism(tmp_path: Path) -> None:
    done = _predict(_write(tmp_path, MIXTRAL_8X7B))
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["mesh"]["sizes"] == {"pp": 1, "dp": 8, "ep": 8, "cp": 1, "tp": 1}
    assert data["mesh"]["devices"] == 64
    assert data["plan"]["expert"]["degree"] == 8
    assert data["breakdown_s"]["ep_comm"] > 0
    assert data["mesh"]["collectives_s"]["ep"] == data["breakdown_s"]["ep_comm"]


def test_cli_bad_moe_config_exits_2_with_one_line(tmp_path: Path) -> None:
    done = _predict(_write(tmp_path, {**MIXTRAL_8X7B, "num_experts_per_tok": 9}))
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "hf_config.num_experts_per_tok" in lines[0]
    assert "Traceback" not in done.stderr

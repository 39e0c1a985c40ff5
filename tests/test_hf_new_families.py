"""The Hugging Face families of issue 41's new layers (madsl/interop/huggingface/): Nemotron-H's latent
mixture of experts (moe_latent_size), Qwen3-Next, Qwen3.5's language models and RecurrentGemma convert
exactly, back, and refuse what they cannot state by name.

Every count here is that of transformers' own model built from the same config (transformers 5.24,
torch 2.13, `AutoModelForCausalLM.from_config` on the meta device, in a separate environment: this
suite does not need transformers)."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

import madsl
from madsl.cli import main
from madsl.hf_config import read_hf_config, to_hf_config
from madsl.spec import spec_from_data

PUBLIC = Path(__file__).resolve().parent.parent / "specs/public"


def _params(data: dict) -> int:
    return madsl.account(spec_from_data(data)).totals["params"]


def _same_stack(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "description"} == {k: v for k, v in b.items() if k != "description"}


def convert(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["convert", *args])
    return rc, out.getvalue(), err.getvalue()


# ---- the configs (the fields that size them) and transformers' counts -----------------------------------

NANO = json.loads((PUBLIC / "nemotron-3-nano-30b-a3b.config.json").read_text())
NEMOTRON_SMALL_LATENT = {
    "model_type": "nemotron_h",
    "hidden_size": 256,
    "hybrid_override_pattern": "ME*EM-",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,
    "mamba_num_heads": 8,
    "mamba_head_dim": 32,
    "n_groups": 2,
    "ssm_state_size": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 96,
    "moe_shared_expert_intermediate_size": 192,
    "moe_latent_size": 64,
    "vocab_size": 1000,
    "num_hidden_layers": 6,
}
# Qwen/Qwen3-Next-80B-A3B-Instruct's config.json: 80B total on its card
QWEN3_NEXT_80B = json.loads((PUBLIC / "qwen3-next-80b-a3b.config.json").read_text())
QWEN_SMALL = {
    "model_type": "qwen3_next",
    "hidden_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 256,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 3,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 48,
    "shared_expert_intermediate_size": 64,
    "vocab_size": 1000,
    "full_attention_interval": 3,
    "mlp_only_layers": [0],
}
_NO_PLACEMENT = {k: v for k, v in QWEN_SMALL.items() if k not in ("full_attention_interval", "mlp_only_layers")}
QWEN_TYPED = {
    **_NO_PLACEMENT,
    "layer_types": ["full_attention", "linear_attention", "linear_attention"] * 2,
    "decoder_sparse_step": 2,
    "linear_num_value_heads": 2,
    "linear_value_head_dim": 16,
    "attention_bias": True,
    "tie_word_embeddings": True,
}
QWEN_BARE = {
    k: QWEN_SMALL[k]
    for k in (
        "model_type",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
    )
}
_EXPERT_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
QWEN3_5_SMALL = {
    **{k: v for k, v in QWEN_SMALL.items() if k not in (*_EXPERT_KEYS, "mlp_only_layers")},
    "model_type": "qwen3_5_text",
}
QWEN3_5_MOE_SMALL = {
    **{k: v for k, v in QWEN_SMALL.items() if k not in ("intermediate_size", "mlp_only_layers")},
    "model_type": "qwen3_5_moe_text",
}
# a Qwen3.5 language model of 64 layers at width 5,120 (48 value heads over 16 key heads)
QWEN3_5_27B_SHAPE = {
    "model_type": "qwen3_5_text",
    "hidden_size": 5120,
    "num_hidden_layers": 64,
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "intermediate_size": 17408,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "vocab_size": 248320,
    "tie_word_embeddings": False,
}
# google/recurrentgemma-2b's config.json: 2.7B on its card
RECURRENTGEMMA_2B = json.loads((PUBLIC / "recurrentgemma-2b.config.json").read_text())
RECURRENTGEMMA_9B_SHAPE = {
    **RECURRENTGEMMA_2B,
    "hidden_size": 4096,
    "intermediate_size": 24576,
    "lru_width": 4096,
    "num_attention_heads": 16,
    "num_hidden_layers": 38,
}
RG_SMALL = {
    "model_type": "recurrent_gemma",
    "hidden_size": 128,
    "num_hidden_layers": 5,
    "num_attention_heads": 4,
    "intermediate_size": 384,
    "vocab_size": 1000,
}
RG_ODD = {
    **RG_SMALL,
    "block_types": ["attention", "recurrent"],
    "lru_width": 192,
    "num_key_value_heads": 2,
    "attention_bias": True,
    "conv1d_width": 3,
    "intermediate_size": 301,
    "tie_word_embeddings": False,
    "attention_window_size": 64,
}

# name -> (config, transformers' count of the model built from it)
# transformers' xLSTMConfig: the counts of xLSTMForCausalLM built from these (5.24, meta device)
XLSTM_SMALL = {"model_type": "xlstm", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2, "num_heads": 4}
XLSTM_NARROW = {
    **XLSTM_SMALL,
    "num_hidden_layers": 3,
    "qk_dim_factor": 1.0,
    "v_dim_factor": 0.5,
    "ffn_proj_factor": 1.5,
    "ffn_round_up_to_multiple_of": 32,
    "gate_soft_cap": 10.0,
    "norm_eps": 1e-5,
}

BUILT = {
    "nemotron-3-nano-30b-a3b with moe_latent_size 1024": ({**NANO, "moe_latent_size": 1024}, 13_520_147_904),
    "nemotron-h small latent": (NEMOTRON_SMALL_LATENT, 1_869_232),
    "qwen3-next-80b-a3b": (QWEN3_NEXT_80B, 79_674_391_296),
    "qwen3-next small": (QWEN_SMALL, 1_589_024),
    "qwen3-next layer_types": (QWEN_TYPED, 1_161_552),
    "qwen3-next dense": ({**QWEN_SMALL, "num_experts": 0}, 1_214_624),
    "qwen3-next bare": (QWEN_BARE, 12_513_088),
    "qwen3.5 small": (QWEN3_5_SMALL, 1_214_624),
    "qwen3.5 27b shape": (QWEN3_5_27B_SHAPE, 26_895_998_464),
    "qwen3.5 moe small": (QWEN3_5_MOE_SMALL, 1_663_904),
    "qwen3.5 moe bare": ({**QWEN_BARE, "model_type": "qwen3_5_moe_text"}, 12_513_088),
    "recurrentgemma-2b": (RECURRENTGEMMA_2B, 2_682_862_080),
    "recurrentgemma 9b shape": (RECURRENTGEMMA_9B_SHAPE, 8_579_977_216),
    "recurrentgemma small": (RG_SMALL, 801_280),
    "recurrentgemma odd": (RG_ODD, 884_188),
    "xlstm-7b": (json.loads((PUBLIC / "xlstm-7b.config.json").read_text()), 6_865_424_896),
    "xlstm small": (XLSTM_SMALL, 120_784),
    "xlstm narrow keys and values": (XLSTM_NARROW, 113_208),
}


@pytest.mark.parametrize("name", sorted(BUILT))
def test_converts_to_transformers_count_and_back(name):
    config, built = BUILT[name]
    read = read_hf_config(config, "m")
    assert _params(read.data) == built
    written = to_hf_config(spec_from_data(read.data), config["model_type"])
    again = read_hf_config(written, "m")
    assert _same_stack(again.data, read.data) and again.notes == []


def test_published_sizes():
    assert abs(BUILT["qwen3-next-80b-a3b"][1] - 80e9) / 80e9 < 0.01  # the card's 80B
    assert abs(BUILT["recurrentgemma-2b"][1] - 2.7e9) / 2.7e9 < 0.01  # the card's 2.7B
    data = read_hf_config(QWEN3_NEXT_80B).data
    assert data["topology"] == "(3GDN-MoE:A-MoE)x12"
    assert data["layers"]["GDN"] == {
        "heads": 16,
        "head_dim": 128,
        "expand_v": 1,
        "d_conv": 4,
        "gated": True,
        "output_gate": True,
        "value_heads": 32,
        "norm_eps": 1e-6,
        "l2norm_eps": 1e-6,
    }
    assert data["layers"]["A"]["output_gate"] and data["layers"]["A"]["qk_norm"]
    assert data["layers"]["A"]["rotary_fraction"] == 0.25
    assert data["layers"]["MoE"]["shared_gate"] is True and data["layers"]["MoE"]["shared_width"] == 512
    rg = read_hf_config(RECURRENTGEMMA_2B).data
    assert rg["layers"]["RG"] == {"width": 2560, "heads": 10, "d_conv": 4, "bias": True}
    assert rg["layers"]["A"]["window"] == 2048 and rg["layers"]["A"]["out_bias"] is True
    assert rg["layers"]["Sg"] == {"inner": 7680, "bias": True, "activation": "gelu"} and rg["tie_embeddings"] is True
    # RecurrentGemmaModel's normalizer: sqrt(2560) = 50.596 in bfloat16; the soft cap and eps as stated
    assert (rg["embedding_scale"], rg["logit_soft_cap"], rg["norm_eps"]) == (50.5, 30.0, 1e-6)


# ---- Nemotron-H's latent experts ------------------------------------------------------------------------


def test_nemotron_latent_experts_read_and_written():
    data = read_hf_config(NEMOTRON_SMALL_LATENT).data
    assert data["layers"]["MoE"]["latent_width"] == 64
    assert to_hf_config(spec_from_data(data), "nemotron_h")["moe_latent_size"] == 64
    plain = read_hf_config({**NEMOTRON_SMALL_LATENT, "moe_latent_size": None}).data
    assert "latent_width" not in plain["layers"]["MoE"]
    assert to_hf_config(spec_from_data(plain), "nemotron_h")["moe_latent_size"] is None


def test_nemotron_experts_with_mlp_bias_are_refused_by_name():
    with pytest.raises(madsl.MadslError, match='"mlp_bias": true'):
        read_hf_config({**NEMOTRON_SMALL_LATENT, "mlp_bias": True})


@pytest.mark.parametrize(
    "model_type, topology, option",
    [
        ("granitemoehybrid", "M2-MoE{shared_width=8,latent_width=4}", "latent_width"),
        ("granitemoehybrid", "M2-MoE{shared_width=8,shared_gate=true}", "shared_gate"),
        ("jamba", "Mb-MoE{latent_width=4}", "latent_width"),
        ("jamba", "Mb-MoE{shared_width=8,shared_gate=true}", "shared_gate"),
        ("lfm2_moe", "GConv-MoE{latent_width=4}", "latent_width"),
        ("qwen3_next", "GDN-MoE{shared_width=8,shared_gate=true,latent_width=4}", "latent_width"),
    ],
)
def test_moe_options_a_family_cannot_state_are_refused_by_name(model_type, topology, option):
    spec = madsl.spec_from_topology(topology, dim=32, vocab=100)
    with pytest.raises(madsl.MadslError, match=f"has no MoE {option}"):
        to_hf_config(spec, model_type)


def test_nemotron_refuses_a_gated_shared_expert_by_name():
    spec = spec_from_data(
        {
            "name": "n",
            "dim": 32,
            "vocab": 100,
            "topology": "M2-MoE",
            "layers": {
                "M2": {"heads": 2, "head_dim": 32},
                "MoE": {"shared_width": 8, "shared_gate": True, "gated": False, "activation": "relu2"},
            },
        }
    )
    with pytest.raises(madsl.MadslError, match="has no MoE shared_gate"):
        to_hf_config(spec, "nemotron_h")


# ---- the missing-key policy ------------------------------------------------------------------------------


def test_qwen3_next_defaults_are_listed():
    read = read_hf_config(QWEN_BARE)
    for key in ("full_attention_interval", "linear_num_value_heads", "head_dim", "partial_rotary_factor"):
        assert key in read.defaulted
    assert read.defaulted["linear_num_value_heads"] == 32 and read.defaulted["partial_rotary_factor"] == 0.25
    assert read_hf_config(RECURRENTGEMMA_2B).defaulted == {"tie_word_embeddings": True}
    small = read_hf_config(RG_SMALL)
    assert small.defaulted["block_types"] == ["recurrent", "recurrent", "attention"]
    assert small.defaulted["lru_width"] == 128 and small.defaulted["num_key_value_heads"] == 4


@pytest.mark.parametrize(
    "config, key",
    [
        (QWEN3_NEXT_80B, "hidden_size"),
        (QWEN3_NEXT_80B, "num_experts"),
        (QWEN3_NEXT_80B, "moe_intermediate_size"),
        (QWEN3_NEXT_80B, "shared_expert_intermediate_size"),
        (QWEN_SMALL, "intermediate_size"),  # a dense layer (mlp_only_layers) needs it
        (QWEN3_5_SMALL, "intermediate_size"),
        (QWEN3_5_MOE_SMALL, "num_experts"),
        (RECURRENTGEMMA_2B, "intermediate_size"),
        (RECURRENTGEMMA_2B, "num_attention_heads"),
        (RECURRENTGEMMA_2B, "vocab_size"),
    ],
)
def test_a_size_that_says_which_model_it_is_is_refused_by_name(tmp_path, config, key):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in config.items() if k != key}, indent=2))
    rc, out, err = convert("--from-hf", str(path))
    assert rc == 2 and out == "" and f'missing key "{key}"' in err and "Traceback" not in err


@pytest.mark.parametrize(
    "change, message",
    [
        ({"linear_num_value_heads": 24}, "not a multiple of linear_num_key_heads"),
        ({"linear_value_head_dim": 96}, "not a multiple of linear_key_head_dim"),
        ({"hidden_act": "gelu"}, '"hidden_act"'),
        ({"layer_types": ["linear_attention"] * 47}, "47 layers, but num_hidden_layers is 48"),
        ({"num_experts_per_tok": 600}, "exceeds num_experts"),
    ],
)
def test_what_qwen3_next_cannot_state_is_a_located_error(tmp_path, change, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**QWEN3_NEXT_80B, **change}, indent=2))
    rc, out, err = convert("--from-hf", str(path))
    assert rc == 2 and out == "" and message in err and f"{path}:" in err and "Traceback" not in err


def test_qwen3_5_moe_reads_no_dense_layers_and_says_so():
    read = read_hf_config({**QWEN3_5_MOE_SMALL, "mlp_only_layers": [0]})
    assert _params(read.data) == 1_663_904
    assert any(note.startswith("mlp_only_layers is not read") for note in read.notes)


@pytest.mark.parametrize(
    "model_type, text, tied, built",
    [
        ("qwen3_5", QWEN3_5_SMALL, None, 1_214_624),
        ("qwen3_5", QWEN3_5_SMALL, True, 1_086_624),
        ("qwen3_5_moe", QWEN3_5_MOE_SMALL, None, 1_663_904),
    ],
)
def test_the_vision_language_configs_convert_their_language_model(model_type, text, tied, built):
    """AutoModelForCausalLM builds text_config's language model alone (its tying, not the top level's)."""
    text = {**text, **({"tie_word_embeddings": tied} if tied is not None else {})}
    read = read_hf_config(
        {"model_type": model_type, "tie_word_embeddings": True, "text_config": text, "vision_config": {}}
    )
    assert _params(read.data) == built
    assert any("vision encoder (vision_config) is not counted" in note for note in read.notes)
    assert (tied is None) == any("not read at the top level" in note for note in read.notes)
    assert "text_config.hidden_act" in read.defaulted


@pytest.mark.parametrize(
    "config, message",
    [
        ({"model_type": "qwen3_5"}, 'missing key "text_config"'),
        ({"model_type": "qwen3_5", "text_config": QWEN3_5_MOE_SMALL}, '"text_config"."model_type"'),
        ({"model_type": "qwen3_5_moe", "text_config": {**QWEN3_5_MOE_SMALL, "num_experts_per_tok": 9}}, "exceeds"),
    ],
)
def test_a_vision_language_config_without_its_language_model_is_refused(tmp_path, config, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=2))
    rc, out, err = convert("--from-hf", str(path))
    assert rc == 2 and out == "" and message in err and "Traceback" not in err


@pytest.mark.parametrize(
    "model_type, topology, message",
    [
        ("qwen3_next", "GDN-Sg:A-Sg", "normalises queries and keys and gates its output"),
        ("qwen3_next", "GDN{output_gate=false}-Sg", "the decay gate, the output gate"),
        ("qwen3_next", "GDN-MoE{shared_width=8}", "shared SwiGLU expert with its gate"),
        ("qwen3_5_text", "GDN-MoE{shared_width=8, shared_gate=true}", "followed by a SwiGLU"),
        ("qwen3_5_moe_text", "GDN-Sg", "followed by a mixture of experts"),
        ("recurrent_gemma", "RG-Sg{activation=gelu}", "MLPs have biases"),
        ("recurrent_gemma", "RG-Sg", "gated MLPs gate with gelu"),
        (
            "recurrent_gemma",
            "RG-Sg{bias=true, activation=gelu}:A{heads=4}-Sg{bias=true, activation=gelu}",
            "attention is local",
        ),
        ("recurrent_gemma", "RG-Sg{bias=true, activation=gelu}", "sqrt\\(hidden_size\\) in bfloat16"),
        ("lfm2", "GConv-Sg{activation=gelu}", "gate with silu; the spec's Sg with gelu"),
        ("recurrent_gemma", "M2-Sg", "RecurrentGemma has no mamba2 layer"),
    ],
)
def test_what_a_family_cannot_express_is_refused(model_type, topology, message):
    spec = madsl.spec_from_topology(topology, dim=32, vocab=100)
    with pytest.raises(madsl.MadslError, match=message):
        to_hf_config(spec, model_type)


# ---- Kimi Linear (kimi_linear) ---------------------------------------------------------------------------

# moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json (token ids and dtype left out): 48B total on its card
KIMI_LINEAR_48B = json.loads((PUBLIC / "kimi-linear-48b-a3b.config.json").read_text())
KIMI_SMALL = {
    "model_type": "kimi_linear",
    "hidden_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 24,
    "linear_attn_config": {
        "full_attn_layers": [3, 6],
        "kda_layers": [1, 2, 4, 5],
        "num_heads": 4,
        "head_dim": 16,
        "short_conv_kernel_size": 3,
    },
    "num_experts": 8,
    "num_experts_per_token": 2,
    "num_shared_experts": 1,
    "moe_intermediate_size": 48,
    "first_k_dense_replace": 1,
    "vocab_size": 1000,
    "pad_token_id": 0,
}
# transformers' own key names (num_local_experts, num_experts_per_tok, n_shared_experts), layer_types,
# mlp_layer_types, a query bottleneck, attention bias, and tie_word_embeddings, which the class ignores
KIMI_TYPED = {
    "model_type": "kimi_linear",
    "hidden_size": 96,
    "num_hidden_layers": 5,
    "num_attention_heads": 3,
    "intermediate_size": 200,
    "q_lora_rank": 40,
    "kv_lora_rank": 24,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "attention_bias": True,
    "layer_types": ["full_attention", "linear_attention", "linear_attention", "full_attention", "linear_attention"],
    "mlp_layer_types": ["dense", "sparse", "dense", "sparse", "sparse"],
    "linear_num_heads": 2,
    "linear_head_dim": 24,
    "linear_conv_kernel_dim": 2,
    "num_local_experts": 6,
    "num_experts_per_tok": 3,
    "n_shared_experts": 2,
    "moe_intermediate_size": 32,
    "vocab_size": 500,
    "pad_token_id": 0,
    "tie_word_embeddings": True,
}
KIMI_BARE = {
    "model_type": "kimi_linear",
    "hidden_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "num_experts": 8,
    "num_experts_per_token": 2,
    "moe_intermediate_size": 48,
    "vocab_size": 1000,
    "pad_token_id": 0,
}
KIMI_DENSE = {**{k: v for k, v in KIMI_SMALL.items() if k != "num_experts"}, "first_k_dense_replace": 6}

# name -> (config, transformers' count of KimiLinearForCausalLM built from it)
KIMI_BUILT = {
    "kimi-linear-48b-a3b": (KIMI_LINEAR_48B, 49_122_675_072),
    "kimi small": (KIMI_SMALL, 1_420_560),
    "kimi typed": (KIMI_TYPED, 546_734),
    "kimi bare": (KIMI_BARE, 18_132_896),
    "kimi dense": (KIMI_DENSE, 1_077_520),
    "kimi no shared expert": ({**KIMI_SMALL, "num_shared_experts": 0}, 1_328_400),
}


@pytest.mark.parametrize("name", sorted(KIMI_BUILT))
def test_kimi_linear_converts_to_transformers_count_and_back(name):
    config, built = KIMI_BUILT[name]
    read = read_hf_config(config, "m")
    assert _params(read.data) == built
    written = to_hf_config(spec_from_data(read.data), "kimi_linear")
    again = read_hf_config(written, "m")
    assert _same_stack(again.data, read.data) and again.notes == []


def test_kimi_linear_48b_reads_its_checkpoint_keys():
    read = read_hf_config(KIMI_LINEAR_48B)
    data = read.data
    assert data["topology"].startswith("KDA-Sg:2KDA-MoE:MLA-MoE:3KDA-MoE") and data["topology"].endswith(
        "2KDA-MoE:MLA-MoE"
    )
    assert data["layers"]["KDA"] == {
        "heads": 32,
        "head_dim": 128,
        "expand_v": 1,
        "d_conv": 4,
        "norm_eps": 1e-5,
        "l2norm_eps": 1e-6,  # transformers' l2norm of q and k
    }
    assert data["layers"]["MLA"] == {
        "heads": 32,
        "q_lora_rank": None,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "rotary": False,
        "bias": False,
    }
    assert data["layers"]["MoE"] == {
        "experts": 256,
        "expert_width": 1024,
        "active": 8,
        "shared_width": 1024,
        "scores": "sigmoid",  # KimiLinearTopkRouter, with e_score_correction_bias
        "selection_bias": True,
        "normalize_top": True,  # moe_renormalize
        "route_scale": 2.446,  # routed_scaling_factor
    }
    assert data["layers"]["Sg"] == {"inner": 9216} and data["tie_embeddings"] is False
    assert data["norm_eps"] == 1e-5
    assert read.defaulted == {"attention_bias": False}
    assert any(note.startswith("head_dim = 72 is not read") for note in read.notes)
    assert abs(KIMI_BUILT["kimi-linear-48b-a3b"][1] - 48e9) / 48e9 < 0.03  # the card's 48B (2.3 % over)


def test_kimi_linear_defaults_are_listed():
    read = read_hf_config(KIMI_BARE)
    for key, value in (
        ("first_k_dense_replace", 1),
        ("linear_num_heads", 32),
        ("linear_head_dim", 128),
        ("kv_lora_rank", 512),
        ("q_lora_rank", None),
        ("num_shared_experts", 1),
    ):
        assert read.defaulted[key] == value
    assert read.defaulted["layer_types"][4] == "full_attention"


def test_kimi_linear_follows_the_class_where_it_ignores_a_key():
    """The head is never tied; the checkpoint's num_experts is read over num_local_experts."""
    read = read_hf_config({**KIMI_SMALL, "tie_word_embeddings": True, "num_local_experts": 4, "mla_use_nope": False})
    assert _params(read.data) == 1_420_560 and read.data["tie_embeddings"] is False
    assert any("never ties" in note for note in read.notes)
    assert any("num_local_experts is not read" in note for note in read.notes)
    assert any(note.startswith("mla_use_nope = false is not read") for note in read.notes)


@pytest.mark.parametrize(
    "key",
    [
        "hidden_size",
        "num_hidden_layers",
        "vocab_size",
        "num_attention_heads",
        "intermediate_size",
        "num_experts",
        "num_experts_per_token",
        "moe_intermediate_size",
    ],
)
def test_kimi_linear_size_that_says_which_model_it_is_is_refused_by_name(tmp_path, key):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in KIMI_LINEAR_48B.items() if k != key}, indent=2))
    rc, out, err = convert("--from-hf", str(path))
    assert rc == 2 and out == "" and f'missing key "{key}"' in err and "Traceback" not in err


@pytest.mark.parametrize(
    "change, message",
    [
        ({"layer_types": ["linear_attention"] * 26}, "26 layers, but num_hidden_layers is 27"),
        ({"mlp_layer_types": ["moe"] * 27}, '"mlp_layer_types"[0]'),
        ({"linear_attn_config": {"full_attn_layers": [0], "kda_layers": []}}, "not a layer number from 1 to 27"),
        ({"linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2]}}, "layer 3 is in neither"),
        ({"linear_attn_config": {"full_attn_layers": [1], "kda_layers": [1]}}, "layer 1 is in both"),
        ({"num_experts_per_token": 300}, "exceeds the 256 experts"),
        ({"hidden_act": "gelu"}, '"hidden_act"'),
        ({"num_expert_group": 8, "topk_group": 4}, "best groups only"),
        ({"moe_router_activation_func": "softmax"}, "scores experts by a softmax"),
    ],
)
def test_what_kimi_linear_cannot_state_is_a_located_error(tmp_path, change, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**KIMI_LINEAR_48B, **change}, indent=2))
    rc, out, err = convert("--from-hf", str(path))
    assert rc == 2 and out == "" and message in err and f"{path}:" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "topology, message",
    [
        ("K-Sg:MLA-Sg", "no rotary embeddings"),
        ("KDA{norm_eps=1e-6, l2norm_eps=1e-6}-Sg", "the model's rms_norm_eps"),
        ("KDA-Sg", "sqrt"),
        ("K-MoE{shared_width=16, expert_width=16}", "sigmoid scores plus a correction bias"),
        ("KDA{expand_v=2}-Sg", "values as wide as its keys"),
        ("K-MoE{shared_width=24, expert_width=16}", "not a multiple of expert_width"),
        ("K-MoE{shared_width=16, expert_width=16, shared_gate=true}", "has no MoE shared_gate"),
        ("KDA-none", "followed by a SwiGLU or a mixture of experts"),
        ("A-Sg", "Kimi Linear has no attention layer"),
    ],
)
def test_what_kimi_linear_cannot_express_is_refused(topology, message):
    data = {"name": "k", "dim": 32, "vocab": 100, "tie_embeddings": False, "topology": topology}
    spec = spec_from_data({**data, "layers": {"K": {"base": "KDA", "l2norm_eps": 1e-6}}})  # Kimi Linear's KDA
    with pytest.raises(madsl.MadslError, match=message):
        to_hf_config(spec, "kimi_linear")


def test_kimi_linear_refuses_a_tied_spec():
    data = read_hf_config(KIMI_SMALL).data
    with pytest.raises(madsl.MadslError, match="never ties"):
        to_hf_config(spec_from_data({**data, "tie_embeddings": True}), "kimi_linear")


# ---- MiniMax-Text-01 and MiniMax-M1 (minimax, minimax_m1) -------------------------------------------------

# MiniMaxAI/MiniMax-M1-80k's config.json (token ids, dtype, initialisation and dropout left out): 456B total
# on its card; model_type minimax_m1, MiniMax's own code, MiniMax-Text-01's layers
MINIMAX_M1 = json.loads((PUBLIC / "minimax-m1-80k.config.json").read_text())
# MiniMax-Text-01's shape in transformers' own keys (MiniMaxConfig: layer_types, the alpha factors)
MINIMAX_TEXT_01 = {
    "architectures": ["MiniMaxForCausalLM"],
    "model_type": "minimax",
    "hidden_size": 6144,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 9216,
    "num_local_experts": 32,
    "num_experts_per_tok": 2,
    "vocab_size": 200064,
    "rope_theta": 10000000,
    "max_position_embeddings": 10240000,
    "block_size": 256,
    "full_attn_alpha_factor": 3.5565588200778455,
    "full_attn_beta_factor": 1.0,
    "linear_attn_alpha_factor": 3.5565588200778455,
    "linear_attn_beta_factor": 1.0,
    "mlp_alpha_factor": 3.5565588200778455,
    "mlp_beta_factor": 1.0,
    "layer_types": [*["linear_attention"] * 7, "full_attention"] * 10,
    "rms_norm_eps": 1e-05,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
}
MINIMAX_SMALL = {
    "model_type": "minimax",
    "hidden_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 1000,
    "layer_types": [
        "linear_attention",
        "linear_attention",
        "full_attention",
        "linear_attention",
        "linear_attention",
        "full_attention",
    ],
}
MINIMAX_BARE = {
    "model_type": "minimax",
    "hidden_size": 128,
    "num_hidden_layers": 5,
    "num_attention_heads": 8,
    "intermediate_size": 96,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 1000,
}
# the num_experts alias, a head width of its own, tying, a sliding window and rope_parameters
MINIMAX_TYPED = {
    "model_type": "minimax",
    "hidden_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 40,
    "intermediate_size": 64,
    "num_experts": 3,
    "num_experts_per_tok": 1,
    "vocab_size": 500,
    "tie_word_embeddings": True,
    "sliding_window": 64,
    "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0},
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "linear_attention"],
}
MINIMAX_M1_SMALL = {
    "model_type": "minimax_m1",
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rotary_dim": 16,
    "intermediate_size": 96,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 1000,
    "attn_type_list": [0, 1, 0, 1],
    "postnorm": True,
    "shared_intermediate_size": 0,
}

# name -> (config, transformers' count of MiniMaxForCausalLM built from it; for minimax_m1, from the same
# config in MiniMaxConfig's keys: layer_types for attn_type_list)
MINIMAX_BUILT = {
    "minimax-m1": (MINIMAX_M1, 456_089_655_296),
    "minimax-text-01 shape": (MINIMAX_TEXT_01, 456_089_655_296),
    "minimax small": (MINIMAX_SMALL, 1_571_968),
    "minimax bare": (MINIMAX_BARE, 1_357_952),
    "minimax typed": (MINIMAX_TYPED, 540_480),
    "minimax-m1 small": (MINIMAX_M1_SMALL, 1_111_424),
}


@pytest.mark.parametrize("name", sorted(MINIMAX_BUILT))
def test_minimax_converts_to_transformers_count_and_back(name):
    config, built = MINIMAX_BUILT[name]
    read = read_hf_config(config, "m")
    assert _params(read.data) == built
    written = to_hf_config(spec_from_data(read.data), config["model_type"])
    again = read_hf_config(written, "m")
    assert _same_stack(again.data, read.data) and again.notes == []


def test_minimax_m1_is_text_01_in_its_own_keys():
    m1, text = read_hf_config(MINIMAX_M1).data, read_hf_config(MINIMAX_TEXT_01).data
    # the same stack; MiniMax-M1's code scales layer l's slopes by 1 - l / 79 + 1e-5, transformers' by 1 - l / 79.00001
    assert re.sub(r"\{[^}]*\}", "", m1["topology"]) == re.sub(r"\{[^}]*\}", "", text["topology"])
    assert m1["topology"].startswith("Lt{decay_scale=1.00001}-MoE:Lt{decay_scale=0.987351772152}-MoE:")
    assert text["topology"].startswith("Lt{decay_scale=1.00001}-MoE:Lt{decay_scale=0.987351773754}-MoE:")
    assert m1["residual_factors"] == text["residual_factors"] and m1["postnorm"] and text["postnorm"]
    assert m1["layers"]["Lt"] == {"heads": 64, "head_dim": 128}
    assert m1["layers"]["MoE"] == {"experts": 32, "expert_width": 9216, "active": 2, "aux_loss_weight": 0.001}
    assert m1["layers"]["A"]["rotary_fraction"] == 0.5 and "rotary_fraction" not in text["layers"]["A"]
    assert "MiniMaxForCausalLM" in m1["description"] and "residual after each norm" in text["description"]
    assert abs(MINIMAX_BUILT["minimax-m1"][1] - 456e9) / 456e9 < 0.01  # the card's 456B


def test_minimax_decay_follows_transformers_per_layer():
    """Layer l of N scales its slopes by 1 - l / (N - 1 + 1e-5) + 1e-5, as MiniMaxLightningAttention."""
    topology = read_hf_config(MINIMAX_SMALL).data["topology"]
    assert topology.split(":")[:2] == ["Lt{decay_scale=1.00001}-MoE", "Lt{decay_scale=0.800010399999}-MoE"]
    data = read_hf_config(MINIMAX_SMALL).data
    wrong = {**data, "topology": topology.replace("0.800010399999", "0.9")}
    with pytest.raises(madsl.MadslError, match="lightning layer 1 of 6 scales its slopes"):
        to_hf_config(spec_from_data(wrong), "minimax")


def test_minimax_defaults_are_listed_and_ignored_keys_said():
    read = read_hf_config(MINIMAX_BARE)
    assert read.defaulted["num_key_value_heads"] == 8 and read.defaulted["rope_theta"] == 1e6
    assert read.defaulted["layer_types"] == ["full_attention", "linear_attention"] * 2 + ["full_attention"]
    said = read_hf_config({**MINIMAX_BARE, "attn_type_list": [0, 0, 0, 0, 1]})
    assert any(note.startswith("attn_type_list = a list is not read") for note in said.notes)
    assert _params(said.data) == 1_357_952  # transformers' MiniMaxConfig alternates, whatever attn_type_list says
    m1 = read_hf_config({k: v for k, v in MINIMAX_M1_SMALL.items() if k != "rotary_dim"})
    assert m1.defaulted["rotary_dim"] == 32


@pytest.mark.parametrize(
    "config, key",
    [
        (MINIMAX_M1, "hidden_size"),
        (MINIMAX_M1, "num_attention_heads"),
        (MINIMAX_M1, "intermediate_size"),
        (MINIMAX_M1, "num_local_experts"),
        (MINIMAX_M1, "num_experts_per_tok"),
        (MINIMAX_M1, "vocab_size"),
        (MINIMAX_M1, "attn_type_list"),
        (MINIMAX_TEXT_01, "num_local_experts"),
    ],
)
def test_minimax_size_that_says_which_model_it_is_is_refused_by_name(tmp_path, config, key):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in config.items() if k != key}, indent=2))
    rc, out, err = convert("--from-hf", str(path))
    assert rc == 2 and out == "" and f'missing key "{key}"' in err and "Traceback" not in err


@pytest.mark.parametrize(
    "change, message",
    [
        ({"attn_type_list": [0, 1] * 39}, "a list of 80 entries, each 0 (lightning) or 1 (attention)"),
        ({"attn_type_list": [2] * 80}, "a list of 80 entries"),
        ({"shared_intermediate_size": 1024}, "a shared expert beside the routed ones"),
        ({"rotary_dim": 256}, "at most head_dim=128"),
        ({"num_experts_per_tok": 33}, "exceeds the 32 experts"),
        ({"hidden_act": "gelu"}, '"hidden_act"'),
    ],
)
def test_what_minimax_m1_cannot_state_is_a_located_error(tmp_path, change, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**MINIMAX_M1, **change}, indent=2))
    rc, out, err = convert("--from-hf", str(path))
    assert rc == 2 and out == "" and message in err and f"{path}:" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "model_type, topology, message",
    [
        ("minimax", "Lt-Sg", "MiniMax has no swiglu layer"),
        ("minimax", "Lt-none", "followed by its mixture of experts"),
        ("minimax", "Lt-MoE{shared_width=8}", "without a shared expert"),
        ("minimax", "A{rotary=false}-MoE", "attention is rotary"),
        ("minimax", "A{rotary_fraction=0.5}-MoE", "rotates the whole head"),
        ("minimax", "Lt{heads=2}-MoE:A{heads=4}-MoE", "share num_attention_heads and head_dim"),
        ("minimax", "GDN-MoE", "MiniMax has no delta_net layer"),
        ("minimax_m1", "Lt-MoE{latent_width=4}", "has no MoE latent_width"),
    ],
)
def test_what_minimax_cannot_express_is_refused(model_type, topology, message):
    spec = madsl.spec_from_topology(topology, dim=32, vocab=100)
    with pytest.raises(madsl.MadslError, match=message):
        to_hf_config(spec, model_type)


# ---- xLSTM (xlstm) ---------------------------------------------------------------------------------------


def test_xlstm_reads_the_7b_layer_and_lists_its_defaults():
    read = read_hf_config(XLSTM_SMALL, "m")
    assert read.data["topology"] == "2mL-Sg" and read.data["tie_embeddings"] is False
    assert read.data["layers"]["mL"] == {
        "heads": 4,
        "head_dim": 16,
        "qk_head_dim": 8,
        "gate_soft_cap": 15.0,
        "bias": False,
        "norm_eps": 1e-6,
        "zero_stabilizer": True,
        "eps": 1e-6,
    }
    assert read.data["layers"]["Sg"] == {"inner": 192}  # round_up(2.667 x 64, 64)
    assert "defaulted: gate_soft_cap = 15.0 (transformers' xLSTMConfig default)" in read.notes


@pytest.mark.parametrize(
    "change, message",
    [
        ({"use_bias": True}, '"use_bias": is true: xLSTM\'s block norms then have biases'),
        ({"embedding_dim": 32}, '"embedding_dim": 32 differs from hidden_size=64'),
        ({"num_blocks": 7}, '"num_blocks": 7 differs from num_hidden_layers=2'),
        ({"v_dim_factor": 0.3}, '"v_dim_factor": gives 19.2 channels'),
        ({"add_out_norm": False}, '"add_out_norm": is false'),
    ],
)
def test_what_xlstm_cannot_state_is_refused_by_name(change, message):
    with pytest.raises(madsl.MadslError, match=message):
        read_hf_config({**XLSTM_SMALL, **change}, "m")

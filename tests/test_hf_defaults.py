"""The converters' one policy for a key a config.json leaves out (madsl/interop/huggingface/): a key
transformers' config class defaults is taken at that default and listed (text and JSON), a size that
says which model it is is refused by name; the aliases transformers reads are read; where
transformers' class ignores a key, madsl follows the class and says so; LFM2-MoE converts.

Every count here is that of transformers' own model built from the same config (transformers 5.24,
torch 2.13, `AutoModelForCausalLM.from_config` on the meta device, in a separate environment: this
suite does not need transformers)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml

import madsl
from madsl.cli import main
from madsl.hf_config import read_hf_config, to_hf_config
from madsl.spec import spec_from_data

PUBLIC = Path(__file__).resolve().parent.parent / "specs/public"


def _config(name: str) -> dict:
    return json.loads((PUBLIC / f"{name}.config.json").read_text())


def _params(data: dict) -> int:
    return madsl.account(spec_from_data(data)).totals["params"]


def convert(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["convert", *args])
    return rc, out.getvalue(), err.getvalue()


# LFM2-2.6B's shape (22 gated convolutions + 8 attention layers, block_ff_dim 10752 not auto-adjusted):
# transformers builds 2,569,272,320 parameters, the card's count
LFM2_2_6B = {
    "model_type": "lfm2",
    "block_auto_adjust_ff_dim": False,
    "block_ff_dim": 10752,
    "block_ffn_dim_multiplier": 1.0,
    "block_multiple_of": 256,
    "conv_L_cache": 3,
    "conv_bias": False,
    "hidden_size": 2048,
    "intermediate_size": 10752,
    "layer_types": ["full_attention" if i in (2, 6, 10, 14, 18, 21, 24, 27) else "conv" for i in range(30)],
    "num_attention_heads": 32,
    "num_hidden_layers": 30,
    "num_key_value_heads": 8,
    "rope_theta": 1000000.0,
    "tie_embedding": True,
    "vocab_size": 65536,
}
# LiquidAI/LFM2-8B-A1B's config.json (the fields that size it): 8.3B total on its card
LFM2_8B_A1B = json.loads((PUBLIC / "lfm2-8b-a1b.config.json").read_text())

# (config, key left out) -> transformers' count of the model built without the key: each converts to
# it exactly, with the key listed at transformers' default
BUILT_WITHOUT = {
    ("lfm2-2.6b", "block_auto_adjust_ff_dim"): 1_908_669_440,  # Lfm2Config's true: 2/3 of the width
    ("bamba-9b", "num_key_value_heads"): 9_780_235_392,
    ("bamba-9b", "mamba_d_state"): 9_810_681_216,
    ("bamba-9b", "attn_layer_indices"): 9_961_267_200,  # none: Mamba-2 in every layer
    ("falcon-h1-0.5b", "mamba_expand"): 521_411_104,  # mamba_d_ssm fixes the width
    ("falcon-h1-0.5b", "num_key_value_heads"): 549_722_656,
    ("granite-4.0-h-small", "num_key_value_heads"): 32_308_001_280,  # null: as many as the heads
    ("granite-4.0-h-small", "tie_word_embeddings"): 32_618_379_776,
    ("granite-4.0-h-small", "mamba_d_state"): 32_245_132_800,
    ("nemotron-3-nano-30b-a3b", "mamba_num_heads"): 32_342_157_056,
    ("nemotron-3-nano-30b-a3b", "num_key_value_heads"): 31_602_709_952,
    ("nemotron-nano-9b-v2", "mamba_head_dim"): 8_144_717_312,
    ("jamba-v0.1", "attn_layer_offset"): 51_570_323_328,  # JambaConfig's 4
}


def _named(name: str) -> dict:
    return {"lfm2-2.6b": LFM2_2_6B, "lfm2-8b-a1b": LFM2_8B_A1B}.get(name) or _config(name)


@pytest.mark.parametrize("name, key", sorted(BUILT_WITHOUT))
def test_a_key_transformers_defaults_is_taken_at_its_default_and_listed(name, key):
    config = {k: v for k, v in _named(name).items() if k != key}
    read = read_hf_config(config, name)
    assert _params(read.data) == BUILT_WITHOUT[name, key]
    assert key in read.defaulted
    assert any(note.startswith(f"defaulted: {key} = ") and "transformers' " in note for note in read.notes)


def test_lfm2_without_block_auto_adjust_ff_dim_is_listed_in_text_and_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in LFM2_2_6B.items() if k != "block_auto_adjust_ff_dim"}))
    rc, text, _ = convert("--from-hf", str(path))
    assert rc == 0
    assert "# defaulted: block_auto_adjust_ff_dim = true (transformers' Lfm2Config default)\n" in text
    assert yaml.safe_load(text)["layers"]["Sg"]["inner"] == 7168
    rc, out, _ = convert("--from-hf", str(path), "--format", "json")
    record = json.loads(out)
    assert record["defaulted"] == {"block_auto_adjust_ff_dim": True} and record["totals"]["params"] == 1_908_669_440
    assert record["notes"] == ["defaulted: block_auto_adjust_ff_dim = true (transformers' Lfm2Config default)"]
    rc, out, err = convert("--from-hf", str(path), "-o", str(tmp_path / "lfm2.mad"))
    assert rc == 0 and out == "" and "# defaulted: block_auto_adjust_ff_dim = true" in err  # visible with -o too
    assert _params(read_hf_config(LFM2_2_6B).data) == 2_569_272_320 and read_hf_config(LFM2_2_6B).notes == []


# a size that says which model it is: refused by name when absent (transformers' default is one checkpoint's)
REFUSED = [
    ("bamba-9b", "hidden_size"),
    ("bamba-9b", "intermediate_size"),
    ("jamba-v0.1", "num_experts"),
    ("granite-4.0-h-small", "layer_types"),
    ("granite-4.0-h-small", "num_local_experts"),
    ("nemotron-3-nano-30b-a3b", "moe_intermediate_size"),
    ("lfm2-1.2b", "layer_types"),
    ("lfm2-1.2b", "block_ff_dim"),
    ("lfm2-8b-a1b", "layer_types"),
    ("lfm2-8b-a1b", "num_experts"),
    ("falcon-h1-0.5b", "vocab_size"),
]


@pytest.mark.parametrize("name, key", REFUSED)
def test_a_size_that_says_which_model_it_is_is_refused_by_name(tmp_path, name, key):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in _named(name).items() if k != key}, indent=2))
    rc, out, err = convert("--from-hf", str(path))
    shown = "intermediate_size" if key == "block_ff_dim" else key
    assert rc == 2 and out == "" and f'missing key "{shown}"' in err and f"{path}" in err and "Traceback" not in err


def test_falcon_h1_without_mamba_d_ssm_names_the_width_it_took():
    config = {k: v for k, v in _config("falcon-h1-0.5b").items() if k != "mamba_d_ssm"}
    with pytest.raises(madsl.MadslError, match="1024 wide .mamba_d_ssm, absent: transformers' default"):
        read_hf_config(config)


# ---- the aliases transformers reads -----------------------------------------------------------------------


def test_the_aliases_transformers_maps_are_read():
    granite = _config("granite-4.0-h-small")
    kinds = granite.pop("layer_types")
    expected = read_hf_config(_config("granite-4.0-h-small"), "g").data
    assert read_hf_config({**granite, "layers_block_type": kinds}, "g").data == expected
    new_names = ["linear_attention" if k == "mamba" else "full_attention" for k in kinds]
    assert read_hf_config({**granite, "layer_types": new_names}, "g").data == expected
    with pytest.raises(madsl.MadslError, match="differs from layer_types"):
        read_hf_config({**granite, "layer_types": kinds, "layers_block_type": new_names[::-1]})
    jamba = _config("jamba-v0.1")
    jamba["num_local_experts"] = jamba.pop("num_experts")
    assert _params(read_hf_config(jamba).data) == 51_570_323_328
    nano = {k: v for k, v in _config("nemotron-nano-9b-v2").items() if k not in ("n_groups", "conv_kernel")}
    read = read_hf_config({**nano, "mamba_n_groups": 4, "mamba_d_conv": 3})  # NemotronHConfig's other names
    assert _params(read.data) == 8_763_921_920 and read.data["layers"]["M2"]["groups"] == 4
    both = read_hf_config({**nano, "n_groups": 8, "mamba_n_groups": 4})
    assert both.data["layers"]["M2"]["groups"] == 4 and any("n_groups is not read" in n for n in both.notes)
    listed = {k: v for k, v in _config("nemotron-3-nano-30b-a3b").items() if k != "hybrid_override_pattern"}
    names = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    listed["layer_types"] = [names[c] for c in _config("nemotron-3-nano-30b-a3b")["hybrid_override_pattern"]]
    assert _params(read_hf_config(listed).data) == 31_577_937_344
    # NemotronHConfig counts the pattern's layers itself: num_hidden_layers may be left out
    nano = {k: v for k, v in _config("nemotron-nano-9b-v2").items() if k != "num_hidden_layers"}
    assert _params(read_hf_config(nano).data) == 8_888_227_328


# ---- where transformers' class ignores a key, madsl follows it and says so ------------------------------


@pytest.mark.parametrize(
    "name, change, said",
    [
        ("nemotron-h-8b", {"tie_word_embeddings": True}, "tie_word_embeddings = true is not read"),
        ("nemotron-h-8b", {"attention_bias": True}, "attention_bias = true is not read"),
        ("nemotron-h-8b", {"attention_head_dim": 96}, "attention_head_dim = 96 is not read"),
        ("falcon-h1-0.5b", {"attn_layer_indices": [0, 1]}, "attn_layer_indices = a list is not read"),
        ("bamba-9b", {"partial_rotary_factor": 1.0}, "partial_rotary_factor = 1.0 is not read"),
    ],
)
def test_a_key_the_class_ignores_is_followed_and_said(name, change, said):
    read = read_hf_config({**_config(name), **change})
    assert _params(read.data) == _params(read_hf_config(_config(name)).data)  # transformers' count: unchanged
    assert any(note.startswith(said) for note in read.notes)
    assert read_hf_config({**_config(name), **change}).data["tie_embeddings"] is False or name != "nemotron-h-8b"
    rc, out, _ = convert("--from-hf", str(PUBLIC / f"{name}.config.json"), "--format", "json")
    assert rc == 0 and not any(note.startswith(said) for note in json.loads(out)["notes"])


# ---- LFM2-MoE --------------------------------------------------------------------------------------------


def test_lfm2_8b_a1b_converts_exactly_with_dense_first_layers():
    read = read_hf_config(LFM2_8B_A1B, "lfm2-8b-a1b")
    data = read.data
    assert data["topology"].startswith("2GConv-Sg:A-MoE:") and data["tie_embeddings"] is True
    assert data["layers"]["MoE"] == {
        **{"experts": 32, "expert_width": 1792, "active": 4},
        # Lfm2MoeTopKRouter: sigmoid scores, experts picked with the expert bias (a buffer)
        **{"scores": "sigmoid", "selection_bias": True, "normalize_top": True, "route_scale": 1.0},
    }
    assert data["layers"]["Sg"] == {"inner": 7168}
    totals = madsl.account(spec_from_data(data)).totals
    assert totals["params"] == 8_339_929_856  # transformers' Lfm2MoeForCausalLM; the card's 8.3B
    assert abs(totals["active_params"] - 1.5e9) / 1.5e9 < 0.05  # the card's 1.5B active
    written = to_hf_config(spec_from_data(data), "lfm2_moe")
    assert written["num_dense_layers"] == 2 and written["layer_types"] == LFM2_8B_A1B["layer_types"]
    assert {k: v for k, v in read_hf_config(written, "lfm2-8b-a1b").data.items() if k != "description"} == {
        k: v for k, v in data.items() if k != "description"
    }


@pytest.mark.parametrize(
    "change, built",
    [
        ({"num_dense_layers": 0}, 8_956_623_616),
        ({"num_dense_layers": 24}, 1_556_298_496),
        ({}, 8_339_929_856),
        # LFM2.5-8B-A1B's shape: a 128,000-token vocabulary, heads of 64, rope_parameters
        (
            {
                "vocab_size": 128000,
                "head_dim": 64,
                "rope_theta": None,
                "rope_parameters": {"rope_theta": 5000000.0, "rope_type": "default"},
            },
            8_467_856_128,
        ),
    ],
)
def test_lfm2_moe_counts_as_transformers_builds(change, built):
    config = {k: v for k, v in {**LFM2_8B_A1B, **change}.items() if v is not None}
    assert _params(read_hf_config(config).data) == built


def test_lfm2_moe_without_num_dense_layers_takes_transformers_two():
    read = read_hf_config({k: v for k, v in LFM2_8B_A1B.items() if k != "num_dense_layers"})
    assert read.defaulted == {"num_dense_layers": 2} and _params(read.data) == 8_339_929_856


@pytest.mark.parametrize(
    "topology, message",
    [
        ("GConv-MoE:A{qk_norm=true}-Sg", "first layers are followed by a SwiGLU"),
        ("GConv-Sg:A{qk_norm=true}-MoE{shared_width=8}", "no shared expert"),
        ("GConv-Mlp", "LFM2-MoE has no mlp layer"),
    ],
)
def test_what_lfm2_moe_cannot_express_is_refused(topology, message):
    spec = madsl.spec_from_topology(topology, dim=32, vocab=100, layers={"A": {"heads": 2}})
    with pytest.raises(madsl.MadslError, match=message):
        to_hf_config(spec, "lfm2_moe")

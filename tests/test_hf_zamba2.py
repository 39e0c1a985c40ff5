"""Zamba2 config.json <-> spec (madsl/interop/huggingface/zamba2.py): Mamba-2 layers with shared transformer
blocks injected before some of them (`Zs#s0>M2-none`), their per-use adapters counted per use.

Every count here is that of transformers' own Zamba2ForCausalLM built from the same config (transformers
5.24, torch 2.13, `AutoModelForCausalLM.from_config` on the meta device: shared blocks tied, each block
holding the adapters of its uses); this suite does not need transformers for them."""

from __future__ import annotations

import json

import pytest

import madsl
from madsl.cli import main
from madsl.errors import MadslError
from madsl.hf_config import read_hf_config, to_hf_config
from madsl.spec import spec_from_data

TWO_BLOCKS = {
    "model_type": "zamba2",
    "hidden_size": 64,
    "num_hidden_layers": 7,
    "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid", "mamba", "hybrid", "hybrid"],
    "num_attention_heads": 4,
    "vocab_size": 100,
    "n_mamba_heads": 4,
    "num_mem_blocks": 2,
    "adapter_rank": 8,
    "mamba_d_state": 16,
}
# one block, adapters on q, k, v too, rotary, biases, 2 Mamba groups, an intermediate size of its own
EVERY_OPTION = {
    "model_type": "zamba2",
    "hidden_size": 64,
    "num_hidden_layers": 5,
    "layer_types": ["mamba", "hybrid", "linear_attention", "hybrid", "hybrid"],
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 100,
    "n_mamba_heads": 4,
    "num_mem_blocks": 1,
    "adapter_rank": 8,
    "use_shared_attention_adapter": True,
    "use_mem_rope": True,
    "add_bias_linear": True,
    "intermediate_size": 96,
    "mamba_ngroups": 2,
}
# three blocks, grouped-query attention (8 heads, 2 key/value heads)
THREE_BLOCKS = {
    "model_type": "zamba2",
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "layers_block_type": ["hybrid", "mamba", "hybrid", "hybrid"],
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "n_mamba_heads": 4,
    "num_mem_blocks": 3,
    "adapter_rank": 4,
}
# transformers' Zamba2ForCausalLM built from each (meta device)
BUILT = [
    (TWO_BLOCKS, "M2-none:Zs#s0>M2-none:M2-none:Zs#s1>M2-none:M2-none:Zs#s0>M2-none:Zs#s1>M2-none", 449_844),
    (EVERY_OPTION, "M2-none:Zs#s0>M2-none:M2-none:2Zs#s0>M2-none", 339_152),
    (THREE_BLOCKS, "Zs#s0>M2-none:M2-none:Zs#s1>M2-none:Zs#s2>M2-none", 410_032),
]


@pytest.mark.parametrize("config, topology, built", BUILT, ids=["two-blocks", "every-option", "three-blocks"])
def test_zamba2_converts_exactly_and_back(config, topology, built):
    read = read_hf_config(config)
    spec = spec_from_data(read.data)
    assert spec.data["topology"] == topology
    assert madsl.account(spec).totals["params"] == built
    rows = [row for row in madsl.account(spec).layers if row.symbol == "Zs"]
    # each block counted once with its first use; every later use adds its own projection and adapters
    assert [row.shared for row in rows][: config["num_mem_blocks"]] == [False] * config["num_mem_blocks"]
    assert all(row.params == rows[-1].params for row in rows if row.shared)
    back = read_hf_config(to_hf_config(spec, "zamba2"))
    assert {k: v for k, v in back.data.items() if k != "description"} == {
        k: v for k, v in read.data.items() if k != "description"
    }


def test_the_stack_the_class_computes():
    data = read_hf_config(EVERY_OPTION).data
    zs, m2 = data["layers"]["Zs"], data["layers"]["M2"]
    assert zs == {
        "heads": 4,
        "ffn": 96,
        "adapter_rank": 8,
        "qkv_adapters": True,
        "rope": True,
        "rope_theta": 10000.0,
        "activation": "gelu",
        "bias": True,
        "norm_eps": 1e-5,
    }
    # the Mamba conv is always biased, its gated norm at 1e-5, dt clamped at time_step_min
    assert (m2["conv_bias"], m2["norm_eps"], m2["dt_min"], m2["bias"], m2["groups"]) == (True, 1e-5, 0.001, True, 2)
    assert data["tie_embeddings"] is True and data["channel_mixer"] == "none"


def test_defaulted_keys_are_listed(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TWO_BLOCKS))
    assert main(["convert", "--from-hf", str(path)]) == 0
    out = capsys.readouterr().out
    assert "# defaulted: mamba_d_conv = 4 (transformers' Zamba2Config default)" in out
    assert "# defaulted: intermediate_size = 256 (null: 4 x hidden_size" in out
    read = read_hf_config(TWO_BLOCKS)
    assert read.defaulted["intermediate_size"] == 256 and read.defaulted["time_step_min"] == 0.001
    assert "n_mamba_heads" not in read.defaulted  # stated
    # no layers_block_type: Zamba2Config's own 54-layer stack (Zamba2-2.7B's), listed
    bare = {k: v for k, v in TWO_BLOCKS.items() if k != "layers_block_type"} | {"num_hidden_layers": 54}
    assert len(read_hf_config(bare).defaulted["layers_block_type"]) == 54


@pytest.mark.parametrize(
    "change, key, message",
    [
        ({"tie_word_embeddings": False}, "tie_word_embeddings", "ties its shared blocks only along with"),
        ({"use_shared_attention_adapter": True, "num_key_value_heads": 2}, "use_shared_attention_adapter", "fit"),
        ({"lora_rank": 128}, "lora_rank", "Zamba2Config reads adapter_rank instead, which this config states 8"),
        ({"ffn_hidden_size": 256}, "ffn_hidden_size", "reads intermediate_size instead, which this config leaves"),
        ({"use_shared_block_lora": False}, "use_shared_block_lora", "builds the MLP adapters of every use"),
        ({"mamba_headdim": 64}, "mamba_headdim", "Zamba2Config derives"),
        ({"num_attention_heads": 3}, "num_attention_heads", "does not divide 2 x hidden_size"),
        ({"n_mamba_heads": 3}, "n_mamba_heads", "do not divide the Mamba width"),
        ({"num_hidden_layers": 8}, "layers_block_type", "7 layers, but num_hidden_layers is 8"),
        ({"hidden_act": "relu"}, "hidden_act", "expected"),
    ],
)
def test_what_zamba2_cannot_state_is_refused_by_key(tmp_path, change, key, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TWO_BLOCKS, **change}, indent=1))
    with pytest.raises(MadslError) as err:
        read_hf_config(path)
    assert message in err.value.message
    lines = path.read_text().splitlines()
    assert f'"{key}"' in lines[err.value.location.line - 1]  # located at the key


@pytest.mark.parametrize(
    "topology, message",
    [
        ("M2-none:Zs#s0>M2-Sg", "no channel mixer"),
        ("M2-none:Zs>M2-none:Zs>M2-none", "in turn"),
        ("Zs#s0>M2-none:Zs#s1>M2-none:Zs#s1>M2-none", "in turn"),
        ("A>M2-none", r"shared transformer blocks \(Zs\) alone"),
    ],
)
def test_a_spec_zamba2_cannot_state_is_refused_on_export(topology, message):
    data = read_hf_config(TWO_BLOCKS).data | {"topology": topology}
    data["layers"] = {**data["layers"], "A": {"heads": 4}}
    with pytest.raises(MadslError, match=message):
        to_hf_config(spec_from_data(data), "zamba2")


def test_zyphras_earlier_keys_agreeing_with_transformers_are_left_with_a_note():
    read = read_hf_config({**TWO_BLOCKS, "lora_rank": 8, "use_shared_block_lora": True})
    assert read.data == read_hf_config(TWO_BLOCKS).data
    assert "lora_rank is not read: Zamba2Config reads adapter_rank (the same value)" in read.notes

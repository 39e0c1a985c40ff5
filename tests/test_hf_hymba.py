"""Hymba config.json -> spec (madsl/interop/huggingface/hymba.py): hybrid-head layers (`Hb`), meta tokens,
sliding windows with the meta tokens as sinks, keys and values shared across layers.

transformers has no Hymba class: the count is checked against the one the reference code builds
(NVIDIA's modeling_hymba.py, the hub's nvidia/Hymba-1.5B-Base: 17 layers of 46,700,932 parameters that
compute keys and values, 15 of 45,164,932 that reuse them, 51,201,600 embedding, 204,800 meta tokens and
1,600 final norm, tied head), which the hub's 3.05 GB bf16 model.safetensors agrees with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from layer_helpers import model_steps

import madsl
from madsl.errors import MadslError
from madsl.hf_config import read_hf_config, to_hf_config
from madsl.spec import spec_from_data

PUBLIC = Path(__file__).resolve().parent.parent / "specs/public/hymba-1.5b-base.config.json"
REFERENCE_COUNT = 17 * 46_700_932 + 15 * 45_164_932 + 51_201_600 + 204_800 + 1_600


def _config(**change) -> dict:
    return {**json.loads(PUBLIC.read_text()), **change}


def test_hymba_1_5b_converts_to_the_reference_count():
    read = read_hf_config(PUBLIC)
    spec = spec_from_data(read.data)
    account = madsl.account(spec)
    assert account.totals["params"] == REFERENCE_COUNT == 1_522_797_824
    assert spec.meta_tokens == 128
    rows = {row.symbol: row for row in account.layers}
    assert rows["Hb"].params - rows["HbR"].params == 1600 * (320 + 640)  # a consumer has no k and v rows
    symbols = [row.symbol for row in account.layers if row.role != "channel"]
    consumers = [i for i, s in enumerate(symbols) if s == "HbR"]
    assert consumers == [2, 4, 6, 8, 10, 12, 14, 17, 18, 20, 22, 24, 26, 28, 30]
    assert [i for i, s in enumerate(symbols) if s == "HbG"] == [0, 15, 31]
    hb = read.data["layers"]["Hb"]
    assert (hb["window"], hb["sinks"], hb["dt_rank"]) == (1025, 128, 100)
    assert hb["rope_theta"] == pytest.approx(10000.0 * 7 ** (64 / 62))  # the NTK base, about 74,535


def test_keys_a_config_leaves_out_take_hymbaconfigs_defaults_and_are_listed():
    data = _config()
    for key in ("mamba_dt_rank", "kv_reuse_group", "global_attn_idx"):
        data.pop(key)
    read = read_hf_config(data)
    assert read.defaulted["mamba_dt_rank"] == 100 and read.defaulted["global_attn_idx"] is None
    symbols = {symbol for symbol in read.data["layers"]}
    assert "HbR" not in symbols and "HbG" not in symbols  # every layer computes its own, within the window


def test_kv_reuse_every_i_layer_is_read():
    data = _config(kv_reuse_every_i_layer=2)
    data.pop("kv_reuse_group")
    spec = spec_from_data(read_hf_config(data).data)
    symbols = [row.symbol for row in madsl.account(spec).layers if row.role != "channel"]
    assert [i for i, s in enumerate(symbols) if s == "HbR"] == [i for i in range(32) if i % 2]


@pytest.mark.parametrize(
    "change, key, message",
    [
        ({"kv_reuse_group": [[1, 3], [2, 4]]}, "kv_reuse_group", "the nearest layer before it"),
        ({"kq_norm": "rms"}, "kq_norm", "the released Hymba uses 'none'"),
        ({"memory_tokens_interspersed_every": 8}, "memory_tokens_interspersed_every", "uses 0"),
        ({"mamba_proj_bias": True}, "mamba_proj_bias", "uses False"),
        ({"rope_type": "dynamic_ntk"}, "rope_type", "rescales rotary by the length"),
        ({"kq_head_dim": 32}, "kq_head_dim", "attends over the hidden size"),
        ({"num_key_value_heads": 4}, "num_key_value_heads", "does not divide"),
        ({"layer_type": ["m"] * 32}, "layer_type", "hybrid layers alone"),
    ],
)
def test_what_hb_cannot_state_is_refused_by_key(tmp_path, change, key, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_config(**change), indent=1))
    with pytest.raises(MadslError) as err:
        read_hf_config(path)
    assert message in err.value.message
    assert f'"{key}"' in path.read_text().splitlines()[err.value.location.line - 1]


def test_no_hymba_config_is_written():
    spec = spec_from_data(read_hf_config(PUBLIC).data)
    with pytest.raises(MadslError, match="madsl writes no Hymba config.json"):
        to_hf_config(spec, "hymba")


TINY = {
    "model_type": "hymba",
    "hidden_size": 32,
    "num_hidden_layers": 5,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 48,
    "vocab_size": 50,
    "mamba_d_state": 4,
    "num_memory_tokens": 3,
    "sliding_window": 2,
    "global_attn_idx": [0],
    "kv_reuse_group": [[1, 2, 3]],
    "rope": True,
    "tie_word_embeddings": True,
}


def test_a_small_hymba_compiles_linked_and_its_steps_equal_its_forward():
    import torch

    spec = spec_from_data(read_hf_config(TINY).data)
    torch.manual_seed(0)
    model = madsl.compile(spec, max_seq_len=16).double()
    mixers = [block.mixer.layer for block in model.body]
    producer = mixers[1]
    assert [m.kv_from is producer.kv_source for m in mixers[2:4]] == [True, True]
    assert not hasattr(mixers[4], "kv_from") and mixers[4].kv_source is not None  # layer 4 computes its own
    assert model.num_params() == madsl.account(spec).totals["params"]
    tokens = torch.randint(0, 50, (2, 9))
    full = model(tokens)
    assert (model_steps(model, tokens)[0] - full).abs().max() < 1e-10
    # unlinked, the consumers would read nothing: the link is what they compute with
    for m in mixers[2:4]:
        m.kv_from = producer.kv_source.__class__()
    with pytest.raises(RuntimeError):
        model(tokens)


def test_a_layer_reusing_keys_with_no_producer_before_it_is_a_located_error():
    spec = spec_from_data({"name": "h", "dim": 32, "vocab": 10, "topology": "Hb{kv_reuse=true}-Sg:Hb-Sg"})
    with pytest.raises(MadslError, match="no Hb layer before it computes the keys and values") as err:
        madsl.compile(spec)
    assert "kv_reuse: false on the first Hb layer" in err.value.hint


@pytest.mark.parametrize(
    "change, key, message",
    [
        ({"num_memory_tokens": 100_000}, "num_memory_tokens", "from 0 to 65,536"),
        ({"kv_reuse_group": [[0]]}, "kv_reuse_group", "each a producer and its consumers"),
        ({"sliding_window": 0}, "sliding_window", "positive integer"),
    ],
)
def test_hostile_hymba_values_are_located_errors(tmp_path, change, key, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY, **change}, indent=1))
    with pytest.raises(MadslError) as err:
        read_hf_config(path)
    assert message in err.value.message
    assert f'"{key}"' in path.read_text().splitlines()[err.value.location.line - 1]

"""Hugging Face config.json of hybrid families <-> specs (madsl/interop/huggingface/,
`madsl convert --from-hf/--to-hf`):
the bundled public configurations convert to the bundled specs, back to the same config fields, and
account to their published sizes; what a family cannot express is refused with the reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

import madsl
from madsl.hf_config import from_hf_config, to_hf_config
from madsl.interop.huggingface.families import FAMILIES
from madsl.spec import spec_from_data

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = ROOT / "specs/public"


class Model(NamedTuple):
    model_type: str
    published: float  # the model card's size
    built: int  # Hugging Face's model built from the config.json (transformers 5.24, on the meta device)
    counted: int  # madsl's count: every weight, embeddings and untied head included
    rounded: str = ""  # why the published size is more than 1% off, where it is


MODELS = {
    "jamba-v0.1": Model("jamba", 52e9, 51_570_323_328, 51_570_323_328),
    "nemotron-h-8b": Model(
        "nemotron_h", 8e9, 8_100_852_736, 8_100_852_736, rounded="the name's 8B rounds the 8.10B the checkpoint holds"
    ),
    "granite-4.0-h-small": Model("granitemoehybrid", 32e9, 32_207_337_984, 32_207_337_984),
    "nemotron-nano-9b-v2": Model("nemotron_h", 8.89e9, 8_888_227_328, 8_888_227_328),
    "nemotron-3-nano-30b-a3b": Model("nemotron_h", 31.6e9, 31_577_937_344, 31_577_937_344),
    "bamba-9b": Model("bamba", 9.78e9, 9_780_235_392, 9_780_235_392),
    "falcon-h1-0.5b": Model(
        "falcon_h1", 0.5e9, 521_411_104, 521_411_104, rounded="the name's 0.5B rounds the 0.52B the checkpoint holds"
    ),
    "lfm2-1.2b": Model("lfm2", 1_170_340_608, 1_170_340_608, 1_170_340_608),
    "lfm2-8b-a1b": Model("lfm2_moe", 8.3e9, 8_339_929_856, 8_339_929_856),
    "qwen3-next-80b-a3b": Model("qwen3_next", 80e9, 79_674_391_296, 79_674_391_296),
    "recurrentgemma-2b": Model("recurrent_gemma", 2.7e9, 2_682_862_080, 2_682_862_080),
    "kimi-linear-48b-a3b": Model(
        "kimi_linear", 48e9, 49_122_675_072, 49_122_675_072, rounded="the name's 48B rounds the 49.1B the model holds"
    ),
    "minimax-m1-80k": Model("minimax_m1", 456e9, 456_089_655_296, 456_089_655_296),
    "xlstm-7b": Model(
        "xlstm", 7e9, 6_865_424_896, 6_865_424_896, rounded="the name's 7B rounds the 6.87B the model holds"
    ),
    "zamba2-2.7b": Model(
        "zamba2", 2.7e9, 2_662_214_560, 2_662_214_560, rounded="the name's 2.7B rounds the 2.66B the checkpoint holds"
    ),
    # transformers has no Hymba: `built` is the count of NVIDIA's reference code (tests/test_hf_hymba.py); the
    # hub's model.safetensors, 3.05 GB in bf16, is the published size (the name says 1.5B)
    "hymba-1.5b-base": Model("hymba", 1.525e9, 1_522_797_824, 1_522_797_824),
}
# docs/convert.md's table: fixed (recurrent) state, conv state and KV cache at 8192 tokens, in numbers
STATE_AT_8192 = {
    "jamba-v0.1": (3_670_016, 688_128, 67_108_864),
    "nemotron-h-8b": (25_165_824, 737_280, 67_108_864),
    "granite-4.0-h-small": (37_748_736, 912_384, 67_108_864),
    "nemotron-nano-9b-v2": (35_389_440, 995_328, 67_108_864),
    "nemotron-3-nano-30b-a3b": (12_058_624, 423_936, 25_165_824),
    "bamba-9b": (30_408_704, 734_976, 50_331_648),
    "falcon-h1-0.5b": (7_077_888, 193_536, 75_497_472),
    "lfm2-1.2b": (0, 40_960, 50_331_648),
    "lfm2-8b-a1b": (0, 73_728, 50_331_648),
    "qwen3-next-80b-a3b": (18_874_368, 884_736, 100_663_296),
    "recurrentgemma-2b": (46_080, 138_240, 8_388_608),
    "kimi-linear-48b-a3b": (10_485_760, 737_280, 33_030_144),
    "minimax-m1-80k": (73_400_320, 0, 167_772_160),
    "xlstm-7b": (33_620_224, 0, 0),
    "zamba2-2.7b": (17_694_720, 850_176, 754_974_720),
    "hymba-1.5b-base": (1_638_400, 307_200, 135_782_400),
}


def _config(name: str) -> dict:
    return json.loads((PUBLIC / f"{name}.config.json").read_text())


def _without_description(data: dict) -> dict:
    return {k: v for k, v in data.items() if k != "description"}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_bundled_spec_is_the_conversion_of_the_bundled_config(name):
    assert yaml.safe_load((PUBLIC / f"{name}.mad").read_text()) == from_hf_config(PUBLIC / f"{name}.config.json", name)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameters_match_the_built_model_and_the_published_size_and_the_state_is_accounted(name):
    model = MODELS[name]
    account = madsl.account(PUBLIC / f"{name}.mad", seq_len=8192)
    totals = account.totals
    assert totals["params"] == model.counted == model.built
    off = abs(model.counted - model.published) / model.published
    assert off < 0.01 or model.rounded and off < 0.05, f"{name}: {off:.2%} off the published size"
    assert (totals["fixed_state"], totals["conv_state"], totals["kv_cache"]) == STATE_AT_8192[name]


def test_every_bundled_config_is_checked():
    assert {path.name.removesuffix(".config.json") for path in PUBLIC.glob("*.config.json")} == set(MODELS)


# every family but Hymba's writes a config.json back (no class loads a Hymba config: tests/test_hf_hymba.py)
@pytest.mark.parametrize("name", sorted(name for name, model in MODELS.items() if model.model_type != "hymba"))
def test_config_to_spec_to_config_gives_the_same_spec_back(name):
    model_type = MODELS[name].model_type
    written = to_hf_config(PUBLIC / f"{name}.mad", model_type)
    assert written["model_type"] == model_type
    assert _without_description(from_hf_config(written, name)) == _without_description(
        from_hf_config(_config(name), name)
    )


@pytest.mark.parametrize(
    "name", ["jamba-v0.1", "nemotron-h-8b", "granite-4.0-h-small", "nemotron-nano-9b-v2", "falcon-h1-0.5b"]
)
def test_the_families_fields_come_back_as_written(name):
    written, config = to_hf_config(PUBLIC / f"{name}.mad", MODELS[name].model_type), _config(name)
    if "attention_head_dim" in config:  # Nemotron-H's earlier spelling; transformers 5 reads head_dim
        config["head_dim"] = config.pop("attention_head_dim")
    # keys the bundled copy leaves out come back at transformers' defaults (Granite's multipliers)
    defaults = FAMILIES[MODELS[name].model_type].defaults
    assert {key: written[key] for key in written.keys() - config.keys()} == {
        key: defaults[key] for key in written.keys() - config.keys()
    }
    assert {key: written[key] for key in config} == config


def test_what_each_family_places_where():
    jamba = madsl.load_spec(PUBLIC / "jamba-v0.1.mad")
    account = madsl.account(jamba)
    mixers = [r.symbol for r in account.layers if r.role != "channel"]
    channels = [r.symbol for r in account.layers if r.role == "channel"]
    assert [i for i, s in enumerate(mixers) if s == "A"] == [4, 12, 20, 28]  # i % 8 == 4
    assert [i for i, s in enumerate(channels) if s == "MoE"] == list(range(1, 32, 2))  # i % 2 == 1
    granite = madsl.account(PUBLIC / "granite-4.0-h-small.mad")
    assert [i for i, r in enumerate(r for r in granite.layers if r.role != "channel") if r.symbol == "A"] == [
        5,
        15,
        25,
        35,
    ]
    nemotron = madsl.account(PUBLIC / "nemotron-h-8b.mad")
    assert len(nemotron.layers) == 52 and sum(r.symbol == "A" for r in nemotron.layers) == 4


def test_grouped_query_attention_and_the_family_layers_are_read():
    data = from_hf_config(PUBLIC / "nemotron-h-8b.config.json")
    assert data["layers"]["A"] == {"heads": 32, "head_dim": 128, "rotary": False, "bias": False, "kv_heads": 8}
    assert data["layers"]["Mlp"]["activation"] == "relu2" and data["layers"]["M2"]["groups"] == 8
    granite = from_hf_config(PUBLIC / "granite-4.0-h-small.config.json")
    assert granite["layers"]["MoE"]["shared_width"] == 1536 and granite["tie_embeddings"] is True
    # one expert is a dense MLP in Jamba; an attention-only stack, no Mamba settings needed
    small = {**_config("jamba-v0.1"), "num_experts": 1, "num_experts_per_tok": 1}
    assert "MoE" not in from_hf_config(small)["topology"]
    dense = {k: v for k, v in _config("granite-4.0-h-small").items() if not k.startswith("mamba_")}
    dense.update(layer_types=["attention"] * 40, num_local_experts=0, position_embedding_type="rope", rope_theta=1e7)
    data = from_hf_config(dense)
    assert data["topology"] == "40A-Sg" and data["layers"]["A"]["rotary_base"] == 1e7
    assert to_hf_config(spec_from_data(data), "granitemoehybrid")["layer_types"] == ["attention"] * 40


BAD_CONFIGS = {
    "unknown family": ({"model_type": "llama"}, 'madsl converts no "llama" configs'),
    "offset past period": ({"attn_layer_offset": 8}, '"attn_layer_offset": 8 is not below attn_layer_period=8'),
    "kv heads": ({"num_key_value_heads": 3}, "3 does not divide num_attention_heads=32"),
    "missing": (
        {"mamba_d_state": None},
        '"mamba_d_state": expected a positive integer at most 9,223,372,036,854,775,807, got null',
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_configs_are_located_errors(case, tmp_path):
    change, message = BAD_CONFIGS[case]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_config("jamba-v0.1"), **change}, indent=2))
    with pytest.raises(madsl.MadslError, match=message) as err:
        from_hf_config(path)
    assert err.value.location.file == str(path) and err.value.location.line is not None


def test_nemotron_patterns_that_madsl_cannot_pair_or_size_are_refused():
    config = _config("nemotron-h-8b")
    for pattern, message in (
        ("M-ME" + "M-" * 24, 'missing key "n_routed_experts"'),
        ("M--" + "M-" * 24 + "M", "layer 3"),
        ("M-" * 25, "50 layers, but num_hidden_layers is 52"),
    ):
        with pytest.raises(madsl.MadslError, match=message):
            from_hf_config({**config, "hybrid_override_pattern": pattern})
    # the Mamba width is heads x head width, whatever expand says (Nemotron-H's mixer)
    assert from_hf_config({**config, "mamba_num_heads": 96})["layers"]["M2"]["heads"] == 96


@pytest.mark.parametrize(
    "topology,model_type,message",
    [
        ("A{rotary=false}-Sg:Mb-Sg:A{rotary=false}-Sg:A{rotary=false}-Sg", "jamba", "not every k-th layer"),
        ("M2-Sg:A-Sg", "jamba", "Jamba has no mamba2 layer"),
        ("M2-Sg:A-Sg", "nemotron_h", "Nemotron-H has no swiglu layer"),
        ("M2-MoE:A-MoE", "granitemoehybrid", "always has a shared expert"),
        ("M2-Sg:A-MoE", "granitemoehybrid", "same channel mixer"),
        ("[M2 | A]-Sg", "granitemoehybrid", "parallel mixers"),
        ("Mb-Sg:A{heads=2}-Sg", "jamba", "has no rotary"),
    ],
)
def test_what_a_family_cannot_express_is_refused_with_the_reason(topology, model_type, message):
    spec = madsl.spec_from_topology(topology, dim=64, vocab=100)
    with pytest.raises(madsl.MadslError, match=message):
        to_hf_config(spec, model_type)


def test_madsl_convert_from_and_to_hf_without_torch(tmp_path):
    from test_surfaces import madsl_without_torch

    def run(*args):  # the gate's light install converts too
        return madsl_without_torch("convert", *args)

    out = tmp_path / "jamba.mad"
    proc = run("--from-hf", "specs/public/jamba-v0.1.config.json", "--name", "jamba", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr.strip() == f"wrote {out}"  # says what it wrote, as fit and export do
    proc = run("--to-hf", str(out), "--model-type", "jamba")
    assert proc.returncode == 0 and json.loads(proc.stdout) == _config("jamba-v0.1")
    bad = run("--to-hf", str(out), "--model-type", "nemotron_h")
    assert bad.returncode == 2 and "Nemotron-H has no mamba layer" in bad.stderr and "Traceback" not in bad.stderr
    bad = run("--from-hf", "specs/public/README.md")
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr

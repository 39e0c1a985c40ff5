"""The hybrid families people ship, converted exactly or refused by name (madsl/interop/huggingface/: the
registry and a module a family, `madsl convert`): Mamba-2 as wide as its config says (heads x head width, not
expand x width), and the three paths (--from-hf, --from-megatron, --to-hf) agreeing on it; Nemotron-H in
both layer-list formats and with NVIDIA-Nemotron-3's squared-ReLU experts; Bamba, Falcon-H1 (attention
beside Mamba-2) and LFM2 (gated short convolutions); the families madsl lacks a part for, refused with
the part; `--format text|json`. The bundled configs' counts against their published sizes are in
tests/test_hf_config.py."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch
import yaml

import madsl
from madsl.cli import main
from madsl.hf_config import from_hf_config, to_hf_config
from madsl.spec import spec_from_data

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = ROOT / "specs/public"
NANO_9B = "specs/public/nemotron-nano-9b-v2.config.json"


def _config(name: str) -> dict:
    return json.loads((PUBLIC / f"{name}.config.json").read_text())


def convert(*args: str) -> tuple[int, str, str]:
    """`madsl convert ARGS` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["convert", *args])
    return rc, out.getvalue(), err.getvalue()


def _body_params(account) -> int:
    """The layers' parameters, their norms included: what a Megatron pattern's sizes determine (no vocabulary)."""
    return sum(row.params for row in account.layers)


# ---- Mamba-2 as wide as the config says -------------------------------------------------------------------


def test_nemotron_nano_9b_mamba_is_128_heads_of_80_and_every_path_agrees():
    config = _config("nemotron-nano-9b-v2")
    data = from_hf_config(config, "nano")
    assert data["layers"]["M2"]["heads"] == 128 and data["layers"]["M2"]["head_dim"] == 80
    account = madsl.account(spec_from_data(data))
    assert account.totals["params"] == 8_888_227_328  # Hugging Face's model built from the config, to the parameter
    assert all(row.config.get("heads") == 128 for row in account.layers if row.symbol == "M2")
    sizes = [
        "M2.heads=128",
        "M2.head_dim=80",
        "M2.groups=8",
        "M2.d_state=128",
        "A.heads=40",
        "A.kv_heads=8",
        "A.head_dim=128",
        "A.rotary=false",
        "Mlp.inner=15680",
        "Mlp.activation=relu2",
    ]
    rc, text, err = convert(
        "--from-megatron", config["hybrid_override_pattern"], "--dim", "4480", *(f"--layer={size}" for size in sizes)
    )
    assert rc == 0, err
    megatron = madsl.account(spec_from_data(yaml.safe_load(text)))
    assert _body_params(megatron) == _body_params(account)
    written = to_hf_config(spec_from_data(data), "nemotron_h")
    assert (written["mamba_num_heads"], written["mamba_head_dim"], written["expand"]) == (128, 80, 2)
    assert written["hybrid_override_pattern"] == config["hybrid_override_pattern"]


NANO_4B = {  # NVIDIA-Nemotron-3-Nano-4B's config.json: the fields quoted by mlc-llm's nemotron_h tests
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "vocab_size": 131072,
    "hidden_size": 3136,
    "hybrid_override_pattern": "M-M-M-MM-M-M*-M-M*-M-M-M*-M-M-MM*-MMM-M-M-",
    "num_hidden_layers": 42,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 12544,
    "ssm_state_size": 128,
    "mamba_num_heads": 96,
    "mamba_head_dim": 80,
    "conv_kernel": 4,
    "use_conv_bias": True,
    "n_groups": 8,
}


def test_nvidia_nemotron_3_nano_4b_converts_at_96_heads_of_80():
    """Refused before for its Mamba width (7,680 channels, not 2 x 3,136); now the count of Hugging Face's
    model built from the config (3,973,556,832), 0.7% under the name's 4B."""
    data = from_hf_config(NANO_4B)
    assert (data["layers"]["M2"]["heads"], data["layers"]["M2"]["head_dim"]) == (96, 80)
    params = madsl.account(spec_from_data(data)).totals["params"]
    assert params == 3_973_556_832 and abs(params - 4e9) / 4e9 < 0.01


def test_the_megatron_path_refuses_to_guess_the_mamba_width():
    rc, out, err = convert("--from-megatron", "M-M*-", "--dim", "4480", "--layer", "M2.head_dim=80")
    assert rc == 2 and out == "" and "width is not stated" in err and "M2.heads=N" in err
    for given in ("M2.heads=128", "M2.expand=2"):
        rc, out, err = convert(
            "--from-megatron", "M-M*-", "--dim", "4480", "--layer", "M2.head_dim=80", "--layer", given
        )
        assert rc == 0, err
    rc, out, _ = convert(
        "--from-megatron",
        "M-M*-",
        "--dim",
        "4480",
        "--layer",
        "M2.heads=112",
        "--layer",
        "M2.head_dim=64",
        "--format",
        "json",
    )
    m2 = json.loads(out)["spec"]["layers"]["M2"]
    assert m2 == {"heads": 112, "head_dim": 64}  # Nemotron-H-4B's 112 x 64 = 7168 on 3072, as given
    assert convert("--from-megatron", "M-M*-")[0] == 0  # no sizes given: the stdlib's, stated by nothing


def test_an_m2_width_of_heads_times_head_dim_is_what_the_layer_builds():
    spec = madsl.spec_from_topology("M2{heads=6, head_dim=16, expand=1, groups=2}-Sg", dim=32, vocab=20)
    account = madsl.account(spec)
    model = madsl.compile(spec, vocab_size=20)
    assert account.totals["params"] == sum(p.numel() for p in model.parameters())
    assert account.layers[0].derived["d_inner"] == 96 and account.totals["fixed_state"] == 96 * 128


# ---- Nemotron-H: both layer-list formats, NVIDIA-Nemotron-3 ------------------------------------------------


def _as_layers_block_type(config: dict, names: dict[str, str]) -> dict:
    new = {k: v for k, v in config.items() if k not in ("hybrid_override_pattern", "num_hidden_layers")}
    new["layers_block_type"] = [names[c] for c in config["hybrid_override_pattern"]]
    return new


@pytest.mark.parametrize(
    "names",
    [
        {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"},
        {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"},
    ],
)
def test_layers_block_type_reads_as_the_pattern(names):
    for name in ("nemotron-3-nano-30b-a3b", "nemotron-nano-9b-v2"):
        config = _config(name)
        assert from_hf_config(_as_layers_block_type(config, names), name) == from_hf_config(config, name)


def test_a_nemotron_config_without_a_layer_list_names_both_formats(tmp_path):
    config = {k: v for k, v in _config("nemotron-3-nano-30b-a3b").items() if k != "hybrid_override_pattern"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    rc, _, err = convert("--from-hf", str(path))
    assert rc == 2 and "hybrid_override_pattern" in err and "layers_block_type" in err
    assert "missing key" not in err


@pytest.mark.parametrize(
    "stack, change, message",
    [
        (
            "list",
            {"layers_block_type": ["mamba", "moe", "attnetion"]},
            '"layers_block_type"[2]: layer 3 is "attnetion"',
        ),
        ("list", {"layers_block_type": ["mlp", "mamba"]}, "MLP with no Mamba or attention layer before it"),
        (
            "list",
            {"layers_block_type": ["mamba", "moe"], "num_hidden_layers": 3},
            "2 layers, but num_hidden_layers is 3",
        ),
        ("both", {"layers_block_type": ["mamba", "moe"]}, "where hybrid_override_pattern says"),
        ("pattern", {"num_experts_per_tok": 129}, "exceeds n_routed_experts=128"),
        ("pattern", {"n_group": 8, "topk_group": 4}, "picked from the best groups only"),
    ],
)
def test_nemotron_layer_lists_and_experts_madsl_cannot_state_are_refused(stack, change, message):
    config = _config("nemotron-3-nano-30b-a3b")
    if stack == "list":  # the newer format alone
        del config["hybrid_override_pattern"], config["num_hidden_layers"]
    with pytest.raises(madsl.MadslError) as err:
        from_hf_config({**config, **change})
    assert message in str(err.value)


def test_nemotron_3_experts_are_two_matrix_squared_relu_mlps_with_a_shared_one():
    data = from_hf_config(_config("nemotron-3-nano-30b-a3b"))
    assert data["layers"]["MoE"] == {
        "experts": 128,
        "expert_width": 1856,
        "active": 6,
        "shared_width": 3712,
        "gated": False,
        "activation": "relu2",
        "scores": "sigmoid",  # NemotronHTopkRouter's, with its correction bias
        "selection_bias": True,
        "normalize_top": True,
        "route_scale": 2.5,
    }
    account = madsl.account(spec_from_data(data))
    moe = next(row for row in account.layers if row.symbol == "MoE")
    # router, experts of two matrices, the shared expert (and the block's RMSNorm)
    assert moe.params - moe.norm_params == 2688 * 128 + 128 * 2 * 2688 * 1856 + 2 * 2688 * 3712
    assert "sigmoid" not in data["description"]  # the routing is computed, not only described


def test_a_tiny_nemotron_3_shaped_model_builds_what_it_accounts_and_routes_either_way():
    spec = madsl.spec_from_topology(
        "M2{heads=4, head_dim=8, groups=2, d_state=8}-MoE:A{heads=2, kv_heads=1, rotary=false}-MoE",
        dim=16,
        vocab=30,
        layers={
            "MoE": {
                "experts": 8,
                "expert_width": 12,
                "active": 2,
                "shared_width": 10,
                "gated": False,
                "activation": "relu2",
            }
        },
    )
    account = madsl.account(spec)
    model = madsl.compile(spec, vocab_size=30)
    assert account.totals["params"] == sum(p.numel() for p in model.parameters())
    moe = next(m for m in model.modules() if type(m).__name__ == "MoE")
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))
    moe.dense_dispatch = True
    dense = moe(x)
    moe.dense_dispatch = False
    torch.testing.assert_close(moe(x), dense, rtol=1e-5, atol=1e-6)


# ---- Bamba, Falcon-H1, LFM2 ------------------------------------------------------------------------------


def test_bamba_places_attention_by_index_and_rotates_half_of_each_head():
    data = from_hf_config(_config("bamba-9b"))
    account = madsl.account(spec_from_data(data))
    mixers = [row.symbol for row in account.layers if row.role != "channel"]
    assert [i for i, s in enumerate(mixers) if s == "A"] == [9, 18, 27] and len(mixers) == 32
    assert data["layers"]["A"]["rotary_fraction"] == 0.5
    with pytest.raises(madsl.MadslError, match="listed twice"):
        from_hf_config({**_config("bamba-9b"), "attn_layer_indices": [9, 9]})
    with pytest.raises(madsl.MadslError, match="not a layer index from 0 to 31"):
        from_hf_config({**_config("bamba-9b"), "attn_layer_indices": [32]})


def test_falcon_h1_runs_attention_beside_mamba_2_in_every_layer():
    data = from_hf_config(_config("falcon-h1-0.5b"))
    assert data["topology"] == "36[A | M2]-Sg"
    m2 = data["layers"]["M2"]
    assert (m2["heads"], m2["head_dim"], m2["norm"]) == (24, 64, False)  # mamba_d_ssm 1536, no gated RMSNorm
    config = _config("falcon-h1-0.5b")
    normed = from_hf_config({**config, "mamba_rms_norm": True, "mamba_norm_before_gate": False})
    assert normed["layers"]["M2"]["norm"] is True
    expand = from_hf_config({**config, "mamba_d_ssm": None, "mamba_n_heads": 32})  # null: expand x hidden_size
    assert expand["layers"]["M2"]["heads"] * expand["layers"]["M2"]["head_dim"] == 2048


@pytest.mark.parametrize(
    "change, message",
    [
        ({"mamba_rms_norm": True, "mamba_norm_before_gate": True}, "normalises after it"),
        ({"projectors_bias": True}, "one bias switch"),
        ({"mamba_n_heads": 25}, "25 heads x 64 = 1600 channels, but the Mamba layers are 1536 wide"),
        ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "no scaling"),
    ],
)
def test_falcon_h1_settings_madsl_cannot_state_are_refused(change, message):
    with pytest.raises(madsl.MadslError, match=message):
        from_hf_config({**_config("falcon-h1-0.5b"), **change})


def test_lfm2_sizes_its_mlp_as_its_config_class_does():
    config = _config("lfm2-1.2b")
    assert from_hf_config(config)["layers"]["Sg"]["inner"] == 8192  # 2/3 of 12288, a multiple of 256
    assert from_hf_config({**config, "block_auto_adjust_ff_dim": False})["layers"]["Sg"]["inner"] == 12288
    assert from_hf_config({**config, "block_ffn_dim_multiplier": 1.5})["layers"]["Sg"]["inner"] == 12288
    untied = {k: v for k, v in config.items() if k != "tie_embedding"} | {"tie_word_embeddings": False}
    assert from_hf_config(untied)["tie_embeddings"] is False
    # earlier configs name the attention layers by index
    by_index = {k: v for k, v in config.items() if k != "layer_types"} | {"full_attn_idxs": [2, 5, 8, 10, 12, 14]}
    assert from_hf_config(by_index) == from_hf_config(config)


def test_tiny_family_shaped_models_build_what_they_account():
    """Each family's layers at a tiny width: the module holds the accounted parameters, and its step
    form continues its parallel form (the contract of every primitive, here in the families' settings)."""
    layers = {
        "A": {"heads": 4, "kv_heads": 2, "qk_norm": True, "rotary_fraction": 0.5},
        "M2": {"heads": 3, "head_dim": 8, "d_state": 8, "norm": False},
        "Sg": {"inner": 24},
    }
    for topology in ("2[A | M2]-Sg", "GConv-Sg:A-Sg:GConv{bias=true}-Sg"):
        spec = madsl.spec_from_topology(topology, dim=16, vocab=30, layers=layers)
        model = madsl.compile(spec, vocab_size=30).double().eval()
        assert madsl.account(spec).totals["params"] == sum(p.numel() for p in model.parameters())
        tokens = torch.randint(0, 30, (2, 7), generator=torch.Generator().manual_seed(1))
        expected = model(tokens)
        logits, state = model.prefill(tokens[:, :3])
        for t in range(3, 7):
            logits, state = model.step(tokens[:, t], state)
            torch.testing.assert_close(logits, expected[:, t], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "topology, settings, model_type, message",
    [
        ("M2-Sg:A-Sg", {}, "falcon_h1", "attention beside Mamba-2"),
        ("[A | M2]-Mlp", {}, "falcon_h1", "Falcon-H1 has no mlp layer"),
        ("GConv-Sg:A-Sg", {}, "lfm2", "qk_norm: true"),
        ("GConv-Mlp", {}, "lfm2", "LFM2 has no mlp layer"),
        ("M2-MoE:A-MoE", {"A": {"rotary": False}}, "nemotron_h", "two matrices"),
        ("M2-Mlp", {"M2": {"norm": False}}, "nemotron_h", "have the gated RMSNorm"),
        ("M2-Sg:A-Sg", {"M2": {"heads": 3, "head_dim": 16}}, "bamba", "mamba_expand x hidden_size wide"),
        ("M2-Mlp:A-Mlp", {}, "bamba", "Bamba has no mlp layer"),
    ],
)
def test_what_the_new_families_cannot_express_is_refused_with_the_reason(topology, settings, model_type, message):
    layers = {"A": {"heads": 2, **settings.get("A", {})}, **{k: v for k, v in settings.items() if k != "A"}}
    spec = madsl.spec_from_topology(topology, dim=32, vocab=100, layers=layers)
    with pytest.raises(madsl.MadslError, match=message):
        to_hf_config(spec, model_type)


# ---- the families madsl lacks a part for: refused by name ------------------------------------------------

ZAMBA_SHAPE = {
    "architectures": ["ZambaForCausalLM"],
    "model_type": "zamba",
    "hidden_size": 3712,
    "num_hidden_layers": 76,
}


@pytest.mark.parametrize(
    "config, name, part",
    [
        (ZAMBA_SHAPE, "Zamba", "multi-head Mamba-1 mixers"),
    ],
)
def test_families_madsl_lacks_a_part_for_are_refused_by_name(tmp_path, config, name, part):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=2))
    rc, out, err = convert("--from-hf", str(path))
    assert rc == 2 and out == "" and f"madsl does not convert {name}" in err and part in err
    assert f"{path}:" in err  # located at model_type


# ---- --format text | json ----------------------------------------------------------------------------------


def test_the_command_offers_every_family_the_library_converts():
    from madsl.cli.convert import FAMILY_TYPES
    from madsl.hf_config import FAMILIES, REFUSED
    from madsl.interop.huggingface.families import LANGUAGE_MODELS

    assert set(FAMILY_TYPES) == set(FAMILIES) | set(LANGUAGE_MODELS) and not set(FAMILIES) & set(REFUSED)


def test_convert_formats():
    rc, text, _ = convert("--from-hf", NANO_9B)
    assert rc == 0 and yaml.safe_load(text)["layers"]["M2"]["heads"] == 128
    rc, out, _ = convert("--from-hf", NANO_9B, "--format", "json")
    result = json.loads(out)
    assert result["totals"]["params"] == 8_888_227_328 and result["spec"] == yaml.safe_load(text)
    rc, out, _ = convert("--to-hf", "specs/public/falcon-h1-0.5b.mad", "--model-type", "falcon_h1")
    assert json.loads(out) == _config("falcon-h1-0.5b")  # JSON by default, as a config.json is
    rc, out, _ = convert("--to-hf", "specs/public/falcon-h1-0.5b.mad", "--model-type", "falcon_h1", "--format", "text")
    assert "mamba_n_heads: 24\n" in out and "attn_layer_indices: null\n" in out
    rc, out, _ = convert("--to-megatron", "specs/public/nemotron-h-8b.mad", "--format", "json")
    assert json.loads(out) == {"hybrid_override_pattern": _config("nemotron-h-8b")["hybrid_override_pattern"]}


def test_the_megatron_path_lands_on_nemotron_nano_9b_v2_with_flags_alone_and_lists_its_defaults():
    """docs/convert.md's command: the checkpoint's 8,888,227,328 with --vocab and --no-tie, no hand
    edits; every value taken from madsl's defaults is listed; no --vocab is warned of."""
    pattern = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"
    sizes = ["M2.heads=128", "M2.head_dim=80", "M2.groups=8", "A.heads=40", "A.head_dim=128", "A.kv_heads=8"]
    sizes += ["A.rotary=false", "Mlp.inner=15680", "Mlp.activation=relu2"]
    flags = [item for layer in sizes for item in ("--layer", layer)]
    rc, out, err = convert(
        "--from-megatron", pattern, "--dim", "4480", "--vocab", "131072", "--no-tie", *flags, "--format", "json"
    )
    assert rc == 0, err
    record = json.loads(out)
    assert record["totals"]["params"] == 8_888_227_328 and record["warnings"] == []
    assert record["defaulted"]["M2.d_state"] == 128 and "M2.heads" not in record["defaulted"]
    assert "vocab" not in record["defaulted"] and record["spec"]["tie_embeddings"] is False
    rc, out, err = convert("--from-megatron", pattern, "--dim", "4480", *flags)
    assert rc == 0 and out.startswith("# defaulted (not in the pattern or the flags): ")
    assert "# warning: no --vocab: the embedding and head are not counted" in out
    assert "vocab=" in out.splitlines()[0] and "tie_embeddings=" in out.splitlines()[0]
    rc, _, err = convert("--from-hf", "specs/public/nemotron-nano-9b-v2.config.json", "--vocab", "7")
    assert rc == 2 and "--vocab: not read by --from-hf" in err

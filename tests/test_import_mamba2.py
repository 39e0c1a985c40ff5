"""`madsl import` of the Mamba-2 families: Bamba (Mamba-2 and attention layers, each with an MLP;
madsl.weights.bamba) and Nemotron-H (one Megatron layer per entry, Mamba-2, attention or MLP, paired
into madsl blocks; madsl.weights.nemotron_h). A tiny checkpoint made here by transformers (every
weight random, norms, dt_bias, A_log and D included) loads into the compiled madsl model with
transformers' logits, through the parallel forward and through prefill + step; what madsl's layers
cannot compute as the family's (another norm eps, a clamped step size, Nemotron-H's experts) is
refused by name, exit status 2, nothing written.

Tolerance: 1e-4 absolute on logits of magnitude ~1-10, float32, as tests/test_import_hf.py argues:
the same operations in another grouping (madsl's chunked SSD scan against transformers' reference
chunk scan, one fused q/k/v projection against three) round differently at float32 precision; a
wrong map (a swapped or transposed tensor, x and z exchanged, a group's B read for another) moves
logits by 1e-1 or more."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from madsl.cli import main  # noqa: E402
from madsl.errors import MadslError  # noqa: E402
from madsl.weights import load_pretrained  # noqa: E402

TOLERANCE = 1e-4
VOCAB = 61


def _bamba(folder: Path, *, tied: bool = False, groups: int = 2, **extra) -> Path:
    """A tiny Bamba (two Mamba-2 layers of 2 groups, one attention layer with grouped-query
    heads) with every weight random, saved by transformers into `folder`."""
    config = transformers.BambaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_indices=[1],
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_n_groups=groups,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=8,  # several chunks in the reference's scan, as in madsl's
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        **extra,
    )
    return _saved(transformers.BambaForCausalLM(config), folder)


def _nemotron_h(folder: Path, pattern: str = "M-*-", **extra) -> Path:
    """A tiny Nemotron-H of `pattern` (M Mamba-2 of 2 groups, * attention, - MLP) with every weight
    random, saved by transformers into `folder`."""
    config = transformers.NemotronHConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=len(pattern),
        hybrid_override_pattern=pattern,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        mamba_num_heads=4,
        mamba_head_dim=16,
        n_groups=2,
        ssm_state_size=8,
        conv_kernel=4,
        expand=2,
        chunk_size=8,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        **extra,
    )
    return _saved(transformers.NemotronHForCausalLM(config), folder)


def _saved(model, folder: Path) -> Path:
    """`model` with every weight random (norms near 1, A_log and dt_bias in Mamba-2's ranges), saved."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("norm.weight", "norm_f.weight")):
                parameter.uniform_(0.5, 1.5)
            elif name.endswith("A_log"):
                parameter.uniform_(0.0, 2.0)
            elif name.endswith("dt_bias"):
                parameter.uniform_(-3.0, 0.0)
            else:
                parameter.normal_(0.0, 0.3 if parameter.dim() > 1 else 0.1)
    model.eval().save_pretrained(folder)
    return folder


def _reference(folder: Path, tokens):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(tokens).logits


def _tokens(length: int = 21):
    return torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(1))


CHECKPOINTS = {
    "bamba untied, 2 groups": lambda folder: _bamba(folder),
    "bamba tied, 1 group": lambda folder: _bamba(folder, tied=True, groups=1),
    "nemotron-h M-*-": lambda folder: _nemotron_h(folder, "M-*-"),
    "nemotron-h MM-*-M (unpaired sequence layers)": lambda folder: _nemotron_h(folder, "MM-*-M"),
    "nemotron-h *-M-M": lambda folder: _nemotron_h(folder, "*-M-M"),
}


@pytest.mark.parametrize("make", CHECKPOINTS.values(), ids=CHECKPOINTS)
def test_logits_equal_transformers(tmp_path: Path, make) -> None:
    folder = make(tmp_path / "ckpt")
    tokens = _tokens()
    expected = _reference(folder, tokens)
    model = load_pretrained(folder)
    with torch.no_grad():
        got = model(tokens)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() < TOLERANCE
    assert expected.abs().max().item() > 1.0  # logits large enough that a wrong map shows


@pytest.mark.parametrize("make", [_bamba, _nemotron_h], ids=["bamba", "nemotron-h"])
def test_prefill_and_step_equal_transformers(tmp_path: Path, make) -> None:
    folder = make(tmp_path / "ckpt")
    tokens = _tokens(14)
    expected = _reference(folder, tokens)
    model = load_pretrained(folder)
    logits, state = model.prefill(tokens[:, :9])
    assert (logits - expected[:, :9]).abs().max().item() < TOLERANCE
    for position in range(9, tokens.shape[1]):
        logits, state = model.step(tokens[:, position], state)
        assert (logits - expected[:, position]).abs().max().item() < TOLERANCE


@pytest.mark.parametrize(
    ("make", "key", "value", "words"),
    [
        (_bamba, "rms_norm_eps", 1e-6, ['"rms_norm_eps" is 1e-06', "eps 1e-05"]),
        (_bamba, "time_step_limit", [0.001, 0.1], ['"time_step_limit" [0.001, 0.1] clamps the Mamba-2 step size']),
        (_bamba, "time_step_limit", "fast", ["\"time_step_limit\" 'fast'"]),
        (_nemotron_h, "layer_norm_epsilon", 1e-6, ['"layer_norm_epsilon" is 1e-06']),
        (_nemotron_h, "time_step_limit", [0.0, 0.5], ['"time_step_limit" [0.0, 0.5] clamps']),
    ],
)
def test_what_madsl_does_not_compute_is_refused_by_name(tmp_path: Path, capsys, make, key, value, words) -> None:
    folder = make(tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    spec, out = tmp_path / "out.mad", tmp_path / "out-model"
    assert main(["import", str(folder), "-o", str(spec), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert all(word in error for word in words) and "Traceback" not in error
    assert not spec.exists() and not out.exists()
    with pytest.raises(MadslError):
        load_pretrained(folder)


def test_nemotron_h_experts_are_refused_by_name(tmp_path: Path, capsys) -> None:
    folder = _nemotron_h(tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    config["layers_block_type"] = ["mamba", "moe", "attention", "mlp"]
    config.update(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    (folder / "config.json").write_text(json.dumps(config))
    assert main(["import", str(folder), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "the layer stack has MoE layers (E); madsl imports no Nemotron-H expert weights yet" in error
    assert not (tmp_path / "out").exists()

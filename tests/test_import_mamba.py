"""`madsl import` of the Mamba families: Bamba (Mamba-2 and attention layers, each with an MLP;
madsl.weights.bamba), Granite 4.0 (the same, with mixtures of experts beside a shared MLP and
µP-style multipliers; madsl.weights.granite), Nemotron-H (one Megatron layer per entry, Mamba-2,
attention or MLP, paired into madsl blocks; madsl.weights.nemotron_h) and Jamba (Mamba-1 with dt,
B and C norms, attention, MLPs and mixtures of experts whose router does not renormalise;
madsl.weights.jamba). A tiny checkpoint made here by transformers (every weight random, norms,
dt_bias, A_log and D included) loads into the compiled madsl model with transformers' logits,
through the parallel forward and through prefill + step; what madsl's layers cannot compute as the
family's (another norm eps, a clamped step size) is refused by name, exit status 2, nothing written.

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

from hf_checkpoints import bamba, granite, jamba, nemotron_h, prefill_and_step_error, reference, tokens  # noqa: E402

from madsl.cli import main  # noqa: E402
from madsl.errors import MadslError  # noqa: E402
from madsl.weights import load_pretrained  # noqa: E402

TOLERANCE = 1e-4


CHECKPOINTS = {
    "bamba untied, 2 groups": lambda folder: bamba(folder),
    "bamba tied, 1 group": lambda folder: bamba(folder, tied=True, groups=1),
    "nemotron-h M-*-": lambda folder: nemotron_h(folder, "M-*-"),
    "nemotron-h MM-*-M (unpaired sequence layers)": lambda folder: nemotron_h(folder, "MM-*-M"),
    "nemotron-h *-M-M": lambda folder: nemotron_h(folder, "*-M-M"),
    "jamba, 4 experts, untied": lambda folder: jamba(folder),
    "jamba, no experts, tied, eps 1e-5": lambda folder: jamba(folder, experts=1, tied=True, rms_norm_eps=1e-5),
    "granite, 4 experts and the shared one": lambda folder: granite(folder),
    "granite, the shared MLP alone, eps 1e-5": lambda folder: granite(folder, experts=0, rms_norm_eps=1e-5),
}


@pytest.mark.parametrize("make", CHECKPOINTS.values(), ids=CHECKPOINTS)
def test_logits_equal_transformers(tmp_path: Path, make) -> None:
    folder = make(tmp_path / "ckpt")
    ids = tokens(21)
    expected = reference(folder, ids)
    model = load_pretrained(folder)
    with torch.no_grad():
        got = model(ids)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() < TOLERANCE
    assert expected.abs().max().item() > 1.0  # logits large enough that a wrong map shows


@pytest.mark.parametrize("make", [bamba, nemotron_h, jamba, granite], ids=["bamba", "nemotron-h", "jamba", "granite"])
def test_prefill_and_step_equal_transformers(tmp_path: Path, make) -> None:
    folder = make(tmp_path / "ckpt")
    ids = tokens(14)
    assert prefill_and_step_error(load_pretrained(folder), ids, reference(folder, ids), prompt=9) < TOLERANCE


@pytest.mark.parametrize(
    ("make", "key", "value", "words"),
    [
        (bamba, "rms_norm_eps", 1e-6, ['"rms_norm_eps" is 1e-06', "eps 1e-05"]),
        (bamba, "time_step_limit", [0.001, 0.1], ['"time_step_limit" [0.001, 0.1] clamps the Mamba-2 step size']),
        (bamba, "time_step_limit", "fast", ["\"time_step_limit\" 'fast'"]),
        (nemotron_h, "layer_norm_epsilon", 1e-6, ['"layer_norm_epsilon" is 1e-06']),
        (nemotron_h, "time_step_limit", [0.0, 0.5], ['"time_step_limit" [0.0, 0.5] clamps']),
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

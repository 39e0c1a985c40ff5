"""`madsl import` of xLSTM (madsl.weights.xlstm; the way back out: test_export_hf.py): a tiny
checkpoint made here by transformers (every weight random) loads into the compiled madsl model with
transformers' logits, soft cap included, through prefill + step. Tolerance: 1e-4 absolute on
logits up to the cap of 4, float32 (tests/test_import_hf.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_checkpoints import prefill_and_step_error, reference, tokens, xlstm  # noqa: E402

from madsl.cli import main  # noqa: E402
from madsl.weights import load_pretrained  # noqa: E402

TOLERANCE = 1e-4


def test_logits_equal_transformers_through_prefill_and_step(tmp_path: Path) -> None:
    folder = xlstm(tmp_path / "ckpt")
    ids = tokens(21)
    expected = reference(folder, ids)
    model = load_pretrained(folder)
    with torch.no_grad():
        got = model(ids)
    assert (got - expected).abs().max().item() < TOLERANCE and expected.abs().max().item() > 1.0
    assert prefill_and_step_error(model, ids, expected, prompt=9) < TOLERANCE
    model.logit_soft_cap = None  # the cap matters: without it, other logits
    with torch.no_grad():
        assert (model(ids) - expected).abs().max().item() > 100 * TOLERANCE


def test_a_fused_weight_layout_is_refused_by_name(tmp_path: Path, capsys) -> None:
    folder = xlstm(tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "weight_mode": "fused"}))
    assert main(["import", str(folder), "--out", str(tmp_path / "out")]) == 2
    assert "\"weight_mode\" is 'fused'" in capsys.readouterr().err and not (tmp_path / "out").exists()

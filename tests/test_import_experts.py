"""`madsl import` of mixtures of experts routed by sigmoid scores (the way back out: test_export_hf.py):
LFM2-MoE (SwiGLU experts, an expert bias; madsl.weights.lfm2_moe) and Nemotron-H's MoE layers
(squared-ReLU experts with a shared one, a correction bias, optionally through a latent projection;
madsl.weights.nemotron_h). Tiny checkpoints made here by transformers, every weight random and the
routers' selection biases too, so that the bias picks other experts than the scores alone would.

Tolerance: 1e-4 absolute on logits up to ~8, float32 (as tests/test_import_mamba.py argues). The
selection bias must matter: zeroing it moves the logits by far more than the tolerance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_checkpoints import lfm2_moe, nemotron_h, prefill_and_step_error, reference, tokens  # noqa: E402

from madsl.cli import main  # noqa: E402
from madsl.weights import load_pretrained  # noqa: E402

TOLERANCE = 1e-4
MOE = {
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 24,
    "moe_shared_expert_intermediate_size": 20,
    "routed_scaling_factor": 2.5,
}
CHECKPOINTS = {
    "lfm2-moe": ("lfm2_moe", lambda folder: lfm2_moe(folder)),
    "lfm2-moe unnormalised, scaled": (
        "lfm2_moe",
        lambda folder: lfm2_moe(folder, norm_topk_prob=False, routed_scaling_factor=1.7),
    ),
    "nemotron-h M-*E": ("nemotron_h", lambda folder: nemotron_h(folder, "M-*E", **MOE)),
    "nemotron-h ME*E, latent experts": (
        "nemotron_h",
        lambda folder: nemotron_h(folder, "ME*E", moe_latent_size=16, **MOE),
    ),
}


@pytest.mark.parametrize("case", CHECKPOINTS, ids=CHECKPOINTS)
def test_logits_equal_transformers_through_prefill_and_step(tmp_path: Path, case: str) -> None:
    folder = CHECKPOINTS[case][1](tmp_path / "ckpt")
    ids = tokens(14)
    expected = reference(folder, ids)
    model = load_pretrained(folder)
    with torch.no_grad():
        assert (model(ids) - expected).abs().max().item() < TOLERANCE
    assert prefill_and_step_error(model, ids, expected, prompt=9) < TOLERANCE
    for module in model.modules():  # the selection bias picks the experts: without it, other logits
        if getattr(module, "selection_bias", None) is not None:
            module.selection_bias.zero_()
    with torch.no_grad():
        assert (model(ids) - expected).abs().max().item() > 100 * TOLERANCE


def test_group_limited_routing_is_refused_by_name(tmp_path: Path, capsys) -> None:
    folder = nemotron_h(tmp_path / "ckpt", "M-*E", **MOE)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "n_group": 2, "topk_group": 1}))
    assert main(["import", str(folder), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert '"topk_group"' in error and "best groups only" in error and "Traceback" not in error
    assert not (tmp_path / "out").exists()

"""The seed-004 study's pretrained backbones: `madsl import` of GPT-Neo (madsl.weights.gpt_neo) and
of Hugging Face's Mamba-1 (madsl.weights.mamba), and the study's hybrid of the two written as a spec
whose branches start from both checkpoints, frozen (docs/weights.md, "The seed-004 pretrained
hybrids"). Tiny checkpoints made here by transformers, every weight random.

Tolerance: 1e-4 absolute on logits up to ~10, float32 (tests/test_import_hf.py argues it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_checkpoints import gpt_neo, mamba, prefill_and_step_error, reference, tokens  # noqa: E402

import madsl  # noqa: E402
from madsl.cli import main  # noqa: E402
from madsl.graph import account  # noqa: E402
from madsl.weights import load_pretrained  # noqa: E402

TOLERANCE = 1e-4
CHECKPOINTS = {
    "gpt-neo tied": ("gpt_neo", lambda folder: gpt_neo(folder)),
    "gpt-neo untied": ("gpt_neo", lambda folder: gpt_neo(folder, tied=False)),
    "mamba tied": ("mamba", lambda folder: mamba(folder)),
    "mamba untied": ("mamba", lambda folder: mamba(folder, tied=False)),
}


@pytest.mark.parametrize("case", CHECKPOINTS, ids=CHECKPOINTS)
def test_logits_equal_transformers_through_prefill_and_step(tmp_path: Path, case: str) -> None:
    folder = CHECKPOINTS[case][1](tmp_path / "ckpt")
    ids = tokens(21)  # past GPT-Neo's local window of 5
    expected = reference(folder, ids)
    model = load_pretrained(folder)
    with torch.no_grad():
        assert (model(ids) - expected).abs().max().item() < TOLERANCE
    assert expected.abs().max().item() > 1.0  # logits large enough that a wrong map shows
    assert prefill_and_step_error(model, ids, expected, prompt=9) < TOLERANCE


HYBRID = """name: seed004-pretrained-hybrid
dim: 32
norm: rms
final_norm: false
positions: learned
seq_len: 64
channel_mixer: Mlp
layers:
  Ag: {primitive: attention, heads: 4, rotary: false, scale: 1.0, out_bias: true}
  Al: {base: Ag, window: 5}
  Mlp: {inner: 128, bias: true, activation: gelu}
  Mb: {d_state: 8, d_conv: 4, expand: 2, dt_rank: 2, bias: false, conv_bias: true}
topology: '((Ag:Al){norm=layer} | 2Mb){split=gated, combine=gated}'
init:
  - from: neo
    layers: [Ag, Al, Mlp]
    freeze: true
  - from: mamba
    layers: [Mb]
    freeze: true
"""


def test_the_seed004_hybrid_of_two_frozen_pretrained_backbones_trains_its_projectors_alone(tmp_path, capsys):
    """The study's Gated-res hybrid of GPT-Neo's first two layers and Mamba's first two, both frozen
    from their checkpoints: the accounting says what trains, and a MAD run leaves both backbones'
    weights bit for bit as imported."""
    for name, make in (("neo", lambda f: gpt_neo(f, layers=2)), ("mamba", lambda f: mamba(f, layers=2))):
        make(tmp_path / f"{name}-ckpt")
        assert main(["import", str(tmp_path / f"{name}-ckpt"), "--out", str(tmp_path / name), "-q"]) == 0
    spec = tmp_path / "hybrid.mad"
    spec.write_text(HYBRID)
    totals = account(madsl.load_spec(spec)).totals
    neo, mb = madsl.compiler.load(tmp_path / "neo"), madsl.compiler.load(tmp_path / "mamba")
    frozen = sum(p.numel() for p in neo.body.parameters()) + sum(p.numel() for p in mb.body.parameters())
    assert totals["frozen_params"] == frozen  # both backbones' blocks, norms included
    assert totals["trainable_params"] == totals["params"] - frozen > 0  # the projectors, embedding, positions
    tiny = ["--task", "selective-copying", "--protocol", "smoke", "--epochs", "2", "--batch-size", "8"]
    tiny += ["--set", "seq_len=20", "--set", "num_tokens_to_copy=5", "--set", "vocab_size=16"]
    tiny += ["--set", "num_train_examples=32", "--set", "num_test_examples=16"]
    db = tmp_path / "results.db"
    capsys.readouterr()
    assert main(["eval", str(spec), *tiny, "--db", str(db), "--keep", "best", "--format", "json"]) == 0
    [run_id] = json.loads(capsys.readouterr().out)["run_ids"]
    assert main(["export", run_id[:12], "-o", str(tmp_path / "run"), "--db", str(db)]) == 0
    trained = madsl.load_run(tmp_path / "run").backbone
    for symbol, saved in (("Ag", neo), ("Al", neo), ("Mlp", neo), ("Mb", mb)):
        for mine, theirs in zip(trained.named_layers[symbol], saved.named_layers[symbol]):
            assert all(torch.equal(a, b) for a, b in zip(mine.state_dict().values(), theirs.state_dict().values()))

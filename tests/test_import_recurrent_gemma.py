"""`madsl import` of RecurrentGemma (madsl.weights.recurrent_gemma; the way back out:
test_export_hf.py): a tiny checkpoint made here by transformers (Griffin's recurrent blocks and
local attention, every weight random, norms and the RG-LRU's recurrent_param included) loads into
the compiled madsl model with transformers' logits, through the parallel forward and through
prefill + step (past the attention's window of 5).

Tolerance: 1e-4 absolute on logits up to ~9 (soft-capped at 10), float32. transformers' own forward
in float64 differs from its float32 forward by ~3e-5 on these logits (its norms, rotary tables and
RG-LRU accumulator stay in float32), and madsl's by as much: the residual stream, scaled by
sqrt(hidden_size) and by norms of 1 + w, rounds alike in both; a layer at a time, in float64, madsl's
RG, attention, MLP and norms agree with transformers' to its float32 internals (< 1e-6).

What each difference from a plain stack does, each shown to matter: the norms' 1 + w (Part.offset),
the MLP's GeLU (Sg activation: gelu), the soft cap, and the embedding scale rounded to bfloat16 as
RecurrentGemmaModel's normalizer holds it (unrounded, the logits move by ~2e-3: 20 x the tolerance).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_checkpoints import prefill_and_step_error, recurrent_gemma, reference, tokens  # noqa: E402

from madsl.cli import main  # noqa: E402
from madsl.interop.huggingface.recurrent_gemma import normalizer  # noqa: E402
from madsl.weights import load_pretrained  # noqa: E402

TOLERANCE = 1e-4
CASES = {"tied": {}, "untied, attention biases": {"tied": False, "bias": True}}


def _error(model, ids, expected) -> float:
    with torch.no_grad():
        return (model(ids) - expected).abs().max().item()


@pytest.mark.parametrize("case", CASES, ids=CASES)
def test_logits_equal_transformers_through_prefill_and_step(tmp_path: Path, case: str) -> None:
    folder = recurrent_gemma(tmp_path / "ckpt", **CASES[case])
    ids = tokens(21)
    expected = reference(folder, ids)
    model = load_pretrained(folder)
    assert _error(model, ids, expected) < TOLERANCE and expected.abs().max().item() > 5.0
    assert prefill_and_step_error(model, ids, expected, prompt=9) < TOLERANCE
    assert prefill_and_step_error(model, ids, expected, prompt=1) < TOLERANCE  # every token a step


def test_each_difference_from_a_plain_stack_matters(tmp_path: Path) -> None:
    folder = recurrent_gemma(tmp_path / "ckpt")
    ids = tokens(21)
    expected = reference(folder, ids)
    model = load_pretrained(folder)
    assert model.embedding_scale == 5.65625 and model.logit_soft_cap == 10.0
    model.embedding_scale = math.sqrt(32)  # sqrt(hidden_size) not rounded to bfloat16
    assert _error(model, ids, expected) > 10 * TOLERANCE
    model.embedding_scale, model.logit_soft_cap = 5.65625, None
    assert _error(model, ids, expected) > 100 * TOLERANCE
    model.logit_soft_cap = 10.0
    mlps = [block.channel.layer for block in model.body]
    for mlp in mlps:
        mlp.gelu = False  # SiLU, a SwiGLU
    assert _error(model, ids, expected) > 100 * TOLERANCE
    for mlp in mlps:
        mlp.gelu = True
    assert _error(model, ids, expected) < TOLERANCE
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.sub_(1.0)  # the checkpoint's w, not Gemma's 1 + w
    assert _error(model, ids, expected) > 100 * TOLERANCE


def test_the_embedding_scale_is_the_normalizer_transformers_holds() -> None:
    """sqrt(hidden_size) rounded to bfloat16 without torch, as RecurrentGemmaModel's buffer."""
    for dim in [*range(1, 4097), 2560, 4096, 5120, 8192, 12288, 65536, 10**6 + 3]:
        assert normalizer(dim) == torch.tensor(dim**0.5, dtype=torch.bfloat16).item(), dim


def test_the_exact_gelu_is_refused_by_name_and_gelu_new_imports(tmp_path: Path, capsys) -> None:
    folder = recurrent_gemma(tmp_path / "ckpt", hidden_activation="gelu_new")  # GeLU's tanh formula, written out
    ids = tokens(13)
    assert _error(load_pretrained(folder), ids, reference(folder, ids)) < TOLERANCE
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_activation": "gelu"}))
    assert main(["import", str(folder), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "\"hidden_activation\" is 'gelu'" in error and "Traceback" not in error
    assert not (tmp_path / "out").exists()


def test_the_recurrent_block_is_transformers_in_float64(tmp_path: Path, monkeypatch) -> None:
    """madsl's RG with the imported weights is RecurrentGemmaRecurrentBlock (conv with its bias, the
    block-diagonal gates, c = 8, sqrt(1 - a^2) but at position 0), forward and step, to float64
    rounding, once transformers' float32 accumulator of the RG-LRU is widened to float64 too."""
    from transformers.models.recurrent_gemma import modeling_recurrent_gemma as reference_module

    scan = reference_module.RecurrentGemmaRglru._rnn_scan

    def widened(self, *args, **kwargs):
        return scan(self, *args, **{**kwargs, "acc_dtype": torch.float64})

    monkeypatch.setattr(reference_module.RecurrentGemmaRglru, "_rnn_scan", widened)
    folder = recurrent_gemma(tmp_path / "ckpt")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder).eval().double()
    ours = load_pretrained(folder).double()
    x = torch.randn(2, 21, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(21).expand(2, 21)
    with torch.no_grad():
        for i in (0, 1, 3):  # the recurrent layers
            expected = theirs.model.layers[i].temporal_block(x, positions, None, use_cache=False)[0]
            layer = ours.body[i].mixer.layer
            state, steps = layer.init_state(2), []
            for t in range(21):
                y, state = layer.step(x[:, t], state)
                steps.append(y)
            assert (layer(x) - expected).abs().max().item() < 1e-12
            assert (torch.stack(steps, 1) - expected).abs().max().item() < 1e-12

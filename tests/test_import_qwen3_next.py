"""`madsl import` of Qwen3-Next and Qwen3.5 (madsl.weights.qwen3_next; the way back out:
test_export_hf.py): tiny checkpoints made here by transformers (every weight random, the
zero-centred norms, the Gated DeltaNet's output norm, A_log and dt_bias included) load into the
compiled madsl model with transformers' logits, through the parallel forward and through prefill +
step, and each option the map needs moves the logits by far more than the tolerance when off.

Tolerance: 1e-4 absolute in float32 on logits up to about 7, over 21 tokens (one chunk of both
chunked delta rules: madsl's WY form and transformers' torch_chunk_gated_delta_rule, both of 64);
measured at most 4.3e-5 in the parallel forward. Prefill + step is compared with transformers' own
cached decoding (its recurrent delta rule, as madsl's step): at most 5.5e-5. transformers' parallel
and cached logits of one checkpoint differ from each other by up to 2.9e-4 on these random models
(Qwen3.5-MoE's), so its parallel logits are no reference for a recurrent form to 1e-4. Over 80
tokens (two chunks) the tolerance is 2e-4: there float32 rounding alone moves madsl's logits by
4.1e-4 from its own float64 ones (checked below: madsl's error must be the smaller), and madsl's
float32 logits differ from transformers' by 6.5e-5 (prefill + step: 5.7e-5; 1.0e-4 on another seed).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_checkpoints import prefill_and_step_error, qwen3_5, qwen3_next, reference, tokens  # noqa: E402

from madsl.cli import main  # noqa: E402
from madsl.weights import import_checkpoint, load_pretrained  # noqa: E402

TOLERANCE = 1e-4
ACROSS_CHUNKS = 2e-4
PROMPT = 9
CASES = {
    "qwen3-next": lambda folder: qwen3_next(folder),
    "qwen3.5": lambda folder: qwen3_5(folder),
    "qwen3.5-moe": lambda folder: qwen3_5(folder, experts=True),
    "qwen3.5 vision-language": lambda folder: qwen3_5(folder, vision=True),
    "qwen3.5-moe vision-language": lambda folder: qwen3_5(folder, experts=True, vision=True),
}


def cached_logits(folder: Path, ids, prompt: int):
    """transformers' logits of `ids` through its cache: the first `prompt` tokens at once, then one
    token a call (its recurrent delta rule and causal_conv1d_update, as madsl's step)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model(ids[:, :prompt], use_cache=True)
        logits = [out.logits]
        for position in range(prompt, ids.shape[1]):
            out = model(ids[:, position : position + 1], cache=out.past_key_values, use_cache=True)
            logits.append(out.logits)
    return torch.cat(logits, dim=1)


@pytest.mark.parametrize("case", CASES, ids=CASES)
def test_logits_equal_transformers_through_prefill_and_step(tmp_path: Path, case: str) -> None:
    folder = CASES[case](tmp_path / "ckpt")
    ids = tokens(21)
    expected = reference(folder, ids)
    imported = import_checkpoint(folder)
    with torch.no_grad():
        got = imported.model(ids)
    assert (got - expected).abs().max().item() < TOLERANCE and expected.abs().max().item() > 2.0
    assert prefill_and_step_error(imported.model, ids, cached_logits(folder, ids, PROMPT), PROMPT) < TOLERANCE
    if "vision" in case:  # the vision encoder is left out, as AutoModelForCausalLM leaves it, and said
        assert any(note.startswith("not imported: the vision encoder") for note in imported.notes)


def test_across_chunks_the_difference_is_float32_rounding(tmp_path: Path) -> None:
    folder = qwen3_next(tmp_path / "ckpt")
    ids = tokens(80)
    expected = reference(folder, ids)
    model = load_pretrained(folder)
    with torch.no_grad():
        got = model(ids)
        error = (got - expected).abs().max().item()
        rounding = (got - model.double()(ids)).abs().max().item()  # madsl's own float32 against its float64
    assert error < ACROSS_CHUNKS and error < rounding
    assert prefill_and_step_error(model.float(), ids, cached_logits(folder, ids, 40), 40) < ACROSS_CHUNKS


def _moved(model, ids, expected) -> float:
    with torch.no_grad():
        return (model(ids) - expected).abs().max().item()


def test_each_option_the_map_needs_moves_the_logits(tmp_path: Path) -> None:
    """Off, each moves the logits by far more than the tolerance: the norms' 1 + w and, at an
    rms_norm_eps of 0.05, the attention's q/k norms' and the DeltaNet's output norm's epsilon."""
    folder = qwen3_next(tmp_path / "ckpt", rms_norm_eps=0.05)
    ids = tokens(21)
    expected = reference(folder, ids)
    model = load_pretrained(folder)
    assert _moved(model, ids, expected) < TOLERANCE
    attention, delta_net = model.body[1].mixer.layer, model.body[0].mixer.layer
    changes = {
        "q/k norm eps": [(attention.q_norm, "eps", 1e-5), (attention.k_norm, "eps", 1e-5)],
        "output norm eps": [(delta_net.o_norm, "eps", 1e-5), (model.body[2].mixer.layer.o_norm, "eps", 1e-5)],
    }
    for what, edits in changes.items():
        before = [getattr(module, name) for module, name, _ in edits]
        for module, name, value in edits:
            setattr(module, name, value)
        assert _moved(model, ids, expected) > 10 * TOLERANCE, what
        for (module, name, _), value in zip(edits, before):
            setattr(module, name, value)
    with torch.no_grad():
        model.final_norm.weight -= 1.0  # the checkpoint's w as it stands, not 1 + w
    assert _moved(model, ids, expected) > 0.1


def test_short_queries_and_keys_need_the_l2_norms_epsilon(tmp_path: Path) -> None:
    """transformers' l2norm divides by sqrt(||x||^2 + 1e-6): where the short convolution makes q and
    k short (its q and k taps scaled by 1e-3 here), F.normalize's x / ||x|| gives other logits."""
    from safetensors.torch import load_file, save_file

    folder = qwen3_5(tmp_path / "ckpt")
    tensors = load_file(folder / "model.safetensors")
    conv = tensors["model.layers.0.linear_attn.conv1d.weight"]
    conv[:32] *= 1e-3  # the q and k channels (2 key heads of 8 each)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    ids = tokens(21)
    expected = reference(folder, ids)
    model = load_pretrained(folder)
    assert _moved(model, ids, expected) < TOLERANCE
    model.body[0].mixer.layer.l2norm_eps = 0.0
    assert _moved(model, ids, expected) > 10 * TOLERANCE


def test_the_qkvz_layout_is_grouped_per_key_head(tmp_path: Path) -> None:
    """Qwen3-Next's in_proj_qkvz read as one [q | k | v | z] block (not per key head) gives other logits."""
    folder = qwen3_next(tmp_path / "ckpt")
    ids = tokens(21)
    expected = reference(folder, ids)
    model = load_pretrained(folder)
    from safetensors.torch import load_file

    fused = load_file(folder / "model.safetensors")["model.layers.0.linear_attn.in_proj_qkvz.weight"]
    layer = model.body[0].mixer.layer
    with torch.no_grad():
        q, k, v, z = fused.split((16, 16, 64, 64))
        for projection, rows in zip((layer.q_proj, layer.k_proj, layer.v_proj, layer.g_proj), (q, k, v, z)):
            projection.weight.copy_(rows)
    assert _moved(model, ids, expected) > 10 * TOLERANCE


def test_the_multi_token_prediction_head_is_left_out_and_said(tmp_path: Path, capsys) -> None:
    from safetensors.torch import load_file, save_file

    folder = qwen3_5(tmp_path / "ckpt")
    tensors = load_file(folder / "model.safetensors")
    save_file({**tensors, "mtp.fc.weight": torch.ones(32, 64)}, folder / "model.safetensors", metadata={"format": "pt"})
    assert main(["import", str(folder), "--out", str(tmp_path / "out")]) == 0
    assert "not imported: the multi-token prediction head (1 tensors, mtp.fc.weight" in capsys.readouterr().out


def test_an_attention_bias_is_refused_by_name(tmp_path: Path, capsys) -> None:
    folder = qwen3_next(tmp_path / "ckpt", attention_bias=True)
    assert main(["import", str(folder), "--out", str(tmp_path / "out")]) == 2
    assert '"attention_bias" is true' in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_vision_language_model_exports_as_its_language_model_either_way(tmp_path: Path, capsys) -> None:
    """`--to-hf qwen3_5` writes the vision-language config (the stack as its text_config) with the
    language model's tensors under model.language_model.; `--to-hf qwen3_5_text` the text model alone."""
    folder = qwen3_5(tmp_path / "ckpt", vision=True)
    assert main(["import", str(folder), "--out", str(tmp_path / "madsl"), "-q"]) == 0
    assert main(["export", str(tmp_path / "madsl"), "--to-hf", "qwen3_5", "-o", str(tmp_path / "vl"), "-q"]) == 0
    config = json.loads((tmp_path / "vl" / "config.json").read_text())
    assert config["model_type"] == "qwen3_5" and config["text_config"]["model_type"] == "qwen3_5_text"
    assert main(["export", str(tmp_path / "madsl"), "--to-hf", "qwen3_5_text", "-o", str(tmp_path / "hf"), "-q"]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["Qwen3_5ForCausalLM"]

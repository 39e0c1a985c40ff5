"""`madsl import` of Falcon-H1 (madsl.weights.falcon_h1; the way back out: test_export_hf.py): tiny
checkpoints made here by transformers (attention beside a Mamba-2 of one or two groups in every
layer, every weight random, every µP multiplier off its default) load into the compiled madsl model
with transformers' logits, through prefill + step too; each multiplier matters (left at its default,
the logits move by far more than the tolerance), and what madsl cannot compute as Falcon-H1 does is
refused by name. Tolerance: 1e-4 absolute on logits up to about 5, float32 (tests/test_import_hf.py):
the multipliers folded into the weights round once where transformers rounds twice, and the scans
are grouped differently: measured at most 5.6e-6 here, 2.1e-5 for test_export_hf.py's tied, biased,
gated-norm checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from hf_checkpoints import FALCON_H1_MULTIPLIERS, falcon_h1, prefill_and_step_error, reference, tokens  # noqa: E402

from madsl.cli import main  # noqa: E402
from madsl.weights import load_pretrained  # noqa: E402

TOLERANCE = 1e-4
CASES = {
    "untied, 2 groups": {},
    "tied, 1 group": {"tied": True, "groups": 1},
    "biases": {"bias": True},
    "gated norm, eps 1e-6": {"gated_norm": True},
}


@pytest.mark.parametrize("case", CASES, ids=CASES)
def test_logits_equal_transformers_through_prefill_and_step(tmp_path: Path, case: str) -> None:
    folder = falcon_h1(tmp_path / "ckpt", **CASES[case])
    ids = tokens(21)
    expected = reference(folder, ids)
    model = load_pretrained(folder)
    with torch.no_grad():
        got = model(ids)
    assert (got - expected).abs().max().item() < TOLERANCE and expected.abs().max().item() > 1.0
    assert prefill_and_step_error(model, ids, expected, prompt=9) < TOLERANCE


def _defaulted_one_at_a_time() -> list[tuple[str, object]]:
    """Each multiplier (each element of the lists) at its default, 1, the others as they were."""
    out: list[tuple[str, object]] = []
    for key, value in FALCON_H1_MULTIPLIERS.items():
        if isinstance(value, list):
            out += [(key, [1.0 if j == i else v for j, v in enumerate(value)]) for i in range(len(value))]
        else:
            out.append((key, 1.0))
    return out


def test_every_multiplier_moves_the_logits(tmp_path: Path) -> None:
    """A map that dropped any one multiplier would be caught: reading it at 1 instead moves the
    logits by 0.4 or more (the dt segment of ssm_multipliers least)."""
    folder = falcon_h1(tmp_path / "ckpt")
    ids = tokens(21)
    expected = reference(folder, ids)
    config = json.loads((folder / "config.json").read_text())
    for key, value in _defaulted_one_at_a_time():
        (folder / "config.json").write_text(json.dumps({**config, key: value}))
        with torch.no_grad():
            moved = (load_pretrained(folder)(ids) - expected).abs().max().item()
        assert moved > 1000 * TOLERANCE, (key, value, moved)


def test_export_folds_the_multipliers_into_the_weights(tmp_path: Path) -> None:
    """The exported config states the folded multipliers at 1 (absent: FalconH1Config's default)
    and the embedding's and lm_head's from the spec; the weights carry the others."""
    original = falcon_h1(tmp_path / "ckpt")
    assert main(["import", str(original), "--out", str(tmp_path / "madsl"), "-q"]) == 0
    assert main(["export", str(tmp_path / "madsl"), "--to-hf", "falcon_h1", "-o", str(tmp_path / "hf"), "-q"]) == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["embedding_multiplier"] == 1.7 and config["lm_head_multiplier"] == pytest.approx(0.6, rel=1e-15)
    assert not {"key_multiplier", "ssm_multipliers", "mlp_multipliers", "attention_in_multiplier"} & set(config)
    before = safetensors_torch.load_file(str(original / "model.safetensors"))
    after = safetensors_torch.load_file(str(tmp_path / "hf" / "model.safetensors"))
    o_proj = "model.layers.1.self_attn.o_proj.weight"
    torch.testing.assert_close(after[o_proj], before[o_proj] * 1.3)  # attention_out_multiplier
    k_proj = "model.layers.0.self_attn.k_proj.weight"
    torch.testing.assert_close(after[k_proj], before[k_proj] * 0.8 * 0.45)  # attention_in x key
    dt_rows = "model.layers.0.mamba.in_proj.weight"
    torch.testing.assert_close(after[dt_rows][-4:], before[dt_rows][-4:] * 1.25 * 1.5)  # ssm_in x mup_vector's dt


def _refused(tmp_path: Path, folder: Path, capsys, *needles: str) -> None:
    assert main(["import", str(folder), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert all(needle in error for needle in needles) and "Traceback" not in error, error
    assert not (tmp_path / "out").exists()


def _with_config(folder: Path, **changes: object) -> Path:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"key_multiplier": 0.0}, '"key_multiplier" is 0.0'),
        ({"ssm_multipliers": [1.0, 1.0, -1.0, 1.0, 1.0]}, '"ssm_multipliers[2]" is -1.0'),
        ({"mlp_multipliers": [1.0]}, "a list of 2 multipliers"),
        ({"hidden_act": "gelu"}, "\"hidden_act\" is 'gelu'"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}}, "whole heads"),
        ({"time_step_limit": [0.0, 1.0]}, "clamps the Mamba-2 step size"),
        ({"mamba_rms_norm": True, "mamba_norm_before_gate": True}, "normalises after it"),
    ],
)
def test_what_madsl_cannot_compute_is_refused_by_key(tmp_path: Path, capsys, changes: dict, needle: str) -> None:
    _refused(tmp_path, _with_config(falcon_h1(tmp_path / "ckpt"), **changes), capsys, needle)


def test_a_stored_mup_vector_is_refused_by_name(tmp_path: Path, capsys) -> None:
    """transformers does not save its mup_vector (a buffer, persistent=False): a checkpoint that holds
    one anyway was written by something else, and madsl does not guess which vector it computes with."""
    folder = falcon_h1(tmp_path / "ckpt")
    tensors = safetensors_torch.load_file(str(folder / "model.safetensors"))
    tensors["model.layers.0.mamba.mup_vector"] = torch.ones(1, 1, 164)
    safetensors_torch.save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    _refused(tmp_path, folder, capsys, "'model.layers.0.mamba.mup_vector'", "cannot place")


def test_a_spec_falcon_h1_cannot_state_is_refused_on_the_way_out() -> None:
    """A residual scale, which Falcon-H1 lacks, is not dropped from the config madsl writes."""
    import madsl
    from madsl.hf_config import from_hf_config, to_hf_config
    from madsl.spec import spec_from_data

    public = Path(__file__).resolve().parent.parent / "specs/public/falcon-h1-0.5b.config.json"
    data = from_hf_config(json.loads(public.read_text()))
    written = to_hf_config(spec_from_data({**data, "embedding_scale": 2.0, "logit_divisor": 4.0}), "falcon_h1")
    assert (written["embedding_multiplier"], written["lm_head_multiplier"]) == (2.0, 0.25)
    with pytest.raises(madsl.MadslError, match="no residual scale"):
        to_hf_config(spec_from_data({**data, "residual_scale": 0.5}), "falcon_h1")

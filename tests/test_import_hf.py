"""`madsl import` / `madsl.load_pretrained`: a tiny checkpoint made here by transformers (random
weights, `save_pretrained`) loads into the compiled madsl model with transformers' logits, through
the parallel forward and through prefill + step; a checkpoint madsl cannot fill exactly (a tensor
missing, one extra, one of another shape, a pickle file, a norm madsl does not compute) is refused
by name with exit status 2 and nothing written.

Tolerance: 1e-4 absolute on logits of magnitude ~1-10, all in float32. The two models run the same
operations in another grouping (madsl's one fused q/k/v projection against three, SDPA against
transformers' attention, torch's RMSNorm against LFM2's), so each op rounds differently at float32's
~6e-8 relative precision. Through four layers, on logits up to ~6.5, that is at most ~2.4e-6 in the
parallel forward and ~1e-5 through prefill + step (measured with transformers 5.24, torch 2.13 CPU);
1e-4 leaves a tenfold margin, while a wrong map (a swapped or transposed tensor, a missing norm) moves
logits by 1e-1 or more."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from hf_checkpoints import VOCAB, lfm2, prefill_and_step_error, reference, tokens  # noqa: E402

from madsl.cli import main  # noqa: E402
from madsl.compiler import load  # noqa: E402
from madsl.errors import MadslError  # noqa: E402
from madsl.weights import load_pretrained  # noqa: E402

TOLERANCE = 1e-4  # float32, see the module docstring


@pytest.mark.parametrize(("tied", "bias"), [(True, False), (False, True)])
def test_lfm2_logits_equal_transformers(tmp_path: Path, tied: bool, bias: bool) -> None:
    folder = lfm2(tmp_path / "ckpt", tied=tied, bias=bias)
    ids = tokens()
    expected = reference(folder, ids)
    model = load_pretrained(folder)
    with torch.no_grad():
        got = model(ids)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() < TOLERANCE
    assert expected.abs().max().item() > 1.0  # logits large enough that a wrong map shows


def test_lfm2_prefill_and_step_equal_transformers(tmp_path: Path) -> None:
    folder = lfm2(tmp_path / "ckpt", tied=False, bias=True)
    ids = tokens(12)
    expected = reference(folder, ids)
    assert prefill_and_step_error(load_pretrained(folder), ids, expected, prompt=7) < TOLERANCE


def test_sharded_checkpoint_and_cli_outputs(tmp_path: Path, capsys) -> None:
    folder = lfm2(tmp_path / "ckpt", shard="20KB")
    assert (folder / "model.safetensors.index.json").is_file()
    assert len(list(folder.glob("*.safetensors"))) > 1
    ids = tokens()
    expected = reference(folder, ids)
    spec, out = tmp_path / "lfm2.mad", tmp_path / "model"
    assert main(["import", str(folder), "-o", str(spec), "--out", str(out), "--name", "tiny-lfm2", "-q"]) == 0
    with torch.no_grad():
        assert (load(out)(ids) - expected).abs().max().item() < TOLERANCE
    import madsl

    assert main(["import", str(folder), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["spec"]["topology"] == "(GConv-Sg:A-Sg)x2"
    assert madsl.load_spec(spec).name == "tiny-lfm2"
    assert madsl.account(madsl.load_spec(spec)).totals["params"] == sum(
        p.numel() for p in transformers.AutoModelForCausalLM.from_pretrained(folder).parameters()
    )


def _rewrite(folder: Path, change) -> None:
    path = folder / "model.safetensors"
    tensors = safetensors_torch.load_file(str(path))
    change(tensors)
    safetensors_torch.save_file(tensors, str(path))


def _refused(tmp_path: Path, folder: Path, capsys, *words: str) -> None:
    spec, out = tmp_path / "out.mad", tmp_path / "out-model"
    assert main(["import", str(folder), "-o", str(spec), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    for word in words:
        assert word in error
    assert not spec.exists() and not out.exists()  # nothing written
    with pytest.raises(MadslError):
        load_pretrained(folder)


def test_missing_tensor_refused_by_name(tmp_path: Path, capsys) -> None:
    folder = lfm2(tmp_path / "ckpt")
    _rewrite(folder, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    _refused(tmp_path, folder, capsys, "lacks 'model.layers.1.self_attn.k_proj.weight'")


def test_extra_tensor_refused_by_name(tmp_path: Path, capsys) -> None:
    folder = lfm2(tmp_path / "ckpt")
    _rewrite(folder, lambda t: t.update({"model.layers.0.adapter.weight": torch.zeros(4, 4)}))
    _refused(tmp_path, folder, capsys, "'model.layers.0.adapter.weight'", "cannot place")


def test_wrong_shape_refused_by_name(tmp_path: Path, capsys) -> None:
    folder = lfm2(tmp_path / "ckpt")
    _rewrite(folder, lambda t: t.update({"model.layers.2.conv.conv.weight": torch.zeros(32, 1, 4)}))
    _refused(tmp_path, folder, capsys, "'model.layers.2.conv.conv.weight' has shape [32, 1, 4]", "[32, 1, 3]")


def test_pickle_file_refused_by_name(tmp_path: Path, capsys) -> None:
    folder = lfm2(tmp_path / "ckpt")
    (folder / "model.safetensors").unlink()
    torch.save({"model.embed_tokens.weight": torch.zeros(VOCAB, 32)}, folder / "pytorch_model.bin")
    _refused(tmp_path, folder, capsys, "pytorch_model.bin", "pickle")


def test_tied_head_that_differs_refused(tmp_path: Path, capsys) -> None:
    folder = lfm2(tmp_path / "ckpt")
    _rewrite(folder, lambda t: t.update({"lm_head.weight": torch.ones(VOCAB, 32)}))
    _refused(tmp_path, folder, capsys, "'lm_head.weight' differs")


def test_norm_madsl_does_not_compute_refused(tmp_path: Path, capsys) -> None:
    folder = lfm2(tmp_path / "ckpt", norm_eps=1e-6)
    _refused(tmp_path, folder, capsys, '"norm_eps"')


def test_sharded_index_that_disagrees_with_its_shards_refused(tmp_path: Path, capsys) -> None:
    folder = lfm2(tmp_path / "ckpt", shard="20KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.0.adapter.weight"] = next(iter(index["weight_map"].values()))
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    _refused(tmp_path, folder, capsys, "model.safetensors.index.json", "'model.layers.0.adapter.weight'")


@pytest.mark.parametrize(
    "model_type, message",
    [
        ("zamba", "madsl imports no 'zamba' weights yet"),  # no name map
        ("hymba", "madsl imports no 'hymba' weights: Hymba's only implementation"),  # none, with the reason
    ],
)
def test_a_family_without_weights_refused_by_name(tmp_path: Path, capsys, model_type, message) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": model_type, "hidden_size": 32}))
    safetensors_torch.save_file({"model.embed_tokens.weight": torch.zeros(4, 32)}, str(folder / "model.safetensors"))
    _refused(tmp_path, folder, capsys, message)


def test_every_family_convert_reads_has_a_name_map() -> None:
    """`madsl import` reads every family `madsl convert --from-hf` reads (issue 42), the vision-language
    Qwen3.5 configs too (their language model); the families convert refuses by name have none."""
    from madsl.interop.huggingface.families import FAMILIES, LANGUAGE_MODELS, REFUSED
    from madsl.weights.mapping import NOT_IMPORTED, families

    assert set(families()) | set(NOT_IMPORTED) == set(FAMILIES) | set(LANGUAGE_MODELS)
    assert not set(families()) & (set(REFUSED) | set(NOT_IMPORTED))


def test_partial_rotary_lfm2_does_not_read_refused(tmp_path: Path, capsys) -> None:
    folder = lfm2(tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"]["partial_rotary_factor"] = 0.5
    (folder / "config.json").write_text(json.dumps(config))
    _refused(tmp_path, folder, capsys, '"partial_rotary_factor"')

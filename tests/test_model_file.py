"""madsl's one model file format (madsl/model_file.py): `madsl.compiler.save` / `load` write and read
the folder kept runs use (model.safetensors + config.json); an old pickle file is refused, never loaded."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

import madsl
from madsl.compiler import load, save
from madsl.runner.store import kept

pytest.importorskip("safetensors")
torch.set_num_threads(1)

HYENA = "specs/paper/striped-hyena-moe.mad"


def _states_equal(a: dict, b: dict) -> bool:
    """The same names, dtypes, shapes and bits."""
    return list(a) == list(b) and all(
        a[k].dtype == b[k].dtype
        and a[k].shape == b[k].shape
        and torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8))
        if a[k].numel()
        else a[k].shape == b[k].shape
        for k in a
    )


def test_a_saved_model_loads_bit_identical(tmp_path):
    model = madsl.compile(HYENA, vocab_size=16, max_seq_len=32, seed=3)
    with torch.no_grad():
        for p in model.parameters():  # weights no fresh build has
            p.add_(torch.randn_like(p) * 1e-3)
    folder = save(model, tmp_path / "m")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    again = load(folder)
    assert _states_equal(model.state_dict(), again.state_dict())
    tokens = torch.randint(0, 16, (2, 12))
    model.eval(), again.eval()
    assert torch.equal(model(tokens), again(tokens))
    config = json.loads((folder / "config.json").read_text())
    assert config["format"] == "madsl-model/2" and config["spec"] == model.spec.data
    assert config["build"] == {"vocab_size": 16, "num_classes": 16, "max_seq_len": 32}


def test_a_shared_layer_is_saved_under_each_name_and_loads_shared(tmp_path):
    """A tag used twice is one module under two names: safetensors refuses tensors that share
    memory, so each name gets its own copy, and loading shares them again."""
    model = madsl.compile(madsl.spec_from_topology("H#a:A:H#a", dim=16), vocab_size=8, max_seq_len=8)
    state = model.state_dict()
    assert len({t.data_ptr() for t in state.values()}) < len(state)  # names that share a tensor
    again = load(save(model, tmp_path / "m"))
    assert _states_equal(state, again.state_dict())
    assert len({t.data_ptr() for t in again.state_dict().values()}) == len({t.data_ptr() for t in state.values()})
    tokens = torch.randint(0, 8, (1, 6))
    assert torch.equal(model(tokens), again(tokens))


def test_save_is_the_kept_models_format(tmp_path):
    """One writer and one reader: the files kept.py writes and those compiler.save writes differ
    only in config.json's tag and what it adds."""
    from madsl import model_file

    model = madsl.compile("specs/paper/mamba.mad", vocab_size=8, max_seq_len=16)
    folder = save(model, tmp_path / "m")
    assert (
        (model_file.WEIGHTS, model_file.CONFIG)
        == (kept.WEIGHTS, kept.CONFIG)
        == tuple(sorted(p.name for p in folder.iterdir()))[::-1]
    )
    assert kept.safetensors_torch is model_file.safetensors_torch


@pytest.mark.parametrize("kind", ["torch.save archive", "bare pickle", "pickle in a folder"])
def test_an_old_pickle_model_is_refused_never_unpickled(tmp_path, kind, monkeypatch):
    model = madsl.compile("specs/paper/mamba.mad", vocab_size=8, max_seq_len=16)
    path = tmp_path / "model.pt"
    if kind == "torch.save archive":  # what madsl 0.2.0's save wrote
        torch.save(
            {
                "format": "madsl-model/1",
                "spec": model.spec.data,
                "vocab_size": 8,
                "num_classes": 8,
                "max_seq_len": 16,
                "state_dict": model.state_dict(),
            },
            path,
        )
    elif kind == "bare pickle":
        path.write_bytes(pickle.dumps({"format": "madsl-model/1"}))
    else:
        path = tmp_path / "old"
        path.mkdir()
        torch.save({"format": "madsl-model/1"}, path / "model.pt")

    def no_unpickling(*args, **kwargs):
        raise AssertionError("unpickled")

    monkeypatch.setattr(torch, "load", no_unpickling)
    monkeypatch.setattr(pickle, "load", no_unpickling)
    monkeypatch.setattr(pickle, "loads", no_unpickling)
    with pytest.raises(madsl.MadslError) as err:
        load(path)
    text = err.value.render()
    assert "old pickle format" in text and "no longer reads" in text and "run any code" in text
    assert "--emit torch" in text and "docs/guide.md" in text and str(tmp_path) in text


def test_not_a_model_is_a_clear_error(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(madsl.MadslError, match="not a saved madsl model"):
        load(tmp_path / "notes.txt")
    with pytest.raises(madsl.MadslError, match="not a saved madsl model"):
        load(tmp_path)  # a folder without config.json
    model = madsl.compile("specs/paper/mamba.mad", vocab_size=8, max_seq_len=16)
    folder = save(model, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    config["build"]["vocab_size"] = 2**40
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(madsl.MadslError, match="build.vocab_size must be an integer") as err:
        load(folder)
    assert str(folder / "config.json") in str(err.value)


def test_save_into_a_file_or_over_a_link_is_refused_and_touches_nothing(tmp_path):
    model = madsl.compile("specs/paper/mamba.mad", vocab_size=8, max_seq_len=16)
    (tmp_path / "model.pt").write_bytes(b"PK\x03\x04 an old model")
    with pytest.raises(madsl.MadslError, match="not a directory"):
        save(model, tmp_path / "model.pt")
    assert (tmp_path / "model.pt").read_bytes() == b"PK\x03\x04 an old model"
    folder = tmp_path / "m"
    folder.mkdir()
    (tmp_path / "victim").write_text("untouched")
    (folder / "config.json").symlink_to(tmp_path / "victim")
    with pytest.raises(madsl.MadslError, match="not a regular file"):
        save(model, folder)
    assert (tmp_path / "victim").read_text() == "untouched"

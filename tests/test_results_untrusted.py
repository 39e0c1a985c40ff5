"""Every file madsl reads back from its results folder (`<db>.files/`) is untrusted input.

Others may write to a results folder (a shared disk, a copied folder), and a disk can fill up
under it. What madsl finds there is checked before it is used: the cached task data,
checkpoints, kept models (config.json and model.safetensors). (The plan's rate cache lives
outside it and is checked the same way: tests/test_plan_rate.py.) A damaged cache is discarded with a
warning and rebuilt; a symbolic link is
refused with an error naming it and left as it is, as is what it points to; a planted config
is refused before the model it describes is allocated; a write that fails says why in words.
"""

from __future__ import annotations

import errno
import io
import json
import pickle
import resource
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from runner_helpers import TOY_TASKS, run_rows, run_toy_eval

import madsl
from madsl.cli import main
from madsl.errors import MadslError
from madsl.runner.store import kept
from madsl.runner.store.database import StoreError
from madsl.runner.store.results import Store
from madsl.runner.train import checkpoint as checkpoints
from madsl.runner.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from madsl.tasks import cache

torch.set_num_threads(1)
SPEC = str(Path(__file__).resolve().parent.parent / "specs" / "paper" / "hyena-sg.mad")
TINY = [
    "--task",
    "in-context-recall",
    "--protocol",
    "smoke",
    "--epochs",
    "1",
    "--batch-size",
    "8",
    "--set",
    "seq_len=16",
    "--set",
    "num_train_examples=16",
    "--set",
    "num_test_examples=8",
]


def _files(db: Path) -> Path:
    return db.with_name(db.stem + ".files")


def _elsewhere(tmp_path: Path) -> tuple[Path, dict]:
    """A folder outside the results folder, with a file in it; and what it holds, to compare after."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "precious.txt").write_text("not madsl's")
    return target, _snapshot(target)


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- the data cache (data/*.npz) ---------------------------------------------------------------

TASK = TOY_TASKS["toy-previous"]
SETTING = {"num_train_examples": 32, "num_test_examples": 16}


def _arrays(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def _save(path: Path, arrays: dict) -> None:
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def _huge_header(path: Path) -> None:
    """A file whose inputs header claims 10^12 rows (8 TB) over a few bytes of data."""
    arrays = _arrays(path)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i8", "fortran_order": False, "shape": (10**12, 16)})
    with zipfile.ZipFile(path, "w") as z:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, array)
            z.writestr(
                f"{name}.npy",
                b"\x93NUMPY\x01\x00" + header.getvalue() + b"\0" * 64 if name == "inputs" else buffer.getvalue(),
            )


CORRUPT_NPZ = {
    "truncated": lambda path: path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2]),
    "empty": lambda path: path.write_bytes(b""),
    "garbage": lambda path: path.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8),
    "no targets": lambda path: _save(path, {k: v for k, v in _arrays(path).items() if k != "targets"}),
    "rows of another setting": lambda path: _save(
        path, {**_arrays(path), "inputs": _arrays(path)["inputs"][:5], "targets": _arrays(path)["targets"][:5]}
    ),
    "another sequence length": lambda path: _save(
        path, {**_arrays(path), "inputs": _arrays(path)["inputs"][:, :7], "targets": _arrays(path)["targets"][:, :7]}
    ),
    "tokens outside the vocabulary": lambda path: _save(
        path, {**_arrays(path), "inputs": np.full_like(_arrays(path)["inputs"], 10**4)}
    ),
    "targets outside the classes": lambda path: _save(
        path, {**_arrays(path), "targets": np.full_like(_arrays(path)["targets"], 99)}
    ),
    "floats where tokens belong": lambda path: _save(
        path, {**_arrays(path), "inputs": _arrays(path)["inputs"].astype(np.float64)}
    ),
    "dtypes.json naming objects": lambda path: _save(
        path, {**_arrays(path), "dtypes.json": np.array(json.dumps({"inputs": "object", "targets": "int64"}))}
    ),
    "meta.json nested deeply": lambda path: _save(
        path, {**_arrays(path), "meta.json": np.array("[" * 100_000 + "]" * 100_000)}
    ),
    "an extra array": lambda path: _save(path, {**_arrays(path), "payload": np.zeros(3)}),
    "a header claiming 8 TB": _huge_header,
}


@pytest.mark.parametrize("kind", sorted(CORRUPT_NPZ))
def test_a_damaged_cached_split_is_deleted_with_a_warning_and_generated_again(tmp_path, kind):
    folder = tmp_path / "data"
    expected = cache.load_or_generate(TASK, SETTING, "train", 0, folder)
    path = cache.cache_path(TASK, SETTING, "train", 0, folder)
    CORRUPT_NPZ[kind](path)
    started = time.monotonic()
    with pytest.warns(RuntimeWarning, match="not a valid cached split") as caught:
        data = cache.load_or_generate(TASK, SETTING, "train", 0, folder)
    assert time.monotonic() - started < 5
    assert str(path) in str(caught[0].message) and "deleted" in str(caught[0].message)
    assert np.array_equal(data.inputs, expected.inputs) and data.inputs.dtype == np.int64
    assert np.array_equal(data.targets, expected.targets)
    assert sorted(p.name for p in folder.iterdir()) == [path.name]  # regenerated; no temporaries left
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the new file reads back clean
        again = cache.load_or_generate(TASK, SETTING, "train", 0, folder)
    assert np.array_equal(again.inputs, expected.inputs)


def test_a_run_over_truncated_cached_data_succeeds_and_regenerates_it(tmp_path):
    db = tmp_path / "r.db"
    assert run_toy_eval(db, epochs=1)["done"] == 1
    files = sorted((_files(db) / "data").glob("*.npz"))
    assert len(files) == 2
    for path in files:
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        summary = run_toy_eval(db, epochs=1, lr=1e-3)  # another run of the same setting: the same data
    assert summary["done"] == 1 and summary["failed"] == {}, summary["failed"]
    for path in files:  # whole again
        data = cache._read(path)
        assert data.inputs.shape[0] > 0 and data.inputs.shape == data.targets.shape


def test_a_failed_cache_write_only_warns(tmp_path, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache, "save_npz_atomic", disk_full)
    with pytest.warns(RuntimeWarning, match="no space left on device"):
        data = cache.load_or_generate(TASK, SETTING, "train", 0, tmp_path)
    assert data.inputs.shape == (32, 16)


# --- symbolic links in the results folder ------------------------------------------------------


@pytest.mark.parametrize("entry", ["checkpoints", "data", "models", "step-times.json"])
def test_a_symlinked_entry_of_the_results_folder_is_refused_before_anything_runs(tmp_path, entry):
    db = tmp_path / "r.db"
    target, before = _elsewhere(tmp_path)
    _files(db).mkdir()
    link = _files(db) / entry
    link.symlink_to(target if entry != "step-times.json" else target / "precious.txt")
    for dry_run in (True, False):
        with pytest.raises(StoreError, match="symbolic link") as err:
            run_toy_eval(db, epochs=1, dry_run=dry_run)
        assert str(link) in str(err.value)
    assert link.is_symlink() and _snapshot(target) == before
    assert not db.exists()


def test_a_symlinked_checkpoint_fails_its_run_and_is_left_as_it_is(tmp_path):
    db = tmp_path / "r.db"
    [run] = run_toy_eval(db, epochs=1, dry_run=True)["plan"]["per_run"]
    target, before = _elsewhere(tmp_path)
    link = _files(db) / "checkpoints" / f"{run['run_id']}.pt"
    link.parent.mkdir(parents=True)
    link.symlink_to(target / "precious.txt")
    for _ in range(2):  # a retry fails the same way: nothing was deleted
        summary = run_toy_eval(db, epochs=1)
        assert list(summary["failed"]) == [run["run_id"]]
        error = summary["failed"][run["run_id"]]
        assert str(link) in error and "symbolic link" in error
        assert link.is_symlink() and _snapshot(target) == before
    assert run_rows(db)[0]["status"] == "failed"


def test_checkpoints_behind_links_are_neither_written_nor_read(tmp_path):
    target, before = _elsewhere(tmp_path)
    folder_link = tmp_path / "checkpoints"
    folder_link.symlink_to(target)
    with pytest.raises(CheckpointError, match="symbolic link"):
        save_checkpoint(folder_link / "run.pt", {"epoch": 1})
    with pytest.raises(CheckpointError, match="symbolic link"):
        load_checkpoint(folder_link / "precious.txt")
    (tmp_path / "real").mkdir()
    file_link = tmp_path / "real" / "run.pt"
    file_link.symlink_to(target / "precious.txt")
    for call in (lambda: save_checkpoint(file_link, {"epoch": 1}), lambda: load_checkpoint(file_link)):
        with pytest.raises(CheckpointError, match="symbolic link") as err:
            call()
        assert str(file_link) in str(err.value)
    assert file_link.is_symlink() and folder_link.is_symlink() and _snapshot(target) == before


def test_a_symlinked_cached_split_fails_its_run_and_is_left_as_it_is(tmp_path):
    db = tmp_path / "r.db"
    assert run_toy_eval(db, epochs=1)["done"] == 1
    target, _ = _elsewhere(tmp_path)
    link = sorted((_files(db) / "data").glob("toy-previous-train-*.npz"))[0]
    link.replace(target / "split.npz")
    link.symlink_to(target / "split.npz")
    before = _snapshot(target)
    summary = run_toy_eval(db, epochs=1, lr=1e-3)
    [error] = summary["failed"].values()
    assert str(link) in error and "symbolic link" in error
    assert link.is_symlink() and _snapshot(target) == before


def test_a_symlinked_kept_model_folder_is_refused_before_training(tmp_path, capsys):
    db = tmp_path / "r.db"
    assert main(["eval", SPEC, *TINY, "--db", str(db), "--dry-run", "--format", "json"]) == 0
    [run] = json.loads(capsys.readouterr().out)["per_run"]
    target, before = _elsewhere(tmp_path)
    link = _files(db) / "models" / run["run_id"]
    link.parent.mkdir(parents=True)  # a dry run writes nothing: no results folder yet
    link.symlink_to(target, target_is_directory=True)
    assert main(["eval", SPEC, *TINY, "--db", str(db), "--keep", "best"]) == 2
    err = capsys.readouterr().err
    assert str(link) in err and "symbolic link" in err and "Traceback" not in err
    assert link.is_symlink() and _snapshot(target) == before


def test_keeping_a_model_never_writes_through_a_link_planted_after_the_check(tmp_path):
    target, before = _elsewhere(tmp_path)
    link = tmp_path / "r.files" / "models" / "ab12"
    link.parent.mkdir(parents=True)
    link.symlink_to(target, target_is_directory=True)
    with pytest.raises(MadslError, match="symbolic link"):
        kept._write_dir(link, {"w": torch.zeros(2)}, {"format": kept.FORMAT})
    assert link.is_symlink() and _snapshot(target) == before


# --- kept models: config.json and model.safetensors --------------------------------------------

BUILD = {
    "vocab_size": 8,
    "max_seq_len": 16,
    "num_classes": 8,
    "backbone_num_classes": None,
    "head": "lm",
    "input_dim": 0,
    "target_len": None,
    "compression_position": -1,
    "conventions": "madsl",
    "lm_head": "conventions",
}


def _kept_model(folder: Path, dim: int = 16) -> Path:
    """A kept model as `madsl eval --keep best` writes it (a tiny attention model)."""
    from safetensors.torch import save_file

    from madsl.runner.train.heads import TaskModel

    spec = madsl.spec_from_topology("A", dim=dim)
    model = TaskModel(madsl.compile(spec, vocab_size=8, max_seq_len=16), "lm", num_classes=8)
    folder.mkdir(parents=True)
    save_file(
        {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors")
    )
    config = {
        "format": kept.FORMAT,
        "run_id": "ab" * 32,
        "spec": spec.data,
        "task": "toy",
        "setting": {},
        "build": dict(BUILD),
        "best_epoch": 1,
        "metrics": {"eval_loss": 1.0},
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _edit_config(folder: Path, edit) -> None:
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


def test_a_kept_model_loads(tmp_path):
    model = madsl.load_run(_kept_model(tmp_path / "m"))
    assert model.config["build"] == BUILD and not model.training
    assert model(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 8)


def test_a_planted_config_of_a_huge_model_is_refused_before_anything_is_allocated(tmp_path):
    """A real build of this config allocates 2^27 x 2^20 floats (512 TB) for the embedding alone."""
    folder = _kept_model(tmp_path / "m")

    def huge(config):
        config["spec"]["dim"] = 2**20
        config["build"].update(vocab_size=2**27, num_classes=2**27, max_seq_len=2**24)

    _edit_config(folder, huge)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    with pytest.raises(MadslError) as err:  # not MemoryError, not a RuntimeError of the allocator
        madsl.load_run(folder)
    assert time.monotonic() - started < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 256 * 1024  # KiB: nothing large was built
    assert str(folder / "model.safetensors") in str(err.value) and "shape" in str(err.value)


def _deep(config):
    config["spec"]["layers"] = json.loads("[" * 200 + "]" * 200)


PLANTED_CONFIGS = {
    "vocab_size a string": lambda c: c["build"].update(vocab_size="8"),
    "vocab_size 1e999": lambda c: c["build"].update(vocab_size=float("inf")),
    "vocab_size NaN": lambda c: c["build"].update(vocab_size=float("nan")),
    "vocab_size a float": lambda c: c["build"].update(vocab_size=8.0),
    "vocab_size zero": lambda c: c["build"].update(vocab_size=0),
    "vocab_size negative": lambda c: c["build"].update(vocab_size=-8),
    "vocab_size true": lambda c: c["build"].update(vocab_size=True),
    "vocab_size 2^40": lambda c: c["build"].update(vocab_size=2**40),
    "max_seq_len missing": lambda c: c["build"].pop("max_seq_len"),
    "an unknown head": lambda c: c["build"].update(head="nope"),
    "unknown conventions": lambda c: c["build"].update(conventions=7),
    "compression without its length": lambda c: c["build"].update(head="compression", target_len=None),
    "build not an object": lambda c: c.update(build=[1, 2]),
    "spec not an object": lambda c: c.update(spec="A"),
    "a spec of negative width": lambda c: c["spec"].update(dim=-16),
    "a spec of infinite width": lambda c: c["spec"].update(dim=float("inf")),
    "a spec of NaN init": lambda c: c["spec"].update(embedding_std=float("nan")),
    "a spec of an unknown layer": lambda c: c["spec"].update(topology="Zz"),
    "a spec of too many blocks": lambda c: c["spec"].update(topology="(A)x100000"),
    "nested 200 deep": _deep,
    "metrics not an object": lambda c: c.update(metrics=[0.5]),
}


@pytest.mark.parametrize("kind", sorted(PLANTED_CONFIGS))
def test_a_planted_config_is_a_clear_error_naming_it(tmp_path, kind):
    folder = _kept_model(tmp_path / "m")
    _edit_config(folder, PLANTED_CONFIGS[kind])
    started = time.monotonic()
    with pytest.raises(MadslError) as err:
        madsl.load_run(folder)
    assert time.monotonic() - started < 5
    assert str(folder / "config.json") in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000 + "]" * 100_000, '{"format": "madsl-run-model/1", "pad": "' + "x" * (5 * 2**20) + '"}'],
    ids=["nested too deep to parse", "5 MiB"],
)
def test_a_config_too_large_or_too_deep_is_not_a_model(tmp_path, text):
    folder = _kept_model(tmp_path / "m")
    (folder / "config.json").write_text(text)
    with pytest.raises(MadslError, match="not an exported madsl model"):
        madsl.load_run(folder)


def test_weights_of_another_model_are_refused_naming_the_tensor(tmp_path):
    folder = _kept_model(tmp_path / "m")
    _edit_config(folder, lambda c: c["spec"].update(dim=32))
    with pytest.raises(MadslError, match=r"tensor '.+' has shape \[.+\]; the model config.json describes has"):
        madsl.load_run(folder)
    _edit_config(folder, lambda c: c["spec"].update(dim=16, topology="A:A"))
    with pytest.raises(MadslError, match="lacks"):
        madsl.load_run(folder)


def _header(tensors: dict) -> bytes:
    text = json.dumps(tensors).encode()
    return len(text).to_bytes(8, "little") + text


def _edit_header(path: Path, edit) -> None:
    """Rewrite a safetensors file's header (the tensors' bytes stay as they are)."""
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    edit({k: v for k, v in header.items() if k != "__metadata__"}, header)
    path.write_bytes(_header(header) + raw[8 + size :])


def _transpose_a_matrix(tensors: dict, header: dict) -> None:
    name = next(k for k, v in sorted(tensors.items()) if len(v["shape"]) == 2 and v["shape"][0] != v["shape"][1])
    header[name]["shape"] = header[name]["shape"][::-1]  # as many bytes: safetensors reads it


def _rename_a_tensor(tensors: dict, header: dict) -> None:
    name = sorted(tensors)[0]
    header[f"{name}.planted"] = header.pop(name)


CORRUPT_WEIGHTS = {
    "truncated": lambda path: path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2]),
    "empty": lambda path: path.write_bytes(b""),
    "random bytes": lambda path: path.write_bytes(
        bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8))
    ),
    "a header claiming 2^60 bytes": lambda path: path.write_bytes((2**60).to_bytes(8, "little") + b"{}"),
    "offsets past the end": lambda path: path.write_bytes(
        _header({"w": {"dtype": "F32", "shape": [10**9], "data_offsets": [0, 4 * 10**9]}})
    ),
    "a pickle": lambda path: path.write_bytes(pickle.dumps({"w": [1.0]})),
    "a folder": lambda path: (path.unlink(), path.mkdir()),
    "a matrix transposed in the header": lambda path: _edit_header(path, _transpose_a_matrix),
    "a tensor renamed in the header": lambda path: _edit_header(path, _rename_a_tensor),
}


@pytest.mark.parametrize("kind", sorted(CORRUPT_WEIGHTS))
def test_a_corrupt_safetensors_file_is_a_clear_error_naming_it(tmp_path, kind):
    folder = _kept_model(tmp_path / "m")
    CORRUPT_WEIGHTS[kind](folder / "model.safetensors")
    with pytest.raises(MadslError) as err:  # not the RuntimeError of load_state_dict
        madsl.load_run(folder)
    assert str(folder / "model.safetensors") in str(err.value)
    if "header" not in kind:
        assert "not a safetensors file" in str(err.value)


def test_integer_weights_where_floats_belong_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _kept_model(tmp_path / "m")
    weights = load_file(str(folder / "model.safetensors"))
    name = sorted(weights)[0]
    save_file({**weights, name: weights[name].to(torch.int64)}, str(folder / "model.safetensors"))
    with pytest.raises(MadslError, match=f"tensor '{name}' is I64"):
        madsl.load_run(folder)


# --- a full disk, permissions, a file where a folder belongs ---------------------------------


class _FullDisk:
    """A file whose disk fills after `room` bytes."""

    def __init__(self, f, room: int = 4096):
        self.f, self.room = f, room

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def _torch_on_a_full_disk(monkeypatch) -> None:
    save = torch.save
    with pytest.raises(RuntimeError, match="unexpected pos"):  # what torch itself says of a full disk
        save({"w": torch.zeros(100_000)}, _FullDisk(io.BytesIO()))
    monkeypatch.setattr(checkpoints.torch, "save", lambda obj, f: save(obj, _FullDisk(f)))


def test_a_full_disk_under_torch_save_says_no_space_left(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "run.pt"
    save_checkpoint(path, {"epoch": 1})
    _torch_on_a_full_disk(monkeypatch)
    with pytest.raises(CheckpointError) as err:
        save_checkpoint(path, {"epoch": 2, "w": torch.zeros(100_000)})
    assert "no space left on device" in str(err.value) and str(path) in str(err.value)
    assert "unexpected pos" not in str(err.value)
    monkeypatch.undo()
    assert [p.name for p in path.parent.iterdir()] == ["run.pt"] and load_checkpoint(path)["epoch"] == 1


class _Filesystem:
    def __init__(self, free_blocks: int):
        self.f_bavail, self.f_frsize = free_blocks, 4096


@pytest.mark.parametrize("free_blocks, full", [(0, True), (10**6, False)])
def test_torchs_bare_write_error_is_read_against_the_free_space(tmp_path, monkeypatch, free_blocks, full):
    def failing_save(obj, f):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 463296 vs 463188")

    monkeypatch.setattr(checkpoints.torch, "save", failing_save)
    monkeypatch.setattr(checkpoints.os, "statvfs", lambda path: _Filesystem(free_blocks))
    with pytest.raises(CheckpointError if full else RuntimeError) as err:
        save_checkpoint(tmp_path / "run.pt", {"epoch": 1})
    assert ("no space left on device" in str(err.value)) == full
    assert not list(tmp_path.iterdir())


def test_a_run_on_a_full_disk_fails_saying_no_space_left(tmp_path, monkeypatch):
    _torch_on_a_full_disk(monkeypatch)
    summary = run_toy_eval(tmp_path / "r.db", epochs=1)
    [error] = summary["failed"].values()
    assert "no space left on device" in error and "unexpected pos" not in error
    assert str(_files(tmp_path / "r.db") / "checkpoints") in error


@pytest.mark.parametrize(
    "err, words",
    [
        (PermissionError(errno.EACCES, "Permission denied"), "permission denied"),
        (PermissionError(errno.EPERM, "Operation not permitted"), "permission denied"),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk quota exceeded"),
    ],
)
def test_a_refused_checkpoint_write_says_why(tmp_path, monkeypatch, err, words):
    def refuse(*args, **kwargs):
        raise err

    monkeypatch.setattr(checkpoints.os, "replace", refuse)
    with pytest.raises(CheckpointError, match=f"could not be written: {words}") as raised:
        save_checkpoint(tmp_path / "run.pt", {"epoch": 1})
    assert str(tmp_path / "run.pt") in str(raised.value)


def test_a_file_where_the_checkpoint_folder_belongs_says_not_a_directory(tmp_path):
    blocked = tmp_path / "checkpoints"
    blocked.write_text("in the way")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(blocked / "run.pt")
    assert "not a directory" in str(err.value) and "NotADirectoryError" not in str(err.value)
    assert str(blocked) in str(err.value)
    with pytest.raises(CheckpointError, match="could not be written: not a directory") as err:
        save_checkpoint(blocked / "run.pt", {"epoch": 1})
    assert str(blocked) in str(err.value) and blocked.read_text() == "in the way"


def test_eval_refuses_a_file_where_the_checkpoint_folder_belongs(tmp_path):
    db = tmp_path / "r.db"
    _files(db).mkdir()
    (_files(db) / "checkpoints").write_text("in the way")
    with pytest.raises(StoreError, match="is not a directory"):
        run_toy_eval(db, epochs=1)


def test_a_store_that_cannot_be_created_says_why(tmp_path, monkeypatch):
    def disk_full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "mkdir", disk_full)
    with pytest.raises(StoreError, match="no space left on device") as err:
        Store(tmp_path / "new" / "r.db")
    assert str(tmp_path / "new" / "r.db") in str(err.value)


def test_a_kept_model_on_a_full_disk_says_no_space_left(tmp_path, monkeypatch):
    import safetensors.torch

    checkpoint = tmp_path / "r.files" / "checkpoints" / "run.pt"
    save_checkpoint(checkpoint, {"best_state": {"w": torch.zeros(3)}})

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    with pytest.raises(MadslError, match="could not be written: no space left on device"):
        kept.keep_best("ab" * 32, checkpoint, tmp_path / "r.files", {"name": "x"}, dict(BUILD), {}, "toy", {})
    assert not list((tmp_path / "r.files" / "models").iterdir())  # no staging folder left behind


def test_a_finished_run_never_deletes_a_link_planted_as_its_checkpoint(tmp_path):
    from madsl.runner.store.files import discard_checkpoint

    target = tmp_path / "precious.pt"
    target.write_bytes(b"not madsl's")
    link = tmp_path / "run.pt"
    link.symlink_to(target)
    discard_checkpoint(link)
    assert link.is_symlink() and target.read_bytes() == b"not madsl's"
    own = tmp_path / "own.pt"
    own.write_bytes(b"x")
    discard_checkpoint(own)
    assert not own.exists()


def test_weights_that_cannot_be_kept_leave_the_run_done_and_the_eval_going(tmp_path, monkeypatch):
    """A kept model that cannot be written (a link planted under models/ after the check, a full
    disk) ended the whole eval after training; now the run stays done and the summary says so."""
    from runner_helpers import run_toy_eval

    from madsl.errors import MadslError
    from madsl.runner.store import kept

    def refuse(*args, **kwargs):
        raise MadslError("models/abc is a symbolic link")

    monkeypatch.setattr(kept, "keep_best", refuse)
    summary = run_toy_eval(tmp_path / "r.db", epochs=1, keep="best")
    assert summary["done"] == 1 and not summary["failed"]
    assert list(summary["unkept"].values()) == ["models/abc is a symbolic link"]

"""Output paths (`compile -o`, `report --plot`) that cannot be written are bad input: exit 2, no traceback."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from runner_helpers import run_toy_eval

from madsl import outputs
from madsl.cli import main
from madsl.runner.store.results import Store

SPEC = str(Path(__file__).resolve().parent.parent / "specs" / "paper" / "hyena-sg.mad")


def _bad_path(kind: str, tmp: Path) -> Path:
    if kind == "directory":
        (tmp / "out").mkdir()
        return tmp / "out"
    if kind == "under a file":
        (tmp / "file").write_text("x")
        return tmp / "file" / "out.png"
    assert kind == "unwritable place"
    if not Path("/proc/self").exists():
        pytest.skip("needs /proc, a place no one can create files in")
    return Path("/proc/madsl-test-output.png")


@pytest.fixture(scope="module")
def results_db(tmp_path_factory):
    """A database with one finished run: something to plot."""
    db = tmp_path_factory.mktemp("results") / "r.db"
    run_toy_eval(db, epochs=1)
    return db


@pytest.mark.parametrize("kind", ["directory", "under a file", "unwritable place"])
@pytest.mark.parametrize("command", ["compile json", "compile torch", "report --plot"])
def test_an_output_path_that_cannot_be_written_is_bad_input(tmp_path, capsys, results_db, kind, command):
    out = _bad_path(kind, tmp_path)
    if command == "compile torch" and kind == "directory":  # a model is a folder: a file is what stands in its way
        out = tmp_path / "file"
        out.write_text("x")
    db = results_db
    argv = {
        "compile json": ["compile", SPEC, "--emit", "json", "-o", str(out)],
        "compile torch": ["compile", SPEC, "--emit", "torch", "--vocab", "16", "-o", str(out)],
        "report --plot": ["report", "--db", str(db), "--plot", str(out)],
    }[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "Traceback" not in err, err


def test_a_plot_in_a_format_matplotlib_cannot_write_is_bad_input(tmp_path, capsys):
    db = tmp_path / "r.db"
    Store(db).close()
    assert main(["report", "--db", str(db), "--plot", str(tmp_path / "plot.json")]) == 2
    assert "cannot write '.json' images" in capsys.readouterr().err


def test_a_failed_output_write_is_bad_input_and_leaves_no_partial_file(tmp_path, capsys, monkeypatch):
    def disk_full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs.os, "replace", disk_full)
    out = tmp_path / "account.json"
    assert main(["compile", SPEC, "--emit", "json", "-o", str(out)]) == 2
    assert "No space left" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_plot_is_written_where_asked(tmp_path, capsys, results_db):
    out = tmp_path / "plots" / "scores.png"  # a folder that does not exist yet is made
    assert main(["report", "--db", str(results_db), "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {out}" in capsys.readouterr().err


@pytest.fixture
def umask_022():
    import os

    previous = os.umask(0o022)
    yield 0o644
    os.umask(previous)


@pytest.mark.parametrize("command", ["compile json", "compile torch", "schema", "convert", "report --plot"])
def test_a_new_output_gets_the_permissions_the_umask_gives(tmp_path, capsys, results_db, umask_022, command):
    """Outputs are written to a temporary file and moved into place; mkstemp made that file
    owner-only (0600), so every output was unreadable to the rest of a shared folder."""
    out = tmp_path / ("out.png" if command == "report --plot" else "out")
    argv = {
        "compile json": ["compile", SPEC, "--emit", "json", "-o", str(out)],
        "compile torch": ["compile", SPEC, "--emit", "torch", "--vocab", "16", "-o", str(out)],
        "schema": ["schema", "-o", str(out)],
        "convert": ["convert", "--from-megatron", "M-M*-", "-o", str(out)],
        "report --plot": ["report", "--db", str(results_db), "--plot", str(out)],
    }[command]
    assert main(argv) == 0
    files = [out / "model.safetensors", out / "config.json"] if command == "compile torch" else [out]
    assert [path.stat().st_mode & 0o777 for path in files] == [umask_022] * len(files)


def test_fit_written_over_a_spec_keeps_the_spec_s_permissions(tmp_path, capsys, umask_022):
    """docs/guide.md's `madsl fit my/hyena-attn.mad -o my/hyena-attn.mad` rewrites the spec in place."""
    spec = tmp_path / "hyena-sg.mad"
    spec.write_text(Path(SPEC).read_text())
    spec.chmod(0o664)
    mamba = str(Path(SPEC).with_name("mamba.mad"))
    assert main(["fit", str(spec), "--match", mamba, "--on", "params", "--free", "Sg.inner", "-o", str(spec)]) == 0
    assert spec.stat().st_mode & 0o777 == 0o664 and "inner: 361" in spec.read_text()


# --- folder outputs: a command writes only the files it names and never deletes anything ---


@pytest.fixture(scope="module")
def kept_run(tmp_path_factory):
    """A results database with one run whose best weights are kept: (db, run id)."""
    pytest.importorskip("safetensors")
    from madsl.runner.api import evaluate

    db = tmp_path_factory.mktemp("kept") / "results.db"
    result = evaluate(
        [SPEC],
        tasks=["in-context-recall"],
        protocol="smoke",
        epochs=1,
        batch_size=8,
        settings_overrides={"seq_len": 32, "num_train_examples": 16, "num_test_examples": 8},
        keep="best",
        db=db,
    )
    [run_id] = result["run_ids"]
    return db, run_id


def _export(kept_run, out, *extra) -> int:
    db, run_id = kept_run
    return main(["export", run_id[:12], "-o", str(out), "--db", str(db), *extra])


def test_export_into_a_folder_with_other_files_is_refused_and_deletes_nothing(tmp_path, capsys, kept_run):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "keep").write_text("an earlier export, or anything else")
    assert _export(kept_run, folder) == 2
    err = capsys.readouterr().err
    assert "holds 1 entry this command did not write (keep)" in err and "--force" in err and "Traceback" not in err
    assert sorted(p.name for p in folder.iterdir()) == ["keep"]
    assert (folder / "keep").read_text() == "an earlier export, or anything else"


def test_export_with_force_writes_beside_the_other_files_and_removes_none(tmp_path, capsys, kept_run):
    folder = tmp_path / "models"
    (folder / "sub").mkdir(parents=True)
    (folder / "keep").write_text("x")
    assert _export(kept_run, folder, "--force") == 0
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "keep", "model.safetensors", "sub"]
    assert (folder / "keep").read_text() == "x"
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_export_again_into_its_own_folder_replaces_its_two_files(tmp_path, capsys, kept_run):
    folder = tmp_path / "out"
    assert _export(kept_run, folder) == 0
    (folder / "config.json").write_text("{}")  # an older export's file: replaced, not refused
    assert _export(kept_run, folder) == 0
    assert (folder / "config.json").read_text() != "{}"


@pytest.mark.parametrize("where", [".", ".."])
def test_export_to_the_working_folder_or_its_parent_deletes_nothing(tmp_path, capsys, kept_run, monkeypatch, where):
    """`-o ..` emptied the parent folder (the working directory with it) before failing."""
    work = tmp_path / "parent" / "work"
    work.mkdir(parents=True)
    (work / "notes.txt").write_text("mine")
    (tmp_path / "parent" / "other.txt").write_text("mine too")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    monkeypatch.chdir(work)
    assert _export(kept_run, where) == 2
    err = capsys.readouterr().err
    assert "did not write" in err and "Traceback" not in err
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def test_export_through_a_symlink_writes_into_the_folder_it_names(tmp_path, capsys, kept_run):
    target = tmp_path / "real"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    assert _export(kept_run, link) == 0
    assert link.is_symlink() and sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]


def test_export_refuses_a_planted_symlink_where_its_file_goes(tmp_path, capsys, kept_run):
    folder = tmp_path / "out"
    folder.mkdir()
    victim = tmp_path / "victim.json"
    victim.write_text("untouched")
    (folder / "config.json").symlink_to(victim)
    assert _export(kept_run, folder, "--force") == 2
    assert "config.json there is not a regular file" in capsys.readouterr().err
    assert victim.read_text() == "untouched"


@pytest.mark.parametrize("run_id", ["", "*", "/etc/", "abc", "../x", "ABCDEF0", "0" * 65])
def test_export_takes_only_run_ids(tmp_path, capsys, kept_run, run_id):
    db, _ = kept_run
    assert main(["export", run_id, "-o", str(tmp_path / "out"), "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "is not a run id" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_plot_sweeps_into_a_folder_with_other_files_is_refused(tmp_path, capsys, results_db):
    pytest.importorskip("matplotlib")
    folder = tmp_path / "figures"
    folder.mkdir()
    (folder / "paper-draft.tex").write_text("x")
    assert main(["report", "--db", str(results_db), "--plot-sweeps", str(folder)]) == 2
    assert "did not write (paper-draft.tex)" in capsys.readouterr().err
    # with --force the check passes (this database has no sweep to plot) and the file stays
    assert main(["report", "--db", str(results_db), "--plot-sweeps", str(folder), "--force"]) == 2
    assert "nothing to plot" in capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir()) == ["paper-draft.tex"]


# --- the one atomic write (madsl.outputs.AtomicFile and its short forms) ---


def _write_all_ways(path: Path, data: bytes):
    yield "AtomicFile", lambda: _with_atomic_file(path, data)
    yield "write_atomic", lambda: outputs.write_atomic(path, lambda tmp: Path(tmp).write_bytes(data))
    yield "write_bytes_atomic", lambda: outputs.write_bytes_atomic(path, data)
    yield "write_text_atomic", lambda: outputs.write_text_atomic(path, data.decode())


def _with_atomic_file(path: Path, data: bytes) -> None:
    with outputs.AtomicFile(path) as f:
        f.write(data)


WAYS = ["AtomicFile", "write_atomic", "write_bytes_atomic", "write_text_atomic"]


def _way(path: Path, data: bytes, name: str):
    return dict(_write_all_ways(path, data))[name]


@pytest.mark.parametrize("way", WAYS)
def test_an_atomic_write_fsyncs_the_file_then_renames_then_fsyncs_the_folder(tmp_path, monkeypatch, way):
    import os
    import stat

    path = tmp_path / "out.json"
    path.write_text("old")
    events = []
    fsync, replace = os.fsync, os.replace

    def watched_fsync(fd):
        st = os.fstat(fd)
        events.append(("fsync", "folder" if stat.S_ISDIR(st.st_mode) else "file", st.st_ino))
        fsync(fd)

    def watched_replace(source, target):
        events.append(("replace", Path(source).parent == Path(target).parent, os.stat(source).st_ino))
        replace(source, target)

    monkeypatch.setattr(outputs.os, "fsync", watched_fsync)
    monkeypatch.setattr(outputs.os, "replace", watched_replace)
    _way(path, b"new", way)()
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    new_file, folder = path.stat().st_ino, tmp_path.stat().st_ino
    assert events == [("fsync", "file", new_file), ("replace", True, new_file), ("fsync", "folder", folder)]


class _Boom(Exception):
    pass


def _fail(*args, **kwargs):
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize("fail_in", ["fsync", "replace"])
@pytest.mark.parametrize("way", WAYS)
def test_a_failed_atomic_write_removes_its_temporary_and_keeps_the_old_file(tmp_path, monkeypatch, way, fail_in):
    path = tmp_path / "out.json"
    path.write_text("old")
    monkeypatch.setattr(outputs.os, fail_in, _fail)
    with pytest.raises(OSError, match="No space left"):
        _way(path, b"new", way)()
    monkeypatch.undo()
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_writer_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("old")

    def half_then_fail(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise _Boom

    with pytest.raises(_Boom):
        outputs.write_atomic(path, half_then_fail)
    with pytest.raises(_Boom), outputs.AtomicFile(path) as f:
        f.write(b"half")
        raise _Boom
    writer = outputs.AtomicFile(path)  # the streaming use: written over time, then discarded
    writer.file.write(b"half")
    writer.discard()
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_an_atomic_write_gives_the_permissions_a_file_written_in_place_gets(tmp_path, umask_022):
    import os

    new = outputs.write_text_atomic(tmp_path / "new.txt", "x")
    assert new.stat().st_mode & 0o777 == umask_022  # not mkstemp's 0600
    existing = tmp_path / "existing.txt"
    existing.write_text("x")
    existing.chmod(0o640)
    outputs.write_bytes_atomic(existing, b"y")
    assert existing.stat().st_mode & 0o777 == 0o640  # the file's own mode
    owner_only = tmp_path / "weights.bin"  # a writer that makes its file owner-only (safetensors does)

    def writer(tmp: str) -> None:
        Path(tmp).write_bytes(b"w")
        os.chmod(tmp, 0o600)

    outputs.write_atomic(owner_only, writer)
    assert owner_only.stat().st_mode & 0o777 == umask_022


def test_an_atomic_write_replaces_a_link_and_never_writes_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    link = tmp_path / "out"
    link.symlink_to(victim)
    outputs.write_text_atomic(link, "new")
    assert not link.is_symlink() and link.read_text() == "new" and victim.read_text() == "untouched"


# Every module of madsl writes files through madsl.outputs: none renames a file onto another or
# fsyncs one itself. What must differ, and why:
RENAMES_ALLOWED = {
    "madsl/corpus/prepare.py": "a prepared cache folder renamed into place whole (os.rename): of processes that "
    "prepare at once the first rename wins and the others find the folder there; a "
    "folder, not a file it wrote, whose files AtomicFile already made durable",
}


def _file_moves_and_syncs(path: Path) -> list[str]:
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value.id if isinstance(node.value, ast.Name) else None
        if owner == "os" and node.attr in ("replace", "rename", "renames", "fsync", "fdatasync"):
            found.append(f"os.{node.attr}")
        elif owner == "shutil" and node.attr == "move":
            found.append("shutil.move")
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        # Path.replace(target) / Path.rename(target): one argument (str.replace takes two)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and len(node.args) == 1
            and not node.keywords
            and node.func.attr in ("replace", "rename")
            and not (isinstance(node.func.value, ast.Name) and node.func.value.id in ("os", "dataclasses"))
        ):
            found.append(f".{node.func.attr}()")
    return found


def test_only_outputs_py_renames_files_into_place_or_fsyncs():
    package = Path(outputs.__file__).parent
    repo = package.parent
    offenders = {}
    for path in sorted(package.rglob("*.py")):
        name = path.relative_to(repo).as_posix()
        found = _file_moves_and_syncs(path)
        if name == "madsl/outputs.py":
            assert {"os.replace", "os.fsync"} <= set(found)  # the check can see what it looks for
            continue
        if name in RENAMES_ALLOWED:
            found = [f for f in found if f == "os.fsync" or f == "os.fdatasync"]
        if found:
            offenders[name] = found
    assert offenders == {}, "write through madsl.outputs (AtomicFile, write_atomic, ...) instead"
    assert all(("os.rename" in _file_moves_and_syncs(repo / name)) for name in RENAMES_ALLOWED)  # still needed

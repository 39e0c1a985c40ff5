"""Output paths (`compile -o`, `report --plot`) that cannot be written are bad input: exit 2, no traceback."""
from __future__ import annotations

import errno
from pathlib import Path

import pytest

from madsl.cli import main
from madsl.cli import common
from madsl.runner.store import Store
from runner_helpers import run_toy_eval

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
    db = results_db
    argv = {"compile json": ["compile", SPEC, "--emit", "json", "-o", str(out)],
            "compile torch": ["compile", SPEC, "--emit", "torch", "--vocab", "16", "-o", str(out)],
            "report --plot": ["report", "--db", str(db), "--plot", str(out)]}[command]
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

    monkeypatch.setattr(common.os, "replace", disk_full)
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
    argv = {"compile json": ["compile", SPEC, "--emit", "json", "-o", str(out)],
            "compile torch": ["compile", SPEC, "--emit", "torch", "--vocab", "16", "-o", str(out)],
            "schema": ["schema", "-o", str(out)],
            "convert": ["convert", "--from-megatron", "M-M*-", "-o", str(out)],
            "report --plot": ["report", "--db", str(results_db), "--plot", str(out)]}[command]
    assert main(argv) == 0
    assert out.stat().st_mode & 0o777 == umask_022


def test_fit_written_over_a_spec_keeps_the_spec_s_permissions(tmp_path, capsys, umask_022):
    """docs/guide.md's `madsl fit my/hyena-attn.mad -o my/hyena-attn.mad` rewrites the spec in place."""
    spec = tmp_path / "hyena-sg.mad"
    spec.write_text(Path(SPEC).read_text())
    spec.chmod(0o664)
    mamba = str(Path(SPEC).with_name("mamba.mad"))
    assert main(["fit", str(spec), "--match", mamba, "--on", "params", "--free", "Sg.inner", "-o", str(spec)]) == 0
    assert spec.stat().st_mode & 0o777 == 0o664 and "inner: 361" in spec.read_text()

"""The command line as scripts and gates use it: -q/-v before or after the command, one
--format word for the human format (`text`; compile's old `summary` still works, with a note),
`--format` on export and schema, a pinned pre-commit `rev` in docs/ci.md, and `export` of a run
the database does not hold saying which run, which database, and how to list its runs."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from madsl import __version__
from madsl.cli import build_parser, main
from madsl.runner.store.results import RunIdentity, Store
from madsl.schema import spec_schema

ROOT = Path(__file__).resolve().parent.parent
SPEC = str(ROOT / "specs" / "paper" / "mamba.mad")


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# ---- -q / -v before or after the command ---------------------------------------------------


@pytest.mark.parametrize("flag", ["-q", "--quiet", "-v", "--verbose"])
def test_verbosity_flags_work_before_and_after_the_command(capsys, flag):
    before = _run(capsys, flag, "check", SPEC)
    after = _run(capsys, "check", SPEC, flag)
    plain = _run(capsys, "check", SPEC)
    assert before == after and before[0] == 0
    assert before[1] != plain[1]  # the flag took effect: -q prints less, -v more (the spec's layers)


def test_a_global_flag_is_not_reset_by_the_command_defaults():
    parser = build_parser()
    args = parser.parse_args(["-q", "compile", SPEC])
    assert (args.quiet, args.verbose) == (True, False)
    args = parser.parse_args(["compile", SPEC, "-v"])
    assert (args.quiet, args.verbose) == (False, True)
    args = parser.parse_args(["compile", SPEC])
    assert (args.quiet, args.verbose) == (False, False)


@pytest.mark.parametrize(
    "argv",
    [
        ["-q", "compile", SPEC, "-v"],
        ["-v", "compile", SPEC, "--quiet"],
        ["-q", "-v", "compile", SPEC],
        ["compile", SPEC, "-q", "-v"],
    ],
)
def test_quiet_and_verbose_together_are_refused_wherever_they_stand(capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and "not allowed with" in capsys.readouterr().err


def test_quiet_compile_before_the_command_prints_only_the_verdict(capsys):
    code, out, err = _run(capsys, "-q", "compile", SPEC)
    assert code == 0 and out.strip() == "✓ within budget: fixed_state 4096" and not err


# ---- --format: `text` is the human format everywhere ---------------------------------------


def _format_choices() -> dict[str, tuple[str, ...]]:
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {
        name: tuple(action.choices)
        for name, parser in subparsers.choices.items()
        for action in parser._actions
        if "--format" in action.option_strings
    }


def test_every_command_that_prints_a_result_takes_format_and_calls_the_human_one_text():
    choices = _format_choices()
    for command in ("compile", "expand", "check", "fit", "eval", "report", "export", "schema"):
        assert "text" in choices[command], command
    for command, words in choices.items():
        assert not {"summary", "human", "table", "pretty"} & set(words), (command, words)


def test_compile_text_is_the_default_and_summary_still_works_with_a_note(capsys):
    default = _run(capsys, "compile", SPEC)
    text = _run(capsys, "compile", SPEC, "--format", "text")
    assert default == text and default[0] == 0 and "within budget" in default[1] and not default[2]
    for old in (["--format", "summary"], ["--emit", "summary"]):
        code, out, err = _run(capsys, "compile", SPEC, *old)
        assert (code, out) == text[:2]
        assert "--format summary is now --format text" in err


def test_compile_help_documents_the_old_name(capsys):
    with pytest.raises(SystemExit):
        main(["compile", "--help"])
    assert "old name: summary" in capsys.readouterr().out


def test_schema_format_json_is_the_schema_and_text_lists_what_it_allows(capsys):
    code, out, _ = _run(capsys, "schema", "--format", "json")
    assert code == 0 and json.loads(out) == spec_schema()
    code, text, _ = _run(capsys, "schema", "--format", "text")
    assert code == 0 and not text.lstrip().startswith("{")
    assert re.search(r"^  mA +attention +heads: integer = 1,", text, re.M)  # a symbol, its primitive, parameters
    assert re.search(r"^  dim +integer >= 1$", text, re.M)
    assert "fixed_state" in text and "4096 ± 5%" in text  # the budgets and their grammar


def test_schema_text_can_be_written_to_a_file(tmp_path, capsys):
    out = tmp_path / "schema.txt"
    assert main(["schema", "--format", "text", "-o", str(out), "-q"]) == 0
    assert out.read_text() == _run(capsys, "schema", "--format", "text")[1]


# ---- export: a run the database does not hold --------------------------------------------


def _database_with_a_run(path: Path) -> str:
    store = Store(path)
    try:
        store.add_spec("s" * 64, "mamba", "{}", None)
        identity = RunIdentity(
            "s" * 64,
            "in-context-recall",
            {},
            {"lr": 1e-3, "wd": 0.0, "epochs": 1, "batch_size": 8, "seed": 0},
            __version__,
        )
        store.add_runs([(identity, "mamba")], "smoke")
    finally:
        store.close()
    return identity.run_id


def test_export_of_a_run_missing_from_the_default_database_names_run_database_and_listing(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    _database_with_a_run(tmp_path / "madsl-results.db")
    code, out, err = _run(capsys, "export", "abcd1234", "-o", "out")
    assert code == 2 and not out
    assert "run 'abcd1234'" in err and "madsl-results.db (the default: no --db given)" in err
    assert "has no run with that id" in err and "madsl report --db madsl-results.db --format csv --rows runs" in err
    assert not (tmp_path / "out").exists() and "Traceback" not in err


def test_export_names_a_database_given_with_db_without_calling_it_the_default(tmp_path, capsys):
    db = tmp_path / "other results.db"
    _database_with_a_run(db)
    code, _, err = _run(capsys, "export", "abcd1234", "-o", str(tmp_path / "out"), "--db", str(db))
    assert code == 2 and f"results database {db} has no run" in err and "default" not in err.split("hint")[0]
    assert f"--db '{db}'" in err  # quoted: the hint is a command to paste


def test_export_of_a_missing_default_database_says_it_was_the_default(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(capsys, "export", "abcd1234", "-o", "out")
    assert code == 2 and "no results database at madsl-results.db (the default: no --db given)" in err


def test_export_of_a_recorded_run_without_a_kept_model_says_how_to_keep_one(tmp_path, capsys):
    db = tmp_path / "r.db"
    run_id = _database_with_a_run(db)
    code, _, err = _run(capsys, "export", run_id[:8], "-o", str(tmp_path / "out"), "--db", str(db))
    assert code == 2 and "no kept model" in err and "--keep best" in err and "has no run" not in err


def test_export_format_json_prints_what_was_written(tmp_path, capsys, monkeypatch):
    db = tmp_path / "r.db"
    run_id = _database_with_a_run(db)
    out = tmp_path / "out"
    # the export itself (a kept model's files: tests/test_kept.py) is not what this test is about
    monkeypatch.setattr("madsl.runner.store.kept.export", lambda files, rid, folder, force: (run_id, folder))
    code, printed, err = _run(capsys, "export", run_id[:8], "-o", str(out), "--db", str(db), "--format", "json")
    assert code == 0 and not err
    assert json.loads(printed) == {
        "run_id": run_id,
        "output": str(out),
        "files": [str(out / "model.safetensors"), str(out / "config.json")],
    }
    code, printed, err = _run(capsys, "export", run_id[:8], "-o", str(out), "--db", str(db))
    assert code == 0 and not printed and f"wrote {out}: run {run_id}" in err


# ---- docs/ci.md: a pinned pre-commit rev -------------------------------------------------


def test_the_pre_commit_example_pins_a_release_tag():
    page = (ROOT / "docs" / "ci.md").read_text()
    revs = re.findall(r"^\s*rev:\s*(\S+)", page, re.M)
    assert revs == [f"v{__version__}"]  # a tag of madsl's version, never a branch such as main
    assert "mutable reference" in " ".join(page.split())  # and says why


def test_eval_leaves_out_a_spec_that_breaks_its_budget(tmp_path, capsys):
    """A spec over its own `budget:` is not trained (what `madsl check` fails), unless --allow-over-budget."""
    from madsl.cli import main

    over = tmp_path / "over.mad"
    over.write_text("name: over\ndim: 16\ntopology: Mb\nbudget:\n  fixed_state: 100\n")
    db = str(tmp_path / "r.db")
    assert main(["eval", str(over), "--protocol", "smoke", "--task", "memorization", "--db", db]) == 2
    err = capsys.readouterr().err
    assert f"over budget, not run: {over}: fixed_state" in err and "every spec breaks its budget" in err
    code = main(["eval", str(over), "--protocol", "smoke", "--task", "memorization", "--db", db, "--dry-run"])
    assert code == 2
    code = main(
        ["eval", str(over), "--protocol", "smoke", "--task", "memorization", "--db", db, "--dry-run"]
        + ["--allow-over-budget"]
    )
    assert code == 0 and "over budget, run anyway (--allow-over-budget)" in capsys.readouterr().err

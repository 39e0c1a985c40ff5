"""A user's mistakes at the command line, found by a review that tried every option wrong: each is
bad input (exit 2, an error that says what was expected), never an option silently ignored, a
file silently not written, a traceback or a run that fails later."""

from __future__ import annotations

import pytest

from madsl.cli import main
from madsl.lang.budget import BudgetError, parse_bound

MAMBA = "specs/paper/mamba.mad"


def run(capsys, *args: str) -> tuple[int, str, str]:
    try:
        rc = main(list(args))
    except SystemExit as stop:  # argparse's usage errors
        rc = stop.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    "args,message",
    [
        # options that only one executor or direction reads are refused where they would be ignored
        (
            ["eval", MAMBA, "--address", "auto", "--dry-run", "--db", "{tmp}/r.db"],
            "--address applies only with --executor ray",
        ),
        (
            ["eval", MAMBA, "--cpus-per-run", "2", "--gpus-per-run", "0.5", "--dry-run", "--db", "{tmp}/r.db"],
            "--cpus-per-run, --gpus-per-run apply only with --executor ray",
        ),
        (["fit", "specs/paper/hyena-sg.mad", "--on", "params", "--free", "Sg.inner"], "--on applies only with --match"),
        (
            ["fit", "specs/paper/hyena-sg.mad", "--tolerance", "5%", "--free", "Sg.inner"],
            "--tolerance applies only with --match",
        ),
        (
            ["fit", "{tmp}/no-budget.mad", "--free", "H.ordr"],
            "H (hyena) has no parameter 'ordr'",
        ),  # not 'nothing to fit to'
        (["convert", "--from-megatron", "M-", "--model-type", "jamba"], "--model-type: not read by --from-megatron"),
        (
            ["convert", "--to-megatron", MAMBA, "--dim", "64", "--layer", "A.heads=2"],
            "--dim, --layer: not read by --to-megatron",
        ),
        (
            ["convert", "--from-hf", "specs/public/jamba-v0.1.config.json", "--mamba", "Mb"],
            "--mamba: not read by --from-hf",
        ),
        # a seed training cannot use (torch's generators take 64 bits; the run failed after planning)
        (
            ["eval", MAMBA, "--seed", str(10**14), "--dry-run", "--db", "{tmp}/r.db"],
            "expected a seed from 0 to 4,294,967,295",
        ),
        (["data", "memorization", "--seed", str(2**32), "--format", "text"], "expected a seed"),
        (
            ["eval", MAMBA, "--executor", "ray", "--cpus-per-run", "inf", "--dry-run", "--db", "{tmp}/r.db"],
            "expected a finite number",
        ),
        # the task name first: a misspelled task is the error, not the missing -o
        (["data", "memorisation"], "unknown task 'memorisation'"),
        (["data", "in-context-recall", "--format", "text", "--set", "vocab_size=1000000000"], "does not fit in memory"),
        (["export", "abc", "-o", "{tmp}/out", "--db", "{tmp}/no-such.db"], "no results database at"),
        # --workers and --devices place runs on this machine: on Ray they were ignored in silence
        (
            ["eval", MAMBA, "--executor", "ray", "--workers", "2", "--dry-run", "--db", "{tmp}/r.db"],
            "--workers applies only to the local executor",
        ),
        (
            ["eval", MAMBA, "--executor", "ray", "--devices", "cpu", "--dry-run", "--db", "{tmp}/r.db"],
            "--devices applies only to the local executor",
        ),
        (["eval", MAMBA, "--devices", "cpu,,cpu", "--dry-run", "--db", "{tmp}/r.db"], "an empty item in 'cpu,,cpu'"),
        # a value or a spec given twice is a slip: planned once, it was dropped in silence
        (["eval", MAMBA, "--seed", "1", "--seed", "1", "--dry-run", "--db", "{tmp}/r.db"], "--seed: 1 is given twice"),
        (
            ["eval", MAMBA, "--lr", "1e-3", "--lr", "0.001", "--dry-run", "--db", "{tmp}/r.db"],
            "--lr: 0.001 is given twice",
        ),
        (
            ["eval", MAMBA, "--eval-lengths", "64,32..128", "--dry-run", "--db", "{tmp}/r.db"],
            "--eval-lengths: 64 is given twice",
        ),
        (
            ["eval", MAMBA, "specs/paper/../paper/mamba.mad", "--dry-run", "--db", "{tmp}/r.db"],
            "the spec specs/paper/../paper/mamba.mad is given twice",
        ),
        # a length left out between commas is not skipped in silence
        (["eval", MAMBA, "--eval-lengths", "64,,256", "--dry-run", "--db", "{tmp}/r.db"], "an empty item in '64,,256'"),
        (["eval", MAMBA, "--eval-lengths", "64,", "--dry-run", "--db", "{tmp}/r.db"], "an empty item in '64,'"),
    ],
)
def test_options_that_cannot_work_are_refused_with_the_reason(capsys, tmp_path, args, message):
    (tmp_path / "no-budget.mad").write_text("name: x\ndim: 128\ntopology: H:A\n")
    rc, _, err = run(capsys, *(a.format(tmp=tmp_path) for a in args))
    assert rc == 2 and message in err, err


@pytest.mark.parametrize(
    "args",
    [
        ["schema", "-o", "{tmp}"],
        ["convert", "--from-megatron", "M-", "-o", "{tmp}"],
        ["convert", "--from-megatron", "M-", "-o", "{file}/spec.mad"],
    ],
)
def test_outputs_that_cannot_be_written_are_refused_before_the_work(capsys, tmp_path, args):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    rc, _, err = run(capsys, *(a.format(tmp=tmp_path, file=a_file) for a in args))
    assert rc == 2 and "-o" in err and str(tmp_path) in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]


def test_compile_summary_with_o_writes_the_table_instead_of_ignoring_o(capsys, tmp_path):
    out_file = tmp_path / "table.txt"
    rc, out, _ = run(capsys, "compile", MAMBA, "-o", str(out_file))
    assert rc == 0 and out == ""
    text = out_file.read_text()
    assert "total" in text and "within budget" in text and "\x1b[" not in text  # plain text, no colors


@pytest.mark.parametrize(
    "text,message",
    [
        ("<=", "expected a number after '<='"),  # was "got '='": the regex split '<=' into '<' and '='
        (">=   ", "expected a number after '>='"),
        ("< 4096", "written '<= X' (inclusive)"),  # read as '<= 4096', it admitted 4096
        ("> 1M", "written '>= X' (inclusive)"),
        ("=< 5", "written '<= X'"),
    ],
)
def test_one_sided_budgets_are_inclusive_and_need_their_number(text, message):
    with pytest.raises(BudgetError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_bound(text)
    assert parse_bound("<= 4096").high == 4096 and parse_bound(">= 1k").low == 1000


@pytest.mark.parametrize(
    "text,hint",
    [
        ("H{order=3}#a", "a tag comes before the layer's {...}: H#a{order=3}"),
        ("(H:A)#a", "a group takes no tag"),
        ("(H:A){residual=add}#a", "a group takes no tag"),
        ("H#a#b", "a layer takes one tag"),
        ("A{heads=4,}", "remove the ',' after the last setting"),
    ],
)
def test_misplaced_tags_and_commas_say_where_they_go(text, hint):
    from madsl import topology as topo

    with pytest.raises(topo.TopologySyntaxError) as info:
        topo.parse(text)
    assert info.value.hint is not None and hint in info.value.hint, info.value.hint


def test_a_narrow_terminal_wraps_the_layer_table_instead_of_cutting_its_numbers():
    import io

    from rich.console import Console

    import madsl
    from madsl import report_text
    from madsl.cli.common import print_whole

    acc = madsl.account("specs/hybrid/selcopy-hybrid-gated-2.mad")
    console = Console(file=io.StringIO(), width=70, color_system=None)
    print_whole(console, report_text.account_table(acc, []))
    text = console.file.getvalue()
    assert "…" not in text and f"{acc.totals['params']:,}" in text and f"{acc.totals['flops']:,}" in text
    assert console.width == 70


def test_text_that_can_wrap_in_its_cell_wraps_within_the_terminal():
    import io

    from rich.console import Console
    from rich.table import Table

    from madsl.cli.common import print_whole

    table = Table("spec", "budget")
    table.add_row("a.mad", "fixed_state = 6,144 is outside its budget <= 4096; from H x3 (2,048 each) " * 3)
    console = Console(file=io.StringIO(), width=60, color_system=None)
    print_whole(console, table)
    lines = console.file.getvalue().splitlines()
    assert max(map(len, lines)) <= 60 and "…" not in "".join(lines)


def test_a_seed_training_cannot_use_is_refused_wherever_it_is_written(capsys, tmp_path):
    """A spec's eval.seed (located) and a sweep's train.seed above 2^32 - 1 are bad input, as
    --seed is: they planned, then every run failed in training (exit 3)."""
    spec = tmp_path / "s.mad"
    spec.write_text(f"name: s\ntopology: H:Sg\ndim: 32\neval:\n  protocol: smoke\n  seed: [0, {10**14}]\n")
    rc, _, err = run(capsys, "eval", str(spec), "--dry-run", "--db", str(tmp_path / "r.db"))
    assert rc == 2 and "s.mad:6:13" in err and "eval.seed: expected an integer at most 4,294,967,295" in err
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"specs: [s.mad]\nprotocol: smoke\ntrain:\n  seed: [{2**32}]\n")
    spec.write_text("name: s\ntopology: H-Sg\ndim: 32\n")
    rc, _, err = run(capsys, "eval", str(sweep), "--dry-run", "--db", str(tmp_path / "r.db"))
    assert rc == 2 and "sweep.yaml:4:10" in err and "train.seed: expected an integer at most 4,294,967,295" in err
    assert "Traceback" not in err


def test_a_rate_cache_that_cannot_be_written_is_no_error(capsys, tmp_path, monkeypatch):
    """The plan's rate cache is a cache: where it cannot be written (a full disk, a read-only
    home) nothing is raised and nothing is left behind; the next plan measures again."""
    import json
    import types

    from madsl.runner.plan import rate_cache

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rate_cache, "json", types.SimpleNamespace(dumps=disk_full, loads=json.loads))
    assert rate_cache.save_cache(tmp_path / "cache" / "device-rates.json", {"format": 1, "devices": {}}) is False
    assert not list((tmp_path / "cache").iterdir())
    (tmp_path / "home").write_text("a file where the cache's folder would be")
    assert rate_cache.save_cache(tmp_path / "home" / "madsl" / "device-rates.json", {}) is False


def test_a_value_a_task_rejects_in_a_specs_eval_set_is_located(capsys, tmp_path):
    """eval.set's seq_len: -3 has the right type, and the task rejects it: the error points at it
    (it said only 'bad setting'); a --set of the same knob takes the blame off the spec."""
    spec = tmp_path / "s.mad"
    spec.write_text("name: s\ntopology: H-Sg\ndim: 32\neval:\n  protocol: smoke\n  set:\n    seq_len: -3\n")
    rc, _, err = run(capsys, "eval", str(spec), "--dry-run", "--db", str(tmp_path / "r.db"))
    assert rc == 2 and "seq_len must be an integer >= 2, got -3" in err and "s.mad:7:14" in err
    rc, _, _ = run(capsys, "eval", str(spec), "--set", "seq_len=64", "--dry-run", "--db", str(tmp_path / "r.db"))
    assert rc == 0


def test_a_compile_switch_that_is_neither_1_nor_0_is_refused(capsys, tmp_path, monkeypatch):
    """MADSL_COMPILE_STACKED=true was read as 'no' in silence."""
    monkeypatch.setenv("MADSL_COMPILE_STACKED", "true")
    rc, _, err = run(capsys, "eval", MAMBA, "--dry-run", "--db", str(tmp_path / "r.db"))
    assert rc == 2 and "MADSL_COMPILE_STACKED='true': expected 1" in err and not (tmp_path / "r.db").exists()


def test_a_value_given_twice_in_a_specs_eval_section_is_located(capsys, tmp_path):
    spec = tmp_path / "twice.mad"
    spec.write_text("name: twice\ndim: 64\ntopology: H:A\neval:\n  lr: [1.0e-3, 5.0e-4, 0.001]\n")
    rc, _, err = run(capsys, "eval", str(spec), "--dry-run", "--db", str(tmp_path / "r.db"))
    assert rc == 2 and f"{spec}:5:" in err and "eval.lr: 0.001 is given twice" in err, err

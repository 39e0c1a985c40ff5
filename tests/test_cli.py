"""The command line as users and CI jobs call it: outputs, exit codes, no traceback, no torch."""

import json
import subprocess
import sys

import pytest

from tests.test_topology import TABLE_D1


def madsl(*args, check_rc=None):
    proc = subprocess.run([sys.executable, "-m", "madsl", *args], capture_output=True, text=True)
    if check_rc is not None:
        assert proc.returncode == check_rc, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_expand_text_and_json():
    out = madsl("expand", "(H:5A:5H:A)x2", check_rc=0).stdout.strip()
    assert out == " : ".join((["H"] + ["A"] * 5 + ["H"] * 5 + ["A"]) * 2)
    blocks = json.loads(madsl("expand", "H-Sg:[H | mA]", "--format", "json", check_rc=0).stdout)
    assert blocks == [["H", "Sg"], ["H", "mA"]]


@pytest.mark.parametrize("topology", TABLE_D1)
def test_compile_json_contract_for_table_d1(topology):
    out = json.loads(madsl("compile", "-t", topology, "--dim", "768", "--emit", "json", check_rc=0).stdout)
    assert {"name", "topology", "layers", "totals"} <= set(out)
    assert len(out["layers"]) == 48
    assert {"index", "symbol", "primitive", "params", "fixed_state", "kv_cache", "flops"} <= set(out["layers"][0])
    assert set(out["totals"]) >= {"params", "fixed_state", "kv_cache", "flops"}
    assert out["totals"]["params"] == sum(r["params"] for r in out["layers"]) + sum(p["params"] for p in out["parts"])


def test_compile_summary_and_dot():
    proc = madsl("compile", "specs/paper/striped-hyena-moe.mad", check_rc=0)
    assert "within budget" in proc.stdout and "hyena" in proc.stdout
    assert madsl("compile", "-t", "H:A", "--emit", "dot", check_rc=0).stdout.startswith("digraph")


def test_check_iso_state_passes_for_non_attention_mad_specs():
    import glob

    specs = [p for p in glob.glob("specs/paper/*.mad") if "attention" not in p and "striped" not in p]
    proc = madsl("check", *specs, "--iso-state", check_rc=0)
    assert "pass" in proc.stdout


def test_check_iso_state_fails_with_a_report():
    proc = madsl(
        "check",
        "specs/paper/hyena-sg.mad",
        "specs/paper/striped-hyena-sg.mad",
        "specs/paper/mh-attention-sg.mad",
        "--iso-state",
        check_rc=1,
    )
    assert "iso-state" in proc.stdout and "4,096" in proc.stdout and "2,048" in proc.stdout
    data = json.loads(
        madsl(
            "check",
            "specs/paper/hyena-sg.mad",
            "specs/paper/mh-attention-sg.mad",
            "--iso-state",
            "--format",
            "json",
            check_rc=1,
        ).stdout
    )
    assert data["ok"] is False and data["set_checks"][0]["check"] == "iso-state"


def test_check_budget_violation_exit_1(tmp_path):
    spec = tmp_path / "over.mad"
    spec.write_text("name: over\ndim: 128\ntopology: 4Mb\nbudget:\n  fixed_state: 2048\n  params: <= 100k\n")
    proc = madsl("check", str(spec), check_rc=1)
    assert "fixed_state" in proc.stdout and "params" in proc.stdout
    data = json.loads(madsl("check", str(spec), "--format", "json", check_rc=1).stdout)
    assert {v["quantity"] for v in data["specs"][0]["violations"]} == {"fixed_state", "params"}


def test_iso_params(tmp_path):
    madsl(
        "check",
        "specs/topologies/d1-1h-1a-x12.mad",
        "specs/topologies/d1-8h-12a-4a.mad",
        "--iso-params",
        "1%",
        check_rc=0,
    )
    madsl("check", "specs/paper/hyena-sg.mad", "specs/paper/hyena-moe.mad", "--iso-params", "5%", check_rc=1)


@pytest.mark.parametrize(
    "args",
    [
        ["expand", "(H:A"],
        ["expand", "H::A"],
        ["compile", "-t", "(Hy:A)x2"],
        ["compile", "no/such.mad"],
        ["check", "no/such.mad"],
        ["compile", "-t", "A{heads=3}"],
        ["check", "specs/paper/mamba.mad", "--iso-params", "x"],
        ["compile", "-t", "H", "--dim", "0"],
        ["compile"],
    ],
)
def test_bad_input_exits_2_with_a_located_message(args):
    proc = madsl(*args, check_rc=2)
    assert "error" in proc.stderr


def test_check_and_expand_do_not_import_torch():
    code = (
        "import sys; from madsl.cli import main; "
        "rc = main(['check', 'specs/paper/mamba.mad']); rc2 = main(['expand', '(H:A)x2']); "
        "rc3 = main(['compile', 'specs/paper/mamba.mad', '--emit', 'json']); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc or rc2 or rc3)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_eval_protocol_choices_are_the_runners_protocols():
    from madsl.runner.plan.protocols import PROTOCOLS
    from madsl.runner.plan.settings import PROTOCOL_NAMES

    assert set(PROTOCOL_NAMES) == set(PROTOCOLS)


@pytest.mark.parametrize(
    "args",
    [
        ["compile", "specs/paper/mamba.mad", "--emit", "torch", "--vocab", "4", "-o", "{file}"],  # a file: not a folder
        ["compile", "specs/paper/mamba.mad", "--emit", "torch", "--vocab", "4", "-o", "{file}/model.pt"],
        ["compile", "specs/paper/mamba.mad", "--emit", "json", "-o", "{tmp}"],
        [
            "fit",
            "specs/paper/hyena-sg.mad",
            "--match",
            "specs/paper/mamba.mad",
            "--on",
            "params",
            "--free",
            "Sg.inner",
            "-o",
            "{file}/solved.mad",
        ],
    ],
)
def test_unwritable_outputs_are_bad_input_naming_the_path(tmp_path, args):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    args = [a.format(tmp=tmp_path, file=a_file) for a in args]
    proc = madsl(*args, check_rc=2)
    assert "-o" in proc.stderr and str(tmp_path) in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing half-written left behind


@pytest.mark.parametrize(
    "outcome,rc,line",
    [
        ({"failed": {"run-1": "boom"}}, 3, "1 run(s) failed; rerun `madsl eval` to retry them"),
        ({"interrupted": 2}, 130, "interrupted: 2 run(s) left; rerun the same command to resume"),
    ],
)
def test_quiet_eval_still_says_when_its_table_is_not_the_result(tmp_path, capsys, monkeypatch, outcome, rc, line):
    """-q prints the score table and errors only; failed or interrupted runs are errors to report,
    or a partial table would pass for the evaluation's result."""
    import importlib

    import madsl.runner.api as api
    from madsl.cli import main

    report = importlib.import_module("madsl.runner.reports.outputs")  # (the package's `report` is the function)

    summary = {"run_ids": [], "failed": {}, "interrupted": 0, **outcome}
    monkeypatch.setattr(api, "evaluate", lambda *args, **kwargs: summary)
    monkeypatch.setattr(report, "load_scores", lambda *args, **kwargs: [])
    assert main(["eval", "specs/paper/mamba.mad", "-q", "--db", str(tmp_path / "r.db")]) == rc
    out, err = capsys.readouterr()
    assert line in err and line not in out

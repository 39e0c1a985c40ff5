"""The surfaces users copy from: the documented Python calls, as written."""
from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import madsl

ROOT = Path(__file__).resolve().parent.parent


def test_runner_report_and_evaluate_are_the_functions_whatever_was_imported_before():
    code = ("import madsl.runner.api, madsl.runner.report\n"
            "from madsl.runner import evaluate, report\n"
            "assert callable(report) and callable(evaluate), (report, evaluate)\n"
            "from madsl.errors import MadslError\n"
            "try:\n    report('no-such.db')\nexcept MadslError as err:\n    print('refused', err)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and "refused" in proc.stdout, proc.stderr


def test_python_evaluate_runs_the_specs_eval_tasks_like_the_cli():
    from madsl.runner.api import cli_overrides, evaluate, plan_spec

    assert inspect.signature(evaluate).parameters["tasks"].default is None
    path = ROOT / "specs/hybrid/selcopy-mamba.mad"
    plan = plan_spec(madsl.load_spec(path), str(path), cli_overrides())
    assert {run.task for run in plan.runs} == {"selective-copying"}


def test_account_and_build_graph_accept_a_path():
    path = ROOT / "specs/paper/mamba.mad"
    assert madsl.account(str(path)).totals == madsl.account(madsl.load_spec(path)).totals
    assert madsl.account(path, seq_len=64).seq_len == 64
    assert madsl.build_graph(str(path)).graph["seq_len"] == madsl.load_spec(path).seq_len

"""The surfaces users copy from: the documented Python calls, as written."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import madsl

ROOT = Path(__file__).resolve().parent.parent


def test_runner_report_and_evaluate_are_the_functions_whatever_was_imported_before():
    code = (
        "import madsl.runner.api, madsl.runner.reports.outputs\n"
        "from madsl.runner import evaluate, report\n"
        "assert callable(report) and callable(evaluate), (report, evaluate)\n"
        "from madsl.errors import MadslError\n"
        "try:\n    report('no-such.db')\nexcept MadslError as err:\n    print('refused', err)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and "refused" in proc.stdout, proc.stderr


def test_python_evaluate_runs_the_specs_eval_tasks_like_the_cli():
    from madsl.runner.plan.evaluation import cli_overrides, plan_spec

    assert cli_overrides(tasks=None).tasks is None  # not given: the spec's eval.tasks
    path = ROOT / "specs/hybrid/selcopy-mamba.mad"
    plan = plan_spec(madsl.load_spec(path), str(path), cli_overrides())
    assert {run.task for run in plan.runs} == {"selective-copying"}


def test_account_and_build_graph_accept_a_path():
    path = ROOT / "specs/paper/mamba.mad"
    assert madsl.account(str(path)).totals == madsl.account(madsl.load_spec(path)).totals
    assert madsl.account(path, seq_len=64).seq_len == 64
    assert madsl.build_graph(str(path)).graph["seq_len"] == madsl.load_spec(path).seq_len


# ---- the CI gate: light install, globs, one-line formats ---------------------------------------

BLOCK_TRAINING_MODULES = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'numpy'):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name.split('.')[0])
sys.meta_path.insert(0, Block())
from madsl.cli import main
sys.exit(main(sys.argv[1:]))
"""


def madsl_without_torch(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`madsl ARGS` where torch and numpy cannot be imported, as in the gate's light install."""
    return subprocess.run(
        [sys.executable, "-c", BLOCK_TRAINING_MODULES, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )


def test_the_gate_runs_without_torch_or_numpy(tmp_path):
    for args in (
        ["check", "specs/"],
        ["check", "specs/paper", "--iso-params", "1000%"],
        ["check", "specs/paper/mamba.mad", "--format", "github"],
        ["compile", "specs/paper/striped-hyena-moe.mad", "--format", "json"],
        ["expand", "(H:A)x2"],
        ["compile", "-t", "H:A", "--format", "dot"],
    ):
        proc = madsl_without_torch(*args)
        assert proc.returncode == 0, (args, proc.stdout[-500:], proc.stderr[-2000:])
    proc = madsl_without_torch(
        "compile", "specs/paper/mamba.mad", "--format", "torch", "--vocab", "16", "-o", str(tmp_path / "m.pt")
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "madsl[torch]" in proc.stderr, proc.stderr


def test_the_core_install_has_no_torch():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    assert "torch" not in core and "numpy" not in core
    assert any(d.startswith("torch") for d in project["optional-dependencies"]["torch"])
    hooks = (ROOT / ".pre-commit-hooks.yaml").read_text()
    assert "id: madsl-check" in hooks and "entry: madsl check" in hooks and "\\.mad$" in hooks


def test_check_expands_folders_and_recursive_globs_and_refuses_an_empty_match(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    spec = (ROOT / "specs/paper/mamba.mad").read_text()
    (tmp_path / "a" / "one.mad").write_text(spec)
    (tmp_path / "a" / "b" / "two.mad").write_text(spec.replace("name: mamba", "name: mamba-two"))
    for pattern in ("a", "a/**/*.mad"):
        proc = madsl_without_torch("check", pattern, "--format", "json", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert sorted(s["path"] for s in json.loads(proc.stdout)["specs"]) == ["a/b/two.mad", "a/one.mad"]
    proc = madsl_without_torch("check", "nothing/**/*.mad", cwd=tmp_path)
    assert proc.returncode == 2 and "no spec file matches" in proc.stderr


def test_check_line_and_github_formats_locate_errors_and_budget_violations(tmp_path):
    (tmp_path / "over.mad").write_text("name: over\ndim: 128\ntopology: 3H:mA\nbudget:\n  fixed_state: 4096\n")
    (tmp_path / "broken.mad").write_text("name: broken\ndim: 12x\ntopology: H\n")
    proc = madsl_without_torch("check", "over.mad", "broken.mad", "--format", "line", cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stdout.splitlines()
    assert any(line.startswith("over.mad:5:3: error: over: fixed_state = 6,144") for line in lines), lines
    assert any(line.startswith("broken.mad:2:6: error: dim must be an integer") for line in lines), lines
    assert any("from H x3 (2,048 each)" in line for line in lines), lines
    proc = madsl_without_torch("check", "over.mad", "--format", "github", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.startswith("::error file=over.mad,line=5,col=3::over: fixed_state = 6,144"), proc.stdout


def test_cli_conventions_version_verbosity_and_help_for_every_argument():
    import argparse

    from madsl import __version__
    from madsl.cli import build_parser

    proc = madsl_without_torch("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"madsl {__version__}"
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, command in commands.items():
        options = {o for action in command._actions for o in action.option_strings}
        assert {"-q", "--quiet", "-v", "--verbose"} <= options, name
        for action in command._actions:
            assert action.help, f"madsl {name}: {action.option_strings or action.dest} has no help"
    assert "--format" in {o for a in commands["compile"]._actions for o in a.option_strings}
    quiet = madsl_without_torch("compile", "specs/paper/mamba.mad", "-q")
    assert quiet.returncode == 0 and "┃" not in quiet.stdout and "within budget" in quiet.stdout


def test_eval_lengths_accepts_a_range_of_powers_of_two():
    import argparse

    import pytest

    from madsl.cli.arguments import lengths

    assert lengths("64..1048576") == [2**e for e in range(6, 21)]
    assert lengths("32,64..256") == [32, 64, 128, 256]
    assert lengths("64,128") == [64, 128]
    for bad in ("64..100", "256..64", "0..64", "a..b", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            lengths(bad)


# ---- madsl convert: Megatron-LM / Nemotron-H hybrid patterns -------------------------------------

HYBRID_PATTERN = "M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-M-M-M-M-M-"  # 54 layers, 4 attention


def test_megatron_patterns_round_trip_and_pair_each_mlp_with_the_layer_before_it():
    from madsl.convert import from_megatron_pattern, to_megatron_pattern
    from madsl.spec import spec_from_topology

    assert from_megatron_pattern("M-M-M*-ME") == "2M2-Mlp:M2-none:A-Mlp:M2-MoE"
    assert from_megatron_pattern("MM*", {"mamba": "Mb"}) == "2Mb-none:A-none"
    for pattern in (HYBRID_PATTERN, "M-M*-ME", "*-*-", "MMMM", "*E*E"):
        topology = from_megatron_pattern(pattern)
        assert to_megatron_pattern(spec_from_topology(topology, channel_mixer=None)) == pattern
    # a madsl spec whose blocks default to a SwiGLU channel mixer: the MLP is in the pattern
    assert to_megatron_pattern(ROOT / "specs/paper/attention-sg.mad") == "*-*-"


def test_what_megatron_cannot_express_is_refused_with_the_reason():
    import pytest

    from madsl.convert import from_megatron_pattern, to_megatron_pattern
    from madsl.spec import spec_from_topology

    for pattern, message in (
        ("-M", "MLP with no Mamba or attention layer before it"),
        ("M--", "layer 3"),
        ("MX", "unknown layer character 'X'"),
        ("", "empty"),
    ):
        with pytest.raises(madsl.MadslError, match=message):
            from_megatron_pattern(pattern)
    for topology, message in (
        ("H-Sg", "no Megatron layer character"),
        ("[A | Mb]", "parallel"),
        ("Mb#a:Mb#a", "shared tags"),
        ("(A:Mb){residual=gated}", "group connection"),
    ):
        with pytest.raises(madsl.MadslError, match=message):
            to_megatron_pattern(spec_from_topology(topology))


def test_madsl_convert_writes_a_spec_that_checks_and_converts_back(tmp_path):
    out = tmp_path / "nemotron.mad"
    proc = madsl_without_torch(
        "convert",
        "--from-megatron",
        HYBRID_PATTERN,
        "--dim",
        "256",
        "--layer",
        "A.heads=4",
        "--layer",
        "Mlp.inner=1024",
        "-o",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    account = madsl.account(out)
    assert [r.symbol for r in account.layers].count("A") == 4 and len(account.layers) == len(HYBRID_PATTERN)
    proc = madsl_without_torch("convert", "--to-megatron", str(out))
    assert proc.returncode == 0 and proc.stdout.strip() == HYBRID_PATTERN
    bad = madsl_without_torch("convert", "--from-megatron", "M-", "--layer", "A.head=4")
    assert bad.returncode == 2 and "did you mean 'heads'" in bad.stderr and "Traceback" not in bad.stderr


def test_reprs_are_one_short_line():
    spec = madsl.load_spec(ROOT / "specs/paper/striped-hyena-moe.mad")
    account = madsl.account(spec)
    model = madsl.compile(spec, vocab_size=16)
    for text in (repr(spec), repr(account), repr(model)):
        assert "\n" not in text and len(text) < 200, text
    assert "fixed_state=2,048" in repr(account) and "params=" in repr(model) and "H-MoE:mA-MoE" in repr(spec)


def test_the_aggregate_is_the_mad_score_only_over_the_six_mad_tasks():
    from madsl.runner.reports.outputs import aggregate_name, mad_task_order

    assert aggregate_name(mad_task_order()) == "MAD score"
    assert aggregate_name(list(reversed(mad_task_order()))) == "MAD score"
    assert aggregate_name(["in-context-recall"]) == "mean"
    assert aggregate_name([*mad_task_order(), "induction-heads"]) == "mean"


def test_compile_json_shows_the_derived_sizes_of_every_layer():
    proc = madsl_without_torch("compile", "-t", "Mb:A-Sg", "--dim", "768", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    layers = {row["symbol"]: row for row in json.loads(proc.stdout)["layers"]}
    assert layers["A"]["config"]["head_dim"] is None and layers["A"]["derived"]["inner_head_dim"] == 768
    assert layers["Mb"]["derived"] == {"d_inner": 1536, "rank": 48}


def test_progress_labels_name_the_protocols_own_setting():
    from madsl.runner.plan.evaluation import _setting_label
    from madsl.runner.plan.protocols import budgeted_baseline, get_protocol
    from madsl.tasks import TASKS

    task = TASKS["in-context-recall"]
    smoke = budgeted_baseline(task, get_protocol("smoke"))
    assert smoke != dict(task.baseline)
    assert _setting_label(smoke, smoke, task.baseline, "smoke") == "smoke setting"
    baseline = budgeted_baseline(task, get_protocol("baseline"))
    assert _setting_label(baseline, baseline, task.baseline, "baseline") == "baseline"
    assert _setting_label(smoke, {**smoke, "seq_len": 256}, task.baseline, "smoke") == "seq_len=256"


def test_every_public_callable_has_a_docstring_and_a_return_type():
    missing = []
    for name in madsl.__all__:
        obj = getattr(madsl, name)
        if not callable(obj):
            continue
        functions = [(name, obj)]
        if inspect.isclass(obj):
            if not obj.__doc__ or obj.__doc__.startswith(f"{name}("):  # a dataclass's generated signature
                missing.append(f"{name}: docstring")
            functions = [
                (f"{name}.{m}", getattr(f, "__func__", f))
                for m, f in vars(obj).items()
                if not m.startswith("_") and inspect.isfunction(getattr(f, "__func__", f))
            ]
        for label, function in functions:
            if not (function.__doc__ or "").strip():
                missing.append(f"{label}: docstring")
            if inspect.signature(function).return_annotation is inspect.Signature.empty:
                missing.append(f"{label}: return type")
    assert not missing, missing

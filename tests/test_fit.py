"""`madsl fit`: integer search over free hyperparameters to meet a budget."""

from __future__ import annotations

import pytest

import madsl
from madsl.errors import MadslError
from madsl.fit import solve, solved_data
from madsl.lang.budget import parse_bound
from madsl.spec import spec_from_data


def spec(topology: str, budget: dict, **layers) -> madsl.Spec:
    return spec_from_data({"name": "s", "dim": 128, "topology": topology, "budget": budget, "layers": layers})


def test_exact_solution_when_one_exists():
    result = solve(spec("H:H:mA", {"fixed_state": 4096}), ["H.filter_states"])
    assert result.best.values == {"H.filter_states": 16} and result.best.totals["fixed_state"] == 4096


def test_no_exact_solution_gives_the_closest_on_both_sides():
    # three Hyena layers: 3 x 128 x n states; 4096 is not a multiple of 384
    result = solve(spec("3H:mA", {"fixed_state": "4096 ± 0%"}), ["H.filter_states"])
    assert result.best is None
    assert (result.below.values, result.below.totals["fixed_state"]) == ({"H.filter_states": 10}, 3840)
    assert (result.above.values, result.above.totals["fixed_state"]) == ({"H.filter_states": 11}, 4224)


def test_one_sided_budget_takes_the_value_nearest_its_limit():
    result = solve(spec("3H:mA", {"fixed_state": "<= 4096"}), ["H.filter_states"])
    assert result.best.values == {"H.filter_states": 10}
    assert all(s.totals["fixed_state"] <= 4096 for s in result.solutions)


def test_invalid_values_are_skipped_and_a_decreasing_total_is_followed():
    # GLA's state is heads x (128/heads)^2, falling with heads, which must divide the width
    result = solve(spec("Alg", {"fixed_state": "<= 3000"}), ["Alg.heads"])
    assert result.best.values == {"Alg.heads": 8} and result.best.totals["fixed_state"] == 2048
    assert all(128 % s.values["Alg.heads"] == 0 for s in result.solutions)


def test_iso_parameter_match_with_the_paper_mamba_within_one_percent():
    target = madsl.account(madsl.load_spec("specs/paper/mamba.mad")).totals["params"]
    hyena = madsl.load_spec("specs/paper/hyena-sg.mad")
    result = solve(hyena, ["Sg.inner"], {"params": parse_bound(f"{target} ± 1%")})
    assert abs(result.best.totals["params"] - target) <= 0.01 * target
    solved = spec_from_data(solved_data(hyena, result.best))
    assert madsl.account(solved).totals == result.best.totals


@pytest.mark.parametrize(
    "free,message",
    [
        (["filter_states"], "SYMBOL.param"),
        (["Mb.d_state"], "does not use"),
        (["H.filter_statez"], "no parameter"),
        (["H.filter"], "only integer parameters"),
    ],
)
def test_bad_free_parameters_are_errors(free, message):
    with pytest.raises(MadslError, match=message):
        solve(spec("H:mA", {"fixed_state": 4096}), free)


def _madsl(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "madsl", *args], capture_output=True, text=True)


def test_cli_writes_the_solved_spec_and_it_meets_the_budget(tmp_path):
    source = tmp_path / "ha.mad"
    source.write_text("name: hyena-attn\ndim: 128\ntopology: 3H:mA\nbudget:\n  fixed_state: <= 4096\n")
    out = tmp_path / "solved.mad"
    proc = _madsl("fit", str(source), "--free", "H.filter_states", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "H.filter_states=10" in proc.stdout
    check = _madsl("check", str(out))
    assert check.returncode == 0, check.stdout + check.stderr
    assert madsl.account(madsl.load_spec(out)).totals["fixed_state"] == 3840


def test_cli_exits_1_without_a_solution_and_shows_both_sides(tmp_path):
    source = tmp_path / "ha.mad"
    source.write_text("name: hyena-attn\ndim: 128\ntopology: 3H:mA\nbudget:\n  fixed_state: 4096\n")
    proc = _madsl("fit", str(source), "--free", "H.filter_states")
    assert proc.returncode == 1
    assert "closest below: H.filter_states=10" in proc.stdout and "closest above: H.filter_states=11" in proc.stdout


def test_cli_iso_parameter_match(tmp_path):
    proc = _madsl(
        "fit",
        "specs/paper/hyena-sg.mad",
        "--match",
        "specs/paper/mamba.mad",
        "--on",
        "params",
        "--free",
        "Sg.inner",
        "--format",
        "json",
    )
    assert proc.returncode == 0, proc.stderr
    import json

    result = json.loads(proc.stdout)
    target = madsl.account(madsl.load_spec("specs/paper/mamba.mad")).totals["params"]
    assert abs(result["solution"]["totals"]["params"] - target) <= 0.01 * target


@pytest.mark.parametrize(
    "args",
    [
        ["--free", "H.nope"],
        ["--match", "specs/paper/mamba.mad", "--on", "paramz"],
        ["--match", "specs/paper/mamba.mad", "--tolerance", "nan"],
        [],
    ],
)
def test_cli_bad_input_is_exit_2_without_traceback(args):
    proc = _madsl("fit", "specs/paper/hyena-sg.mad", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr


def test_cli_unwritable_output_is_exit_2(tmp_path):
    proc = _madsl(
        "fit",
        "specs/paper/hyena-sg.mad",
        "--match",
        "specs/paper/mamba.mad",
        "--on",
        "params",
        "--free",
        "Sg.inner",
        "-o",
        str(tmp_path),
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "is a directory" in proc.stderr


def test_fit_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys; from madsl.cli import main; "
        "main(['fit', 'specs/paper/hyena-sg.mad', '--match', 'specs/paper/mamba.mad', '--free', 'Sg.inner', "
        "'--on', 'params', '--format', 'json']); assert 'torch' not in sys.modules, 'torch imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


FIT_SPEC = "name: hyena-attn\ndim: 128\ntopology: 3H:mA\nbudget:\n  fixed_state: <= 4096\n  fit: [H.filter_states]\n"


def test_budget_fit_in_a_spec_check_reports_it_unsolved_and_compile_uses_the_solution(tmp_path):
    source = tmp_path / "ha.mad"
    source.write_text(FIT_SPEC)
    assert madsl.load_spec(source).fit == ["H.filter_states"]
    check = _madsl("check", str(source), "--format", "json")
    import json

    assert check.returncode == 1 and json.loads(check.stdout)["specs"][0]["fit_solved"] is False
    compiled = _madsl("compile", str(source), "--emit", "json")
    assert compiled.returncode == 0 and "H.filter_states=10" in compiled.stderr
    assert json.loads(compiled.stdout)["totals"]["fixed_state"] == 3840
    fitted = _madsl("fit", str(source), "-o", str(tmp_path / "solved.mad"))  # free list from budget.fit
    assert fitted.returncode == 0 and _madsl("check", str(tmp_path / "solved.mad")).returncode == 0


@pytest.mark.parametrize(
    "fit,message,column",
    [
        ("[H.filter_statez]", "no parameter 'filter_statez'", 9),
        ("[Mb.d_state]", "does not use 'Mb'", 9),
        ("5", "must list free parameters", 8),
    ],
)
def test_bad_budget_fit_entries_are_located(tmp_path, fit, message, column):
    source = tmp_path / "bad.mad"
    source.write_text(FIT_SPEC.replace("[H.filter_states]", fit))
    with pytest.raises(MadslError, match=message) as info:
        madsl.load_spec(source)
    assert (info.value.location.line, info.value.location.column) == (6, column)


def test_eval_trains_the_model_compile_shows_for_an_unsolved_budget_fit(tmp_path):
    """madsl eval of a spec whose budget.fit is not solved trains the solution, as compile
    builds it (it trained the written values, outside the budget): the same spec identity as
    the spec `madsl fit -o` writes, and the note on stderr."""
    from madsl.runner.plan.evaluation import load_specs

    source, solved = tmp_path / "ha.mad", tmp_path / "solved.mad"
    source.write_text(FIT_SPEC)
    assert _madsl("fit", str(source), "-o", str(solved)).returncode == 0
    notes: list[str] = []
    [(trained, _)] = load_specs([source], notes)
    assert madsl.account(trained).totals["fixed_state"] == 3840
    assert trained.identity_text == madsl.load_spec(solved).identity_text
    assert notes == [
        f"hyena-attn: budget.fit: using the solution H.filter_states=10 (write it into the spec "
        f"with `madsl fit {source} -o FILE`)"
    ]
    planned = _madsl(
        "eval",
        str(source),
        "--protocol",
        "smoke",
        "--task",
        "memorization",
        "--dry-run",
        "--db",
        str(tmp_path / "r.db"),
    )
    assert planned.returncode == 0 and "H.filter_states=10" in planned.stderr


@pytest.mark.parametrize(
    "tolerance, shown",
    [
        (None, "budget params 429,696 ± 1% (mamba)"),
        ("0.5%", "budget params 429,696 ± 0.5% (mamba)"),
        ("0", "meet params 429,696 ± 0% (mamba)"),
    ],
)
def test_cli_match_states_its_tolerance_as_a_budget_writes_it(tolerance, shown, capsys):
    """The relative tolerance of --match reads as budgets read it (`± 1%`); it was printed as
    `± 0.01`, which in a budget is an absolute tolerance of a hundredth."""
    from madsl.cli import main

    args = ["--tolerance", tolerance] if tolerance is not None else []
    main(
        [
            "fit",
            "specs/paper/hyena-sg.mad",
            "--match",
            "specs/paper/mamba.mad",
            "--on",
            "params",
            "--free",
            "Sg.inner",
            *args,
        ]
    )
    assert shown in capsys.readouterr().out

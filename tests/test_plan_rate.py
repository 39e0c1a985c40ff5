"""The plan's time estimate: the accounting's FLOPs at this machine's training rate, measured once
per device and thread count, cached (as untrusted input), measured again on request, and not
moved by the machine's load when planning (madsl/runner/plan/rate.py, rate_cache.py, cost.py)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from runner_helpers import stand_in_rates

from madsl.cli import main
from madsl.runner.api import evaluate
from madsl.runner.plan import cost, rate_cache, rate_measure, rate_model
from madsl.runner.plan.rate import RateBook, device_key, from_entry
from madsl.runner.plan.rate_model import DeviceRates, Line, Measured, Outside, device_name, now
from madsl.spec import load_spec

SPEC = Path(__file__).resolve().parent.parent / "specs" / "paper" / "hyena-sg.mad"
SMALL = dict(
    protocol="smoke",
    tasks=["in-context-recall"],
    epochs=2,
    batch_size=8,
    set={"seq_len": 32, "num_train_examples": 24, "num_test_examples": 8},
)
CLI_SMALL = [
    "--protocol",
    "smoke",
    "--task",
    "in-context-recall",
    "--epochs",
    "2",
    "--batch-size",
    "8",
    "--set",
    "seq_len=32",
    "--set",
    "num_train_examples=24",
    "--set",
    "num_test_examples=8",
]


def _plan(tmp_path: Path, **keywords) -> dict:
    return evaluate([str(SPEC)], db=tmp_path / "r.db", dry_run=True, device="cpu", **{**SMALL, **keywords})["plan"]


def _layers(seq_len: int = 32) -> list[tuple[str, float]]:
    return list(cost.Shapes().of(load_spec(SPEC), seq_len, 16).layers)


def test_the_estimate_is_the_accountings_flops_at_the_measured_rate(tmp_path, monkeypatch):
    """A run's seconds: per training step, each layer's line (overhead + 3 x forward FLOPs x rows /
    rate) + the rest of a model (a layer and a token), / the threads' speedup; x its steps, + a third
    of a step a test batch."""
    monkeypatch.setenv("MADSL_CACHE_DIR", str(tmp_path / "cache"))
    speedup = 1.2 if torch.get_num_threads() > 1 else 1.0  # a speedup beyond the threads is refused (rate_cache)
    rates = DeviceRates(
        device_name(torch.device("cpu")),
        torch.get_num_threads(),
        {"hyena": Line(0.002, 2e9, now(), 0.1), "swiglu": Line(0.001, 5e9, now(), 0.1)},
        rest=Measured(2e-6, now(), 0.1),
        threads_speedup=Measured(speedup, now(), 0.1),
    )
    RateBook.known(rates, rate_cache.cache_path()).save()
    monkeypatch.setattr(rate_measure, "measure_family", lambda *args: pytest.fail("measured a cached rate"))
    [run] = _plan(tmp_path)["per_run"]
    lines = {"hyena": (0.002, 2e9), "swiglu": (0.001, 5e9)}

    def step(rows: int) -> float:
        layers = _layers()
        return (
            sum(lines[f][0] + 3 * flops * rows / lines[f][1] for f, flops, _ in layers) + 2e-6 * len(layers) * rows * 32
        ) / speedup

    assert run["seconds"] == pytest.approx(2 * (24 // 8 * step(8) + cost.FORWARD_SHARE * step(8)))


def test_a_plan_measures_the_rate_once_and_then_reads_it_whatever_the_load(tmp_path, monkeypatch, capsys):
    """The first plan measures (really: each layer family of the spec and the reference model, in
    this thread's CPU time); later plans read the cache, the same estimate under any load."""
    monkeypatch.setenv("MADSL_CACHE_DIR", str(tmp_path / "cache"))
    first = _plan(tmp_path)
    [source] = first["rates"]
    assert {"hyena", "swiglu", "rest"} <= set(source["measured_now"]) and source["device"].startswith("cpu: ")
    for line in source["families"].values():
        assert math.isfinite(line["flops_per_s"]) and line["flops_per_s"] > 1e6 and line["overhead_s"] >= 0
    assert first["run_seconds"] > 0 and math.isfinite(first["run_seconds"])
    [entry] = rate_cache.read_cache(rate_cache.cache_path())["devices"].values()  # valid as written
    assert set(entry["families"]) >= {"hyena", "swiglu", "attention"} and entry["rest"]["seconds_per_layer_token"] >= 0
    # a new process's imports and first optimizer, measured in a child process: seconds of CPU
    assert 0.1 < entry["startup"]["seconds"] < 120 and source["startup_s"] == entry["startup"]["seconds"]
    assert first["cpu_seconds"] == pytest.approx(first["run_seconds"] + source["startup_s"])

    monkeypatch.setattr(rate_measure, "measure_family", lambda *args: pytest.fail("measured again"))
    monkeypatch.setattr(os, "getloadavg", lambda: (40.0, 40.0, 40.0))  # a machine under heavy load now
    second = _plan(tmp_path)
    assert second["run_seconds"] == first["run_seconds"] and second["rates"][0]["measured_now"] == []
    assert main(["eval", str(SPEC), *CLI_SMALL, "--device", "cpu", "--db", str(tmp_path / "r.db"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "cached rates measured 20" in out and "UTC under load" in out and "--measure-rate measures it again" in out


def test_a_plan_counts_each_process_start_up_once(tmp_path, monkeypatch, capsys):
    """The command's CPU time: its runs and each process's start-up; its wall time: the runs
    shared out among the workers, after the command's process and then its workers start."""
    stand_in_rates(monkeypatch, tmp_path / "cache", startup_s=4.0)
    one = _plan(tmp_path)
    assert (one["processes"], one["startup_seconds"]) == (1, 4.0)
    assert one["cpu_seconds"] == pytest.approx(one["run_seconds"] + 4.0)
    assert one["wall_seconds"] == pytest.approx(one["run_seconds"] + 4.0)
    assert one["cpu_seconds_interval"] == pytest.approx([s + 4.0 for s in one["run_seconds_interval"]])
    two = _plan(tmp_path, workers=2)  # the command's process and two spawned workers
    assert two["processes"] == 3 and two["cpu_seconds"] == pytest.approx(two["run_seconds"] + 12.0)
    assert two["wall_seconds"] == pytest.approx(two["run_seconds"] / 2 + 8.0)
    assert main(["eval", str(SPEC), *CLI_SMALL, "--device", "cpu", "--db", str(tmp_path / "r.db"), "--dry-run"]) == 0
    assert ", 4.0 s to start 1 process; an upper bound" in capsys.readouterr().out


def test_measure_rate_measures_again_and_keeps_the_new_rate(tmp_path, monkeypatch, capsys):
    measured = stand_in_rates(monkeypatch, tmp_path / "cache", flops_per_s=1e9)
    before = _plan(tmp_path)["run_seconds"]
    assert set(measured) >= {"hyena", "swiglu"}
    measured.clear()
    assert _plan(tmp_path)["run_seconds"] == before and measured == []
    stand_in_rates(monkeypatch, tmp_path / "cache", flops_per_s=2e9, overhead_s=0.0005)  # a faster machine now
    assert (
        main(
            [
                "eval",
                str(SPEC),
                *CLI_SMALL,
                "--device",
                "cpu",
                "--db",
                str(tmp_path / "r.db"),
                "--dry-run",
                "--measure-rate",
            ]
        )
        == 0
    )
    assert "measured now" in capsys.readouterr().out
    assert _plan(tmp_path)["run_seconds"] == pytest.approx(before / 2)  # the new rate, cached


def _no_hyena_rate(monkeypatch, tmp_path: Path) -> None:
    """Stand-in rates in which Hyena's measurement fails (a family that cannot train here)."""
    stand_in_rates(monkeypatch, tmp_path / "cache")
    real = rate_measure.measure_family

    def no_hyena(family, device):
        if family == "hyena":
            raise RuntimeError("this layer cannot train here")
        return real(family, device)

    monkeypatch.setattr(rate_measure, "measure_family", no_hyena)


def test_a_family_without_a_rate_leaves_its_runs_untimed_and_says_why(tmp_path, monkeypatch, capsys):
    _no_hyena_rate(monkeypatch, tmp_path)
    assert main(["eval", str(SPEC), *CLI_SMALL, "--device", "cpu", "--db", str(tmp_path / "r.db"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "~? of run time" in out and "no rate for hyena (RuntimeError: this layer cannot train here)" in out
    assert "estimated wall time" not in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_runs_on_a_device_this_machine_lacks_are_not_timed(tmp_path, monkeypatch):
    from madsl.runner.plan.evaluation import cli_overrides, plan_evaluation
    from madsl.runner.store.files import StoreFiles

    stand_in_rates(monkeypatch, tmp_path / "cache")
    plan = plan_evaluation(
        StoreFiles(tmp_path / "r.db"),
        [(load_spec(SPEC), str(SPEC))],
        cli_overrides(**SMALL),
        device="cpu",
        runs_on="cuda",
    )
    for job in plan.jobs:  # placed on a GPU (a Ray cluster's, say), planned here
        job.device = "cuda"
    rates = RateBook.default()
    [run] = cost.estimate(plan.jobs, set(), rates)
    assert run.seconds is None and run.flops > 0
    summary = cost.summarize_cost(1, 0, [run], None, "ray", rates.describe())
    assert "time not estimated for the runs on cuda" in cost.render_cost(summary)


# --- the cache is untrusted input ---------------------------------------------------------------


OUTSIDE_ENTRY = {"fixed_s": 1e-3, "per_logit_s": 1e-8, "per_param_s": 1e-9, "low": 0.8, "high": 1.2}


def _valid_cache() -> dict:
    rates = DeviceRates(
        "cpu: a test CPU, 2 CPUs",
        2,
        {"hyena": Line(0.001, 1e10, now(), 0.25, ((8, 0.0005, 2e9), (128, 0.001, 1e10)))},
        rest=Measured(2e-6, now(), 0.25),
        threads_speedup=Measured(1.5, now(), 0.25),
        outside=Outside(
            **{k: v for k, v in OUTSIDE_ENTRY.items() if k not in ("measured", "load")}, measured=now(), load=0.25
        ),
    )
    return RateBook.known(rates).data


def _corrupt(change):
    def make() -> str:
        data = _valid_cache()
        [entry] = data["devices"].values()
        change(data, entry, entry["families"]["hyena"])
        return json.dumps(data)

    return make


CORRUPT = {
    "rate 1e999": lambda: _corrupt(lambda d, e, f: f.update(flops_per_s=1e999))().replace("Infinity", "1e999"),
    "NaN": _corrupt(lambda d, e, f: f.update(overhead_s=float("nan"))),
    "zero rate": _corrupt(lambda d, e, f: f.update(flops_per_s=0)),
    "negative overhead": _corrupt(lambda d, e, f: f.update(overhead_s=-1.0)),
    "a step of years": _corrupt(lambda d, e, f: f.update(overhead_s=1e9)),
    "strings": _corrupt(lambda d, e, f: f.update(flops_per_s="1e10")),
    "booleans": _corrupt(lambda d, e, f: f.update(flops_per_s=True)),
    "an unknown key": _corrupt(lambda d, e, f: f.update(extra=1)),
    "a missing key": _corrupt(lambda d, e, f: f.pop("load")),
    "a date that is not one": _corrupt(lambda d, e, f: f.update(measured="yesterday")),
    "a negative load": _corrupt(lambda d, e, f: f.update(load=-3)),
    "a family name that is a path": _corrupt(lambda d, e, f: e["families"].update({"../../etc": f})),
    "a device key that is no hash": _corrupt(lambda d, e, f: d["devices"].update({"../x": e})),
    "escape codes in the device's name": _corrupt(lambda d, e, f: e.update(device="cpu \x1b[2J")),
    "zero threads": _corrupt(lambda d, e, f: e.update(threads=0)),
    "a negative rest": _corrupt(lambda d, e, f: e["rest"].update(seconds_per_layer_token=-1e-6)),
    "a speedup below 1": _corrupt(lambda d, e, f: e["threads_speedup"].update(factor=0.5)),
    "an unknown measurement": _corrupt(lambda d, e, f: e.update(model={"factor": 1.0})),
    "another format": _corrupt(lambda d, e, f: d.update(format=3)),
    "a width out of range": _corrupt(lambda d, e, f: f.update(points=[[0, 0.001, 1e10]])),
    "an outside term out of range": _corrupt(lambda d, e, f: e.update(outside={**OUTSIDE_ENTRY, "per_logit_s": 1.0})),
    "deep nesting": lambda: "[" * 100_000 + "]" * 100_000,
    "not an object": lambda: "[1, 2]",
    "not JSON": lambda: "\x00\xff{ not json",
    "too large": lambda: " " * (rate_cache.MAX_BYTES + 1),
}


@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_a_corrupt_rate_cache_is_refused_saying_what_is_wrong(tmp_path, kind):
    path = tmp_path / "device-rates.json"
    path.write_text(json.dumps(_valid_cache()))
    rate_cache.read_cache(path)  # the valid one reads
    path.write_text(CORRUPT[kind]())
    with pytest.raises(ValueError) as err:
        rate_cache.read_cache(path)
    assert str(err.value) and "Traceback" not in str(err.value)


def test_a_corrupt_rate_cache_is_discarded_with_one_warning_measured_again_and_rewritten(
    tmp_path, monkeypatch, capsys, caplog
):
    measured = stand_in_rates(monkeypatch, tmp_path / "cache")
    before = _plan(tmp_path)["run_seconds"]
    path = rate_cache.cache_path()
    path.write_text(path.read_text().replace('"flops_per_s": 1000000000.0', '"flops_per_s": NaN', 1))
    measured.clear()
    with caplog.at_level("WARNING", logger="madsl"):  # logged, not warnings.warn (which shows madsl's source)
        assert (
            main(["eval", str(SPEC), *CLI_SMALL, "--device", "cpu", "--db", str(tmp_path / "r.db"), "--dry-run"]) == 0
        )
    ours = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
    assert len(ours) == 1 and "not a usable rate cache" in ours[0] and "NaN" in ours[0]
    out = capsys.readouterr().out
    assert "nan" not in out and "inf" not in out and "measured now" in out
    assert set(measured) >= {"hyena", "swiglu"}  # measured again
    rate_cache.read_cache(path)  # and rewritten, valid
    caplog.clear()
    assert _plan(tmp_path)["run_seconds"] == pytest.approx(before)
    assert not caplog.records


def test_a_symlinked_rate_cache_is_neither_read_nor_replaced(tmp_path, monkeypatch, caplog):
    stand_in_rates(monkeypatch, tmp_path / "cache")
    target = tmp_path / "precious.json"
    original = json.dumps(_valid_cache())
    target.write_text(original)
    link = rate_cache.cache_path()
    link.parent.mkdir()
    link.symlink_to(target)
    with caplog.at_level("WARNING", logger="madsl"):
        plan = _plan(tmp_path)
    assert "symbolic link" in caplog.text
    assert plan["run_seconds"] > 0  # measured, not read from the link
    assert link.is_symlink() and target.read_text() == original


def test_the_cache_lives_in_the_users_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("MADSL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert rate_cache.cache_path() == tmp_path / "xdg" / "madsl" / "device-rates.json"
    monkeypatch.setenv("MADSL_CACHE_DIR", str(tmp_path / "mine"))
    assert rate_cache.cache_path() == tmp_path / "mine" / "device-rates.json"
    # the key of a device's rates: its name, threads, torch's and madsl's versions
    assert len({device_key("cpu: x", 1), device_key("cpu: x", 2), device_key("cpu: y", 1)}) == 3


# --- progress ----------------------------------------------------------------------------------


def test_a_plan_that_measures_reports_it_and_the_dry_run_shows_it_after_a_second(tmp_path, monkeypatch, capsys):
    from madsl.cli import progress
    from madsl.runner.execute.coordinator import Reporter

    stand_in_rates(monkeypatch, tmp_path / "cache")
    heard = []

    class Listening(Reporter):
        def planning(self, what: str, done: int, total: int) -> None:
            heard.append((what, done, total))

    evaluate([str(SPEC)], db=tmp_path / "r.db", dry_run=True, device="cpu", reporter=Listening(), **SMALL)
    assert heard and all(what.startswith("measuring this machine's training rate: ") for what, _, _ in heard)
    assert [done for _, done, _ in heard] == list(range(len(heard))) and heard[0][2] == len(heard)

    args = ["eval", str(SPEC), *CLI_SMALL, "--device", "cpu", "--db", str(tmp_path / "r.db"), "--dry-run"]
    assert main(args) == 0  # cached: nothing measured, nothing said of it
    assert "measuring" not in capsys.readouterr().err
    monkeypatch.setattr(progress, "PLANNING_SHOWN_AFTER_S", 0.0)  # as if it took longer than a second
    assert main([*args, "--measure-rate"]) == 0
    err = capsys.readouterr().err
    assert "planning 1 spec" in err and "measuring this machine's training rate" in err


@pytest.mark.parametrize("load, speedup", [(40.0, None), (0.0, 1.7)])
def test_the_threads_speedup_is_measured_on_free_cores_only(tmp_path, monkeypatch, load, speedup):
    """On busy cores two threads' speedup would read low: it is taken as 1 (the estimate errs long,
    and says so); on free ones it is measured, and a run on two threads takes that much less."""
    from madsl.runner.plan.evaluation import cli_overrides, plan_evaluation
    from madsl.runner.plan.rate_model import Measured
    from madsl.runner.store.files import StoreFiles

    stand_in_rates(monkeypatch, tmp_path / "cache")
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(
        rate_measure,
        "measure_speedup",
        lambda *args: Measured(speedup, now(), load) if speedup else pytest.fail("measured on busy cores"),
    )
    plan = plan_evaluation(
        StoreFiles(tmp_path / "r.db"), [(load_spec(SPEC), str(SPEC))], cli_overrides(**SMALL), device="cpu"
    )
    rates = RateBook.default()
    [two] = cost.estimate(plan.jobs, set(), rates, threads=2)
    [one] = cost.estimate(plan.jobs, set(), RateBook.default(), threads=1)
    assert two.seconds == pytest.approx(one.seconds / (speedup or 1.0))
    text = cost.render_cost(cost.summarize_cost(1, 0, [two], 1, "local", rates.describe()))
    assert ("the threads' speedup is taken as 1" in text) is (speedup is None)
    assert ("(1.7x one)" in text) is (speedup is not None)


def test_a_line_measured_at_a_ladder_of_widths_is_interpolated_in_log_width_and_held_at_its_ends():
    line = Line(0.004, 4e10, now(), 0.1, ((8, 0.001, 1e9), (32, 0.003, 4e9), (128, 0.004, 4e10)))
    assert line.at(8) == (0.001, 1e9) and line.at(4) == (0.001, 1e9) and line.at(1024) == (0.004, 4e10)
    overhead, rate = line.at(16)  # halfway between 8 and 32 in log width
    assert overhead == pytest.approx(0.002) and rate == pytest.approx(2e9)
    assert line.seconds(6e9, 16) == pytest.approx(0.002 + 3.0)
    assert Line(0.004, 4e10, now(), 0.1).at(8) == (0.004, 4e10)  # one line (a stand-in's): every width


def test_the_step_adds_what_a_model_costs_outside_its_layers_and_the_plan_states_an_interval():
    outside = Outside(0.002, 1e-8, 1e-9, 0.9, 1.7, now(), 0.1)
    rates = DeviceRates("cpu: a test CPU, 1 CPUs", 1, {"hyena": Line(0.001, 1e9, now(), 0.1)}, outside=outside)
    layers = [("hyena", 1e6, 8), ("hyena", 1e6, 8)]
    layers_only = 2 * (0.001 + 3 * 1e6 * 4 / 1e9)
    assert rates.step_seconds(layers, 4, 128) == pytest.approx(layers_only)  # no model: its layers alone
    with_model = rates.step_seconds(layers, 4, 128, model=(256, 5000))
    assert with_model == pytest.approx(layers_only + 0.002 + 1e-8 * 4 * 128 * 256 + 1e-9 * 5000)
    # stacked members pay the fixed cost once, the logits and parameters each
    two = rates.step_seconds(layers, 4, 128, members=2, model=(256, 5000))
    assert two == pytest.approx(2 * layers_only - 2 * 0.001 + 0.002 + 2 * (1e-8 * 4 * 128 * 256 + 1e-9 * 5000))
    low, high = rates.interval()  # the fit's spread, at least the benchmarked one
    assert low == min(0.9, rate_model.PLANNED_LOW) and high == max(1.7, rate_model.PLANNED_HIGH)
    costs = [
        cost.RunCost("r1", "s", "t", 10, 1.0, 10.0, interval=(low, high)),
        cost.RunCost("r2", "s", "t", 10, 1.0, 20.0),
    ]
    plan = cost.summarize_cost(2, 0, costs, 2, "local")
    assert plan["run_seconds"] == 30.0 and plan["run_seconds_interval"] == pytest.approx(
        [10 * low + 20, 10 * high + 20]
    )
    assert plan["wall_seconds_interval"] == pytest.approx([(10 * low + 20) / 2, (10 * high + 20) / 2])
    assert "likely between" in cost.render_cost(plan)


def test_a_format_1_cache_is_measured_again_never_read_as_the_new_format(tmp_path, monkeypatch, caplog):
    path = tmp_path / "device-rates.json"
    old = _valid_cache()
    old["format"] = 1
    path.write_text(json.dumps(old))
    assert rate_cache.read_cache(path) == {"format": rate_cache.FORMAT, "devices": {}}
    book = RateBook(path)
    assert book.data["devices"] == {} and not caplog.records  # no warning: an older madsl's cache


def test_the_cache_keeps_the_ladder_and_the_outside_terms(tmp_path):
    path = tmp_path / "device-rates.json"
    rate_cache.save_cache(path, _valid_cache())
    book = RateBook(path)
    [(key, entry)] = book.data["devices"].items()
    rates = from_entry(entry["device"], entry["threads"], entry)
    assert rates.families["hyena"].points == ((8, 0.0005, 2e9), (128, 0.001, 1e10))
    assert rates.outside is not None and rates.outside.per_logit_s == 1e-8 and rates.outside.high == 1.2


def test_the_rest_is_fitted_with_no_negative_term():
    features = [[1.0, n * 1000.0, n * k * 10.0, 500.0 * k] for n in (1, 2, 4, 8) for k in (1, 3)]
    truth = [0.003, 2e-8, 1e-6, 1e-9]
    values = [sum(c * f for c, f in zip(truth, row)) for row in features]
    assert rate_measure._nonnegative_fit(features, values) == pytest.approx(truth, rel=1e-6)
    # a layer-token term that reads negative (the layers' lines over-counted) is held at 0
    fitted = rate_measure._nonnegative_fit(features, [v - 2e-6 * row[2] for v, row in zip(values, features)])
    assert all(c >= 0 for c in fitted) and fitted[2] == 0.0


def test_multi_head_attention_is_timed_as_a_family_of_its_head_width():
    assert rate_model.rate_family("attention", {"heads": 16, "head_dim": 8}) == "attention_hd8"
    assert rate_model.rate_family("attention", {"heads": 1, "head_dim": 128}) == "attention"
    assert rate_model.rate_family("hyena", {}) == "hyena"
    prim = rate_model.family_primitive("attention_hd8", 32)
    assert (prim.heads, prim.head_dim, prim.dim) == (4, 8, 32)


def test_a_family_is_measured_at_the_widths_it_takes(monkeypatch):
    """Multi-head Hyena's 16 default heads do not divide width 8: its line is measured at the
    ladder's other widths, never refused whole (a plan without its runs' hours)."""
    monkeypatch.setattr(rate_measure, "_family_line", lambda family, device, width: (1e-3, 1e9 * width))
    line = rate_measure.measure_family("multihead_hyena", torch.device("cpu"))
    assert [point[0] for point in line.points] == [16, 32, 64, 128] and line.flops_per_s == 128e9


def test_a_study_whose_runs_have_no_rate_says_the_hours_leave_them_out(tmp_path, monkeypatch, capsys):
    _no_hyena_rate(monkeypatch, tmp_path)
    study = tmp_path / "study.yaml"
    study.write_text(
        "name: s\ndata: bundled:tinyshakespeare\nseq_len: 32\narchitectures:\n  hyena: bundled:paper/hyena-sg\n"
        "  mamba: bundled:paper/mamba\nbudgets: [2e9]\nsizes: [{dim: 16}]\nrecipe: {batch_size: 8, eval_tokens: 1024}\n"
    )
    assert main(["scale", str(study), "--db", str(tmp_path / "r.db"), "--dry-run", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "warning: 1 of 2 runs to do have no time estimate (hyena: RuntimeError: this layer cannot train here)" in out


def test_a_layer_that_reads_the_token_embeddings_is_timed_with_some_linked(monkeypatch):
    """Zs reads the model's token embeddings, which a model links; timed alone, the rate measurement
    links random ones of the input's shape (before: RuntimeError, and its runs were not timed)."""
    monkeypatch.setattr(rate_measure, "TIMED_STEPS", 1)
    overhead, rate = rate_measure._family_line("zamba_shared", torch.device("cpu"), 32)
    assert overhead >= 0 and rate > 0

"""Sweep files: variants of real specs (named, with their own identities, budget-checked),
their errors located in the sweep file, and one sweep run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from madsl.cli import main
from madsl.runner.plan.sweep import load_sweep, variant_name

REPO = Path(__file__).resolve().parent.parent
HYENA = REPO / "specs" / "paper" / "hyena-sg.mad"  # budget: fixed_state 4096 exactly

torch.set_num_threads(1)


def write(tmp_path, text: str) -> Path:
    # a sweep names the bundled spec by name: an absolute path (the old `{HYENA}`) is refused
    # by the read policy (tests/test_hostile_sweeps.py)
    path = tmp_path / "study.yaml"
    path.write_text(text.format(hyena="bundled:paper/hyena-sg"))
    return path


GRID = """\
specs: [{hyena}]
protocol: smoke
tasks: [in-context-recall]
vary:
  dim: [64, 128]
  layers.H.order: [2, 3]
train: {{lr: [5e-4, 1e-3]}}
"""


def test_a_grid_gives_named_variants_with_their_own_identities_and_budget_verdicts(tmp_path):
    sweep = load_sweep(write(tmp_path, GRID))
    assert sweep.protocol == "smoke" and sweep.tasks == ["in-context-recall"]
    assert sweep.train == {"lr": (5e-4, 1e-3)}  # 5e-4 (a string to PyYAML) read as a number
    names = [v.spec.name for v in sweep.variants]
    assert names == [
        "hyena-sg[dim=64,H.order=2]",
        "hyena-sg[dim=64,H.order=3]",
        "hyena-sg[dim=128,H.order=2]",
        "hyena-sg[dim=128,H.order=3]",
    ]
    for variant in sweep.variants:
        assert variant.spec.dim == variant.varied["dim"]
        assert variant.spec.symbols["H"].params["order"] == variant.varied["layers.H.order"]
    assert len({v.spec.identity_text for v in sweep.variants}) == 4
    # hyena-sg's budget is iso-state: fixed_state exactly 4096 = dim * 16 states * (order - 1) * 2 blocks
    over = {v.spec.name for v in sweep.variants if v.over_budget}
    assert over == {"hyena-sg[dim=64,H.order=2]", "hyena-sg[dim=128,H.order=3]"}
    assert [v.spec.name for v in sweep.runnable()] == ["hyena-sg[dim=64,H.order=3]", "hyena-sg[dim=128,H.order=2]"]
    assert len(sweep.runnable(allow_over_budget=True)) == 4


def test_the_unvaried_variant_is_the_spec_itself(tmp_path):
    sweep = load_sweep(write(tmp_path, "specs: [{hyena}]\nvary: {{dim: [128]}}\n"))
    from madsl.spec import load_spec

    assert sweep.variants[0].spec.identity_text == load_spec(HYENA).identity_text  # same runs, same results
    assert variant_name("hyena-sg", {}) == "hyena-sg"


def test_a_sweep_runs_its_variants_skips_the_over_budget_ones_and_reports_them_as_rows(tmp_path, capsys):
    study = write(
        tmp_path,
        """\
specs: [{hyena}]
protocol: smoke
tasks: in-context-recall
vary:
  dim: [64]
  layers.H.order: [2, 3]
train: {{epochs: 1, lr: 1e-3}}
""",
    )
    db = str(tmp_path / "r.db")
    assert main(["eval", str(study), "--db", db, "--format", "json"]) == 0
    out = capsys.readouterr()
    assert "over budget, not run: hyena-sg[dim=64,H.order=2]" in out.err
    summary = json.loads(out.out)
    assert summary["runs"] == 1 and summary["done"] == 1
    assert main(["report", "--db", db, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {row["spec"] for row in rows} == {"hyena-sg[dim=64,H.order=3]"}
    assert main(["report", "--db", db]) == 0
    assert "hyena-sg[dim=64,H.order=3]" in capsys.readouterr().out  # not eaten as rich markup


@pytest.mark.parametrize(
    "text, message, where, hint",
    [
        (
            "specs: [{hyena}]\nvray: {{dim: [64]}}\n",
            "unknown key 'vray' in a sweep file",
            ":2:1",
            "did you mean 'vary'?",
        ),
        (
            "specs: [{hyena}]\nvary:\n  layers.H.ordr: [2, 3]\n",
            "layer H of spec hyena-sg (hyena) has no parameter 'ordr'",
            ":3:3",
            "did you mean 'order'?",
        ),
        ("specs: [{hyena}]\nvary:\n  layers.A.heads: [2, 4]\n", "spec hyena-sg has no layer 'A'", ":3:3", None),
        (
            "specs: [{hyena}]\nvary:\n  dimm: [64]\n",
            "'dimm' is not a field of spec hyena-sg",
            ":3:3",
            "did you mean 'dim'?",
        ),
        ("specs: [{hyena}]\nprotocol: quik\n", "unknown protocol 'quik'", ":2:11", "did you mean 'quick'?"),
        ("specs: [{hyena}, nothing-*.mad]\n", "specs: 'nothing-*.mad' matches no file", ":1:", None),
        ("specs: [{hyena}]\ntrain: {{lr: fast}}\n", "train.lr: expected a number or a list of them", ":2:", None),
        ("specs: [{hyena}]\nvary:\n  dim: []\n", "vary.dim: the list is empty", ":3:8", "or drop vary.dim"),
        ("specs: [{hyena}]\nvary:\n  dim: 64\n", "vary.dim: expected a list of values", ":3:8", "dim: [64]"),
        # a value listed twice would make one variant or one run of two: a slip, located at the repeat
        (
            "specs: [{hyena}]\nvary:\n  layers.H.order: [2, 2]\n",
            "vary.layers.H.order: 2 is given twice",
            ":3:23",
            "list each value once",
        ),
        ("specs: [{hyena}]\ntrain: {{lr: [5e-4, 5.0e-4]}}\n", "train.lr: 0.0005 is given twice", ":2:20", None),
    ],
)
def test_sweep_file_errors_are_located_with_a_hint(tmp_path, capsys, text, message, where, hint):
    study = write(tmp_path, text)
    assert main(["eval", str(study), "--db", str(tmp_path / "r.db")]) == 2
    err = capsys.readouterr().err
    assert message in err and f"{study}{where}" in err and "Traceback" not in err
    if hint:
        assert hint in err
    assert not (tmp_path / "r.db").exists()


# --- plans and their cost ------------------------------------------------------------------------


def _known_rates(overhead_s: float = 0.01, flops_per_s: float = 1e9):
    """A rate book holding fixed rates of this CPU (hyena-sg's families): nothing is measured."""
    from madsl.runner.plan.rate import RateBook
    from madsl.runner.plan.rate_model import DeviceRates, Line, Measured, device_name, now

    return RateBook.known(
        DeviceRates(
            device_name(torch.device("cpu")),
            torch.get_num_threads(),
            {family: Line(overhead_s, flops_per_s, now(), 0.0) for family in ("hyena", "swiglu")},
            rest=Measured(0.0, now(), 0.0),
        )
    )


@pytest.mark.parametrize("done", [0, 1])
def test_a_stacked_groups_runs_are_costed_as_the_group_that_trains_them(tmp_path, monkeypatch, done):
    """On CUDA the paper grid of a setting trains as one stacked group (graph-replayed): the plan
    costs the group's stacked step (its pending members' FLOPs, each layer's per-step overhead
    once) and shares it out among its pending runs, instead of costing each run's own step
    (which on a GPU is bound by its launches, not what runs)."""
    from madsl.runner.plan import cost, rate_measure
    from madsl.runner.plan.evaluation import cli_overrides, plan_evaluation
    from madsl.runner.store.files import StoreFiles
    from madsl.spec import load_spec

    cli = cli_overrides(
        protocol="smoke",
        tasks=["in-context-recall"],
        lr=[1e-3, 5e-4, 1e-4],
        epochs=2,
        batch_size=8,
        settings={"num_train_examples": 24, "num_test_examples": 8, "seq_len": 32},
    )
    spec = load_spec(HYENA)
    plan = plan_evaluation(StoreFiles(tmp_path / "r.db"), [(spec, str(HYENA))], cli, device="cpu")
    [group] = plan.work(batch_grid=True)
    group.stack = True  # as on CUDA (on the CPU a group trains in lockstep, costed run by run)
    monkeypatch.setattr(rate_measure, "measure_family", lambda *args: pytest.fail("measured a known rate"))
    finished = {group.members[0].run_id} if done else set()
    costs = cost.estimate(plan.jobs, finished, _known_rates(), work=[group])
    pending = 3 - done
    assert len(costs) == pending and len({c.seconds for c in costs}) == 1 and costs[0].seconds > 0
    vocab = group.members[0].task.vocab_size(dict(group.members[0].setting))
    layers = cost.Shapes().of(spec, 32, vocab).layers

    def step(rows: int, members: int) -> float:  # the known line of each layer: 0.01 s + FLOPs at 1 GFLOP/s
        return sum(0.01 + 3 * flops * rows * members / 1e9 for _, flops, _width in layers)

    epoch = 24 // 8 * step(8, pending) + cost.FORWARD_SHARE * 1 * step(8, pending)  # 3 steps, one evaluation batch of 8
    assert sum(c.seconds for c in costs) == pytest.approx(epoch * 2)  # 2 epochs of the group
    alone = cost.estimate(plan.jobs, finished, _known_rates(), work=plan.jobs)  # each run's own steps
    shared = (pending - 1) * len(layers) * 0.01 * (24 // 8 + cost.FORWARD_SHARE) * 2  # overheads paid once, not per run
    assert sum(c.seconds for c in alone) - sum(c.seconds for c in costs) == pytest.approx(shared)


def test_a_group_that_cannot_stack_is_costed_run_by_run(tmp_path, monkeypatch):
    """A group whose runs cannot train stacked (Adam: the stack's update is AdamW's) trains in
    lockstep, one run after another, even where groups stack: the plan costs its runs each
    by its own step, not as a share of a stacked step that never runs."""
    from madsl.runner.plan import cost
    from madsl.runner.plan.evaluation import cli_overrides, plan_evaluation
    from madsl.runner.store.files import StoreFiles
    from madsl.spec import load_spec

    cli = cli_overrides(
        protocol="smoke",
        tasks=["in-context-recall"],
        lr=[1e-3, 5e-4],
        epochs=1,
        batch_size=8,
        optimizer="adam",
        settings={"num_train_examples": 16, "num_test_examples": 8, "seq_len": 16},
    )
    plan = plan_evaluation(StoreFiles(tmp_path / "r.db"), [(load_spec(HYENA), str(HYENA))], cli, device="cpu")
    [group] = plan.work(batch_grid=True)
    group.stack = True  # as on CUDA
    costs = cost.estimate(plan.jobs, set(), _known_rates(), work=[group])
    assert costs == cost.estimate(plan.jobs, set(), _known_rates(), work=plan.jobs)  # as runs
    adamw = cli_overrides(
        protocol="smoke",
        tasks=["in-context-recall"],
        lr=[1e-3, 5e-4],
        epochs=1,
        batch_size=8,
        settings={"num_train_examples": 16, "num_test_examples": 8, "seq_len": 16},
    )
    stacking = plan_evaluation(StoreFiles(tmp_path / "r.db"), [(load_spec(HYENA), str(HYENA))], adamw, device="cpu")
    [stack] = stacking.work(batch_grid=True)
    stack.stack = True  # the same runs under AdamW do stack: their overheads shared, cheaper
    assert sum(c.seconds for c in cost.estimate(stacking.jobs, set(), _known_rates(), work=[stack])) < sum(
        c.seconds for c in costs
    )


def test_dry_run_counts_runs_tokens_flops_and_estimates_time_and_a_real_sweep_prints_it_first(
    tmp_path, capsys, monkeypatch
):
    from runner_helpers import stand_in_rates

    from madsl.graph import account
    from madsl.spec import load_spec

    measured = stand_in_rates(monkeypatch, tmp_path / "cache")

    db = tmp_path / "r.db"
    small = ["--set", "num_train_examples=32", "--set", "num_test_examples=32", "--batch-size", "16", "--epochs", "1"]
    args = [
        "eval",
        str(HYENA),
        "--protocol",
        "smoke",
        "--task",
        "in-context-recall",
        "--lr",
        "1e-3",
        "--lr",
        "5e-4",
        *small,
        "--db",
        str(db),
    ]
    assert main([*args, "--dry-run", "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert not db.exists()  # nothing registered, nothing run
    assert (plan["runs"], plan["done"], plan["pending"]) == (2, 0, 2)
    run = plan["per_run"][0]
    assert run["tokens"] == 32 * 128  # examples x seq_len x 1 epoch
    forward = account(load_spec(HYENA), seq_len=128, vocab=16).totals["flops"]
    assert run["flops"] == pytest.approx(3 * forward * 32)  # forward + backward = 3 forwards, per sequence
    assert plan["tokens"] == 2 * run["tokens"] and plan["flops"] == pytest.approx(2 * run["flops"])
    assert plan["run_seconds"] > 0 and plan["wall_seconds"] == pytest.approx(plan["run_seconds"])
    assert measured and set(measured) >= {"hyena", "swiglu"}  # the rate of each of its layer families
    # the rate is cached for this machine: the next plan reads it instead of measuring
    cache = tmp_path / "cache" / "device-rates.json"
    data = json.loads(cache.read_text())
    for device in data["devices"].values():
        for line in device["families"].values():  # a machine 1000 times slower
            line["overhead_s"], line["flops_per_s"] = line["overhead_s"] * 1000, line["flops_per_s"] / 1000
    cache.write_text(json.dumps(data))
    measured.clear()
    assert main([*args, "--dry-run", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["run_seconds"] == pytest.approx(1000 * plan["run_seconds"])
    assert measured == []

    assert main(args) == 0  # a real sweep prints the same plan first
    assert "plan: 2 runs, 0 done, 2 pending" in capsys.readouterr().err
    assert main([*args, "--dry-run"]) == 0
    assert "plan: 2 runs, 2 done, 0 pending" in capsys.readouterr().out

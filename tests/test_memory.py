"""A plan whose runs cannot fit where they train is refused before anything runs (exit 2, what
a run needs against what the device has), and a plan that fits is never refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from madsl.cli import main
from madsl.errors import MadslError
from madsl.runner.plan import cost, memory
from madsl.runner.plan.evaluation import cli_overrides, plan_evaluation
from madsl.runner.store.files import StoreFiles
from madsl.spec import load_spec

PAPER = Path(__file__).resolve().parent.parent / "specs" / "paper"
GiB = 1 << 30


def _plan(tmp_path: Path, spec: str, protocol: str, tasks=None, **overrides):
    path = PAPER / spec
    cli = cli_overrides(protocol=protocol, tasks=tasks, **overrides)
    return plan_evaluation(StoreFiles(tmp_path / "r.db"), [(load_spec(path), str(path))], cli, device="cpu")


@pytest.mark.parametrize("spec", sorted(p.name for p in PAPER.glob("*.mad")))
def test_the_paper_protocol_of_every_paper_spec_fits_a_16_gib_machine(tmp_path, monkeypatch, spec):
    monkeypatch.setattr(memory, "cpu_memory", lambda: 16 * GiB)
    plan = _plan(tmp_path, spec, "paper")
    memory.check_fits(plan.work(batch_grid=True))  # six members a group, the largest vocabularies and lengths


def test_the_bound_counts_the_models_real_parameters_and_each_member_of_a_group(tmp_path, monkeypatch):
    plan = _plan(tmp_path, "attention-sg.mad", "baseline", tasks=["memorization"])
    group = plan.work(batch_grid=True)[0]
    assert len(group.members) == 6
    job = group.members[0]
    vocab = job.task.vocab_size(dict(job.setting))
    model = job.model_factory(
        vocab_size=vocab,
        max_seq_len=int(job.setting["seq_len"]),
        num_classes=job.task.num_classes(dict(job.setting)),
        seed=0,
    )
    real = sum(p.numel() for p in model.parameters())
    from madsl.graph import account

    acc = account(job.model_factory.spec, seq_len=int(job.setting["seq_len"]), vocab=vocab)
    one_run = memory.needs([job], acc.totals["params"], len(acc.layers))
    assert one_run["weights"] == 4 * real and one_run["training state"] == 12 * real
    six_runs = memory.needs(group.members, acc.totals["params"], len(acc.layers))
    # six weights and states; one seed: the data once; activations once (lockstep steps one member at a time)
    assert six_runs == {**one_run, "weights": 6 * one_run["weights"], "training state": 6 * one_run["training state"]}
    monkeypatch.setattr(memory, "cpu_memory", lambda: sum(six_runs.values()) - 1)  # one run fits; six together do not
    memory.check_fits(plan.work(batch_grid=False))
    with pytest.raises(MadslError, match="6 runs trained together need at least"):
        memory.check_fits(plan.work(batch_grid=True))
    monkeypatch.setattr(memory, "cpu_memory", lambda: sum(six_runs.values()))
    memory.check_fits(plan.work(batch_grid=True))


def test_a_setting_far_too_large_is_refused_at_plan_time_with_what_it_needs(tmp_path, capsys):
    db = tmp_path / "r.db"
    rc = main(
        [
            "eval",
            str(PAPER / "attention-sg.mad"),
            "--protocol",
            "smoke",
            "--task",
            "memorization",
            "--set",
            "vocab_size=1000000000",
            "--db",
            str(db),
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and not db.exists()
    assert "attention-sg on memorization (vocab_size=1000000000" in err and "does not fit" in err
    assert "128,000,525,056 parameters" in err and "this machine has" in err and "Traceback" not in err


def test_a_step_that_runs_out_of_memory_while_the_plan_measures_the_rate_is_a_clear_error(
    tmp_path, capsys, monkeypatch
):
    from madsl.runner.plan import rate_measure

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    monkeypatch.setenv("MADSL_CACHE_DIR", str(tmp_path / "cache"))  # nothing cached: the plan measures
    monkeypatch.setattr(rate_measure, "measure_family", out_of_memory)
    rc = main(
        [
            "eval",
            str(PAPER / "attention-sg.mad"),
            "--protocol",
            "smoke",
            "--task",
            "in-context-recall",
            "--db",
            str(tmp_path / "r.db"),
            "--dry-run",
            "--no-batch-grid",
        ]
    )
    err = capsys.readouterr().err
    assert (
        rc == 2 and "ran out of memory while the plan measured this device's training rate (CUDA out of memory" in err
    )
    assert "Traceback" not in err


def test_a_batch_larger_than_the_training_set_is_costed_as_the_batch_that_trains(tmp_path, capsys, monkeypatch):
    import json

    from runner_helpers import stand_in_rates

    stand_in_rates(monkeypatch, tmp_path / "cache", flops_per_s=1e9, overhead_s=0.0)
    rc = main(
        [
            "eval",
            str(PAPER / "mamba.mad"),
            "--protocol",
            "smoke",
            "--task",
            "memorization",
            "--batch-size",
            "100000000",
            "--db",
            str(tmp_path / "r.db"),
            "--dry-run",
            "--no-batch-grid",
            "--format",
            "json",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0, err
    [run] = json.loads(out)["per_run"]
    # smoke trains on 64 examples: one batch of all of them, not a step of 10^8 rows; evaluates
    # its 32 test examples in one batch; 2 epochs, at 3 x the forward FLOPs a sequence
    layers = cost.Shapes().of(load_spec(PAPER / "mamba.mad"), run["seq_len"], 16).layers
    step = sum(3 * flops for _, flops, _width in layers) / 1e9  # one sequence's training step, in seconds
    assert run["seconds"] == pytest.approx(2 * (step * 64 + cost.FORWARD_SHARE * step * 32))


def test_meta_tokens_lengthen_the_activations_the_bound_counts(tmp_path):
    """The stack reads a spec's meta tokens ahead of every sequence: its activations are (L + M) long."""
    from madsl.spec import spec_with

    spec = load_spec(PAPER / "attention-sg.mad")
    cli = cli_overrides(protocol="baseline", tasks=["memorization"])
    jobs = []
    for meta in (0, 64):
        variant = spec_with(spec, {"meta_tokens": meta}) if meta else spec
        plan = plan_evaluation(StoreFiles(tmp_path / f"r{meta}.db"), [(variant, "x.mad")], cli, device="cpu")
        jobs.append(plan.work(batch_grid=False)[0])
    plain, meta = (memory.needs([job], 1000, 4)["activations"] for job in jobs)
    seq_len = int(jobs[0].setting["seq_len"])
    assert meta * seq_len == plain * (seq_len + 64)

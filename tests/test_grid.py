"""Grid-batched training (madsl.runner.batched.grid): a group of runs trained together gives each
member exactly its unbatched result, is stored as the unbatched runs are, and resumes.

Real paper specs (attention, Hyena, Mamba) at tiny settings: a few seconds each.
"""

from __future__ import annotations

import json
import sqlite3
import warnings
from pathlib import Path

import pytest
import torch

from madsl.cli import main
from madsl.runner.batched.grid import GroupJob, execute_group
from madsl.runner.batched.stacked import StackedMembers
from madsl.runner.execute.jobs import execute_job
from madsl.runner.plan.evaluation import cli_overrides, plan_evaluation
from madsl.runner.store.files import StoreFiles
from madsl.runner.train.checkpoint import load_checkpoint
from madsl.spec import load_spec

torch.set_num_threads(1)
PAPER = Path(__file__).resolve().parent.parent / "specs" / "paper"
MODERN = PAPER.parent / "modern"
TINY_SETTING = {"seq_len": 24, "num_train_examples": 24, "num_test_examples": 16}


def _plan(
    spec_name: str,
    db: Path,
    lrs,
    wds=(0.0,),
    seeds=(0,),
    epochs=2,
    task="in-context-recall",
    precision="fp32",
    **overrides,
):
    path = spec_name if isinstance(spec_name, Path) else PAPER / spec_name
    cli = cli_overrides(
        protocol="baseline",
        tasks=[task],
        settings=TINY_SETTING,
        lr=list(lrs),
        wd=list(wds),
        seed=list(seeds),
        epochs=epochs,
        batch_size=8,
        precision=precision,
        **overrides,
    )
    plan = plan_evaluation(StoreFiles(db), [(load_spec(path), str(path))], cli, device="cpu")
    return plan


def _results(events) -> dict[str, dict]:
    return {e.run_id: e.data["result"] for e in events if e.kind == "finished"}


def _strip_time(result: dict) -> dict:
    """A result without its wall-clock fields (the only thing batching may change)."""
    out = {k: v for k, v in result.items() if k != "train_seconds"}
    out["history"] = [{k: v for k, v in h.items() if k != "seconds"} for h in result["history"]]
    out["best"] = {k: v for k, v in result["best"].items() if k != "seconds"}
    return out


def _count_stacked_steps(monkeypatch) -> list[int]:
    """The members in the stack at each stacked step, recorded as the group trains."""
    counts = []
    step = StackedMembers.step
    monkeypatch.setattr(StackedMembers, "step", lambda self, *a: counts.append(len(self.states)) or step(self, *a))
    return counts


@pytest.mark.parametrize(
    "spec, lrs, wds, seeds",
    [
        ("attention-sg.mad", (1e-3, 5e-4), (0.0,), (0,)),
        ("hyena-sg.mad", (1e-3, 1e-4), (0.0, 0.1), (0,)),
        ("mamba.mad", (1e-3,), (0.0,), (0, 1)),  # members with their own data and init
    ],
)
def test_a_group_trains_each_member_exactly_as_its_unbatched_run(tmp_path, spec, lrs, wds, seeds):
    plan = _plan(spec, tmp_path / "a.db", lrs, wds, seeds)
    [group] = plan.work(batch_grid=True)
    assert isinstance(group, GroupJob) and len(group.members) == len(plan.jobs) >= 2
    events = []
    execute_group(group, events.append, lambda: False)
    batched = _results(events)
    assert set(batched) == {job.run_id for job in plan.jobs}
    assert {e.kind for e in events} >= {"started", "progress", "epoch", "finished"}

    alone = _plan(spec, tmp_path / "b.db", lrs, wds, seeds)  # other checkpoint files
    for job in alone.jobs:
        single = []
        execute_job(job, single.append, lambda: False)
        assert _strip_time(batched[job.run_id]) == _strip_time(_results(single)[job.run_id]), job.label
    # the members really differ (their own lr / wd / seed), so equality is not trivial
    assert len({json.dumps(_strip_time(r)["history"]) for r in batched.values()}) == len(batched)


# Two parallel branches between gated projectors, one with its own norm and Linear init
# (specs/hybrid/icr-hybrid.mad in miniature).
BRANCHED_SPEC = """\
name: branches
dim: 32
channel_mixer: Mlp
final_norm: false
layers:
  A: {heads: 4, rotary: false}
  Mb: {d_state: 4, expand: 2}
topology: ((A){norm=layer, linear_std=0.02} | Mb){split=gated, combine=gated}
"""


def _close(a: dict, b: dict, rel: float) -> bool:
    """Every number of two results within `rel` of each other (NaN equal to NaN; None to None)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], rel) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b) or abs(a - b) <= rel * max(abs(a), abs(b))
    return a == b


# RWKV-6 amplifies fp32 rounding most: its vmapped forward is within 2.5e-6 of its own in
# float32 (5e-15 in float64, and every layer is exact under vmap in float64:
# tests/test_member_fold.py), and Adam turns rounding in near-zero gradients into lr-sized
# steps. After 3 epochs its losses differ by 3e-4 at lr 1e-3, 2e-5 at 5e-4 (where one training
# token's argmax flips) and 4e-6 at 1e-4, so it is checked at 1e-4.


@pytest.mark.parametrize(
    "spec, lrs, wds, seeds",
    [
        ("attention-sg.mad", (1e-3, 5e-4), (0.0, 0.1), (0,)),
        ("attention-sg.mad", (1e-3,), (0.1,), (0, 1)),
        ("hyena-sg.mad", (1e-3, 5e-4), (0.0, 0.1), (0,)),  # Hyena's long convolutions under vmap
        ("mamba.mad", (1e-3,), (0.0, 0.1), (0, 1)),  # the scan folded: members into channels
        ("hyena-experts-moe.mad", (1e-3, 5e-4), (0.1,), (0,)),  # routing, MoE's balancing loss
        ("gla-sg.mad", (1e-3,), (0.0,), (0, 1)),  # GLA's chunked form folded into the batch
        ("mh-hyena-sg.mad", (1e-3, 5e-4), (0.0,), (0,)),
        ("branches", (1e-3, 5e-4), (0.0,), (0,)),  # seed 004's hybrid block: gated projectors, group attributes
        (MODERN / "rwkv6-sg.mad", (1e-4,), (0.0, 0.1), (0,)),  # data-dependent decays, token shift
        (MODERN / "gated-deltanet-sg.mad", (1e-3,), (0.0,), (0, 1)),  # the delta rule's WY form
        (MODERN / "mamba2-sg.mad", (1e-3, 5e-4), (0.0,), (0,)),  # SSD's per-head decay
    ],
)
def test_a_stacked_group_trains_each_member_as_its_unbatched_run(tmp_path, monkeypatch, spec, lrs, wds, seeds):
    """Members as one vmapped model with stacked AdamW (every op batching or folding the
    member axis, none falling back to vmap's loop over the members: its "performance drop"
    warning is an error here): equal to the unbatched runs to fp32 rounding, for each family."""
    if spec == "branches":
        spec = tmp_path / "branches.mad"
        spec.write_text(BRANCHED_SPEC)
    plan = _plan(spec, tmp_path / "a.db", lrs, wds, seeds, epochs=3)
    [group] = plan.work(batch_grid=True)
    group.stack = True  # the CUDA default; on the CPU lockstep is the default (faster there)
    stacked_steps = _count_stacked_steps(monkeypatch)
    events = []
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="There is a performance drop")
        execute_group(group, events.append, lambda: False)
    assert not [e for e in events if e.kind == "failed"], [e.data["error"] for e in events if e.kind == "failed"]
    assert stacked_steps == [len(group.members)] * 9  # 3 epochs of 3 steps, every member in the stack
    batched = _results(events)
    alone = _plan(spec, tmp_path / "b.db", lrs, wds, seeds, epochs=3)
    for job in alone.jobs:
        single = []
        execute_job(job, single.append, lambda: False)
        expected = _strip_time(_results(single)[job.run_id])
        got = _strip_time(batched[job.run_id])
        assert got["epochs_done"] == expected["epochs_done"] == 3 and got["best_epoch"] == expected["best_epoch"]
        assert _close(got["history"], expected["history"], rel=1e-5), job.label
    # the members really differ (their own lr / wd / seed), so equality is not trivial
    assert len({json.dumps(_strip_time(r)["history"]) for r in batched.values()}) == len(batched)


@pytest.mark.parametrize("spec", ["attention-sg.mad", "mamba.mad"])
def test_under_madsls_conventions_the_stacked_adamw_decays_matrices_only(tmp_path, monkeypatch, spec):
    """madsl's conventions give AdamW two groups (weight decay on matrices; none on biases,
    norms and `_no_weight_decay` tensors): the stack keeps one flat tensor per group, each with
    its members' decays, and each member trains as its unbatched run."""
    stacks = []
    load = StackedMembers._load
    monkeypatch.setattr(StackedMembers, "_load", lambda self: stacks.append(self) or load(self))
    plan = _plan(spec, tmp_path / "a.db", (1e-3, 5e-4), (0.0, 0.1), conventions="madsl")
    [group] = plan.work(batch_grid=True)
    group.stack = True
    events = []
    execute_group(group, events.append, lambda: False)
    [stack] = stacks
    assert sorted(flat.group for flat in stack.flats) == [0, 1]
    assert [d.tolist() for d in stack.decay] == [pytest.approx([0.0, 0.1, 0.0, 0.1]), [0.0] * 4]
    batched = _results(events)
    for job in _plan(spec, tmp_path / "b.db", (1e-3, 5e-4), (0.0, 0.1), conventions="madsl").jobs:
        single = []
        execute_job(job, single.append, lambda: False)
        assert _close(_strip_time(batched[job.run_id]), _strip_time(_results(single)[job.run_id]), rel=1e-5)


def test_a_stacked_group_with_frozen_layers_trains_as_its_unbatched_runs(tmp_path, monkeypatch):
    """Frozen layers (`--freeze`, hybrid fine-tuning) stay out of the stacked AdamW: stacked
    as they are, never updated; the rest trains as each member's unbatched run."""
    plan = _plan("attention-sg.mad", tmp_path / "a.db", (1e-3, 5e-4), (0.0, 0.1), freeze=["Sg"])
    [group] = plan.work(batch_grid=True)
    group.stack = True
    stacks = []
    load = StackedMembers._load
    monkeypatch.setattr(StackedMembers, "_load", lambda self: stacks.append(self) or load(self))
    events = []
    execute_group(group, events.append, lambda: False)
    [stack] = stacks
    assert stack.frozen and all(".channel." in name for name in stack.frozen)  # the SwiGLU mixers
    assert not set(stack.frozen) & {name for flat in stack.flats for name in flat.names}
    batched = _results(events)
    for job in _plan("attention-sg.mad", tmp_path / "b.db", (1e-3, 5e-4), (0.0, 0.1), freeze=["Sg"]).jobs:
        single = []
        execute_job(job, single.append, lambda: False)
        assert _close(_strip_time(batched[job.run_id]), _strip_time(_results(single)[job.run_id]), rel=1e-5)


@pytest.mark.parametrize("spec", ["attention-sg.mad", "hyena-sg.mad", "mamba.mad"])
def test_a_stacked_group_trains_under_bf16_autocast_as_its_unbatched_runs(tmp_path, spec):
    """bf16 (the CUDA default) through vmap and the member folds (the rotary q, k must have v's
    dtype, found on an H100; the scan and the long convolutions switch autocast off inside).
    Members within bf16 rounding of their runs."""
    plan = _plan(spec, tmp_path / "a.db", (1e-3, 5e-4), (0.0,), precision="bf16")
    [group] = plan.work(batch_grid=True)
    group.stack = True
    events = []
    execute_group(group, events.append, lambda: False)
    assert not [e for e in events if e.kind == "failed"]
    batched = _results(events)
    alone = _plan(spec, tmp_path / "b.db", (1e-3, 5e-4), (0.0,), precision="bf16")
    for job in alone.jobs:
        single = []
        execute_job(job, single.append, lambda: False)
        for got, want in zip(batched[job.run_id]["history"], _results(single)[job.run_id]["history"]):
            assert got["train_loss"] == pytest.approx(want["train_loss"], rel=2e-2), job.label


@pytest.mark.parametrize("spec", ["attention-sg.mad", "mamba.mad"])
def test_an_interrupted_stacked_group_resumes_to_the_uninterrupted_result(tmp_path, spec):
    runs = {}
    for name, stop_after in (("a", None), ("b", 4)):
        plan = _plan(spec, tmp_path / f"{name}.db", (1e-3, 1e-4), (0.0, 0.1), epochs=2)
        [group] = plan.work(batch_grid=True)
        group.stack = True
        events = []

        def progress():
            return stop_after is not None and sum(e.kind == "progress" for e in events) >= stop_after

        execute_group(group, events.append, progress)  # b: stopped mid-epoch (6 steps per epoch)
        if stop_after is not None:
            assert {e.run_id for e in events if e.kind == "interrupted"} == {m.run_id for m in group.members}
            events = []
            execute_group(group, events.append, lambda: False)
        runs[name] = {k: _strip_time(v) for k, v in _results(events).items()}
    assert runs["a"] == runs["b"]


def test_a_stacked_groups_members_checkpoint_together_and_resume_as_a_stack(tmp_path, monkeypatch):
    """Checkpoints are written when due, not after every epoch; one member's being due makes
    every member write its own, before any epoch is reported: after a crash the group
    resumes at one point, as a stack, to the uninterrupted result."""
    runs = {}
    for name in ("uninterrupted", "crashed"):
        plan = _plan("attention-sg.mad", tmp_path / f"{name}.db", (1e-3, 1e-4), epochs=3)
        [group] = plan.work(batch_grid=True)
        group.stack = True
        group.members[0].checkpoint_every_s, group.members[1].checkpoint_every_s = 0.0, 3600.0  # every epoch; hourly
        events = []

        def crash_at_epoch_2(event):
            events.append(event)
            if name == "crashed" and event.kind == "epoch" and event.data["metrics"]["epoch"] == 2:
                raise RuntimeError("the machine is gone")

        execute_group(group, crash_at_epoch_2, lambda: False)
        if name == "crashed":
            assert {e.run_id for e in events if e.kind == "failed"} == {m.run_id for m in group.members}
            saved = [load_checkpoint(Path(m.checkpoint_path)) for m in group.members]
            assert [c["epoch"] for c in saved] == [2, 2]  # the hourly member's too
            steps = _count_stacked_steps(monkeypatch)
            events = []
            execute_group(group, events.append, lambda: False)
            assert steps and set(steps) == {2}, steps  # the third epoch, stacked
        runs[name] = {k: _strip_time(v) for k, v in _results(events).items()}
    assert runs["uninterrupted"] == runs["crashed"]


@pytest.mark.parametrize("fail_at_step", [1, 5])  # the first step; the second epoch's (after a checkpoint)
def test_a_stack_that_runs_out_of_memory_trains_on_in_smaller_stacks(tmp_path, monkeypatch, fail_at_step):
    """A device with room for two members' stacked step (stand-in: the step raises torch's
    OutOfMemoryError for more): the group of four frees the memory, reopens its members from
    their checkpoints (or from the start) and trains them in two stacks of two, each member
    still as its unbatched run; each is told why it was retried."""
    plan = _plan("attention-sg.mad", tmp_path / "a.db", (1e-3, 1e-4), (0.0, 0.1), epochs=2)
    [group] = plan.work(batch_grid=True)
    group.stack = True
    for member in group.members:
        member.checkpoint_every_s = 0.0  # a checkpoint after every epoch (3 steps an epoch)
    sizes = []
    step = StackedMembers.step

    def step_on_a_small_device(self, *args):
        sizes.append(len(self.states))
        if len(self.states) > 2 and len(sizes) >= fail_at_step:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (stand-in)")
        return step(self, *args)

    monkeypatch.setattr(StackedMembers, "step", step_on_a_small_device)
    events = []
    execute_group(group, events.append, lambda: False)
    assert not [e for e in events if e.kind == "failed"]
    retried = [e for e in events if e.kind == "retried"]
    assert sorted(e.run_id for e in retried) == sorted(m.run_id for m in group.members)
    assert all(
        "out of memory stacked with 3 other run(s)" in e.data["reason"]
        and "in stacks of 2" in e.data["reason"]
        and e.data["from_checkpoint"] == (fail_at_step > 3)
        for e in retried
    )
    # then two stacks of two, one after the other, each 2 epochs of 3 steps (from the start), or the
    # second epoch's 3 (from the checkpoints of the first)
    assert sizes == [4] * fail_at_step + [2] * (12 if fail_at_step <= 3 else 6)
    batched = _results(events)
    alone = _plan("attention-sg.mad", tmp_path / "b.db", (1e-3, 1e-4), (0.0, 0.1), epochs=2)
    for job in alone.jobs:
        single = []
        execute_job(job, single.append, lambda: False)
        assert _close(_strip_time(batched[job.run_id]), _strip_time(_results(single)[job.run_id]), rel=1e-5), job.label


@pytest.mark.parametrize("graphs", [False, True])
def test_members_leave_the_stack_as_they_finish(tmp_path, monkeypatch, graphs):
    """Members that stop early (here: no eval-loss improvement, `patience` 1) leave the stack
    and the others train on restacked, each still as its unbatched run. With CUDA graphs the
    last one stays a stack of one (its graphs); without, it trains on alone (on the CPU
    `graphs` changes only that: the step runs eagerly)."""
    plan = _plan("attention-sg.mad", tmp_path / "a.db", (3e-2, 3e-3, 3e-4), epochs=6, patience=1)
    [group] = plan.work(batch_grid=True)
    group.stack, group.graphs = True, graphs
    stacked_steps = _count_stacked_steps(monkeypatch)
    events = []
    execute_group(group, events.append, lambda: False)
    batched = _results(events)
    ends = sorted(result["epochs_done"] for result in batched.values())
    assert len(batched) == 3 and len(set(ends)) == 3, ends  # three members, three ends
    # 3 steps an epoch; members leave after their last epoch; the last alone stays stacked only with graphs
    assert stacked_steps == [3] * 3 * ends[0] + [2] * 3 * (ends[1] - ends[0]) + [1] * 3 * (ends[2] - ends[1]) * graphs
    alone = _plan("attention-sg.mad", tmp_path / "b.db", (3e-2, 3e-3, 3e-4), epochs=6, patience=1)
    for job in alone.jobs:
        single = []
        execute_job(job, single.append, lambda: False)
        assert _close(_strip_time(batched[job.run_id]), _strip_time(_results(single)[job.run_id]), rel=1e-5), job.label


def _without_seconds(result: dict) -> dict:
    """_strip_time, length evaluations' wall time included."""
    out = _strip_time(result)
    out["length_evals"] = [{k: v for k, v in ev.items() if k != "seconds"} for ev in result["length_evals"]]
    return out


def test_a_member_stopped_in_its_length_evaluations_resumes_them_not_its_training(tmp_path):
    """The stack's middle member stops training early (patience 1, lr 3e-2: after epoch 2) and
    is stopped while it evaluates at its lengths. Every member's epochs so far were reported
    (its siblings' too, the last one's included), and each checkpointed there. Resumed, the
    group must not stack that member with its siblings (its training is over): it evaluates its
    remaining length and ends as the uninterrupted member did, and so do its siblings."""
    runs = {}
    for name in ("uninterrupted", "stopped"):
        plan = _plan(
            "attention-sg.mad", tmp_path / f"{name}.db", (3e-4, 3e-2, 3e-3), epochs=4, patience=1, eval_lengths=[24, 32]
        )
        [group] = plan.work(batch_grid=True)
        group.stack = True
        group.members.sort(
            key=lambda m: [3e-4, 3e-2, 3e-3].index(m.train.lr)
        )  # the member that ends early in the middle
        events = []
        if name == "stopped":
            execute_group(group, events.append, lambda: any(e.kind == "length" for e in events))
            assert [e.kind for e in events if e.run_id == group.members[1].run_id][-2:] == ["length", "interrupted"]
            for member in group.members:
                reported = [
                    e.data["metrics"]["epoch"] for e in events if e.kind == "epoch" and e.run_id == member.run_id
                ]
                assert reported == [h["epoch"] for h in load_checkpoint(Path(member.checkpoint_path))["history"]]
            events = []
        execute_group(group, events.append, lambda: False)
        runs[name] = {k: _without_seconds(v) for k, v in _results(events).items()}
    early = runs["uninterrupted"][group.members[1].run_id]
    assert early["epochs_done"] < 4 and [ev["length"] for ev in early["length_evals"]] == [24, 32]
    assert runs["stopped"] == runs["uninterrupted"]


def test_with_cuda_graphs_a_run_alone_is_a_stack_of_one(tmp_path, monkeypatch):
    """--cuda-graphs stacks every run, so that every run gets the graphs: a run with no grid
    siblings becomes a group of one, trained stacked (on the CPU the step runs eagerly), as
    its unbatched run; without graphs it stays a plain run."""
    plan = _plan("hyena-sg.mad", tmp_path / "a.db", (1e-3,), epochs=2)
    [run] = plan.work(batch_grid=True)
    assert not isinstance(run, GroupJob)
    [group] = plan.work(batch_grid=True, cuda_graphs=True)
    assert isinstance(group, GroupJob) and len(group.members) == 1 and group.graphs
    group.stack = True  # as on CUDA
    stacked_steps = _count_stacked_steps(monkeypatch)
    events = []
    execute_group(group, events.append, lambda: False)
    assert stacked_steps == [1] * 6  # 2 epochs of 3 steps
    alone = []
    execute_job(_plan("hyena-sg.mad", tmp_path / "b.db", (1e-3,), epochs=2).jobs[0], alone.append, lambda: False)
    assert _close(_strip_time(_results(events)[run.run_id]), _strip_time(_results(alone)[run.run_id]), rel=1e-5)


def test_the_coordinator_submits_a_group_of_one_as_a_run_unless_it_has_graphs(tmp_path):
    """A group with one member left to run goes to the executor as that run; with CUDA
    graphs as the group (a stack of one has its graphs)."""
    from madsl.runner.execute.coordinator import run_jobs
    from madsl.runner.execute.local import ThreadExecutor
    from madsl.runner.store.results import Store

    for graphs in (False, True):
        plan = _plan("attention-sg.mad", tmp_path / f"{graphs}.db", (1e-3, 5e-4), epochs=1)
        [group] = plan.work(batch_grid=True, cuda_graphs=graphs)
        store = Store(tmp_path / f"{graphs}.db")
        plan.register(store)
        first = []  # the first member ran before: done in the store
        execute_job(group.members[0], first.append, lambda: False)
        store.finish(group.members[0].run_id, _results(first)[group.members[0].run_id])
        submitted = []

        class Recording(ThreadExecutor):
            def submit(self, job):
                submitted.append(job)
                super().submit(job)

        run_jobs(store, [group], Recording())
        assert len(submitted) == 1
        assert isinstance(submitted[0], GroupJob) == graphs
        assert [r["status"] for r in store.runs()] == ["done", "done"]


def test_an_interrupted_group_resumes_to_the_uninterrupted_result(tmp_path):
    plan = _plan("hyena-sg.mad", tmp_path / "a.db", (1e-3, 5e-4, 1e-4), epochs=3)
    [group] = plan.work(batch_grid=True)
    uninterrupted = []
    execute_group(group, uninterrupted.append, lambda: False)

    plan = _plan("hyena-sg.mad", tmp_path / "b.db", (1e-3, 5e-4, 1e-4), epochs=3)
    [group] = plan.work(batch_grid=True)
    events = []
    # stop mid-way: after the first member's second epoch has begun (members sit at different epochs)
    execute_group(group, events.append, lambda: sum(e.kind == "epoch" for e in events) >= 4)
    assert {e.run_id for e in events if e.kind == "interrupted"} == {m.run_id for m in group.members}
    assert all(Path(m.checkpoint_path).exists() for m in group.members)
    resumed = []
    execute_group(group, resumed.append, lambda: False)
    assert {k: _strip_time(v) for k, v in _results(resumed).items()} == {
        k: _strip_time(v) for k, v in _results(uninterrupted).items()
    }


def test_a_checkpoint_that_cannot_be_written_on_a_stop_fails_its_member_and_the_group_reports_every_member(
    tmp_path, monkeypatch
):
    """Stopped, a lockstep group writes every member's checkpoint; where one cannot be written
    (a full disk), that member fails (as its unbatched run would), its siblings still report
    `interrupted`, and execute_group does not raise: an escaping error left the thread
    executor waiting for events that never came."""
    from madsl.runner.train import state as run_state

    plan = _plan("attention-sg.mad", tmp_path / "a.db", (1e-3, 5e-4), epochs=2)
    [group] = plan.work(batch_grid=True)
    full = group.members[1].checkpoint_path
    save = run_state.save_checkpoint

    def save_unless_full(path, state):
        if str(path) == full:
            raise OSError(28, "No space left on device")
        save(path, state)

    monkeypatch.setattr(run_state, "save_checkpoint", save_unless_full)
    events = []
    # stopped once both trained an epoch: the first member checkpoints as it stops, then the group
    # writes the second's, between its epochs
    execute_group(
        group, events.append, lambda: any(e.kind == "epoch" and e.run_id == group.members[1].run_id for e in events)
    )
    ends = {e.run_id: e.kind for e in events if e.kind in ("finished", "failed", "interrupted", "skipped")}
    assert len([e for e in events if e.kind in ("finished", "failed", "interrupted", "skipped")]) == 2
    assert ends == {group.members[0].run_id: "interrupted", group.members[1].run_id: "failed"}
    assert Path(group.members[0].checkpoint_path).exists() and not Path(full).exists()


def test_a_member_that_solves_the_setting_stops_its_siblings(tmp_path):
    plan = _plan("attention-sg.mad", tmp_path / "a.db", (1e-3, 5e-4, 1e-4), epochs=3)
    group = plan.work(batch_grid=True)[0]
    group.skip_solved_at = 0.0  # the first member to finish "solves" the setting
    events = []
    execute_group(group, events.append, lambda: False)
    finished = [e.run_id for e in events if e.kind == "finished"]
    skipped = [e.run_id for e in events if e.kind == "skipped"]
    assert len(finished) == 1 and sorted(finished + skipped) == sorted(m.run_id for m in group.members)


def test_groups_are_one_setting_differing_only_in_lr_wd_and_seed(tmp_path):
    path = PAPER / "attention-sg.mad"
    cli = cli_overrides(
        protocol="baseline",
        tasks=["in-context-recall", "selective-copying"],
        settings={"num_train_examples": 16, "num_test_examples": 8},
        lr=[1e-3, 1e-4],
        wd=[0.0],
        seed=[0, 1],
        epochs=1,
    )
    plan = plan_evaluation(StoreFiles(tmp_path / "a.db"), [(load_spec(path), str(path))], cli, device="cpu")
    work = plan.work(batch_grid=True)
    assert [len(g.members) for g in work] == [4, 4]  # one group per task, 2 lr x 2 seeds each
    assert sorted(m.run_id for g in work for m in g.members) == sorted(j.run_id for j in plan.jobs)
    assert {m.task.name for m in work[0].members} == {"in-context-recall"}
    assert plan.work(batch_grid=False) == plan.jobs


EVAL = [
    "--task",
    "in-context-recall",
    "--protocol",
    "baseline",
    "--epochs",
    "2",
    "--batch-size",
    "8",
    "--lr",
    "1e-3",
    "--lr",
    "5e-4",
    "--lr",
    "1e-4",
    "--wd",
    "0",
    "--wd",
    "0.1",
    *[x for k, v in TINY_SETTING.items() for x in ("--set", f"{k}={v}")],
    "--format",
    "json",
]


def _stored(db: Path) -> dict[str, tuple]:
    with sqlite3.connect(db) as conn:
        runs = {
            row[0]: row[1:]
            for row in conn.execute(
                "SELECT run_id, status, epochs_done, best_epoch, best_eval_loss, best_eval_acc, max_eval_acc FROM runs"
            )
        }
        epochs = conn.execute(
            "SELECT run_id, epoch, train_loss, eval_loss, eval_acc FROM epochs ORDER BY run_id, epoch"
        ).fetchall()
    return {run_id: (*row, [e[1:] for e in epochs if e[0] == run_id]) for run_id, row in runs.items()}


def test_batch_grid_eval_stores_the_six_runs_no_batch_grid_stores(tmp_path, capsys):
    spec = str(PAPER / "hyena-sg.mad")
    assert main(["eval", spec, *EVAL, "--db", str(tmp_path / "batched.db"), "--batch-grid", "--keep", "best"]) == 0
    batched = json.loads(capsys.readouterr().out)
    assert main(["eval", spec, *EVAL, "--db", str(tmp_path / "alone.db"), "--no-batch-grid"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert batched["done"] == alone["done"] == 6 and batched["run_ids"] == alone["run_ids"]
    assert batched["scores"] == alone["scores"]
    stored = _stored(tmp_path / "batched.db")
    assert stored == _stored(tmp_path / "alone.db") and len(stored) == 6
    assert all(row[0] == "done" and len(row[-1]) == 2 for row in stored.values())
    assert not list((tmp_path / "batched.files" / "checkpoints").glob("*"))
    for run_id in batched["run_ids"]:  # --keep best kept every member's best weights
        out = tmp_path / run_id[:12]
        assert main(["export", run_id[:12], "-o", str(out), "--db", str(tmp_path / "batched.db")]) == 0
    # a rerun repeats nothing
    assert main(["eval", spec, *EVAL, "--db", str(tmp_path / "batched.db"), "--batch-grid"]) == 0
    assert json.loads(capsys.readouterr().out)["already_done"] == 6


def test_skip_solved_and_worker_processes_with_batched_groups(tmp_path):
    """Through the coordinator: a group's member solving the setting records its siblings as
    skipped; groups run in worker processes (each group one slot)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from runner_helpers import run_rows, run_toy_eval

    db = tmp_path / "r.db"
    summary = run_toy_eval(
        db, epochs=30, lr=[3e-3, 1e-5], settings_overrides={"num_train_examples": 512}, batch_grid=True
    )
    assert sorted(r["status"] for r in run_rows(db)) == ["done", "skipped"] and summary["skipped"] == 1
    assert summary["complete"] and not list((tmp_path / "r.files" / "checkpoints").glob("*"))

    db = tmp_path / "p.db"
    summary = run_toy_eval(db, epochs=2, wd=[0.0, 0.1], seed=[0, 1], workers=2, batch_grid=True)
    assert summary["complete"] and summary["done"] == 4
    assert {r["status"] for r in run_rows(db)} == {"done"}


def test_batch_grid_on_ray_is_bad_input(tmp_path, capsys):
    pytest.importorskip("ray")
    spec = str(PAPER / "hyena-sg.mad")
    assert main(["eval", spec, *EVAL, "--db", str(tmp_path / "r.db"), "--executor", "ray", "--batch-grid"]) == 2
    assert "--batch-grid runs with the local executors only" in capsys.readouterr().err
    assert not (tmp_path / "r.db").exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--device", "cpu", "--batch-grid"], "--cuda-graphs needs a CUDA device; the runs are planned on cpu"),
        (["--device", "cpu", "--no-batch-grid"], "--cuda-graphs needs a CUDA device"),
        (["--executor", "ray"], "--cuda-graphs runs with the local executors only"),
    ],
)
def test_cuda_graphs_without_a_cuda_device_or_on_ray_is_bad_input(tmp_path, capsys, flags, message):
    if "ray" in flags:
        pytest.importorskip("ray")
    spec = str(PAPER / "hyena-sg.mad")
    assert main(["eval", spec, *EVAL, "--db", str(tmp_path / "g.db"), *flags, "--cuda-graphs"]) == 2
    err = capsys.readouterr().err
    assert message in err and "hint:" in err
    assert "Traceback" not in err and not (tmp_path / "g.db").exists()


def test_cuda_graphs_without_grid_batching_is_bad_input():
    from madsl.errors import MadslError
    from madsl.runner.execute.devices import _check_cuda_graphs

    with pytest.raises(MadslError, match="it needs grid batching"):
        _check_cuda_graphs(False, "cuda", batch_grid=False)
    _check_cuda_graphs(False, "cuda:1", batch_grid=True)  # fine


@pytest.mark.parametrize(
    "asked, on_ray, device, batch_grid, graphs",
    [
        (None, False, "cuda", True, True),
        (None, False, "cuda:1", True, True),  # the default on CUDA
        (None, False, "cpu", False, False),
        (None, False, "cpu", True, False),  # never on the CPU,
        (None, True, "cuda", False, False),
        (None, False, "cuda", False, False),  # on Ray, without grid batching
        (False, False, "cuda", True, False),
        (True, False, "cuda", True, True),
    ],
)  # as asked
def test_cuda_graphs_are_on_by_default_wherever_they_can_run(asked, on_ray, device, batch_grid, graphs):
    from madsl.runner.execute.devices import resolve_cuda_graphs

    assert resolve_cuda_graphs(asked, on_ray, device, batch_grid) is graphs


def test_no_cuda_graphs_is_accepted_on_the_cpu(tmp_path):
    spec = str(PAPER / "attention-sg.mad")
    assert (
        main(["eval", spec, *EVAL, "--db", str(tmp_path / "g.db"), "--device", "cpu", "--no-cuda-graphs", "--dry-run"])
        == 0
    )


# Ops whose result the host must read: each would stall a GPU every step and cannot be captured.
HOST_SYNC_OPS = ("_local_scalar_dense", "nonzero", "is_nonzero", "masked_select", "unique", "aten.equal")


@pytest.mark.parametrize(
    "spec, precision",
    [("attention-sg.mad", "fp32"), ("hyena-sg.mad", "bf16"), ("mamba.mad", "fp32"), ("hyena-experts-moe.mad", "fp32")],
)
def test_a_stacked_step_is_the_same_device_work_every_step(tmp_path, monkeypatch, spec, precision):
    """What a CUDA graph needs of the stacked step and evaluation batch (`--cuda-graphs`
    captures each and replays it): from the second on (the first may fill caches, as the
    warm-up before a capture does), every step (evaluation batch) dispatches the same ops on
    tensors of the same shapes with the same non-tensor arguments (a per-step value passed as
    a Python number, such as the learning rate or Adam's bias correction, would be frozen into
    the graph at its capture), and none reads a value on the host. The dispatch trace of each
    step, on the CPU, stands in for the recorded graph."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map

    def describe(value):
        if isinstance(value, torch.Tensor):
            return ("tensor", tuple(value.shape), value.dtype)
        return repr(value)

    class Trace(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            self.ops.append((str(func), tree_map(describe, args), tree_map(describe, kwargs)))
            return func(*args, **kwargs)

    traces = {"_train_compute": [], "_eval_compute": []}
    for name in traces:

        def traced(self, *args, _compute=getattr(StackedMembers, name), _traces=traces[name]):
            with Trace() as trace:
                _compute(self, *args)
            _traces.append(trace.ops)

        monkeypatch.setattr(StackedMembers, name, traced)
    plan = _plan(spec, tmp_path / "a.db", (1e-3, 5e-4), (0.0, 0.1), epochs=3, precision=precision)
    [group] = plan.work(batch_grid=True)
    group.stack = True
    events = []
    execute_group(group, events.append, lambda: False)
    steps, evaluations = traces["_train_compute"], traces["_eval_compute"]
    # 3 epochs of 3 steps and of 2 evaluation batches (the baseline protocol's mad-lab conventions
    # evaluate in batches of the training batch size)
    assert len(_results(events)) == 4 and len(steps) == 9 and len(evaluations) == 6
    # the first step may fill caches (rotary tables): what a capture after warm-up steps reads
    assert any("addcmul" in op for op, *_ in steps[1]) and any("scatter_add" in op for op, *_ in steps[1])
    for trace in steps[2:]:
        assert trace == steps[1]
    assert any("scatter_add" in op for op, *_ in evaluations[1])
    for trace in evaluations[2:]:
        assert trace == evaluations[1]
    assert not [op for trace in steps + evaluations for op, *_ in trace if any(name in op for name in HOST_SYNC_OPS)]


class _FakeCuda:
    """torch.cuda's stream and graph calls as `ReplayedStep` makes them, recorded on the CPU: a
    capture records which compute it holds (and runs nothing); a replay runs that compute."""

    def __init__(self, fail_capture: bool = False):
        self.log, self.fail_capture = [], fail_capture
        fake = self

        class Graph:
            def replay(self):
                fake.log.append("replay")
                self.compute()

        class Capture:
            def __init__(self, graph, capture_error_mode="global"):
                self.graph = graph

            def __enter__(self):
                fake.capturing = self.graph

            def __exit__(self, *exc):
                fake.capturing = None
                return False

        class Stream:
            def __init__(self, device=None):
                pass

            def wait_stream(self, other):
                pass

        self.CUDAGraph, self.graph, self.Stream = Graph, Capture, Stream
        self.capturing = None

    def stream(self, stream):
        import contextlib

        self.log.append("side stream")
        return contextlib.nullcontext()

    def current_stream(self):
        return self.Stream()

    def synchronize(self):
        pass

    def compute(self, inputs, targets, cache):
        if self.capturing is not None:
            if self.fail_capture:
                raise RuntimeError("operation not permitted when stream is capturing")
            self.log.append(f"captured {tuple(inputs.shape)}")
            self.capturing.compute = lambda: self.log.append(f"ran {tuple(inputs.shape)} cache={cache}")
            return
        self.log.append(f"ran {tuple(inputs.shape)} cache={cache}")


@pytest.mark.parametrize("fail_capture", [False, True])
def test_replayed_warms_up_each_shape_then_captures_once_and_replays(monkeypatch, fail_capture):
    """`ReplayedStep`'s bookkeeping, with torch.cuda's stream and graph calls faked on the CPU: each
    batch shape runs WARMUP times eagerly on a side stream (autocast cache off), is then
    captured once and replayed from then on; a capture that fails warns once and every later
    call runs eagerly on the current stream, with no further capture."""
    from madsl.runner.batched import replay

    fake = _FakeCuda(fail_capture)
    for name in ("CUDAGraph", "graph", "Stream", "stream", "current_stream", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    replayed = replay.ReplayedStep(fake.compute, torch.device("cpu"), graphs=True, what="training step")
    replayed.graphs = True  # as on a CUDA device
    full, last = torch.zeros(2, 8, 5, dtype=torch.long), torch.zeros(2, 3, 5, dtype=torch.long)
    if fail_capture:
        with pytest.warns(RuntimeWarning, match="CUDA graphs off for this group's training step"):
            for x in (full, full, full, full, full, last):
                replayed(x, x)
        warm = ["side stream", "ran (2, 8, 5) cache=False"] * 3
        assert fake.log == warm + ["ran (2, 8, 5) cache=True"] * 2 + ["ran (2, 3, 5) cache=True"]
        return
    for x in (full, full, full, full, full, last, full):
        replayed(x, x)
    warm = ["side stream", "ran (2, 8, 5) cache=False"] * 3
    replays = ["replay", "ran (2, 8, 5) cache=False"]
    assert fake.log == (
        warm + ["captured (2, 8, 5)"] + replays + replays + ["side stream", "ran (2, 3, 5) cache=False"] + replays
    )
    assert len(replayed.shapes) == 2  # the smaller last batch has its own buffers (and will have its graph)

"""Grid-batched training: the runs of one (spec, task setting) that differ only in learning
rate, weight decay or seed train together, in one job (which runs form a group, and on
which device: `madsl.runner.batched.grouping`).

A `GroupJob` holds its members (plain `RunJob`s, each with the run id it has unbatched).
`execute_group` trains them in one process: as one stacked model where the group's device
and layers allow (`GroupJob.stack`, `madsl.runner.batched.stacked`: on CUDA, for every layer that
declares `stacks`, which all of madsl's do), else in lockstep, one epoch of every member
still training per round:

- data is loaded once per seed (members with the same seed share the splits, as their
  unbatched runs would read the same cached data; other seeds load their own);
- each member keeps its own model, AdamW (its lr and weight decay), cosine schedule,
  RNG state (swapped in around its work, so init, data order and every random draw are
  those of its unbatched run), best epoch and checkpoint file, in the unbatched format:
  a member resumes batched or unbatched alike, and the store sees ordinary runs;
- a member that reaches the early-stop accuracy (or its last epoch) finishes at once:
  its length evaluations, its result and its `finished` event, and it costs nothing
  more; with `skip_solved_at` (the quick and smoke protocols) the members still training
  when a sibling solves the setting stop and report `skipped`, as their unbatched runs
  would have been skipped;
- events are reported per member.

In lockstep each member computes exactly what its unbatched run computes, in the same
order (bitwise equal results on the same device); what it saves is the per-run setup
(process, data, compile of the spec). Stacked, results agree to fp32 rounding.
docs/gpu.md has the measurements behind the choice.
"""

from __future__ import annotations

import os
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from madsl.runner.execute.jobs import Event, RunJob, job_hooks, job_inputs, load_split


@dataclass
class GroupJob:
    """Runs trained together (picklable, like RunJob). `run_id` names the group for executors;
    the store only ever sees the members' run ids."""

    run_id: str
    members: list[RunJob]
    device: str = "auto"
    label: str = ""
    skip_solved_at: float | None = None
    stack: bool = False  # train as one stacked model where the layers allow (madsl.runner.batched.stacked)
    graphs: bool = False  # stacked on CUDA: replay each training step and evaluation batch as a CUDA graph

    def execute(self, emit: Callable[[Event], None], should_stop: Callable[[], bool]) -> None:
        execute_group(self, emit, should_stop)


def stacks_settings(job: RunJob) -> bool:
    """Whether a run's settings and task let its group train stacked (its layers aside:
    `stacked.batchable` checks those on the built model): the stack's update is AdamW's, and
    its loss a class head's (a regression mask selects a data-dependent number of positions)."""
    return job.train.optimizer == "adamw" and getattr(job.task, "head", "lm") != "regress"


@dataclass
class Member:
    """One run of a group as it trains: its job, state, data, hooks and RNG state."""

    job: RunJob
    inputs: Any  # JobInputs
    hooks: Any  # TrainHooks
    checkpointer: Any = None
    state: Any = None  # RunState
    data: Any = None  # RunData
    rng: dict | None = None
    done: bool = False
    result: dict | None = field(default=None, repr=False)


@contextmanager
def _own_rng(member: Member) -> Iterator[None]:
    """The member's RNG state in place while it works, saved back after (as if it ran alone)."""
    from madsl.runner.train.checkpoint import rng_state, set_rng_state

    set_rng_state(member.rng)
    try:
        yield
    finally:
        member.rng = rng_state()


def _shared_loader() -> Callable[..., Any]:
    """load_split, remembering each split: members with the same seed read the same data once."""
    cache: dict[tuple, Any] = {}

    def load(task, setting, split, seed, data_dir):
        from madsl.runner.store.results import canonical_json

        key = (task.name, canonical_json(dict(setting)), split, seed)
        if key not in cache:
            cache[key] = load_split(task, setting, split, seed, data_dir)
        return cache[key]

    return load


def execute_group(group: GroupJob, emit: Callable[[Event], None], should_stop: Callable[[], bool]) -> None:
    """Train a group's members to their ends (stacked, then lockstep for what is left) and
    report per member. Never raises."""
    from madsl.runner.train.loop import RunInterrupted

    members: list[Member] = []  # filled as they open: what a stop or a failure reports on
    try:
        _train_group(group, members, emit, should_stop)
    except RunInterrupted as err:
        _stop_members(members, err, emit)
    except BaseException as err:  # noqa: BLE001 - report, never take the executor down
        _fail_unfinished(group, members, err, emit)


def _train_group(
    group: GroupJob, members: list[Member], emit: Callable[[Event], None], should_stop: Callable[[], bool]
) -> None:
    """Open every member (into `members`), then train them: those resumed after their training
    was over end first, then the rest as stacks where they can, then in lockstep, one epoch of
    each member still training per round."""
    from madsl.runner.train.device import resolve_device
    from madsl.runner.train.precision import configure_device

    device = resolve_device(group.device)
    configure_device(device)
    _open_members(group, members, device, emit, should_stop)
    _check_solved(group, members, emit)
    for member in members:  # resumed after its training was over (lengths or result to come): it ends first
        if not member.done and member.state.finished:
            _advance_alone(group, members, member, device, emit)
    together = [m for m in members if not m.done]
    if group.stack and _stackable(together, group.graphs):
        _train_in_stacks(
            group, together, members, device, emit, should_stop, lambda member: _open_member(member, device, emit)
        )
    while any(not m.done for m in members):  # lockstep: one epoch of each member in turn
        for member in members:
            if not member.done:  # not finished, failed, or stopped by a sibling that solved the setting
                _advance_alone(group, members, member, device, emit)


def _open_members(
    group: GroupJob, members: list[Member], device, emit: Callable[[Event], None], should_stop: Callable[[], bool]
) -> None:
    """Report every member started, then open each (its data read once per seed, shared with
    the members that read the same); a member that cannot open fails alone."""
    from madsl.runner.train.state import RunData

    load = _shared_loader()
    for job in group.members:
        emit(Event("started", job.run_id, {"pid": os.getpid(), "device": str(device), "group": group.run_id}))
        members.append(Member(job, None, job_hooks(job, emit, should_stop)))
    for member in members:
        try:
            member.inputs = job_inputs(member.job, load)
            _open_member(member, device, emit)
        except Exception as err:  # noqa: BLE001 - one member's failure is its own
            _fail(member, err, emit)
            continue
        if not member.done:
            member.data = _shared_data(members, member, device, RunData)


def _open_member(member: Member, device, emit: Callable[[Event], None]) -> None:
    """Start (or resume, from its checkpoint) the member's run exactly as train_run would."""
    from madsl.runner.train.checkpoint import rng_state
    from madsl.runner.train.metrics import RunResult
    from madsl.runner.train.state import Checkpointer, open_run

    opened = open_run(
        member.job.train,
        member.inputs.build_model,
        device,
        member.inputs.train_data.inputs.shape[0],
        member.inputs.num_classes,
        Path(member.job.checkpoint_path),
        member.hooks.keep_best,
        member.job.run_id,
    )
    if isinstance(opened, RunResult):
        _finish(member, opened.to_dict(), device, emit)
        return
    member.state, member.rng = opened, rng_state()
    member.checkpointer = Checkpointer(Path(member.job.checkpoint_path), member.hooks.checkpoint_every_s)
    member.state.model.train()


def _advance_alone(
    group: GroupJob, members: list[Member], member: Member, device, emit: Callable[[Event], None]
) -> None:
    """One epoch of the member, alone (or its length evaluations and result); a member that
    fails fails alone, and one that ends may end its siblings (`_check_solved`)."""
    from madsl.runner.train.loop import RunInterrupted

    try:
        with _own_rng(member):
            _advance(member, device, emit)
    except RunInterrupted:
        raise
    except Exception as err:  # noqa: BLE001 - a failing member does not take its siblings down
        _fail(member, err, emit)
    if member.done:
        _check_solved(group, members, emit)


def _fail(member: Member, err: BaseException, emit: Callable[[Event], None]) -> None:
    """The member failed with `err` (called while it is handled: the event holds its traceback)."""
    member.done = True
    emit(
        Event(
            "failed", member.job.run_id, {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        )
    )


def _stop_members(members: list[Member], err: BaseException, emit: Callable[[Event], None]) -> None:
    """Stopped on request: every member still training keeps its progress (in lockstep, the
    siblings between epochs write their checkpoints too) and reports `interrupted`; one whose
    checkpoint cannot be written (a full disk) fails, as its unbatched run's stop would."""
    for member in members:
        if member.done:
            continue
        if member.state is not None:
            try:
                with _own_rng(member):
                    member.checkpointer.save(member.state)
            except Exception as save_err:  # noqa: BLE001 - (a full disk) as its unbatched run's stop would
                _fail(member, save_err, emit)
                continue
        emit(Event("interrupted", member.job.run_id, {"message": str(err)}))


def _fail_unfinished(group: GroupJob, members: list[Member], err: BaseException, emit: Callable[[Event], None]) -> None:
    """The group failed with `err` (called while it is handled): every member not yet ended fails with it."""
    for job in group.members:
        if not any(m.job is job and m.done for m in members):
            emit(
                Event(
                    "failed", job.run_id, {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
                )
            )


def _stackable(members: list[Member], graphs: bool) -> bool:
    """At least two members (one with CUDA graphs: a stack of one has its graphs), at the
    same point of training, whose layers batch exactly."""
    from madsl.runner.batched.stacked import batchable

    at_once = len({(m.state.epoch, m.state.step, m.state.steps_per_epoch) for m in members}) == 1
    return (
        len(members) >= (1 if graphs else 2)
        and at_once
        and not any(m.state.finished for m in members)  # each has training left
        and stacks_settings(members[0].job)
        and batchable([m.state.model for m in members])
    )


def _train_in_stacks(
    group: GroupJob,
    together: list[Member],
    members: list[Member],
    device,
    emit: Callable[[Event], None],
    should_stop: Callable[[], bool],
    reopen: Callable[[Member], None],
) -> None:
    """Train `together` as one stack (`_train_stacked`). Where the device runs out of memory,
    free it, reopen the stack's members from their checkpoints (a member's state is only
    consistent there: the stack holds its weights between them) and train them in two stacks
    of half the size, one after the other, halving again as needed; a member that runs out
    alone trains in lockstep afterwards, as its unbatched run. Results stay each member's own."""
    from madsl.runner.train.device import is_out_of_memory, release_device_memory

    stacks = [together]
    while stacks:
        stack = [m for m in stacks.pop(0) if not m.done]
        if not stack or not _stackable(stack, group.graphs):
            continue  # (what is left trains in lockstep)
        try:
            _train_stacked(group, stack, members, device, emit, should_stop)
            continue
        except Exception as err:  # noqa: BLE001 - running out of memory is handled, anything else raised
            if not is_out_of_memory(err):
                raise
            reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'out of memory'}"
        release_device_memory()  # (the stack's frames went with the exception)
        half = (len(stack) + 1) // 2
        if len(stack) > 1:
            stacks[:0] = [stack[:half], stack[half:]]
        for member in stack:
            if member.done:
                continue
            from_checkpoint = Path(member.job.checkpoint_path).exists()
            reopen(member)
            emit(
                Event(
                    "retried",
                    member.job.run_id,
                    {
                        "from_checkpoint": from_checkpoint,
                        "reason": f"out of memory stacked with {len(stack) - 1} other run(s) ({reason}): "
                        + (f"in stacks of {half}" if len(stack) > 1 else "on its own"),
                    },
                )
            )


def _train_stacked(
    group: GroupJob,
    together: list[Member],
    members: list[Member],
    device,
    emit: Callable[[Event], None],
    should_stop: Callable[[], bool],
) -> None:
    """Train `together` as one stacked model while at least two of them are left; each epoch
    ends per member (evaluation, best epoch, checkpoint, event), finished members leave the
    stack, and a last one trains on alone (lockstep, exactly as its run), except with CUDA
    graphs: there it stays a stack of one, for the graphs (the group's last member is often
    the one that trains longest)."""
    from madsl.runner.batched.stacked import StackedMembers
    from madsl.runner.batched.stacked_epoch import schedulers_without_steps, train_stacked_epoch
    from madsl.runner.train.loop import RunInterrupted, epoch_metrics, epoch_order

    stack = StackedMembers([m.state for m in together], graphs=group.graphs)
    active = list(together)

    def checkpoint() -> None:
        for member in active:
            with _own_rng(member):  # the checkpoint holds the member's RNG state
                member.checkpointer.save(member.state)

    while len(active) >= (1 if group.graphs else 2):
        train_stacked_epoch(
            stack,
            [m.data for m in active],
            [m.hooks for m in active],
            checkpoint,
            lambda: any(m.checkpointer.due() for m in active),
            should_stop,
            RunInterrupted,
            epoch_order,
        )
        started = time.monotonic()
        evaluations = stack.evaluate([m.data for m in active])  # every member's, in one forward per batch
        ended = []
        for member, evaluation in zip(active, evaluations):
            with _own_rng(member), schedulers_without_steps():  # mad-lab steps the schedule per epoch
                ended.append(epoch_metrics(member.state, member.data, started, evaluation))
                member.state.end_epoch(ended[-1])
        if any(m.checkpointer.due_at_epoch_end() for m in active):
            checkpoint()  # every member's, before any is reported: they resume at one point, as a stack
        for member, metrics in zip(active, ended):  # every member's epoch reported before any ends (lengths take long)
            member.hooks.on_epoch(metrics)
        for member in active:
            if member.state.finished:
                with _own_rng(member):
                    _advance(member, device, emit)  # length evaluations, result, `finished`
        _check_solved(group, members, emit)
        keep = [i for i, member in enumerate(active) if not member.done]
        if not keep:
            return  # every member finished (a stack of none is no stack)
        if len(keep) < len(active):
            stack.keep(keep)
            active = [active[i] for i in keep]


def _shared_data(members: list[Member], member: Member, device, run_data_type) -> Any:
    """The member's splits as tensors: shared with an earlier member that read the same data."""
    for other in members:
        if other is member:
            break
        if (
            other.data is not None
            and other.inputs.train_data is member.inputs.train_data
            and other.inputs.test_data is member.inputs.test_data
        ):
            return other.data
    return run_data_type.from_tasks(member.inputs.train_data, member.inputs.test_data, device)


def _advance(member: Member, device, emit: Callable[[Event], None]) -> None:
    """One epoch of the member; once it has trained its last, its length evaluations and result."""
    from madsl.runner.train.loop import evaluate_lengths, train_epoch

    state, hooks = member.state, member.hooks
    if not state.finished:
        metrics = train_epoch(state, member.data, hooks, member.checkpointer)
        state.end_epoch(metrics)
        member.checkpointer.save_if_due(state)
        hooks.on_epoch(metrics)
    if state.finished:
        if state.settings.eval_lengths:
            evaluate_lengths(
                state, member.inputs.length_data, member.inputs.tokens_per_batch, device, hooks, member.checkpointer
            )
        result = state.result()
        member.checkpointer.save(state, result)
        _finish(member, result.to_dict(), device, emit)


def _finish(member: Member, result: dict, device, emit: Callable[[Event], None]) -> None:
    member.done, member.result = True, result
    member.state = member.data = None  # a finished member holds no memory
    import torch

    emit(
        Event(
            "finished",
            member.job.run_id,
            {"result": result, "device": str(device), "build": member.inputs.build, "threads": torch.get_num_threads()},
        )
    )


def _check_solved(group: GroupJob, members: list[Member], emit: Callable[[Event], None]) -> None:
    """skip_solved within a group: once a member finished at the threshold (as the store's
    `solved_sibling` reads it: the best epoch's accuracy), the members of its seed still training stop."""
    if group.skip_solved_at is None:
        return
    solvers = {
        m.job.train.seed: m.job.run_id
        for m in members
        if m.result is not None and (m.result["best"].get("eval_macro_acc") or 0.0) >= group.skip_solved_at
    }
    for member in members:
        if not member.done and member.job.train.seed in solvers:
            member.done, member.state, member.data = True, None, None
            emit(Event("skipped", member.job.run_id, {"reason": f"solved by {solvers[member.job.train.seed]}"}))

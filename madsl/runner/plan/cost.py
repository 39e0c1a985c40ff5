"""What a sweep costs before it runs: runs, training tokens, FLOPs and wall time.

    runs        in all, already done, pending (from the results database, if it exists)
    tokens      per pending run: epochs x training examples x sequence length
    FLOPs       forward FLOPs of one sequence from the accounting (`madsl.graph.account`),
                x 3 for forward + backward, x sequences trained
    seconds     a few timed training steps of each distinct model (spec x batch size x
                device) on this machine at the first sequence length it is planned at,
                scaled linearly to the run's length (a lower bound for attention at longer
                lengths), x the run's steps, + its evaluations (a forward pass costs about
                a third of a training step); cached per database in
                `<db>.files/step-times.json`, so a second plan measures nothing (a cache
                that is not what madsl writes, a number out of range or a symbolic link
                among it, is discarded with a RuntimeWarning and measured again); the runs
                of a stacked grid group (the default on CUDA: `madsl.runner.batched.grid`) are
                costed as what trains, the group: a few timed steps of its members stacked
                (graph-replayed where the group replays), shared out among its runs

The estimate is an upper bound where runs stop early (a protocol's early stop once a
run is solved). Wall time divides the run-seconds over the runs that execute at once.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from madsl.errors import MadslError
from madsl.runner.store.files import os_error_words
from madsl.runner.store.results import canonical_json, sha256

MEASURED_STEPS = 5  # timed steps of a measurement; the fastest counts (other work on the machine only adds)
EVAL_BATCH = 128
FORWARD_SHARE = 1 / 3  # a forward pass against a training step (forward + backward ~ 3 forwards)


@dataclass
class RunCost:
    run_id: str
    spec: str
    task: str
    tokens: int
    flops: float | None  # None: the model has no spec to account (a stand-in model)
    seconds: float | None  # None: not measured
    seq_len: int = 0
    params: int | None = None  # the accounted parameters of the model built for this run's shape
    # layer hyperparameters that follow the sequence length (`seq_len` values): "SYMBOL.field" -> value
    sized: dict[str, int] = field(default_factory=dict)


def length_sized(spec: Any, here: Any, seq_len: int, vocab: int) -> dict[str, int]:
    """Each layer field of `spec` that follows the sequence length ("SYMBOL.field" -> its value in
    `here`, the accounting at (seq_len, vocab)): a value that moves with the length."""
    from madsl.graph import account

    longer = account(spec, seq_len=seq_len + 1, vocab=vocab)
    return {f"{row.symbol}.{name}": value for row, moved in zip(here.layers, longer.layers)
            for name, value in row.config.items() if value == seq_len and moved.config.get(name) == seq_len + 1}


def run_shape(job: Any) -> tuple[int, int, int, int, int]:
    """(seq_len, vocab, train examples, test examples, batch size) of a job; the batch is at most
    the training examples (a larger one trains on all of them at once, and is timed so)."""
    settings = dict(job.setting)
    train_examples = int(settings.get("num_train_examples", 0))
    return (int(settings.get("seq_len", 1)), int(job.task.vocab_size(settings)), train_examples,
            int(settings.get("num_test_examples", 0)), min(int(job.train.batch_size), max(train_examples, 1)))


def estimate(jobs: Sequence[Any], done: set[str], files_dir: Path | None, measure: bool = True,
             work: Sequence[Any] = ()) -> list[RunCost]:
    """The cost of every pending job (done ones cost nothing); `work`: the units the executor
    runs (RunJobs and GroupJobs), so that a stacked group's runs share its measured steps."""
    from madsl.runner.batched.grid import stacks_settings

    timings = StepTimes(files_dir / "step-times.json" if files_dir is not None else None)
    # the groups that train stacked (the others, e.g. Adam's, train in lockstep: run by run)
    stacked = [unit for unit in work if getattr(unit, "stack", False) and stacks_settings(unit.members[0])]
    stacked_in = {member.run_id: unit for unit in stacked for member in unit.members}
    pending_members = {id(unit): sum(m.run_id not in done for m in unit.members) for unit in stacked}
    forward_flops: dict[tuple[int, int, int], float] = {}  # (spec, seq_len, vocab) -> FLOPs of one sequence
    shapes: dict[tuple[int, int, int], tuple[int, dict[str, int]]] = {}  # -> (params, length-sized fields)
    costs = []
    for job in jobs:
        if job.run_id in done:
            continue
        seq_len, vocab, n_train, n_test, batch = run_shape(job)
        tokens = job.train.epochs * n_train * seq_len
        spec = getattr(job.model_factory, "spec", None)
        flops, params, sized = None, None, {}
        if spec is not None:
            from madsl.graph import account

            key = (id(spec), seq_len, vocab)
            if key not in forward_flops:  # a paper sweep has hundreds of runs and a few shapes per spec
                here = account(spec, seq_len=seq_len, vocab=vocab)
                forward_flops[key] = here.totals["flops"]
                shapes[key] = here.totals["params"], length_sized(spec, here, seq_len, vocab)
            flops = 3.0 * forward_flops[key] * n_train * job.train.epochs
            params, sized = shapes[key]
        seconds = None
        if measure:
            group = stacked_in.get(job.run_id)
            try:
                if group is not None:  # the group's stacked step, this run's share of it
                    step = timings.seconds_per_group_step(group, [m for m in group.members if m.run_id not in done],
                                                          seq_len, batch) / pending_members[id(group)]
                else:
                    step = timings.seconds_per_step(job, seq_len, vocab, batch)
            except (MemoryError, RuntimeError) as err:
                from madsl.runner.train.device import is_out_of_memory

                if not is_out_of_memory(err):
                    raise
                _release_device_memory()
                raise MadslError(f"{job.label or job.run_id} does not fit: a training step at length {seq_len}, "
                                 f"batch {batch}, ran out of memory while the plan timed it ({_first_line(err)})",
                                 hint="lower the settings that size it (--set seq_len=..., vocab_size=...; "
                                      "--batch-size), or train where there is more memory") from None
            eval_rows = min(max(job.train.batch_size, EVAL_BATCH), max(n_test, 1))  # an evaluation batch's
            steps = math.ceil(n_train / batch) + FORWARD_SHARE * math.ceil(n_test / eval_rows) * eval_rows / batch
            seconds = step * steps * job.train.epochs
        costs.append(RunCost(job.run_id, getattr(spec, "name", job.label.split(" · ")[0]), job.task.name, tokens,
                             flops, seconds, seq_len, params, sized))
    timings.save()
    return costs


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]


# What a step-time cache may hold: the results folder can be written by others, so every value
# is checked on read, and a cache that is anything else is discarded (and measured again).
STEP_TIMES_MAX_BYTES = 16 * 1024 * 1024  # ~100k entries; madsl writes ~90 bytes per measured model
STEP_TIMES_MAX_SEQ_LEN = 2**31  # a sequence length measured at
STEP_TIMES_MAX_SECONDS = 86400.0  # a training step of a day is no measurement
_STEP_KEY = re.compile(r"[0-9a-f]{64}")  # a sha256, as StepTimes.key makes them


def read_step_times(path: Path) -> dict[str, list]:
    """The cache at `path` (key -> [sequence length, seconds per step]); ValueError saying what is
    wrong with it: not a regular file (a symbolic link is not followed), too large, not JSON, or
    an entry that is not [a length in 1..2^31, seconds finite and in (0, a day]]."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise ValueError("it is a symbolic link, which madsl does not follow" if path.is_symlink()
                         else f"it cannot be read: {os_error_words(err)}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # a folder, a FIFO, a device
            raise ValueError("it is not a regular file")
        text = f.read(STEP_TIMES_MAX_BYTES + 1)
    if len(text) > STEP_TIMES_MAX_BYTES:
        raise ValueError(f"it is larger than {STEP_TIMES_MAX_BYTES // 2**20} MiB")
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as err:  # RecursionError: nesting deeper than the parser goes
        raise ValueError(f"it is not JSON ({type(err).__name__})") from None
    if not isinstance(data, dict):
        raise ValueError(f"it holds a {type(data).__name__}, not an object")
    table = {}
    for key, value in data.items():
        if not _STEP_KEY.fullmatch(key):
            raise ValueError(f"key {key[:70]!r} is not a step-time key")
        if not (isinstance(value, list) and len(value) == 2):
            raise ValueError(f"{key[:12]}: expected [sequence length, seconds per step]")
        length, seconds = value
        if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= STEP_TIMES_MAX_SEQ_LEN:
            raise ValueError(f"{key[:12]}: sequence length {_short(length)} is not an integer in 1..2^31")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
                or not 0 < seconds <= STEP_TIMES_MAX_SECONDS:
            raise ValueError(f"{key[:12]}: {_short(seconds)} seconds per step is not a finite number in "
                             f"(0, {STEP_TIMES_MAX_SECONDS:g}]")
        table[key] = [length, float(seconds)]
    return table


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number of a step-time cache")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class StepTimes:
    """Seconds per training step of each distinct model and shape, measured once and cached."""

    def __init__(self, path: Path | None):
        self.path, self.changed = path, False
        self.table: dict[str, list] = {}  # key -> [sequence length measured at, seconds per step]
        if path is not None and (path.exists() or path.is_symlink()):
            try:
                self.table = read_step_times(path)
            except ValueError as err:  # measured again, and rewritten by save() (a link: left alone)
                warnings.warn(f"{path}: not a usable step-time cache ({err}); it is discarded and the steps "
                              "are measured again", RuntimeWarning, stacklevel=3)
                self.changed = True

    def key(self, job: Any, batch: int) -> str:
        import torch

        model = canonical_json(job.model_factory.spec.identity()) if hasattr(job.model_factory, "spec") \
            else repr(job.model_factory)
        return sha256(canonical_json([model, batch, job.device, torch.get_num_threads()]))

    def seconds_per_step(self, job: Any, seq_len: int, vocab: int, batch: int) -> float:
        key = self.key(job, batch)
        if key not in self.table:
            self.table[key] = [seq_len, _measured(measure_step(job, seq_len, vocab, batch))]
            self.changed = True
            _release_device_memory()
        measured_at, seconds = self.table[key]
        return seconds * seq_len / measured_at

    def seconds_per_group_step(self, group: Any, members: Sequence[Any], seq_len: int, batch: int) -> float:
        """Seconds of a stacked step of `members` (a group's pending runs), measured once per model,
        member count, precision and graphs, at the first sequence length planned, scaled linearly."""
        import torch

        first = members[0]
        model = canonical_json(first.model_factory.spec.identity()) if hasattr(first.model_factory, "spec") \
            else repr(first.model_factory)
        key = sha256(canonical_json(["stacked", model, batch, len(members), first.train.precision, group.graphs,
                                     group.device, torch.get_num_threads()]))
        if key not in self.table:
            self.table[key] = [seq_len, _measured(measure_group_step(group, members, batch))]
            self.changed = True
            _release_device_memory()
        measured_at, seconds = self.table[key]
        return seconds * seq_len / measured_at

    def save(self) -> None:
        """Keep the measurements for the next plan, where the results folder can be written (a
        cache: where it cannot, the next plan measures again, and the database says why)."""
        if not self.changed or self.path is None or self.path.is_symlink():
            return  # a symbolic link is not madsl's: neither followed nor replaced
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            from madsl.outputs import temp_beside

            fd, tmp = temp_beside(self.path, ".tmp")  # a new file (O_EXCL): a planted name is not followed
            os.close(fd)
            Path(tmp).write_text(json.dumps(self.table, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


def _measured(seconds: float) -> float:
    """A measured step as the cache keeps it: positive (a clock's resolution can read 0)."""
    return max(float(seconds), 1e-9)


def _release_device_memory() -> None:
    """A measurement's memory (a stack's graphs among it), cached in the coordinator's process,
    back to the GPU for the workers."""
    from madsl.runner.train.device import release_device_memory

    release_device_memory()


def measure_step(job: Any, seq_len: int, vocab: int, batch: int) -> float:
    """Seconds of a training step (forward, backward, AdamW) on random tokens: the fastest of
    MEASURED_STEPS after a warm-up."""
    import torch
    import torch.nn.functional as F

    from madsl.runner.train.device import resolve_device
    from madsl.runner.train.optim import build_optimizer

    device = resolve_device(job.device if job.device in ("auto", "cpu", "cuda") else "auto")
    model = job.model_factory(vocab_size=vocab, max_seq_len=seq_len, num_classes=None, seed=0).to(device)
    optimizer = build_optimizer(model, 1e-3, 0.0, device)
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (batch, seq_len), generator=generator).to(device)
    times = []
    for _ in range(MEASURED_STEPS + 1):
        started = time.perf_counter()
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return min(times[1:])


def measure_group_step(group: Any, members: Sequence[Any], batch: int) -> float:
    """Seconds of a training step of `members` stacked as their group trains them
    (`madsl.runner.batched.stacked`: precision, graphs): the fastest of MEASURED_STEPS after the warm-up
    (and, with graphs, the capture), on one batch of the task's own data (shapes matter here,
    not values)."""
    import torch

    from madsl.runner.execute.jobs import job_inputs
    from madsl.runner.batched.replay import GRAPH_WARMUP
    from madsl.runner.batched.stacked import StackedMembers
    from madsl.runner.train.device import resolve_device
    from madsl.runner.train.state import RunData, RunState

    def one_batch(task, setting, split, seed, data_dir):
        return task.generate({**setting, "num_train_examples": batch, "num_test_examples": batch}, split, seed)

    device = resolve_device(group.device if group.device in ("auto", "cpu", "cuda") else "auto")
    states, data = [], None
    for job in members:
        inputs = job_inputs(job, one_batch)
        states.append(RunState.start(job.train, inputs.build_model, device,
                                     int(dict(job.setting).get("num_train_examples", batch)), inputs.num_classes))
        data = data or RunData.from_tasks(inputs.train_data, inputs.test_data, device)
    stack = StackedMembers(states, graphs=group.graphs)
    stack.load_metrics()  # the epoch's train-metric sums a step adds into
    x = data.train_x[:batch].expand(len(states), *data.train_x[:batch].shape)
    y = data.train_y[:batch].expand(len(states), *data.train_y[:batch].shape)
    # graphs: the eager runs, the capture (and its replay), one more replay; then only replays are timed
    warm_up = GRAPH_WARMUP + 2 if group.graphs else 1
    times = []
    for index in range(warm_up + MEASURED_STEPS):
        started = time.perf_counter()
        stack.step(x, y)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if index >= warm_up:
            times.append(time.perf_counter() - started)
    return min(times)


def summarize_cost(total_runs: int, done: int, costs: list[RunCost], at_once: int | None,
                   executor: str) -> dict:
    """The plan as JSON: counts, tokens, FLOPs, run-seconds and wall time, per spec and in all."""
    per_spec: dict[str, dict] = {}
    for cost in costs:
        row = per_spec.setdefault(cost.spec, {"pending": 0, "tokens": 0, "flops": 0.0, "seconds": 0.0,
                                              "params_by_length": {}, "sized_by_length": {}})
        if cost.params is not None:  # per sequence length: the smallest vocabulary's model (the baseline's)
            row["params_by_length"][cost.seq_len] = min(cost.params, row["params_by_length"].get(cost.seq_len,
                                                                                                 cost.params))
        for name, value in cost.sized.items():
            row["sized_by_length"].setdefault(name, {})[cost.seq_len] = value
        row["pending"] += 1
        row["tokens"] += cost.tokens
        row["flops"] = None if row["flops"] is None or cost.flops is None else row["flops"] + cost.flops
        row["seconds"] = None if row["seconds"] is None or cost.seconds is None else row["seconds"] + cost.seconds
    run_seconds = None if any(c.seconds is None for c in costs) else sum(c.seconds for c in costs)
    flops = None if any(c.flops is None for c in costs) else sum(c.flops for c in costs)
    return {"runs": total_runs, "done": done, "pending": len(costs), "tokens": sum(c.tokens for c in costs),
            "flops": flops, "run_seconds": run_seconds, "executor": executor, "runs_at_once": at_once,
            "wall_seconds": None if run_seconds is None or not at_once else run_seconds / at_once,
            "per_spec": per_spec, "per_run": [asdict(c) for c in costs]}


def render_cost(plan: dict) -> str:
    """The plan in a few lines, for the terminal."""
    def big(x):
        if x is None:
            return "?"
        for unit, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
            if abs(x) >= size:
                return f"{x / size:.3g}{unit}"
        return f"{x:.3g}"

    def duration(s):
        if s is None or not math.isfinite(s):
            return "?"
        if s < 120:
            return f"{s:.0f} s"
        return f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h" if s < 360000 else f"{s / 3600:,.0f} h"

    lines = [f"plan: {plan['runs']} runs, {plan['done']} done, {plan['pending']} pending; "
             f"{big(plan['tokens'])} training tokens, {big(plan['flops'])} FLOPs (forward + backward)"]
    for name, row in plan["per_spec"].items():
        lines.append(f"  {name}: {row['pending']} pending runs, {big(row['tokens'])} tokens, {big(row['flops'])} FLOPs, "
                     f"~{duration(row['seconds'])} of run time")
        for field_name, by_length in row.get("sized_by_length", {}).items():  # layers built for each length
            lines.append(f"    {field_name} follows the sequence length: " + ", ".join(
                f"{value:,} at {length:,}" for length, value in sorted(by_length.items())) + "; parameters (smallest "
                "vocabulary) " + ", ".join(
                f"{row['params_by_length'][length]:,}" for length in sorted(by_length)))
    if plan["wall_seconds"] is not None:
        lines.append(f"estimated wall time: ~{duration(plan['wall_seconds'])} ({duration(plan['run_seconds'])} of runs, "
                     f"{plan['runs_at_once']} at once on the {plan['executor']} executor; an upper bound where runs "
                     "stop early)")
    elif plan["run_seconds"] is not None:
        lines.append(f"estimated run time: ~{duration(plan['run_seconds'])} in all, divided over the runs the "
                     f"{plan['executor']} executor holds at once")
    return "\n".join(lines) + "\n"

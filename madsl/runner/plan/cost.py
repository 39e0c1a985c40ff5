"""What a sweep costs before it runs: runs, training tokens, FLOPs and wall time.

    runs        in all, already done, pending (from the results database, if it exists)
    tokens      per pending run: epochs x training examples x sequence length
    FLOPs       forward FLOPs of one sequence from the accounting (`madsl.graph.account`),
                x 3 for forward + backward, x sequences trained
    seconds     from the same accounting, layer by layer: each layer's training FLOPs at its
                family's measured rate at its width on the device the run trains on
                (`madsl.runner.plan.rate`: measured once per device, cached, measured again on
                request; the machine's load when planning does not enter it), + the rest of a
                model (a step's fixed cost, per logit, per layer and token, per parameter), over
                the threads' speedup; x the run's steps, + its evaluations (a forward pass
                costs about a third of a training step); an interval around it where the
                measurement is uncertain (DeviceRates.interval). The runs of a stacked grid group (the default
                on CUDA: `madsl.runner.batched.grid`) are costed as what trains, the group: its
                members' FLOPs in one step, each layer's per-step overhead once, shared out among
                its pending runs

The estimate is an upper bound where runs stop early (a protocol's early stop once a
run is solved). Wall time divides the run-seconds over the runs that execute at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from madsl.errors import MadslError
from madsl.runner.common.choices import FORWARD_SHARE, TRAIN_FORWARDS  # a training step: ~3 forward passes
from madsl.runner.plan.rate_model import startup_cost
from madsl.tasks.base import data_shape

if TYPE_CHECKING:
    from madsl.runner.plan.rate import RateBook

EVAL_BATCH = 128
PROGRESS_EVERY = 500  # runs accounted between two progress reports

Progress = Callable[[str, int, int], None]  # (what, done, total)


@dataclass
class RunCost:
    run_id: str
    spec: str
    task: str
    tokens: int
    flops: float | None  # None: the model has no spec to account (a stand-in model)
    seconds: float | None  # None: not estimated (no spec, no rate for a layer family, a device not here)
    seq_len: int = 0
    params: int | None = None  # the accounted parameters of the model built for this run's shape
    interval: tuple[float, float] = (1.0, 1.0)  # the actual seconds expected between these times `seconds`
    # layer hyperparameters that follow the sequence length (`seq_len` values): "SYMBOL.field" -> value
    sized: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Shape:
    """A model at one (spec, sequence length, vocabulary), as the accounting has it."""

    flops: float  # forward FLOPs of one sequence
    params: int
    sized: dict[str, int]  # the layer fields that follow the sequence length
    layers: tuple[tuple[str, float, int], ...]  # (rate family, forward FLOPs of one sequence, width) a layer


class Shapes:
    """The accounting of each distinct (spec, length, vocabulary): a paper sweep has hundreds of
    runs and a few shapes per spec; the length-sized fields, once per (spec, length). One plan
    shares one: its memory check (madsl.runner.plan.memory) and its cost account each shape once."""

    def __init__(self) -> None:
        self.accounted: dict[tuple[int, int, int], Any] = {}
        self.shapes: dict[tuple[int, int, int], Shape] = {}
        self.sized: dict[tuple[int, int], dict[str, int]] = {}

    def accounting(self, spec: Any, seq_len: int, vocab: int) -> Any:
        """The accounting of `spec` at (seq_len, vocab) (madsl.graph.account), computed once."""
        key = (id(spec), seq_len, vocab)
        if key not in self.accounted:
            from madsl.graph import account

            self.accounted[key] = account(spec, seq_len=seq_len, vocab=vocab)
        return self.accounted[key]

    def of(self, spec: Any, seq_len: int, vocab: int) -> Shape:
        key = (id(spec), seq_len, vocab)
        if key not in self.shapes:
            here = self.accounting(spec, seq_len, vocab)
            if (id(spec), seq_len) not in self.sized:
                self.sized[(id(spec), seq_len)] = length_sized(spec, here, seq_len, vocab)
            from madsl.runner.plan.rate_measure import layer_flops

            self.shapes[key] = Shape(
                here.totals["flops"],
                here.totals["params"],
                self.sized[(id(spec), seq_len)],
                tuple(layer_flops(here, spec.dim)),
            )
        return self.shapes[key]


def length_sized(spec: Any, here: Any, seq_len: int, vocab: int) -> dict[str, int]:
    """Each layer field of `spec` that follows the sequence length ("SYMBOL.field" -> its value in
    `here`, the accounting at (seq_len, vocab)): a value that moves with the length."""
    from madsl.graph import account

    written = any(value == seq_len for row in here.layers for value in row.config.values())
    if not written:  # no field holds the length: none can follow it (and nothing to account again)
        return {}
    longer = account(spec, seq_len=seq_len + 1, vocab=vocab)
    return {
        f"{row.symbol}.{name}": value
        for row, moved in zip(here.layers, longer.layers)
        for name, value in row.config.items()
        if value == seq_len and moved.config.get(name) == seq_len + 1
    }


def run_shape(job: Any) -> tuple[int, int, int, int, int]:
    """(seq_len, vocab, train examples, test examples, batch size) of a job; the batch is at most
    the training examples (a larger one trains on all of them at once, and is costed so)."""
    settings = dict(job.setting)
    seq_len, train_examples, test_examples = data_shape(job.task, settings)
    return (
        seq_len,
        int(job.task.vocab_size(settings)),
        train_examples,
        test_examples,
        min(int(job.train.batch_size), max(train_examples, 1)),
    )


def estimate(
    jobs: Sequence[Any],
    done: set[str],
    rates: "RateBook | None" = None,
    work: Sequence[Any] = (),
    threads: int | None = None,
    progress: Progress | None = None,
    shapes: Shapes | None = None,
) -> list[RunCost]:
    """The cost of every pending job (done ones cost nothing). `rates`: a
    madsl.runner.plan.rate.RateBook to time them with (None: tokens and FLOPs only); `work`: the
    units the executor runs (RunJobs and GroupJobs), so that a stacked group's runs share its
    steps; `threads`: the torch threads a run trains on, on the CPU (None: this process's);
    `shapes`: the plan's accounting, where its memory check made it already."""
    shapes = shapes if shapes is not None else Shapes()
    pending = [job for job in jobs if job.run_id not in done]
    costs, layers, sizes = [], [], [run_shape(job) for job in pending]
    for index, (job, (seq_len, vocab, n_train, _, _)) in enumerate(zip(pending, sizes)):
        if progress is not None and index % PROGRESS_EVERY == 0 and index:
            progress("accounting the runs", index, len(pending))
        spec = getattr(job.model_factory, "spec", None)
        shape = shapes.of(spec, seq_len, vocab) if spec is not None else None
        layers.append(shape.layers if shape is not None else None)
        flops = None if shape is None else TRAIN_FORWARDS * float(shape.flops) * n_train * job.train.epochs
        costs.append(
            RunCost(
                job.run_id,
                getattr(spec, "name", job.label.split(" · ")[0]),
                job.task.name,
                job.train.epochs * n_train * seq_len,
                flops,
                None,
                seq_len,
                None if shape is None else shape.params,
                {} if shape is None else shape.sized,
            )
        )
    if rates is not None:
        _time(pending, costs, layers, sizes, done, rates, work, threads)
    return costs


def _time(
    pending: Sequence[Any],
    costs: list[RunCost],
    layers: list,
    sizes: list,
    done: set[str],
    rates: "RateBook",
    work: Sequence[Any],
    threads: int | None,
) -> None:
    """Each pending run's seconds, at the rates of the device it trains on (`layers`: each run's
    Shape.layers, None without a spec; `sizes`: each run's run_shape)."""
    from madsl.runner.batched.grid import stacks_settings

    # the groups that train stacked (the others, e.g. Adam's, train in lockstep: run by run)
    stacked = [unit for unit in work if getattr(unit, "stack", False) and stacks_settings(unit.members[0])]
    stacked_in = {member.run_id: unit for unit in stacked for member in unit.members}
    members = {id(unit): sum(m.run_id not in done for m in unit.members) for unit in stacked}
    books = _device_rates(pending, layers, rates, threads)
    for job, cost, model, (length, vocab, n_train, n_test, batch) in zip(pending, costs, layers, sizes):
        book = books.get(job.device)
        if model is None or book is None:
            continue
        group = stacked_in.get(job.run_id)
        together = members[id(group)] if group is not None else 1
        eval_rows = min(max(job.train.batch_size, EVAL_BATCH), max(n_test, 1))  # an evaluation batch's
        cost.seconds = run_seconds(
            book,
            model,
            length,
            (math.ceil(n_train / batch), batch),
            (math.ceil(n_test / eval_rows) if n_test else 0, eval_rows),
            job.train.epochs,
            together,
            (vocab, cost.params or 0),
        )
        cost.interval = book.interval()


def run_seconds(
    rates: Any,
    layers: Sequence[tuple[str, float]],
    length: int,
    train: tuple[int, int],
    evaluation: tuple[int, int],
    repeats: int = 1,
    together: int = 1,
    model: tuple[int, int] | None = None,
) -> float | None:
    """The step-time estimate of a run (a MAD run's, a pretraining run's: the one estimator): its
    `train` (steps, rows of each) training steps and `evaluation` (batches, rows of each) forward
    passes, each a FORWARD_SHARE of a step, over sequences of `length` tokens, `repeats` times (a
    MAD run's epochs), at a device's `rates` (madsl.runner.plan.rate_model.DeviceRates) for its
    `layers` (Shape.layers). `together`: the pending members of a stacked group, which share its
    steps (a run's share); `model`: (vocabulary, parameters), for the step's cost outside the layers
    (DeviceRates.step_seconds). None where a layer family has no rate on the device."""
    (steps, rows), (batches, eval_rows) = train, evaluation
    train_step = rates.step_seconds(layers, rows, length, together, model)
    eval_step = rates.step_seconds(layers, eval_rows, length, together, model)
    if train_step is None or eval_step is None:  # a family without a rate here
        return None
    evaluations = FORWARD_SHARE * batches * eval_step if batches else 0.0
    return (steps * train_step + evaluations) * repeats / together


def _device_rates(pending: Sequence[Any], layers: list, rates: "RateBook", threads: int | None) -> dict[str, Any]:
    """job.device -> the rates of the device it names, with every family its runs use."""
    families: dict[str, set[str]] = {}
    for job, model in zip(pending, layers):
        if model is not None:
            families.setdefault(job.device, set()).update(layer[0] for layer in model)
    return device_rates(families, rates, threads)


def device_rates(families: dict[str, set[str]], rates: "RateBook", threads: int | None = None) -> dict[str, Any]:
    """Device name (auto, cpu, cuda, cuda:N) -> its rates (madsl.runner.plan.rate_model.DeviceRates)
    with the layer families `families` names for it (measured now where the cache has none; the
    cache saved); a device this machine does not have is left out (`rates.unavailable` says why).
    `threads`: the torch threads a run trains on, on the CPU (None: this process's)."""
    import torch

    from madsl.runner.train.device import resolve_device

    out = {}
    for name, needed in families.items():
        try:
            device = resolve_device(name)
        except RuntimeError as err:  # e.g. cuda, planned on a machine without a GPU (a Ray head)
            rates.unavailable[name] = str(err)
            continue
        try:
            out[name] = rates.rates(device, threads or torch.get_num_threads(), needed)
        except (MemoryError, RuntimeError) as err:
            from madsl.runner.train.device import is_out_of_memory

            if not is_out_of_memory(err):
                raise
            raise MadslError(
                f"{device}: ran out of memory while the plan measured this device's training rate ({_first_line(err)})",
                hint="free the device (other processes may hold its memory) and plan again",
            ) from None
    rates.save()
    return out


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]


def summarize_cost(
    total_runs: int,
    done: int,
    costs: list[RunCost],
    at_once: int | None,
    executor: str,
    rates: list[dict] | None = None,
) -> dict:
    """The plan as JSON: counts, tokens, FLOPs, run-seconds and wall time, per spec and in all;
    `rates`: where the time's rates come from (madsl.runner.plan.rate.RateBook.describe)."""
    per_spec: dict[str, dict] = {}
    for cost in costs:
        row = per_spec.setdefault(
            cost.spec,
            {"pending": 0, "tokens": 0, "flops": 0.0, "seconds": 0.0, "params_by_length": {}, "sized_by_length": {}},
        )
        if cost.params is not None:  # per sequence length: the smallest vocabulary's model (the baseline's)
            row["params_by_length"][cost.seq_len] = min(
                cost.params, row["params_by_length"].get(cost.seq_len, cost.params)
            )
        for name, value in cost.sized.items():
            row["sized_by_length"].setdefault(name, {})[cost.seq_len] = value
        row["pending"] += 1
        row["tokens"] += cost.tokens
        row["flops"] = None if row["flops"] is None or cost.flops is None else row["flops"] + cost.flops
        row["seconds"] = None if row["seconds"] is None or cost.seconds is None else row["seconds"] + cost.seconds
    run_seconds = None if any(c.seconds is None for c in costs) else sum(c.seconds for c in costs)
    interval = None if run_seconds is None else [sum(c.seconds * c.interval[i] for c in costs) for i in (0, 1)]
    flops = None if any(c.flops is None for c in costs) else sum(c.flops for c in costs)
    startup, processes = startup_cost(rates or [], at_once, executor)
    started = startup * processes if run_seconds is not None and startup is not None and costs else 0.0
    # wall: the plan's own process starts, then its workers together (one process: itself alone)
    wall_start = started if processes == 1 or not started else 2 * startup
    return {
        "runs": total_runs,
        "done": done,
        "pending": len(costs),
        "tokens": sum(c.tokens for c in costs),
        "flops": flops,
        "run_seconds": run_seconds,
        "executor": executor,
        "runs_at_once": at_once,
        "wall_seconds": None if run_seconds is None or not at_once else run_seconds / at_once + wall_start,
        "run_seconds_interval": interval,  # [low, high]: where the actual run-seconds are expected
        "wall_seconds_interval": None
        if interval is None or not at_once
        else [s / at_once + wall_start for s in interval],
        "startup_seconds": startup,  # what one process pays before its first step (its CPU time)
        "processes": processes,
        # the CPU time of the whole command: its runs and each process's start-up
        "cpu_seconds": None if run_seconds is None else run_seconds + started,
        "cpu_seconds_interval": None if interval is None else [s + started for s in interval],
        "rates": list(rates or []),
        "per_spec": per_spec,
        "per_run": [{**vars(c), "sized": dict(c.sized)} for c in costs],
    }


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

    lines = [
        f"plan: {plan['runs']} runs, {plan['done']} done, {plan['pending']} pending; "
        f"{big(plan['tokens'])} training tokens, {big(plan['flops'])} FLOPs (forward + backward)"
    ]
    for name, row in plan["per_spec"].items():
        lines.append(
            f"  {name}: {row['pending']} pending runs, {big(row['tokens'])} tokens, {big(row['flops'])} FLOPs, "
            f"~{duration(row['seconds'])} of run time"
        )
        for field_name, by_length in row.get("sized_by_length", {}).items():  # layers built for each length
            lines.append(
                f"    {field_name} follows the sequence length: "
                + ", ".join(f"{value:,} at {length:,}" for length, value in sorted(by_length.items()))
                + "; parameters (smallest "
                "vocabulary) " + ", ".join(f"{row['params_by_length'][length]:,}" for length in sorted(by_length))
            )
    starting = ""
    if plan.get("startup_seconds") and plan["pending"]:
        processes = plan["processes"]
        starting = f", {plan['startup_seconds']:.1f} s to start {'each of ' if processes > 1 else ''}"
        starting += f"{processes} process{'es' if processes > 1 else ''}"
    if plan["wall_seconds"] is not None:
        lines.append(
            f"estimated wall time: ~{duration(plan['wall_seconds'])} ({duration(plan['run_seconds'])} of runs, "
            f"{plan['runs_at_once']} at once on the {plan['executor']} executor{starting}; an upper bound "
            "where runs stop early)"
        )
    elif plan["run_seconds"] is not None:
        lines.append(
            f"estimated run time: ~{duration(plan['run_seconds'])} in all, divided over the runs the "
            f"{plan['executor']} executor holds at once"
        )
    between = plan.get("wall_seconds_interval") or plan.get("run_seconds_interval")
    if between:  # the measurement is uncertain: where the time is expected (DeviceRates.interval)
        lines.append(f"  likely between {duration(between[0])} and {duration(between[1])}")
    return "\n".join(lines + [line for rate in plan.get("rates", []) for line in rate_lines(rate)]) + "\n"


def rate_lines(rate: dict) -> list[str]:
    """Where the estimated time comes from: the device's rate, cached (when, under what load) or
    measured now; what has no rate."""
    from madsl.errors import option

    if "unavailable" in rate:
        return [f"time not estimated for the runs on {rate['device']}: {rate['unavailable']}"]
    threads = ""
    if rate["device"].startswith("cpu"):
        threads = f", {rate['threads']} thread{'s' if rate['threads'] > 1 else ''} a run"
        if rate.get("threads_speedup") and not rate.get("threads_speedup_assumed"):
            threads += f" ({rate['threads_speedup']:.2g}x one)"
    when = _when(rate["measured"])
    if rate["measured_now"] and set(rate["measured_now"]) >= {*rate["families"], "rest"}:
        source = (
            f"measured now (load {_load(rate['load'])}), cached in {rate['cache']}"
            if rate["cache"]
            else f"measured now (load {_load(rate['load'])})"
        )
    else:
        source = f"cached rates measured {when} under load {_load(rate['load'])}" + (
            f" ({', '.join(rate['measured_now'])} measured now)" if rate["measured_now"] else ""
        )
    lines = [
        f"time: from the FLOPs at this machine's training rate ({rate['device']}{threads}): {source}; "
        f"{option('measure_rate')} measures it again"
    ]
    if rate.get("threads_speedup_assumed"):
        lines.append(
            "  the threads' speedup is taken as 1 (the cores were busy when it was to be measured): the "
            "estimate errs long"
        )
    lines += [f"  no rate for {family} ({why}): its runs are not timed" for family, why in rate["failed"].items()]
    return lines


def _when(measured: str | None) -> str:
    from datetime import datetime, timezone

    if measured is None:
        return "?"
    return datetime.fromisoformat(measured).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _load(load: float | None) -> str:
    return "unknown" if load is None else f"{load:.2f}"

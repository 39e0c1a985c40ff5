"""The runner's Python API: `evaluate` specs on MAD tasks, `report` the results.

    summary = evaluate(["specs/paper/striped-hyena-moe.mad"], protocol="quick", workers=2)
    print(report("madsl-results.db"))
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import sqlite3
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from madsl.errors import Location, MadslError
from madsl.runner.executor import Executor, Outcome, Reporter, RunJob, make_executor, run_jobs
from madsl.runner.memory import check_fits
from madsl.runner.protocols import (Overrides, SpecEvalWhere, apply_setting_overrides, budgeted_baseline,
                                    build_plan, check_setting_keys, check_spec_settings, get_protocol,
                                    overrides_from_spec_eval, resolve_task_names)
from madsl.runner.report import load_scores, render_text
from madsl.runner.report import report as _report
from madsl.runner.options import train_config_identity
from madsl.runner.precision import check_precision, resolve_precision
from madsl.runner.store import (DEFAULT_DB, RunIdentity, Store, StoreFiles, canonical_json, check_database,
                                madsl_version, sha256)

DEFAULT_PROTOCOL = "quick"


# --- specs and models ----------------------------------------------------------------------

def spec_identity(spec: Any) -> str:
    """The text whose hash identifies a spec's model (`Spec.identity`, as canonical JSON)."""
    return canonical_json(spec.identity())


@dataclass
class CompiledSpecFactory:
    """Builds the model of a spec with `madsl.compile`. It pickles with its Spec, so a worker on
    another machine needs no spec file (nor the files it extends)."""

    spec: Any
    path: str | None = None

    def __call__(self, vocab_size: int, max_seq_len: int, num_classes: int | None = None, seed: int = 0):
        import madsl

        return madsl.compile(self.spec, vocab_size=vocab_size, max_seq_len=max_seq_len, num_classes=num_classes,
                             seed=seed)


def _load_specs(items: Sequence[Any], notes: list[str] | None = None) -> list[tuple[Any, str | None]]:
    """The specs as `madsl compile` builds them: one whose `budget.fit` is not solved yet trains
    with the solution (`madsl.fit.fitted`), and `notes` gets what was used."""
    from madsl.fit import fit_note, fitted

    out = []
    files: dict[Path, Any] = {}
    for item in items:
        if isinstance(item, (str, os.PathLike)):
            from madsl.spec import load_spec

            if not Path(item).exists():
                raise MadslError(f"no such spec file: {item}")
            if Path(item).resolve() in files:  # e.g. a glob and a name that overlap
                raise MadslError(f"the spec {item} is given twice (as {files[Path(item).resolve()]} before)",
                                 hint="list each spec once")
            files[Path(item).resolve()] = item
            spec, path = load_spec(item), str(item)
        else:
            spec, path = item, str(item.path) if getattr(item, "path", None) else None
        if getattr(spec, "fit", None):
            spec, solution = fitted(spec)
            if solution is not None and notes is not None:
                notes.append(f"{spec.name}: {fit_note(solution, path)}")
        out.append((spec, path))
    return out


def _task_registry(registry: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """name -> Task, and the names `all` stands for."""
    if registry is not None:
        return dict(registry), list(registry)
    from madsl.tasks import MAD_TASKS, get_task, TASKS

    return {name: get_task(name) for name in TASKS}, list(MAD_TASKS)


def _task_for_run(registry: Mapping[str, Any], run) -> Any:
    """The task of a planned run, generated as its conventions have it."""
    from madsl.tasks import with_conventions

    return with_conventions(registry[run.task], run.train.conventions)


def _check_settings(registry: Mapping[str, Any], plan, lengths_where: Location | None = None,
                    set_where: Mapping[str, Location] | None = None) -> None:
    """Let each task reject bad settings now (exit 2) rather than fail its runs later. A rejection
    that names one knob of a spec's `eval.set` (`set_where`: knob -> where its value is written)
    is reported there."""
    seen: set[str] = set()
    for run in plan.runs:
        key = canonical_json([run.task, run.settings, run.train.conventions])
        task = _task_for_run(registry, run)
        if key in seen or not hasattr(task, "check"):
            continue
        seen.add(key)
        try:
            task.check(task.settings(**run.settings))
        except (ValueError, KeyError) as err:
            message = str(err.args[0]) if err.args else str(err)
            conventions = f" (conventions {run.train.conventions})" if run.train.conventions != "madsl" else ""
            named = [where for knob, where in (set_where or {}).items()
                     if re.search(rf"\b{re.escape(knob.rpartition('.')[2])}\b", message)]
            raise MadslError(f"bad setting for {run.task}{conventions}: {message}",
                             named[0] if len(named) == 1 else None,
                             hint="check your --set / eval.set values") from None
        _check_eval_lengths(task, run.settings, run.train.eval_lengths, lengths_where)


def _check_eval_lengths(task: Any, settings: Mapping[str, Any], lengths: Sequence[int],
                        where: Location | None = None) -> None:
    """Length extrapolation changes a task's seq_len: the task must have one, and each length
    must be a valid setting of it (a bad length would otherwise only show as "error" rows)."""
    if not lengths:
        return
    if "seq_len" not in task.baseline:
        raise MadslError(f"--eval-lengths / eval.eval_lengths: task {task.name!r} has no seq_len setting "
                         "to evaluate at other lengths", where,
                         expected="tasks whose length is their seq_len setting",
                         hint=f"leave {task.name} out (--task NAME) or drop the evaluation lengths")
    for length in lengths:
        try:
            task.check(task.settings(**{**settings, "seq_len": length}))
        except (ValueError, KeyError) as err:
            message = str(err.args[0]) if err.args else str(err)
            raise MadslError(f"--eval-lengths / eval.eval_lengths: length {length} is not a valid "
                             f"{task.name} setting: {message}", where) from None


def _setting_label(baseline: Mapping[str, Any], setting: Mapping[str, Any], task_baseline: Mapping[str, Any],
                   protocol: str) -> str:
    """What a run's setting changes from its protocol's baseline; unchanged: "baseline" where
    that is the task's baseline, else the protocol's own (smoke, quick: a smaller budget)."""
    changed = [f"{k}={v}" for k, v in setting.items() if baseline.get(k) != v]
    if changed:
        return ", ".join(changed)
    return "baseline" if dict(baseline) == dict(task_baseline) else f"{protocol} setting"


# --- progress ------------------------------------------------------------------------------

class RichReporter(Reporter):
    """Progress bars: one for all runs, one per running run (epochs), a line per finished run."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        self.console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
        self.view = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                             TextColumn("eta"), TimeRemainingColumn(), console=self.console)
        self.overall = None
        self.bars: dict[str, Any] = {}
        self.started_at: dict[str, float] = {}

    def __enter__(self) -> "RichReporter":
        self.view.start()
        return self

    def __exit__(self, *exc) -> None:
        self.view.stop()

    def planned(self, total: int, already_done: int) -> None:
        self.overall = self.view.add_task("runs", total=total, completed=already_done,
                                              info=f"{already_done} already done" if already_done else "")

    def started(self, job: RunJob) -> None:
        if job.run_id in self.bars:  # started again: retried after its node was lost
            self.view.remove_task(self.bars.pop(job.run_id))
        self.started_at[job.run_id] = time.monotonic()
        self.bars[job.run_id] = self.view.add_task(f"  {job.label}", total=job.train.epochs, info="starting")

    def progress(self, job: RunJob, epoch: int, step: int, steps: int) -> None:
        bar = self.bars.get(job.run_id)
        if bar is not None:
            self.view.update(bar, completed=epoch - 1 + step / steps,
                                 info=f"epoch {epoch}/{job.train.epochs} step {step}/{steps}")

    def epoch(self, job: RunJob, metrics: Mapping[str, Any]) -> None:
        bar = self.bars.get(job.run_id)
        acc = metrics.get("eval_macro_acc")
        if bar is not None:
            self.view.update(bar, completed=metrics["epoch"],
                                 info=f"epoch {metrics['epoch']}" + (f" acc {acc:.3f}" if acc is not None else
                                                                     f" loss {metrics['eval_loss']:.3g}"))

    def length(self, job: RunJob, length: int, index: int, count: int) -> None:
        bar = self.bars.get(job.run_id)
        if bar is not None:
            self.view.update(bar, info=f"evaluating at length {length:,} ({index + 1}/{count})")

    def ended(self, job: RunJob, status: str, detail: str = "") -> None:
        bar = self.bars.pop(job.run_id, None)
        if bar is not None:
            self.view.remove_task(bar)
        if self.overall is not None and status in ("done", "skipped", "failed"):
            self.view.advance(self.overall)
        mark = {"done": "[green]done[/]", "failed": "[red]failed[/]", "skipped": "[dim]skipped[/]",
                "interrupted": "[yellow]interrupted[/]"}.get(status, status)
        took = time.monotonic() - self.started_at.pop(job.run_id, time.monotonic())
        self.console.print(f"{mark} {job.label}" + (f"  {detail}" if detail else "") +
                           (f"  ({took:.0f} s)" if status == "done" and took else ""), highlight=False)

    def message(self, text: str) -> None:
        self.console.print(text, highlight=False)


# --- evaluate ------------------------------------------------------------------------------

def _check_freeze(spec: Any, names: Sequence[str], path: Any, location: Any = None) -> None:
    """Every name to freeze must name layers of the spec: a symbol used in its topology, a #tag, or embedding."""
    if not names:
        return
    from madsl import topology as topo
    from madsl.errors import did_you_mean

    written = {layer.symbol for layer in topo.layers(spec.topology)} | \
              {f"#{layer.tag}" for layer in topo.layers(spec.topology) if layer.tag}
    if spec.channel_mixer:
        written.add(spec.channel_mixer)
    for name in names:
        if name != "embedding" and name not in written:
            raise MadslError(f"{path or spec.name}: nothing named {name!r} to freeze", location,
                             expected="a symbol of the topology, a #tag or embedding: "
                                      + ", ".join(sorted(written | {"embedding"})),
                             hint=did_you_mean(name, written | {"embedding"}))

def plan_spec(spec: Any, path: str | None, cli: Overrides | None = None,
              registry: Mapping[str, Any] | None = None, all_tasks: Sequence[str] | None = None):
    """The runs `madsl eval` would make of one spec: its `eval:` section under the command
    line's overrides `cli`, on the default protocol. Bad keys, values and task names raise
    located MadslErrors, so this also validates a spec's eval section without running it."""
    if registry is None:
        registry, all_tasks = _task_registry(None)
    cli = cli or Overrides()
    where = SpecEvalWhere(getattr(spec, "source_map", None), path)
    from_spec = overrides_from_spec_eval(getattr(spec, "eval", None), path, where.source_map,
                                         task_names=list(registry))
    merged = cli.over(from_spec.over(Overrides(protocol=DEFAULT_PROTOCOL)))
    task_objs = [registry[n] for n in resolve_task_names(merged.tasks, all_tasks, registry)]
    # unknown knobs and type errors, reported where they were written
    check_spec_settings(task_objs, from_spec.settings, f"{path or spec.name}: eval.set", where)
    check_setting_keys(task_objs, cli.settings, "--set")
    for task_obj in task_objs:
        apply_setting_overrides(task_obj, task_obj.baseline, cli.settings, "--set")
    plan = build_plan(task_objs, merged, source="--set")
    _check_freeze(spec, merged.freeze or (), path, where.value("freeze") if cli.freeze is None else None)
    lengths_where = None  # where the evaluation lengths were written, when in the spec
    if cli.eval_lengths is None and from_spec.eval_lengths is not None and getattr(spec, "source_map", None):
        lengths_where = spec.source_map.value(("eval", "eval_lengths"))
    set_where = {knob: where.value("set", knob) for knob in from_spec.settings  # the spec's knobs the CLI keeps
                 if not any(key.rpartition(".")[2] == knob.rpartition(".")[2] for key in cli.settings)}
    _check_settings(registry, plan, lengths_where, set_where)
    _check_learned_positions(spec, plan, path)
    return plan


def _check_learned_positions(spec: Any, plan: Any, path: str | None) -> None:
    """A model with learned positions (`positions: learned`) takes sequences up to its seq_len:
    a run on longer ones (task length or evaluation length) is refused before it starts."""
    if getattr(spec, "positions", "none") != "learned":
        return
    for run in plan.runs:
        longest = max([int(run.settings.get("seq_len", 0)), *run.train.eval_lengths])
        if longest > spec.seq_len:
            at = spec.source_map.value(("seq_len",)) if getattr(spec, "source_map", None) and "seq_len" in spec.data \
                else Location(file=path)
            raise MadslError(f"{spec.name}: {run.task} runs at length {longest}, past the {spec.seq_len} learned "
                             f"positions of this model (positions: learned)", at,
                             hint=f"set seq_len: {longest} or more in the spec")


def evaluate(spec_paths: Sequence[Any], tasks: Sequence[str] | None = None, protocol: str | None = None,
             db: str | os.PathLike = DEFAULT_DB, workers: int = 1, device: str = "auto",
             devices: Sequence[str] | None = None,
             settings_overrides: Mapping[str, Any] | None = None, lr: float | Sequence[float] | None = None,
             wd: float | Sequence[float] | None = None, epochs: int | None = None, seed: int | None = None,
             batch_size: int | None = None, eval_lengths: Sequence[int] | None = None,
             freeze: Sequence[str] | None = None, precision: str | None = None,
             conventions: str | None = None, batch_grid: bool | None = None, cuda_graphs: bool | None = None,
             optimizer: str | None = None, schedule: str | None = None, metric: str | None = None,
             stop_acc: float | None = None, patience: int | None = None, min_delta: float | None = None,
             lm_head: str | None = None, progress: bool = True,
             model_factory: Callable[[Any], Any] | None = None, task_registry: Mapping[str, Any] | None = None,
             executor: Executor | str | None = None, reporter: Reporter | None = None,
             stop_requested: Callable[[], bool] | None = None, address: str | None = None,
             cpus_per_run: float = 1.0, gpus_per_run: float = 0.0, dry_run: bool = False,
             keep: str | None = None, checkpoint_every: float | None = None) -> dict:
    """Evaluate specs on tasks under a protocol; finished runs in `db` are never repeated.

    spec_paths: .mad files (or Spec objects). tasks: task names or "all" (None: the spec's
    eval.tasks, else all). protocol: None -> the spec's eval.protocol, else "quick".
    Knobs given here win over the spec's `eval:` section, which wins over the protocol.
    model_factory(spec) -> factory(vocab_size, max_seq_len, num_classes) replaces madsl.compile.
    reporter: receives progress (default: rich progress bars if `progress`, else nothing).
    stop_requested: polled; once true, runs checkpoint and stop (as on Ctrl-C).
    executor: "local" (default: `workers` processes of this machine), "ray" (a Ray cluster at
    `address`, each run holding `cpus_per_run` CPUs and `gpus_per_run` GPUs), or an Executor.
    optimizer, schedule, metric, stop_acc, patience, min_delta, lm_head: madsl.runner.options.
    keep: "best" keeps each run's best weights in the results folder (`madsl export`, madsl.runner.kept).
    checkpoint_every: seconds between a run's checkpoints (None: a minute; 0: after every epoch).
    dry_run: plan only: return {"plan": ...} (runs, done, pending, tokens, FLOPs, estimated time;
    madsl.runner.cost) without running anything. A run with progress prints the same plan first.
    batch_grid: train the runs of a setting that differ only in lr, wd or seed together
    (madsl.runner.grid; local executors only); None: on for CUDA, off on the CPU and on Ray.
    cuda_graphs: every run trains stacked (a run alone as a stack of one), each training step
    and evaluation batch replayed as a CUDA graph (madsl.runner.stacked; CUDA and grid
    batching only); None: on where grid batching is on a CUDA device, else off.
    Returns a summary: counts of runs, failures, and the scores of these specs.
    """
    from madsl.runner import stacked_compile

    stacked_compile.requested()  # a bad MADSL_COMPILE_STACKED is bad input before anything is planned
    ray_options = _ray_options(executor, address, cpus_per_run, gpus_per_run)
    _check_workers_and_device(workers, device, on_this_machine=ray_options is None)
    if ray_options is not None and device == "cuda" and not ray_options.gpus_per_run:
        raise MadslError("--device cuda on Ray: the runs hold no GPU", hint="give them one: --gpus-per-run 1 "
                                                                           "(or a fraction, e.g. 0.25)")
    placement = place_devices(device, devices) if ray_options is None else None  # on Ray, Ray places runs
    if ray_options is not None and batch_grid:
        raise MadslError("--batch-grid runs with the local executors only: Ray runs each run as its own task",
                         hint="drop --batch-grid, or use --executor local")
    batch_grid = ray_options is None and (default_batch_grid(device) if batch_grid is None else batch_grid)
    cuda_graphs = resolve_cuda_graphs(cuda_graphs, ray_options is not None, _planned_device(device), batch_grid)
    cli = cli_overrides(protocol=protocol, tasks=tasks, settings=settings_overrides, lr=lr, wd=wd, epochs=epochs,
                        seed=seed, batch_size=batch_size, eval_lengths=eval_lengths, freeze=freeze,
                        precision=precision, conventions=conventions, optimizer=optimizer, schedule=schedule,
                        metric=metric, stop_acc=stop_acc, patience=patience, min_delta=min_delta, lm_head=lm_head)
    fit_notes: list[str] = []
    specs = _load_specs(spec_paths, fit_notes)
    if not specs:
        raise MadslError("no spec to evaluate", hint="madsl eval SPEC.mad ...")
    check_database(db)  # a bad --db is refused before anything is planned or written
    if keep not in (None, "none", "best"):
        raise MadslError(f"keep must be 'best' or 'none', got {keep!r}")
    if keep == "best":  # refused here, not once the first run has trained and is to be kept
        from madsl.runner.kept import safetensors_torch

        safetensors_torch("--keep best")
    if checkpoint_every is not None and (isinstance(checkpoint_every, bool) or not isinstance(
            checkpoint_every, (int, float)) or not math.isfinite(checkpoint_every) or checkpoint_every < 0):
        raise MadslError(f"--checkpoint-every: expected a non-negative number of seconds, got {checkpoint_every!r}",
                         hint="how often a run writes its checkpoint, e.g. 60; 0: after every epoch")
    plan = plan_evaluation(StoreFiles(db), specs, cli, task_registry, model_factory, device, placement,
                           runs_on=_ray_device(ray_options) if ray_options is not None else None)
    for job in plan.jobs:
        job.keep_best = keep == "best"
        job.checkpoint_every_s = None if checkpoint_every is None else float(checkpoint_every)
    work = plan.work(batch_grid, placement, cuda_graphs)
    if ray_options is None:  # Ray's runs train on machines this one cannot see
        check_fits(work)
    if dry_run or progress:
        cost = plan_cost(db, plan, at_once=workers if ray_options is None else None,
                         executor_name="ray" if ray_options is not None else "local", work=work)
        print("".join(note + "\n" for note in fit_notes), end="", file=sys.stderr)
        if dry_run:
            return {"db": str(db), "plan": cost}
        from madsl.runner.cost import render_cost

        print(render_cost(cost), end="", file=sys.stderr)
    runner = executor if isinstance(executor, Executor) else _make_executor(workers, ray_options)
    store = Store(db)  # created only now: bad input above leaves no database behind
    try:
        outcome = _register_and_run(store, plan, work, runner, reporter, progress, stop_requested)
    except sqlite3.OperationalError as err:
        # every write is a transaction: what was recorded stays, and the runs in flight stay
        # claimed by this (now ended) process, so the same command resumes them from their checkpoints
        raise MadslError(f"the results database {db} could not be written: {err}",
                         hint="free disk space (or fix the file system) and rerun the same command: finished "
                              "runs are kept and the others resume") from None
    finally:
        store.close()
    summary = summarize(db, plan, outcome)
    if progress:
        print_summary(db, summary, outcome)
    return summary


def _register_and_run(store: Store, plan: "EvaluationPlan", work: list, runner: Executor,
                      reporter: Reporter | None, progress: bool,
                      stop_requested: Callable[[], bool] | None) -> Outcome:
    """Register the plan's runs and execute them, with Ctrl-C handling and progress bars."""
    plan.register(store)
    with stop_guard(stop_requested) as should_stop:
        if reporter is None and progress:
            with RichReporter() as rich_reporter:
                return run_jobs(store, work, runner, rich_reporter, skip_solved_at=plan.skip_solved_at,
                                stop_requested=should_stop)
        return run_jobs(store, work, runner, reporter, skip_solved_at=plan.skip_solved_at,
                        stop_requested=should_stop)


def plan_cost(db: str | os.PathLike, plan: "EvaluationPlan", at_once: int | None, executor_name: str,
              work: Sequence[Any] = ()) -> dict:
    """The plan's cost (madsl.runner.cost): what is done is read from `db` when it exists;
    `work`: the units the executor runs (a stacked grid group is costed as one)."""
    from madsl.runner.cost import estimate, summarize_cost

    done: set[str] = set()
    if Path(db).exists():
        store = Store(db, create=False)
        try:
            done = {j.run_id for j in plan.jobs if (row := store.run(j.run_id)) is not None
                    and row["status"] in ("done", "skipped")}
        finally:
            store.close()
    costs = estimate(plan.jobs, done, StoreFiles(db).files_dir, work=work)
    return summarize_cost(len(plan.jobs), len(done), costs, at_once, executor_name)


def _planned_device(device: str) -> str:
    """The device kind the runs will train on (what `auto` precision resolves against)."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_cuda_graphs(cuda_graphs: bool | None, on_ray: bool, device: str, batch_grid: bool) -> bool:
    """Whether steps replay as CUDA graphs. By default (None) wherever they can: grid-batched
    training on a CUDA device of this machine (on an H100, faster than stacked without them
    for attention, Hyena and Mamba on every task but memorization's one-epoch measurement,
    with results equal to eager's to rounding: docs/gpu.md); asked for (True) where they
    cannot: bad input."""
    if cuda_graphs is None:
        return not on_ray and batch_grid and device.startswith("cuda")
    if cuda_graphs:
        _check_cuda_graphs(on_ray, device, batch_grid)
    return cuda_graphs


def _check_cuda_graphs(on_ray: bool, device: str, batch_grid: bool) -> None:
    """--cuda-graphs replays grid-batched (stacked) training on a CUDA device of this machine."""
    if on_ray:
        raise MadslError("--cuda-graphs runs with the local executors only: Ray runs each run as its own task",
                         hint="drop --cuda-graphs, or use --executor local")
    if not device.startswith("cuda"):
        raise MadslError(f"--cuda-graphs needs a CUDA device; the runs are planned on {device}",
                         hint="run on a GPU (--device cuda), or drop --cuda-graphs")
    if not batch_grid:
        raise MadslError("--cuda-graphs replays grid-batched training: it needs grid batching",
                         hint="drop --no-batch-grid (grid batching is the default on CUDA), or drop --cuda-graphs")


def default_batch_grid(device: str) -> bool:
    """Grid batching by default: on CUDA, where one small run leaves most of the device idle;
    off on the CPU, where members run one after another anyway (docs/gpu.md, measured)."""
    return _planned_device(device).startswith("cuda")


def place_devices(device: str, devices: Sequence[str] | None) -> list[str] | None:
    """The devices runs are placed on, round-robin in plan order (`--devices cuda:0,cuda:1`):
    None for one device. Default on CUDA: every visible GPU. Each must exist (exit 2 otherwise)."""
    import torch

    if devices is None:
        on_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
        count = torch.cuda.device_count() if on_cuda else 0
        return [f"cuda:{i}" for i in range(count)] if count > 1 else None
    if not devices:
        raise MadslError("--devices: the list is empty", hint="e.g. --devices cuda:0,cuda:1")
    for name in devices:
        kind, _, index = name.partition(":")
        if name == "cpu":
            continue
        if kind != "cuda" or not index.isdigit():
            raise MadslError(f"--devices: unknown device {name!r}", expected="cpu or cuda:N, comma-separated")
        if int(index) >= torch.cuda.device_count():
            raise MadslError(f"--devices: {name} does not exist on this machine "
                             f"({torch.cuda.device_count()} CUDA device(s) visible)",
                             hint="see nvidia-smi, or CUDA_VISIBLE_DEVICES")
    return list(devices)


EXECUTORS = ("local", "ray")


def _ray_device(options) -> str:
    """Runs on Ray train on their GPU share, else on the CPU (the driver's devices do not count)."""
    return "cuda" if options.gpus_per_run else "cpu"


def _ray_options(executor: Executor | str | None, address: str | None, cpus_per_run: float,
                 gpus_per_run: float):
    """RayOptions when the runs go to Ray (checked now, before anything is planned), else None."""
    if executor is None or isinstance(executor, Executor) or executor == "local":
        return None
    if executor != "ray":
        from madsl.errors import did_you_mean

        raise MadslError(f"unknown executor {executor!r}", expected=" or ".join(EXECUTORS),
                         hint=did_you_mean(str(executor), EXECUTORS))
    from madsl.runner.ray_executor import RayOptions, import_ray

    options = RayOptions(address=address, cpus_per_run=float(cpus_per_run), gpus_per_run=float(gpus_per_run))
    options.check()
    import_ray()
    return options


def _make_executor(workers: int, ray_options) -> Executor:
    if ray_options is None:
        return make_executor(workers)
    from madsl.runner.ray_executor import RayExecutor

    return RayExecutor(ray_options)


def _check_workers_and_device(workers: int, device: str, on_this_machine: bool = True) -> None:
    if workers < 1:
        raise MadslError(f"--workers must be at least 1, got {workers}")
    if device not in ("auto", "cpu", "cuda"):
        raise MadslError(f"unknown device {device!r}", expected="auto, cpu or cuda")
    if device == "cuda" and on_this_machine:  # on Ray, the workers' GPUs count
        import torch

        if not torch.cuda.is_available():
            raise MadslError("--device cuda: no CUDA device is available", hint="use --device auto or cpu")


def cli_overrides(protocol: str | None = None, tasks: Sequence[str] | None = None,
                  settings: Mapping[str, Any] | None = None, lr=None, wd=None, epochs: int | None = None,
                  seed=None, batch_size: int | None = None, eval_lengths=None, freeze=None,
                  precision: str | None = None, conventions: str | None = None, optimizer: str | None = None,
                  schedule: str | None = None, metric: str | None = None, stop_acc: float | None = None,
                  patience: int | None = None, min_delta: float | None = None,
                  lm_head: str | None = None) -> Overrides:
    """The knobs of `evaluate` as Overrides (one value or several become tuples; None means "not set")."""
    def as_tuple(value, kind, option: str = ""):
        if value is None:
            return None
        values = tuple(kind(x) for x in (value if isinstance(value, (list, tuple)) else [value]))
        repeated = next((x for i, x in enumerate(values) if x in values[:i]), None)
        if repeated is not None:  # planned once either way: a repeat is a slip, not a second run
            raise MadslError(f"{option}: {repeated!r} is given twice", hint="give each value once")
        return values

    if protocol is not None:
        get_protocol(protocol)
    if precision is not None:
        check_precision(precision)
    if conventions is not None:
        from madsl.conventions import check_conventions

        check_conventions(conventions)
    from madsl.runner import options

    chosen = {"optimizer": optimizer, "schedule": schedule, "metric": metric, "lm_head": lm_head}
    for key, value in chosen.items():
        if value is not None:
            options.check_choice(key, value)
    stop_acc = None if stop_acc is None else options.check_stop_acc(stop_acc)
    patience = None if patience is None else options.check_patience(patience)
    min_delta = None if min_delta is None else options.check_min_delta(min_delta)
    return Overrides(protocol=protocol, tasks=None if tasks is None else tuple(tasks),
                     settings=dict(settings or {}), lrs=as_tuple(lr, float, "--lr"), wds=as_tuple(wd, float, "--wd"),
                     epochs=epochs, batch_size=batch_size, seeds=as_tuple(seed, int, "--seed"),
                     eval_lengths=as_tuple(eval_lengths, int, "--eval-lengths"),
                     freeze=as_tuple(freeze, str, "--freeze"), precision=precision,
                     conventions=conventions, stop_acc=stop_acc, patience=patience, min_delta=min_delta, **chosen)


@dataclass
class EvaluationPlan:
    """The runs of an evaluation, before anything is written: jobs (each run once), what to
    register in the store, and the protocols' early-skip threshold."""

    jobs: list[RunJob]
    specs: list[tuple[str, str, str, str | None]]  # (spec_hash, name, identity text, path)
    runs: list[tuple[list[tuple[RunIdentity, str]], str]]  # (identities with their spec name, label)
    skip_solved_at: float | None
    protocols: set[str]
    spec_of: dict[str, str] = dataclasses.field(default_factory=dict)  # run id -> its spec hash

    def work(self, batch_grid: bool, placement: Sequence[str] | None = None, cuda_graphs: bool = False) -> list:
        """What to hand the executor: the runs, or with `batch_grid` the grid groups
        (madsl.runner.grid) that train together, placed round-robin on `placement`; with
        `cuda_graphs`, every run in a group (of one where alone), replaying its steps as CUDA graphs."""
        if not batch_grid:
            return self.jobs
        from madsl.runner.grid import group_jobs

        return group_jobs([(self.spec_of[job.run_id], job) for job in self.jobs], self.skip_solved_at, placement,
                          cuda_graphs)

    def register(self, store: Store) -> None:
        for spec_row in self.specs:
            store.add_spec(*spec_row)
        for identities, protocol_name in self.runs:
            store.add_runs(identities, protocol_name)


def plan_evaluation(store: StoreFiles, specs: Sequence[tuple[Any, str | None]], cli: Overrides,
                    task_registry: Mapping[str, Any] | None = None,
                    model_factory: Callable[[Any], Any] | None = None, device: str = "auto",
                    placement: Sequence[str] | None = None, runs_on: str | None = None) -> EvaluationPlan:
    """Every run of every spec (validated, with its job), without writing to the store.
    runs_on: the device kind the runs will train on, when not this machine's (Ray workers)."""
    runs_on = runs_on or _planned_device(device)
    registry, all_tasks = _task_registry(task_registry)
    jobs: list[RunJob] = []
    plan = EvaluationPlan(jobs=[], specs=[], runs=[], skip_solved_at=None, protocols=set())
    for spec, path in specs:
        spec_plan = plan_spec(spec, path, cli, registry, all_tasks)
        plan.protocols.add(spec_plan.protocol.name)
        if spec_plan.protocol.skip_solved:
            plan.skip_solved_at = spec_plan.protocol.early_stop_acc
        identity_text = spec_identity(spec)
        spec_hash = sha256(identity_text)
        plan.specs.append((spec_hash, spec.name, identity_text, path))
        factory = model_factory(spec) if model_factory is not None else CompiledSpecFactory(spec, path)
        identities: dict[str, list[tuple[RunIdentity, str]]] = {}  # label -> its runs
        for run in spec_plan.runs:
            train = dataclasses.replace(run.train, precision=resolve_precision(run.train.precision, runs_on))
            identity = RunIdentity(spec_hash, run.task, dict(run.settings), train_config_identity(vars(train)),
                                   madsl_version())
            identities.setdefault(run.label, []).append((identity, spec.name))
            task = _task_for_run(registry, run)
            baseline = budgeted_baseline(task, spec_plan.protocol)
            setting_label = _setting_label(baseline, run.settings, task.baseline, spec_plan.protocol.name)
            label = (f"{spec.name} · {run.task} · {setting_label} · "
                     f"lr {run.train.lr:g} wd {run.train.wd:g}" + (f" · seed {run.train.seed}"
                                                                  if run.train.seed else "") +
                     (f" · {run.train.conventions}" if run.train.conventions != "madsl" else ""))
            plan.spec_of[identity.run_id] = spec_hash
            jobs.append(RunJob(run_id=identity.run_id, task=task, setting=dict(run.settings), train=train,
                               model_factory=factory, checkpoint_path=str(store.checkpoint_path(identity.run_id)),
                               data_dir=str(store.data_dir),
                               device=placement[len(jobs) % len(placement)] if placement else device, label=label))
        plan.runs.extend((runs, label) for label, runs in identities.items())
    # the same run can be asked for twice (two specs with the same model): run it once
    plan.jobs = list({job.run_id: job for job in jobs}.values())
    return plan


# Ctrl-C, and the polite stop of batch systems and containers (SLURM's scancel and time limit,
# Kubernetes, `timeout`): SIGTERM, then SIGKILL after a grace period (SLURM: 30 s by default).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def stop_guard(stop_requested: Callable[[], bool] | None = None) -> Iterator[Callable[[], bool]]:
    """Ctrl-C (or SIGTERM) handling while runs execute: the first asks runs to checkpoint and
    stop (the callable yielded turns true), the second aborts (KeyboardInterrupt)."""
    stop = threading.Event()
    previous_handlers: dict[int, Any] = {}

    def on_stop_signal(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    if threading.current_thread() is threading.main_thread():
        previous_handlers = {signum: signal.signal(signum, on_stop_signal) for signum in STOP_SIGNALS}
    try:
        yield (lambda: stop.is_set() or stop_requested()) if stop_requested else stop.is_set
    finally:
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)


def summarize(db: str | os.PathLike, plan: EvaluationPlan, outcome: Outcome) -> dict:
    """The JSON summary of an evaluation: counts, failures and the scores of its specs."""
    run_ids = [j.run_id for j in plan.jobs]
    scores = load_scores(db, run_ids=run_ids)
    return {
        "db": str(db), "protocols": sorted(plan.protocols), "runs": len(plan.jobs), "done": len(outcome.done),
        "already_done": len(outcome.already_done), "skipped": len(outcome.skipped),
        "failed": dict(outcome.failed), "interrupted": len(outcome.interrupted), "complete": outcome.complete,
        "run_ids": run_ids,
        "scores": [{"spec": s.spec, "spec_hash": s.spec_hash, "score": s.score,
                    "tasks": {t: ts.score for t, ts in s.tasks.items()}} for s in scores],
    }


def print_summary(db: str | os.PathLike, summary: dict, outcome: Outcome) -> None:
    """The score table and what is left to do, on the terminal."""
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(render_text(load_scores(db, run_ids=summary["run_ids"]), width=console.width), end="",
                  highlight=False)
    if outcome.failed:
        console.print(f"[red]{len(outcome.failed)} run(s) failed[/]; rerun `madsl eval` to retry them "
                      f"(errors are in the runs table of {db})", highlight=False)
    if outcome.interrupted:
        console.print(f"[yellow]interrupted[/]: {len(outcome.interrupted)} run(s) left; "
                      f"rerun the same command to resume", highlight=False)


def report(db: str | os.PathLike = DEFAULT_DB, fmt: str = "text", plot: str | os.PathLike | None = None,
           protocol: str | None = None, rows: str = "tasks", plot_sweeps: str | os.PathLike | None = None) -> str:
    """The leaderboard of a results database (text, json or csv); rows "settings" or "runs":
    json / csv tables for analysis, one row per task setting or per run. `plot` writes a
    heatmap PNG; `plot_sweeps` a folder of figures, per task its score against each knob varied."""
    return _report(db, fmt=fmt, plot=plot, protocol=protocol, rows=rows, plot_sweeps=plot_sweeps)

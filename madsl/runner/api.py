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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from madsl.errors import Location, MadslError, option
from madsl.runner.executor import Executor, Outcome, Reporter, RunJob, make_executor, run_jobs
from madsl.runner.memory import check_fits
from madsl.runner.protocols import (Overrides, SpecEvalWhere, apply_setting_overrides, budgeted_baseline,
                                    build_plan, check_setting_keys, check_spec_settings,
                                    overrides_from_spec_eval, resolve_task_names)
from madsl.runner.report import load_scores
from madsl.runner.report import report as _report
from madsl.runner.options import train_config_identity
from madsl.runner.settings import BY_KEY as SETTINGS_BY_KEY
from madsl.runner.settings import check_value as check_setting
from madsl.runner.precision import resolve_precision
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
        raise MadslError(f"{option('eval_lengths')} / eval.eval_lengths: task {task.name!r} has no seq_len setting "
                         "to evaluate at other lengths", where,
                         expected="tasks whose length is their seq_len setting",
                         hint=f"leave {task.name} out (--task NAME) or drop the evaluation lengths")
    for length in lengths:
        try:
            task.check(task.settings(**{**settings, "seq_len": length}))
        except (ValueError, KeyError) as err:
            message = str(err.args[0]) if err.args else str(err)
            raise MadslError(f"{option('eval_lengths')} / eval.eval_lengths: length {length} is not a valid "
                             f"{task.name} setting: {message}", where) from None


def _setting_label(baseline: Mapping[str, Any], setting: Mapping[str, Any], task_baseline: Mapping[str, Any],
                   protocol: str) -> str:
    """What a run's setting changes from its protocol's baseline; unchanged: "baseline" where
    that is the task's baseline, else the protocol's own (smoke, quick: a smaller budget)."""
    changed = [f"{k}={v}" for k, v in setting.items() if baseline.get(k) != v]
    if changed:
        return ", ".join(changed)
    return "baseline" if dict(baseline) == dict(task_baseline) else f"{protocol} setting"


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
    check_setting_keys(task_objs, cli.settings, option("settings_overrides"))
    for task_obj in task_objs:
        apply_setting_overrides(task_obj, task_obj.baseline, cli.settings, option("settings_overrides"))
    plan = build_plan(task_objs, merged, source=option("settings_overrides"))
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


def evaluate(spec_paths: Sequence[Any], *, db: str | os.PathLike = DEFAULT_DB, workers: int = 1,
             device: str = "auto", devices: Sequence[str] | None = None, batch_grid: bool | None = None,
             cuda_graphs: bool | None = None, executor: Executor | str | None = None, address: str | None = None,
             cpus_per_run: float = 1.0, gpus_per_run: float = 0.0, keep: str | None = None,
             checkpoint_every: float | None = None, dry_run: bool = False,
             model_factory: Callable[[Any], Any] | None = None, task_registry: Mapping[str, Any] | None = None,
             reporter: Reporter | None = None, stop: Callable[[], bool] | None = None, **settings: Any) -> dict:
    """Evaluate specs on tasks under a protocol; finished runs in `db` are never repeated.
    Prints nothing: progress goes to `reporter` (madsl.runner.executor.Reporter; the command
    line's is madsl.cli.progress.RichReporter), and `stop` is polled (once true, runs
    checkpoint and stop; the command line sets it on Ctrl-C and SIGTERM).

    spec_paths: .mad files (or Spec objects).
    settings: what the runs train, by the keys of madsl.runner.settings (protocol, tasks, set,
    lr, wd, epochs, batch_size, seed, eval_lengths, freeze, precision, conventions, optimizer,
    schedule, metric, stop_acc, patience, min_delta, lm_head; `settings_overrides` is `set`).
    Given here they win over the spec's `eval:` section, which wins over the protocol (None:
    the spec's eval.protocol, else "quick"; tasks None: the spec's eval.tasks, else all).
    How they execute:
    db: the results database. workers: local processes. device: auto, cpu or cuda; devices: the
    devices runs are placed on, round-robin.
    executor: "local" (default: `workers` processes of this machine), "ray" (a Ray cluster at
    `address`, each run holding `cpus_per_run` CPUs and `gpus_per_run` GPUs), or an Executor.
    batch_grid: train the runs of a setting that differ only in lr, wd or seed together
    (madsl.runner.grid; local executors only); None: on for CUDA, off on the CPU and on Ray.
    cuda_graphs: every run trains stacked (a run alone as a stack of one), each training step
    and evaluation batch replayed as a CUDA graph (madsl.runner.stacked; CUDA and grid
    batching only); None: on where grid batching is on a CUDA device, else off.
    keep: "best" keeps each run's best weights in the results folder (`madsl export`, madsl.runner.kept).
    checkpoint_every: seconds between a run's checkpoints (None: a minute; 0: after every epoch).
    dry_run: plan only: return {"db", "plan", "notes"} (runs, done, pending, tokens, FLOPs,
    estimated time; madsl.runner.cost) without running anything.
    model_factory(spec) -> factory(vocab_size, max_seq_len, num_classes) replaces madsl.compile;
    task_registry: name -> Task instead of madsl's tasks.
    Returns a summary: counts of runs, failures, and the scores of these specs.
    """
    if "settings_overrides" in settings:  # the earlier name of `set`
        settings["set"] = settings.pop("settings_overrides")
    unknown = sorted(set(settings) - set(SETTINGS_BY_KEY))
    if unknown:
        raise TypeError(f"evaluate() got unknown argument(s) {', '.join(unknown)}; the settings are "
                        + ", ".join(SETTINGS_BY_KEY))
    cli = cli_overrides(**settings)
    fit_notes: list[str] = []
    specs = _load_specs(spec_paths, fit_notes)
    if not specs:
        raise MadslError("no spec to evaluate", hint="madsl eval SPEC.mad ...")
    check_database(db)  # a bad --db is refused before anything is planned or written
    registry, all_tasks = _task_registry(task_registry)
    for spec, path in specs:  # eval: sections, task names, settings, frozen layers: before torch is imported
        plan_spec(spec, path, cli, registry, all_tasks)
    # the bad input above is answered without torch; what follows may ask the devices
    from madsl.runner import stacked_compile

    stacked_compile.requested()  # a bad MADSL_COMPILE_STACKED is bad input before anything is planned
    ray_options = _ray_options(executor, address, cpus_per_run, gpus_per_run)
    _check_workers_and_device(workers, device, on_this_machine=ray_options is None)
    if ray_options is not None and device == "cuda" and not ray_options.gpus_per_run:
        raise MadslError(f"{option('device')} cuda on Ray: the runs hold no GPU",
                         hint=f"give them one: {option('gpus_per_run')} 1 (or a fraction, e.g. 0.25)")
    placement = place_devices(device, devices) if ray_options is None else None  # on Ray, Ray places runs
    if ray_options is not None and batch_grid:
        raise MadslError(f"{option('batch_grid')} runs with the local executors only: Ray runs each run as its own task",
                         hint=f"drop {option('batch_grid')}, or use {option('executor')} local")
    batch_grid = ray_options is None and (default_batch_grid(device) if batch_grid is None else batch_grid)
    cuda_graphs = resolve_cuda_graphs(cuda_graphs, ray_options is not None, _planned_device(device), batch_grid)
    if keep not in (None, "none", "best"):
        raise MadslError(f"keep must be 'best' or 'none', got {keep!r}")
    if keep == "best":  # refused here, not once the first run has trained and is to be kept
        from madsl.runner.kept import safetensors_torch

        safetensors_torch(f"{option('keep')} best")
    if checkpoint_every is not None and (isinstance(checkpoint_every, bool) or not isinstance(
            checkpoint_every, (int, float)) or not math.isfinite(checkpoint_every) or checkpoint_every < 0):
        raise MadslError(f"{option('checkpoint_every')}: expected a non-negative number of seconds, got {checkpoint_every!r}",
                         hint="how often a run writes its checkpoint, e.g. 60; 0: after every epoch")
    plan = plan_evaluation(StoreFiles(db), specs, cli, task_registry, model_factory, device, placement,
                           runs_on=_ray_device(ray_options) if ray_options is not None else None)
    for job in plan.jobs:
        job.keep_best = keep == "best"
        job.checkpoint_every_s = None if checkpoint_every is None else float(checkpoint_every)
    work = plan.work(batch_grid, placement, cuda_graphs)
    if ray_options is None:  # Ray's runs train on machines this one cannot see
        check_fits(work)
    if dry_run or (reporter is not None and reporter.shows_plan):
        cost = plan_cost(db, plan, at_once=workers if ray_options is None else None,
                         executor_name="ray" if ray_options is not None else "local", work=work)
        if dry_run:
            return {"db": str(db), "plan": cost, "notes": fit_notes}
        reporter.plan(cost, fit_notes)
    runner = executor if isinstance(executor, Executor) else _make_executor(workers, ray_options)
    store = Store(db)  # created only now: bad input above leaves no database behind
    try:
        plan.register(store)
        outcome = run_jobs(store, work, runner, reporter, skip_solved_at=plan.skip_solved_at,
                           stop_requested=stop or (lambda: False))
    except sqlite3.OperationalError as err:
        # every write is a transaction: what was recorded stays, and the runs in flight stay
        # claimed by this (now ended) process, so the same command resumes them from their checkpoints
        raise MadslError(f"the results database {db} could not be written: {err}",
                         hint="free disk space (or fix the file system) and rerun the same command: finished "
                              "runs are kept and the others resume") from None
    finally:
        store.close()
    return summarize(db, plan, outcome)


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
    """CUDA graphs replay grid-batched (stacked) training on a CUDA device of this machine."""
    if on_ray:
        raise MadslError(f"{option('cuda_graphs')} runs with the local executors only: Ray runs each run as its own task",
                         hint=f"drop {option('cuda_graphs')}, or use {option('executor')} local")
    if not device.startswith("cuda"):
        raise MadslError(f"{option('cuda_graphs')} needs a CUDA device; the runs are planned on {device}",
                         hint=f"run on a GPU ({option('device')} cuda), or drop {option('cuda_graphs')}")
    if not batch_grid:
        raise MadslError(f"{option('cuda_graphs')} replays grid-batched training: it needs grid batching",
                         hint=f"turn grid batching ({option('batch_grid')}) back on (the default on CUDA), or drop "
                              f"{option('cuda_graphs')}")


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
        raise MadslError(f"{option('devices')}: the list is empty", hint="e.g. cuda:0,cuda:1")
    for name in devices:
        kind, _, index = name.partition(":")
        if name == "cpu":
            continue
        if kind != "cuda" or not index.isdigit():
            raise MadslError(f"{option('devices')}: unknown device {name!r}", expected="cpu or cuda:N, comma-separated")
        if int(index) >= torch.cuda.device_count():
            raise MadslError(f"{option('devices')}: {name} does not exist on this machine "
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
        raise MadslError(f"{option('workers')} must be at least 1, got {workers}")
    if device not in ("auto", "cpu", "cuda"):
        raise MadslError(f"unknown device {device!r}", expected="auto, cpu or cuda")
    if device == "cuda" and on_this_machine:  # on Ray, the workers' GPUs count
        import torch

        if not torch.cuda.is_available():
            raise MadslError(f"{option('device')} cuda: no CUDA device is available", hint=f"use {option('device')} auto or cpu")


def cli_overrides(**values: Any) -> Overrides:
    """Settings given by keyword (each setting's `key` of madsl.runner.settings: protocol, tasks,
    settings or set, lr, wd, epochs, seed, ...; None: not set) as checked Overrides. One value or
    several become tuples where a setting takes several; errors name the setting's flag."""
    if "settings" in values:  # the Python API's name of `set`
        values["set"] = values.pop("settings")
    unknown = sorted(set(values) - set(SETTINGS_BY_KEY))
    if unknown:
        raise TypeError(f"cli_overrides() got unknown setting(s) {', '.join(unknown)}; the settings are "
                        + ", ".join(SETTINGS_BY_KEY))
    out = Overrides()
    for key, value in values.items():
        setting = SETTINGS_BY_KEY[key]
        if value is None or (key == "set" and not value):
            continue
        setattr(out, setting.field, check_setting(setting, value))
    return out


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


def summarize(db: str | os.PathLike, plan: EvaluationPlan, outcome: Outcome) -> dict:
    """The JSON summary of an evaluation: counts, failures and the scores of its specs."""
    run_ids = [j.run_id for j in plan.jobs]
    scores = load_scores(db, run_ids=run_ids)
    return {
        "db": str(db), "protocols": sorted(plan.protocols), "runs": len(plan.jobs), "done": len(outcome.done),
        "already_done": len(outcome.already_done), "skipped": len(outcome.skipped),
        "failed": dict(outcome.failed), "interrupted": len(outcome.interrupted), "complete": outcome.complete,
        "unkept": dict(outcome.unkept),
        "run_ids": run_ids,
        "scores": [{"spec": s.spec, "spec_hash": s.spec_hash, "score": s.score,
                    "tasks": {t: ts.score for t, ts in s.tasks.items()}} for s in scores],
    }


def report(db: str | os.PathLike = DEFAULT_DB, fmt: str = "text", plot: str | os.PathLike | None = None,
           protocol: str | None = None, rows: str = "tasks", plot_sweeps: str | os.PathLike | None = None) -> str:
    """The leaderboard of a results database (text, json or csv); rows "settings" or "runs":
    json / csv tables for analysis, one row per task setting or per run. `plot` writes a
    heatmap PNG; `plot_sweeps` a folder of figures, per task its score against each knob varied."""
    return _report(db, fmt=fmt, plot=plot, protocol=protocol, rows=rows, plot_sweeps=plot_sweeps)

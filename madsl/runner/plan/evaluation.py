"""The plan of an evaluation: the specs loaded, their `eval:` sections under the caller's settings,
the runs each makes (`plan_spec`), every run's identity and job (`plan_evaluation`); all checked
before anything runs or torch is imported.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from madsl.errors import Location, MadslError, option
from madsl.runner.execute.devices import planned_device
from madsl.runner.execute.jobs import RunJob
from madsl.runner.plan.overrides import Overrides, check_spec_settings, overrides_from_spec_eval, spec_eval_where
from madsl.runner.plan.protocols import budgeted_baseline
from madsl.runner.plan.runs import build_plan
from madsl.runner.plan.settings import BY_KEY as SETTINGS_BY_KEY
from madsl.runner.plan.settings import check_value as check_setting
from madsl.runner.plan.task_settings import apply_setting_overrides, check_setting_keys, resolve_task_names
from madsl.runner.store.files import StoreFiles
from madsl.runner.store.results import RunIdentity, Store, canonical_json, madsl_version
from madsl.runner.train.options import train_config_identity
from madsl.runner.train.precision import resolve_precision

DEFAULT_PROTOCOL = "quick"


# --- specs and models ----------------------------------------------------------------------


@dataclass
class CompiledSpecFactory:
    """Builds the model of a spec with `madsl.compile`. It pickles with its Spec, so a worker on
    another machine needs no spec file (nor the files it extends)."""

    spec: Any
    path: str | None = None

    def __call__(self, vocab_size: int, max_seq_len: int, num_classes: int | None = None, seed: int = 0):
        from madsl.compiler import compile_spec

        return compile_spec(
            self.spec, vocab_size=vocab_size, max_seq_len=max_seq_len, num_classes=num_classes, seed=seed
        )


def load_specs(items: Sequence[Any], notes: list[str] | None = None) -> list[tuple[Any, str | None]]:
    """The specs as `madsl compile` builds them: one whose `budget.fit` is not solved yet trains
    with the solution (`madsl.fit.fitted`), and `notes` gets what was used."""
    from madsl.fit import fit_note, fitted

    out = []
    files: dict[Path, Any] = {}
    for item in items:
        if isinstance(item, (str, os.PathLike)):
            from madsl.lang.spec import load_spec

            if not Path(item).exists():
                raise MadslError(f"no such spec file: {item}")
            if Path(item).resolve() in files:  # e.g. a glob and a name that overlap
                raise MadslError(
                    f"the spec {item} is given twice (as {files[Path(item).resolve()]} before)",
                    hint="list each spec once",
                )
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


def tasks_by_name(registry: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """name -> Task, and the names `all` stands for."""
    if registry is not None:
        return dict(registry), list(registry)
    from madsl.tasks import MAD_TASKS, TASKS, get_task

    return {name: get_task(name) for name in TASKS}, list(MAD_TASKS)


def _task_for_run(registry: Mapping[str, Any], run) -> Any:
    """The task of a planned run, generated as its conventions have it."""
    from madsl.tasks import with_conventions

    return with_conventions(registry[run.task], run.train.conventions)


def _check_settings(
    registry: Mapping[str, Any],
    plan,
    lengths_where: Location | None = None,
    set_where: Mapping[str, Location] | None = None,
) -> None:
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
            named = [
                where
                for knob, where in (set_where or {}).items()
                if re.search(rf"\b{re.escape(knob.rpartition('.')[2])}\b", message)
            ]
            raise MadslError(
                f"bad setting for {run.task}{conventions}: {message}",
                named[0] if len(named) == 1 else None,
                hint="check your --set / eval.set values",
            ) from None
        _check_eval_lengths(task, run.settings, run.train.eval_lengths, lengths_where)


def _check_eval_lengths(
    task: Any, settings: Mapping[str, Any], lengths: Sequence[int], where: Location | None = None
) -> None:
    """Length extrapolation changes a task's seq_len: the task must have one, and each length
    must be a valid setting of it (a bad length would otherwise only show as "error" rows)."""
    if not lengths:
        return
    if "seq_len" not in task.baseline:
        raise MadslError(
            f"{option('eval_lengths')} / eval.eval_lengths: task {task.name!r} has no seq_len setting "
            "to evaluate at other lengths",
            where,
            expected="tasks whose length is their seq_len setting",
            hint=f"leave {task.name} out (--task NAME) or drop the evaluation lengths",
        )
    for length in lengths:
        try:
            task.check(task.settings(**{**settings, "seq_len": length}))
        except (ValueError, KeyError) as err:
            message = str(err.args[0]) if err.args else str(err)
            raise MadslError(
                f"{option('eval_lengths')} / eval.eval_lengths: length {length} is not a valid "
                f"{task.name} setting: {message}",
                where,
            ) from None


def _setting_label(
    baseline: Mapping[str, Any], setting: Mapping[str, Any], task_baseline: Mapping[str, Any], protocol: str
) -> str:
    """What a run's setting changes from its protocol's baseline; unchanged: "baseline" where
    that is the task's baseline, else the protocol's own (smoke, quick: a smaller budget)."""
    changed = [f"{k}={v}" for k, v in setting.items() if baseline.get(k) != v]
    if changed:
        return ", ".join(changed)
    return "baseline" if dict(baseline) == dict(task_baseline) else f"{protocol} setting"


# --- one spec's runs ------------------------------------------------------------------------


def _check_freeze(spec: Any, names: Sequence[str], path: Any, location: Any = None) -> None:
    """Every name to freeze must name layers of the spec: a symbol used in its topology, a #tag, or embedding."""
    if not names:
        return
    from madsl.errors import did_you_mean
    from madsl.lang import topology as topo

    written = {layer.symbol for layer in topo.layers(spec.topology)} | {
        f"#{layer.tag}" for layer in topo.layers(spec.topology) if layer.tag
    }
    if spec.channel_mixer:
        written.add(spec.channel_mixer)
    for name in names:
        if name != "embedding" and name not in written:
            raise MadslError(
                f"{path or spec.name}: nothing named {name!r} to freeze",
                location,
                expected="a symbol of the topology, a #tag or embedding: " + ", ".join(sorted(written | {"embedding"})),
                hint=did_you_mean(name, written | {"embedding"}),
            )


def plan_spec(
    spec: Any,
    path: str | None,
    cli: Overrides | None = None,
    registry: Mapping[str, Any] | None = None,
    all_tasks: Sequence[str] | None = None,
):
    """The runs `madsl eval` would make of one spec: its `eval:` section under the command
    line's overrides `cli`, on the default protocol. Bad keys, values and task names raise
    located MadslErrors, so this also validates a spec's eval section without running it."""
    if registry is None:
        registry, all_tasks = tasks_by_name(None)
    cli = cli or Overrides()
    where = spec_eval_where(getattr(spec, "source_map", None), path)
    from_spec = overrides_from_spec_eval(getattr(spec, "eval", None), path, where.places, task_names=list(registry))
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
    set_where = {
        knob: where.value("set", knob)
        for knob in from_spec.settings  # the spec's knobs the CLI keeps
        if not any(key.rpartition(".")[2] == knob.rpartition(".")[2] for key in cli.settings)
    }
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
            at = (
                spec.source_map.value(("seq_len",))
                if getattr(spec, "source_map", None) and "seq_len" in spec.data
                else Location(file=path)
            )
            raise MadslError(
                f"{spec.name}: {run.task} runs at length {longest}, past the {spec.seq_len} learned "
                f"positions of this model (positions: learned)",
                at,
                hint=f"set seq_len: {longest} or more in the spec",
            )


def cli_overrides(**values: Any) -> Overrides:
    """Settings given by keyword (each setting's `key` of madsl.runner.plan.settings: protocol, tasks,
    settings or set, lr, wd, epochs, seed, ...; None: not set) as checked Overrides. One value or
    several become tuples where a setting takes several; errors name the setting's flag."""
    if "settings" in values:  # the Python API's name of `set`
        values["set"] = values.pop("settings")
    unknown = sorted(set(values) - set(SETTINGS_BY_KEY))
    if unknown:
        raise TypeError(
            f"cli_overrides() got unknown setting(s) {', '.join(unknown)}; the settings are "
            + ", ".join(SETTINGS_BY_KEY)
        )
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
        (madsl.runner.batched.grid) that train together, placed round-robin on `placement`; with
        `cuda_graphs`, every run in a group (of one where alone), replaying its steps as CUDA graphs."""
        if not batch_grid:
            return self.jobs
        from madsl.runner.batched.grouping import group_jobs

        return group_jobs(
            [(self.spec_of[job.run_id], job) for job in self.jobs], self.skip_solved_at, placement, cuda_graphs
        )

    def register(self, store: Store) -> None:
        for spec_row in self.specs:
            store.add_spec(*spec_row)
        for identities, protocol_name in self.runs:
            store.add_runs(identities, protocol_name)


def plan_evaluation(
    store: StoreFiles,
    specs: Sequence[tuple[Any, str | None]],
    cli: Overrides,
    task_registry: Mapping[str, Any] | None = None,
    model_factory: Callable[[Any], Any] | None = None,
    device: str = "auto",
    placement: Sequence[str] | None = None,
    runs_on: str | None = None,
) -> EvaluationPlan:
    """Every run of every spec (validated, with its job), without writing to the store.
    runs_on: the device kind the runs will train on, when not this machine's (Ray workers)."""
    runs_on = runs_on or planned_device(device)
    registry, all_tasks = tasks_by_name(task_registry)
    jobs: list[RunJob] = []
    plan = EvaluationPlan(jobs=[], specs=[], runs=[], skip_solved_at=None, protocols=set())
    for spec, path in specs:
        spec_plan = plan_spec(spec, path, cli, registry, all_tasks)
        plan.protocols.add(spec_plan.protocol.name)
        if spec_plan.protocol.skip_solved:
            plan.skip_solved_at = spec_plan.protocol.early_stop_acc
        spec_hash = spec.hash
        plan.specs.append((spec_hash, spec.name, spec.identity_text, path))
        factory = model_factory(spec) if model_factory is not None else CompiledSpecFactory(spec, path)
        identities: dict[str, list[tuple[RunIdentity, str]]] = {}  # label -> its runs
        for run in spec_plan.runs:
            train = dataclasses.replace(run.train, precision=resolve_precision(run.train.precision, runs_on))
            identity = RunIdentity(
                spec_hash, run.task, dict(run.settings), train_config_identity(vars(train)), madsl_version()
            )
            identities.setdefault(run.label, []).append((identity, spec.name))
            task = _task_for_run(registry, run)
            baseline = budgeted_baseline(task, spec_plan.protocol)
            setting_label = _setting_label(baseline, run.settings, task.baseline, spec_plan.protocol.name)
            label = (
                f"{spec.name} · {run.task} · {setting_label} · "
                f"lr {run.train.lr:g} wd {run.train.wd:g}"
                + (f" · seed {run.train.seed}" if run.train.seed else "")
                + (f" · {run.train.conventions}" if run.train.conventions != "madsl" else "")
            )
            plan.spec_of[identity.run_id] = spec_hash
            jobs.append(
                RunJob(
                    run_id=identity.run_id,
                    task=task,
                    setting=dict(run.settings),
                    train=train,
                    model_factory=factory,
                    checkpoint_path=str(store.checkpoint_path(identity.run_id)),
                    data_dir=str(store.data_dir),
                    device=placement[len(jobs) % len(placement)] if placement else device,
                    label=label,
                )
            )
        plan.runs.extend((runs, label) for label, runs in identities.items())
    # the same run can be asked for twice (two specs with the same model): run it once
    plan.jobs = list({job.run_id: job for job in jobs}.values())
    return plan

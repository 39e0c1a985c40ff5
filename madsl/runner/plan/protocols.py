"""Evaluation protocols: which task settings to run and how to train on each.

A protocol is data: a choice of task settings (the paper's full difficulty
sweep, or the baseline setting of each task), a learning-rate x weight-decay
grid, a number of epochs and a few knobs. `build_plan` turns a protocol plus
overrides into the concrete list of runs.

Precedence of every knob: command line > the spec's `eval:` section > protocol.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping, Sequence

from madsl.errors import Collector, Location, MadslError, did_you_mean
from madsl.runner.plan.settings import BY_KEY, RUN_OPTIONS, SETTINGS, SPEC_EVAL_KEYS, Where

SettingsChoice = Literal["sweep", "baseline"]


@dataclass(frozen=True)
class Protocol:
    name: str
    description: str
    settings: SettingsChoice  # "sweep": baseline + difficulty sweep; "baseline": the baseline only
    lrs: tuple[float, ...]
    wds: tuple[float, ...]
    epochs: int
    batch_size: int = 128
    seeds: tuple[int, ...] = (0,)
    # Task-setting overrides the protocol itself applies (a reduced budget), by task
    # name or "*" for every task; a knob a task does not have is skipped.
    task_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    task_epochs: Mapping[str, int] = field(default_factory=dict)  # per-task epochs instead of `epochs`
    min_lr: float = 1e-6  # cosine decay floor (the reference implementation's default)
    early_stop_acc: float = 0.999  # stop once eval (class-averaged) accuracy reaches this
    # Skip the remaining grid points of a setting once one grid point reached
    # early_stop_acc: the best accuracy over the grid can then gain at most 0.001.
    skip_solved: bool = False
    # Whose task layouts and training details (madsl.conventions): the protocols that
    # reproduce the publication follow its reference implementation.
    conventions: str = "madsl"


PAPER_GRID_LR = (1e-4, 5e-4, 1e-3)
PAPER_GRID_WD = (0.0, 0.1)

PROTOCOLS: dict[str, Protocol] = {
    "paper": Protocol(
        name="paper",
        description="MAD paper Table B.1: every setting of every difficulty sweep, lr x wd grid, 200 epochs, "
                    "as the reference implementation runs it (conventions mad-lab)",
        settings="sweep", lrs=PAPER_GRID_LR, wds=PAPER_GRID_WD, epochs=200, conventions="mad-lab"),
    "baseline": Protocol(
        name="baseline",
        description="the baseline setting of each task, full lr x wd grid, 200 epochs (conventions mad-lab)",
        settings="baseline", lrs=PAPER_GRID_LR, wds=PAPER_GRID_WD, epochs=200, conventions="mad-lab"),
    # Chosen from measurements on 2 CPU cores (docs/runner.md, "The quick protocol"): about
    # 320 optimizer steps of batch 32 per recall task (multi-head Hyena solves in-context
    # recall within 256), ~1.3M training tokens per long task, one grid point.
    "quick": Protocol(
        name="quick",
        description="baseline settings, reduced budget: ~10 minutes for one 4-layer width-128 "
                    "architecture on 2 CPU cores",
        settings="baseline", lrs=(1e-3,), wds=(0.0,), epochs=5, batch_size=32,
        task_settings={
            "*": {"num_test_examples": 512},
            "in-context-recall": {"num_train_examples": 2048},
            "fuzzy-in-context-recall": {"num_train_examples": 2048},
            "noisy-in-context-recall": {"num_train_examples": 2048},
            "selective-copying": {"num_train_examples": 1024},
            "compression": {"num_train_examples": 4096},
        },
        task_epochs={"compression": 6, "memorization": 32},
        skip_solved=True),
    "smoke": Protocol(
        name="smoke",
        description="seconds: tiny data, 2 epochs; for tests",
        settings="baseline", lrs=(1e-3,), wds=(0.0,), epochs=2,
        task_settings={"*": {"num_train_examples": 64, "num_test_examples": 32}},
        skip_solved=True),
}


def get_protocol(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise MadslError(f"unknown protocol {name!r}", expected="one of " + ", ".join(PROTOCOLS),
                         hint=did_you_mean(name, PROTOCOLS))
    return PROTOCOLS[name]


# --- the user's knobs ---------------------------------------------------------------------

class _Knobs:
    """The methods of Overrides (its fields come from madsl.runner.plan.settings)."""

    def over(self, lower: "Overrides") -> "Overrides":
        """These overrides on top of `lower` (ours win; settings merge key by key)."""
        merged = dataclasses.replace(lower)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "settings":
                merged.settings = {**lower.settings, **value}
            elif value is not None:
                setattr(merged, f.name, value)
        return merged


# Knobs a user sets on top of a protocol, one field a setting of madsl.runner.plan.settings (its
# `field`); None / empty means "not set".
Overrides = dataclasses.make_dataclass(
    "Overrides", [(s.field, Any, field(default_factory=dict) if s.field == "settings" else field(default=None))
                  for s in SETTINGS], bases=(_Knobs,), namespace={"__module__": __name__})
Overrides.__doc__ = "Knobs a user sets on top of a protocol (madsl.runner.plan.settings); None / empty: not set."


class SpecEvalWhere:
    """Where things of a spec's `eval:` section are written (the Spec's source map), for located errors;
    without a source map (a Spec built from data), just the spec's file."""

    def __init__(self, source_map: Any = None, spec_file: str | None = None):
        self.source_map, self.spec_file = source_map, spec_file

    def _find(self, part: str, key_path: tuple) -> Location:
        if self.source_map is not None:
            try:
                return getattr(self.source_map, part)(("eval",) + key_path)
            except (KeyError, AttributeError, TypeError):
                pass
        return Location(file=self.spec_file)

    def key(self, *key_path: Any) -> Location:
        return self._find("key", key_path)

    def value(self, *key_path: Any) -> Location:
        return self._find("value", key_path)

    def below(self, key: str) -> Where:
        """The places below `key` of the section, as a setting's check reads them."""
        return Where(lambda part, path: getattr(self, part)(key, *path))


def overrides_from_spec_eval(section: Mapping[str, Any] | None, spec_file: str | None = None,
                             source_map: Any = None, task_names: Sequence[str] | None = None) -> Overrides:
    """The `eval:` section of a spec as Overrides. Unknown keys and bad values (types, ranges,
    protocol names, and task names when `task_names` is given) are errors, located at the key
    or value in the spec file when `source_map` (the Spec's) is given. Each key is a setting of
    madsl.runner.plan.settings (`task:` an alias of `tasks:`), checked by its own check."""
    section = dict(section or {})
    where = SpecEvalWhere(source_map, spec_file)
    for key in section:
        if key not in SPEC_EVAL_KEYS:
            raise MadslError(f"eval: unknown key {key!r}", where.key(key), expected=", ".join(SPEC_EVAL_KEYS),
                             hint=did_you_mean(str(key), SPEC_EVAL_KEYS))
    if "tasks" in section and "task" in section:
        raise MadslError("eval: give either tasks: or task:, not both", where.key("task"))
    out = Overrides()
    for key, value in section.items():
        setting = BY_KEY["tasks" if key == "task" else key]
        setattr(out, setting.field, setting.check(value, where.below(key), f"eval.{key}"))
    task_key = "tasks" if "tasks" in section else "task"
    if out.tasks is not None and task_names is not None:
        known = ("all", *task_names)
        for i, name in enumerate(out.tasks):
            if name not in known:
                at = where.value(task_key, i) if isinstance(section[task_key], list) else where.value(task_key)
                raise MadslError(f"eval.{task_key}: unknown task {name!r}", at, expected=", ".join(known),
                                 hint=did_you_mean(name, known))
    return out


def check_spec_eval(section: Mapping[str, Any] | None, spec_file: str | None = None, source_map: Any = None) -> None:
    """Every error of a spec's `eval:` section that shows without the tasks (unknown keys, types,
    ranges, protocol, precision, conventions; task names and `set:` knobs need the tasks, which
    `plan_spec` has), each key checked on its own and all raised together, in file order.
    Light: `madsl check` runs it without torch or numpy."""
    section = dict(section or {})
    errors = Collector(spec_file)
    for key, value in section.items():
        with errors.check():
            overrides_from_spec_eval({key: value}, spec_file, source_map)
    if not errors:  # what only the keys together can break (tasks: and task: both given)
        with errors.check():
            overrides_from_spec_eval(section, spec_file, source_map)
    errors.raise_any()


def check_spec_settings(tasks: Sequence, settings: Mapping[str, Any], source: str, where: SpecEvalWhere) -> None:
    """A spec's `eval.set` against the tasks evaluated: every knob is one of theirs, of its type;
    errors at the knob (unknown) or its value (wrong type) in the spec file."""
    for knob, value in settings.items():
        try:
            check_setting_keys(tasks, {knob: value}, source)
        except MadslError as err:
            raise err.relocated(where.key("set", knob)) from None
        for task in tasks:
            try:
                apply_setting_overrides(task, task.baseline, {knob: value}, source)
            except MadslError as err:
                raise err.relocated(where.value("set", knob)) from None


def parse_set_option(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` (or `TASK.KEY=VALUE`) from the command line; VALUE is read as YAML."""
    import yaml

    if "=" not in text:
        raise MadslError(f"--set {text!r}: expected KEY=VALUE", hint="e.g. --set seq_len=512")
    key, _, raw = text.partition("=")
    key = key.strip()
    if not key:
        raise MadslError(f"--set {text!r}: the key is empty", hint="e.g. --set seq_len=512")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    if value is None:
        raise MadslError(f"--set {text!r}: the value is empty", hint="e.g. --set seq_len=512")
    if isinstance(value, str):  # YAML 1.1 leaves 1e-3 a string
        try:
            value = int(value) if value.lstrip("-").isdigit() else float(value)
        except ValueError:
            pass
    return key, value


# --- the plan: concrete runs --------------------------------------------------------------

@dataclass(frozen=True)
class TrainSettings:
    """Everything about how one run trains (task setting and model aside)."""

    lr: float
    wd: float
    epochs: int
    batch_size: int
    seed: int
    min_lr: float
    early_stop_acc: float
    eval_lengths: tuple[int, ...] = ()
    freeze: tuple[str, ...] = ()
    precision: str = "fp32"  # fp32 or bf16 once planned for a device; "auto" before
    conventions: str = "madsl"  # whose task layouts and training details (madsl.conventions)
    # madsl.runner.train.options: each default is what runs did before the option existed
    optimizer: str = "adamw"
    schedule: str = "cosine"
    metric: str = "macro"
    stop_acc: float | None = None
    patience: int | None = None
    min_delta: float = 0.0
    lm_head: str = "conventions"


# Runs that the protocol alone would not make (a setting, lr, wd, epochs, batch size, seed or
# frozen layers of the user's) are filed under "<protocol>+custom", not under the protocol.
CUSTOM_SUFFIX = "+custom"


@dataclass(frozen=True)
class PlannedRun:
    task: str
    settings: Mapping[str, Any]
    train: TrainSettings
    label: str = ""  # the protocol the run is filed under in the results store (run_labels)

    def key(self) -> tuple:
        """What the run trains (its label aside)."""
        return self.task, json.dumps(self.settings, sort_keys=True, default=str), self.train


@dataclass(frozen=True)
class Plan:
    protocol: Protocol
    runs: tuple[PlannedRun, ...]


def _check_value(task_name: str, knob: str, value: Any, baseline_value: Any, source: str) -> Any:
    """Type-check a setting value against the type of the task's baseline value."""
    if baseline_value is None:
        return value
    expected = type(baseline_value)
    if isinstance(value, bool) == isinstance(baseline_value, bool):
        if expected is float and isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, expected):
            return value
        if isinstance(baseline_value, (list, tuple)) and isinstance(value, (list, tuple)):
            return expected(value)
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    raise MadslError(f"{source} {knob}={value!r}: {task_name}.{knob} must be "
                     f"{names.get(expected, expected.__name__)}", hint=f"its baseline value is {baseline_value!r}")


def resolve_task_names(names: Iterable[str] | None, all_tasks: Sequence[str], known: Iterable[str]) -> list[str]:
    """`all` -> the MAD tasks; unknown names are errors with a did-you-mean."""
    known = list(known)
    out: list[str] = []
    for name in names or ("all",):
        if name == "all":
            out.extend(t for t in all_tasks if t not in out)
        elif name in known:
            if name not in out:
                out.append(name)
        else:
            raise MadslError(f"unknown task {name!r}", expected="all, " + ", ".join(known),
                             hint=did_you_mean(name, [*known, "all"]))
    return out


def apply_setting_overrides(task, settings: Mapping[str, Any], overrides: Mapping[str, Any],
                            source: str) -> dict[str, Any]:
    """Apply `knob` / `task.knob` overrides that concern `task` (type-checked)."""
    out = dict(settings)
    for key, value in overrides.items():
        scope, _, knob = key.rpartition(".")
        if scope and scope != task.name:
            continue
        if knob in task.baseline:
            out[knob] = _check_value(task.name, knob, value, task.baseline[knob], source)
    return out


def check_setting_keys(tasks: Sequence, overrides: Mapping[str, Any], source: str) -> None:
    """Every override key must be a knob of at least one selected task (or of the task it names)."""
    for key in overrides:
        scope, _, knob = key.rpartition(".")
        scoped = [t for t in tasks if t.name == scope] if scope else list(tasks)
        if scope and not scoped:
            names = [t.name for t in tasks]
            raise MadslError(f"{source} {key}: task {scope!r} is not among the tasks evaluated",
                             expected=", ".join(names), hint=did_you_mean(scope, names))
        knobs = sorted({k for t in scoped for k in t.baseline})
        if not any(knob in t.baseline for t in scoped):
            where = scope or ", ".join(t.name for t in scoped)
            raise MadslError(f"{source} {key}: no setting {knob!r} in {where}",
                             expected="one of " + ", ".join(knobs), hint=did_you_mean(knob, knobs))


def budgeted_baseline(task, protocol: Protocol) -> dict[str, Any]:
    """The task's baseline with the protocol's own budget overrides (e.g. quick's smaller train set)."""
    setting = dict(task.baseline)
    for scope in ("*", task.name):
        budget = {k: v for k, v in protocol.task_settings.get(scope, {}).items() if k in task.baseline}
        setting = apply_setting_overrides(task, setting, budget, f"protocol {protocol.name}")
    return setting


def build_plan(tasks: Sequence, overrides: Overrides, source: str = "--set") -> Plan:
    """The runs of a protocol for `tasks` (Task objects), with `overrides` applied. Each run
    is labelled with the protocol where the protocol alone (under the same conventions,
    precision and evaluation lengths, which do not change what it trains) makes it, else
    with `<protocol>+custom`."""
    plan = _plan_runs(tasks, overrides, source)
    changes_training = dataclasses.replace(overrides, protocol=None, tasks=None, conventions=None, precision=None,
                                           eval_lengths=None) != Overrides()
    own = plan.protocol.name
    if not changes_training:
        return Plan(plan.protocol, tuple(dataclasses.replace(r, label=own) for r in plan.runs))
    reference = _plan_runs(tasks, Overrides(protocol=own, conventions=overrides.conventions,
                                            precision=overrides.precision, eval_lengths=overrides.eval_lengths))
    protocol_runs = {r.key() for r in reference.runs}
    return Plan(plan.protocol, tuple(dataclasses.replace(r, label=own if r.key() in protocol_runs
                                                         else own + CUSTOM_SUFFIX) for r in plan.runs))


def _plan_runs(tasks: Sequence, overrides: Overrides, source: str = "--set") -> Plan:
    protocol = get_protocol(overrides.protocol or "quick")
    check_setting_keys(tasks, overrides.settings, source)
    lrs = overrides.lrs or protocol.lrs
    wds = overrides.wds or protocol.wds
    epochs_for = lambda task: (overrides.epochs if overrides.epochs is not None  # noqa: E731
                               else protocol.task_epochs.get(task.name, protocol.epochs))
    batch_size = overrides.batch_size if overrides.batch_size is not None else protocol.batch_size
    seeds = overrides.seeds or protocol.seeds
    conventions = overrides.conventions or protocol.conventions
    # the reference trains in bf16 on its GPUs: "auto" gives that on CUDA, fp32 on a CPU
    precision = overrides.precision or ("auto" if conventions == "mad-lab" else "fp32")
    options = {key: getattr(overrides, key) for key in RUN_OPTIONS if getattr(overrides, key) is not None}
    if options.get("min_delta") and options.get("patience") is None:
        raise MadslError(f"min_delta {options['min_delta']} has no effect without patience",
                         hint="min_delta is how much the eval loss must improve to count for patience: set "
                              "patience as well (--patience N or the spec's eval.patience), or drop min_delta")
    if options.get("lm_head") == "spec" and conventions != "mad-lab":
        options["lm_head"] = "conventions"  # the madsl conventions' LM head is the spec's: one run, one run id
    for name, value in (("epochs", epochs_for(tasks[0]) if tasks else 1), ("batch size", batch_size)):
        if value < 1:
            raise MadslError(f"{name} must be at least 1, got {value}")
    from madsl.runner.plan.settings import MAX_SEED

    if any(not 0 <= int(seed) <= MAX_SEED for seed in seeds):  # a sweep's train.seed, the Python API's
        raise MadslError(f"seed must be from 0 to {MAX_SEED:,} (2^32 - 1), got {', '.join(map(str, seeds))}",
                         hint="every generator of a run is seeded from it")
    for name, values in (("lr", lrs), ("wd", wds)):
        if not all(math.isfinite(v) for v in values):
            raise MadslError(f"{name} must be a finite number, got {', '.join(map(str, values))}")
        if any(v < 0 for v in values) or (name == "lr" and any(v == 0 for v in values)):
            raise MadslError(f"{name} must be positive, got {', '.join(map(str, values))}")
    runs: list[PlannedRun] = []
    for task in tasks:
        base = [dict(task.baseline)] if protocol.settings == "baseline" else task.sweep_settings()
        lengths = overrides.eval_lengths if overrides.eval_lengths is not None else tuple(task.eval_seq_lens)
        seen: list[dict] = []
        budget = {k: v for k, v in budgeted_baseline(task, protocol).items() if task.baseline[k] != v}
        for setting in base:
            # the protocol's budget (where the sweep point keeps the baseline value), then the user's knobs
            setting = {**setting, **{k: v for k, v in budget.items() if setting[k] == task.baseline[k]}}
            setting = apply_setting_overrides(task, setting, overrides.settings, source)
            if setting in seen:  # an override can collapse sweep points onto each other
                continue
            seen.append(setting)
            for seed in seeds:
                for lr in sorted(lrs, reverse=True):  # large lr first: solves soonest (skip_solved)
                    for wd in wds:
                        runs.append(PlannedRun(task.name, setting, TrainSettings(
                            lr=float(lr), wd=float(wd), epochs=int(epochs_for(task)), batch_size=int(batch_size),
                            seed=int(seed), min_lr=protocol.min_lr, early_stop_acc=protocol.early_stop_acc,
                            eval_lengths=tuple(int(x) for x in lengths),
                            freeze=tuple(overrides.freeze or ()),
                            precision=precision, conventions=conventions, **options)))
    return Plan(protocol, tuple(runs))

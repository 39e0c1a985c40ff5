"""Sweep files: a study as one reviewable file instead of a shell script.

    # study.yaml
    specs: [specs/paper/hyena-sg.mad, specs/paper/striped-*.mad]   # globs, relative to this file
    protocol: baseline
    tasks: [in-context-recall, selective-copying]
    vary:                        # a grid over spec fields: each combination is a variant
      dim: [64, 128]
      layers.H.order: [2, 3]
    train: {lr: [5e-4, 1e-3]}

A variant is an ordinary spec: the spec file with the varied fields set, named after
what varied (`hyena-sg[dim=64,H.order=3]`); its identity, and so its run ids, follow
`Spec.identity()`. Every variant is accounted and budget-checked before anything runs.
Errors point at the line and column of the sweep file, with did-you-mean for keys and
field paths.
"""
from __future__ import annotations

import copy
import glob
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from madsl.errors import Location, MadslError, did_you_mean
from madsl.yamlsource import Located, load

SWEEP_KEYS = ("specs", "protocol", "tasks", "vary", "train")
TRAIN_KEYS = ("lr", "wd", "epochs", "batch_size", "seed")
# spec fields a sweep may vary besides a layer's parameters (`layers.SYMBOL.PARAM`)
SPEC_FIELDS = ("dim", "vocab", "seq_len", "topology", "channel_mixer", "norm", "tie_embeddings")


@dataclass
class Variant:
    spec: Any  # madsl.spec.Spec
    path: str
    varied: dict[str, Any]  # field path -> value
    over_budget: list[str] = field(default_factory=list)  # the budget's violations, as sentences


@dataclass
class Sweep:
    path: str
    variants: list[Variant]
    protocol: str | None = None
    tasks: list[str] | None = None
    train: dict[str, list[Any]] = field(default_factory=dict)  # lr, wd, seed: lists; epochs, batch_size: one

    def runnable(self, allow_over_budget: bool = False) -> list[Variant]:
        return [v for v in self.variants if allow_over_budget or not v.over_budget]


def is_sweep_file(path: str | Path) -> bool:
    """A .yaml/.yml file whose top level has `specs:` (a spec file has `topology:` instead)."""
    path = Path(path)
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        return False
    data = load(path).data
    return isinstance(data, dict) and "specs" in data and "topology" not in data


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file, expand its specs and variants, account and budget-check each."""
    located = load(path)
    data = located.data
    if not isinstance(data, dict):
        raise MadslError(f"{path}: a sweep file is a mapping with specs:, protocol:, tasks:, vary:, train:",
                         Location(str(path), 1, 1, located.line(1)))
    for key in data:
        if key not in SWEEP_KEYS:
            raise MadslError(f"unknown key {key!r} in a sweep file", located.key((key,)),
                             expected=", ".join(SWEEP_KEYS), hint=did_you_mean(str(key), SWEEP_KEYS))
    if "specs" not in data:
        raise MadslError("a sweep file needs specs: (spec files or globs)", located.key(()),
                         hint="specs: [specs/paper/hyena-sg.mad]")
    spec_paths = _spec_paths(located)
    sweep = Sweep(path=str(path), variants=[], protocol=_protocol(located), tasks=_tasks(located),
                  train=_train(located))
    grid = _grid(located)
    from madsl.spec import load_spec

    for spec_path in spec_paths:
        base = load_spec(spec_path)
        for path_key, _ in grid:
            _check_field_path(base, path_key, located)
        for values in itertools.product(*(vals for _, vals in grid)):
            varied = {key: value for (key, _), value in zip(grid, values)}
            sweep.variants.append(_variant(base, spec_path, varied, located))
    return sweep


# --- the sections --------------------------------------------------------------------------

def _spec_paths(located: Located) -> list[str]:
    specs = located.data["specs"]
    patterns = [specs] if isinstance(specs, str) else specs
    if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) for p in patterns):
        raise MadslError("specs: expected a list of spec files or globs", located.value(("specs",)),
                         hint="specs: [specs/paper/hyena-sg.mad, specs/paper/striped-*.mad]")
    here = Path(located.file).parent
    out: list[str] = []
    for index, pattern in enumerate(patterns):
        where = located.value(("specs", index)) if not isinstance(specs, str) else located.value(("specs",))
        full = pattern if Path(pattern).is_absolute() else str(here / pattern)
        matches = sorted(glob.glob(full))
        if not matches:
            raise MadslError(f"specs: {pattern!r} matches no file", where,
                             hint=f"paths are relative to the sweep file's folder ({here})")
        out += [m for m in matches if m not in out]
    return out


def _protocol(located: Located) -> str | None:
    if "protocol" not in located.data:
        return None
    from madsl.runner.protocols import PROTOCOLS

    value = located.data["protocol"]
    if value not in PROTOCOLS:
        raise MadslError(f"unknown protocol {value!r}", located.value(("protocol",)),
                         expected=", ".join(PROTOCOLS), hint=did_you_mean(str(value), PROTOCOLS))
    return value


def _tasks(located: Located) -> list[str] | None:
    if "tasks" not in located.data:
        return None
    value = located.data["tasks"]
    tasks = [value] if isinstance(value, str) else value
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) for t in tasks):
        raise MadslError("tasks: expected a task name or a list of them", located.value(("tasks",)))
    from madsl.tasks import TASKS

    names = set(TASKS) | {"all"}
    for index, name in enumerate(tasks):
        if name not in names:
            where = located.value(("tasks", index)) if not isinstance(value, str) else located.value(("tasks",))
            raise MadslError(f"unknown task {name!r}", where, expected=", ".join(sorted(names)),
                             hint=did_you_mean(name, names))
    return tasks


def _train(located: Located) -> dict[str, Any]:
    section = located.data.get("train") or {}
    if not isinstance(section, dict):
        raise MadslError("train: expected a mapping such as {lr: [5e-4, 1e-3]}", located.value(("train",)))
    out: dict[str, Any] = {}
    for key, value in section.items():
        if key not in TRAIN_KEYS:
            raise MadslError(f"unknown key {key!r} in train:", located.key(("train", key)),
                             expected=", ".join(TRAIN_KEYS), hint=did_you_mean(str(key), TRAIN_KEYS))
        kind = float if key in ("lr", "wd") else int
        values = [_number(v) for v in (value if isinstance(value, list) else [value])]
        if not values or not all(v is not None and v >= 0 and (kind is float or float(v).is_integer())
                                 for v in values):
            raise MadslError(f"train.{key}: expected {'non-negative numbers' if kind is float else 'integers'}",
                             located.value(("train", key)))
        if key in ("epochs", "batch_size"):
            if len(values) != 1 or values[0] <= 0:
                raise MadslError(f"train.{key}: expected one positive integer", located.value(("train", key)))
            out[key] = int(values[0])
        else:
            out[key] = [kind(v) for v in values]
            _once(out[key], f"train.{key}", lambda i, key=key: located.value(("train", key, i))
                  if isinstance(value, list) else located.value(("train", key)))
    return out


def _once(values: list[Any], name: str, where: Callable[[int], Location]) -> None:
    """A value listed twice is a slip (its runs or variant would be planned once): an error at the repeat."""
    for index, value in enumerate(values):
        if value in values[:index]:
            raise MadslError(f"{name}: {value!r} is given twice", where(index), hint="list each value once")


def _number(value: Any) -> float | None:
    """A number as YAML gives it; PyYAML reads 5e-4 (no dot) as a string, so those are parsed too."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _grid(located: Located) -> list[tuple[str, list[Any]]]:
    section = located.data.get("vary") or {}
    if not isinstance(section, dict):
        raise MadslError("vary: expected a mapping of field paths to lists of values", located.value(("vary",)),
                         hint="vary: {dim: [64, 128], layers.H.order: [2, 3]}")
    grid = []
    for key, values in section.items():
        if not isinstance(values, list):
            raise MadslError(f"vary.{key}: expected a list of values", located.value(("vary", key)),
                             hint=f"{key}: [{values!r}]")
        if not values:  # an empty axis would make an empty grid: no variant at all
            raise MadslError(f"vary.{key}: the list is empty", located.value(("vary", key)),
                             expected="at least one value", hint=f"list the values to try, or drop vary.{key}")
        _once(values, f"vary.{key}", lambda i, key=key: located.value(("vary", key, i)))
        grid.append((str(key), values))
    return grid


# --- variants --------------------------------------------------------------------------------

def _check_field_path(spec: Any, key: str, located: Located) -> None:
    """`key` names a field of `spec`: a spec-wide field, or `layers.SYMBOL.PARAM` of a layer it uses."""
    where = located.key(("vary", key))
    parts = key.split(".")
    if parts[0] != "layers":
        if len(parts) != 1 or key not in SPEC_FIELDS:
            candidates = list(SPEC_FIELDS) + [f"layers.{s}.{p}" for s in spec.symbols_used()
                                               for p in spec.symbols[s].params]
            raise MadslError(f"vary: {key!r} is not a field of spec {spec.name}", where,
                             expected="a spec field (" + ", ".join(SPEC_FIELDS) + ") or layers.SYMBOL.PARAM",
                             hint=did_you_mean(key, candidates))
        return
    used = spec.symbols_used()
    if len(parts) != 3:
        raise MadslError(f"vary: {key!r}: a layer's field is written layers.SYMBOL.PARAM", where,
                         hint=f"e.g. layers.{used[0]}.{next(iter(spec.symbols[used[0]].params), 'PARAM')}"
                         if used else None)
    symbol, param = parts[1], parts[2]
    if symbol not in used:
        raise MadslError(f"vary: spec {spec.name} has no layer {symbol!r}", where,
                         expected="a symbol its model uses: " + ", ".join(used), hint=did_you_mean(symbol, used))
    params = list(spec.symbols[symbol].params)
    if param not in params:
        raise MadslError(f"vary: layer {symbol} of spec {spec.name} ({spec.symbols[symbol].primitive}) has no "
                         f"parameter {param!r}", where, expected=", ".join(params),
                         hint=did_you_mean(param, params))


def variant_name(name: str, varied: dict[str, Any]) -> str:
    """hyena-sg[dim=64,H.order=3]: what varied, layer fields without their `layers.` prefix."""
    if not varied:
        return name
    shown = [f"{key.removeprefix('layers.')}={value}" for key, value in varied.items()]
    return f"{name}[{','.join(shown)}]"


def _variant(base: Any, spec_path: str, varied: dict[str, Any], located: Located) -> Variant:
    from madsl.budget import check
    from madsl.graph import account
    from madsl.spec import load_spec

    overrides: dict[str, Any] = {"name": variant_name(base.name, varied)}
    layers = copy.deepcopy(base.data.get("layers") or {})
    for key, value in varied.items():
        parts = key.split(".")
        if parts[0] == "layers":
            layers.setdefault(parts[1], {})[parts[2]] = value
        else:
            overrides[key] = value
    if any(key.startswith("layers.") for key in varied):
        overrides["layers"] = layers
    try:
        spec = load_spec(spec_path, overrides=overrides) if varied else base
        account_ = account(spec, seq_len=spec.budget_seq_len)
    except MadslError as err:
        messages = "; ".join(one.message for one in err.diagnostics)  # all of them, not just the first
        raise MadslError(f"variant {overrides['name']}: {messages}", located.key(("vary",)),
                         expected=err.expected, hint=err.hint) from None
    violations = check(account_.totals, spec.budget)
    return Variant(spec=spec, path=spec_path, varied=varied, over_budget=[v.message() for v in violations])

"""Sweep files: a study as one reviewable file instead of a shell script.

    # study.yaml
    specs: [specs/paper/hyena-sg.mad, specs/paper/striped-*.mad]   # globs, relative to this file
    protocol: baseline
    tasks: [in-context-recall, selective-copying]
    vary:                        # a grid over spec fields: each combination is a variant
      dim: [64, 128]
      layers.H.order: [2, 3]
    train: {lr: [5e-4, 1e-3]}

A variant is an ordinary spec: the spec file with the varied fields set, named after what
varied (`hyena-sg[dim=64,H.order=3]`); its identity, and so its run ids, follow
`Spec.identity()`. Every variant is accounted and budget-checked before anything runs.
Errors point at the line and column of the sweep file, with did-you-mean for keys and
field paths.

Sweep files come from pull requests, and their errors land in CI logs. `specs:` entries
follow the read policy of every file a spec names (madsl/lang/spec/named.py): a relative path
or glob inside the sweep file's folder (or $MADSL_SPEC_ROOT), or `bundled:NAME`; anything
else is refused at the entry before a file is read, and a named file that is not a spec is
reported by name only. The work a sweep asks for is capped before it is done: its number of
variants is computed from its axes before one is built (`MAX_VARIANTS`), each variant's
layers are counted before it is accounted (`MAX_VARIANT_LAYERS`), and the runs of its plan
are counted before one is planned (`MAX_RUNS`, `check_planned_runs`).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from madsl.errors import Location, MadslError, did_you_mean
from madsl.lang.declare import REQUIRED, Choice, Custom, Key, Names, Section, Where
from madsl.lang.yamlsource import Located, load
from madsl.runner.plan.settings import PROTOCOL_NAMES, SWEEP_TRAIN_SECTION

# spec fields a sweep may vary besides a layer's parameters (`layers.SYMBOL.PARAM`)
SPEC_FIELDS = ("dim", "vocab", "seq_len", "topology", "channel_mixer", "norm", "tie_embeddings")

# Caps, checked before the work they bound (docs/runner.md#sweep-files), each with why it is where it is:
# spec files x the values of every vary: axis; each variant is built and accounted before anything
# runs, and 4,096 of them at the quick protocol are months of CPU time
MAX_VARIANTS = 4_096
# sequence and channel mixers of one variant: over 3x the deepest bundled spec (160,
# minimax-m1-80k); a variant of 2,048 took 95 s and 3.6 GB before its plan ran out of memory
MAX_VARIANT_LAYERS = 512
# runs of one sweep's plan: 250 specs at the paper protocol's 396; planning more alone takes minutes and GBs
MAX_RUNS = 100_000


def _vary(value: Any, where: Where, source: str) -> dict[str, list[Any]]:
    """`vary:`: field paths, each to a non-empty list of values, none twice (the paths are
    checked against each spec when its variants are made)."""
    if not isinstance(value, dict):
        raise MadslError(
            f"{source}: expected a mapping of field paths to lists of values",
            where.value(),
            hint="vary: {dim: [64, 128], layers.H.order: [2, 3]}",
        )
    for key, values in value.items():
        if not isinstance(values, list):
            raise MadslError(
                f"{source}.{key}: expected a list of values", where.value(key), hint=f"{key}: [{values!r}]"
            )
        if not values:  # an empty axis would make an empty grid: no variant at all
            raise MadslError(
                f"{source}.{key}: the list is empty",
                where.value(key),
                expected="at least one value",
                hint=f"list the values to try, or drop vary.{key}",
            )
        _once(values, f"{source}.{key}", lambda i, key=key: where.value(key, i))
    return value


SWEEP_FILE = Section(
    "a sweep file",
    (
        Key(
            "specs",
            Names("spec files or globs"),
            "spec files or globs, relative to this file, or bundled:NAME",
            default=REQUIRED,
        ),
        Key("protocol", Choice(PROTOCOL_NAMES, "protocol"), "the protocol of every variant (default: each spec's)"),
        Key("tasks", Names("task names"), "the tasks, or all (default: each spec's)"),
        Key(
            "vary",
            Custom(_vary, {"type": "object", "additionalProperties": {"type": "array", "minItems": 1}}),
            "a grid over spec fields (dim, layers.SYMBOL.PARAM, ...): each combination is a variant",
        ),
        Key("train", SWEEP_TRAIN_SECTION, "training settings of every run: lr, wd, seed lists; epochs, batch_size"),
    ),
    description="a sweep file: specs and a grid of variants for `madsl eval` (docs/runner.md#sweep-files)",
)


@dataclass
class Variant:
    spec: Any  # madsl.lang.spec.Spec
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
    where: Location | None = None  # where the sweep's size is written (its vary:, else its specs:), for the run cap

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
        raise MadslError(
            f"{path}: a sweep file is a mapping with specs:, protocol:, tasks:, vary:, train:",
            Location(str(path), 1, 1, located.line(1)),
        )
    values = SWEEP_FILE.check(data, Where(located), "")
    size_at = located.key(("vary",)) if data.get("vary") else located.key(("specs",))
    grid = [(str(key), items) for key, items in (values.get("vary") or {}).items()]
    _check_variant_count(None, grid, size_at)  # the axes alone, before a folder is searched
    spec_paths = _spec_paths(located)
    _check_variant_count(len(spec_paths), grid, size_at)  # before a spec is read
    sweep = Sweep(
        path=str(path),
        variants=[],
        protocol=values.get("protocol"),
        tasks=_tasks(located, values.get("tasks")),
        train=values.get("train") or {},
        where=size_at,
    )
    for spec_path, where, ref in spec_paths:
        base = _load_named(spec_path, where, ref)
        for path_key, _ in grid:
            _check_field_path(base, path_key, located)
        for values in itertools.product(*(vals for _, vals in grid)):
            varied = {key: value for (key, _), value in zip(grid, values)}
            sweep.variants.append(_variant(base, str(base.path), varied, located, grid, where))
    return sweep


def _check_variant_count(specs: int | None, grid: list[tuple[str, list[Any]]], where: Location) -> None:
    """The variants a sweep makes, counted from its axes (nothing built): at most MAX_VARIANTS.
    `specs`: how many spec files it names (None: not known yet, the axes alone are counted)."""
    count = (specs or 1) * math.prod(len(values) for _, values in grid)
    if count > MAX_VARIANTS:
        axes = " x ".join(f"{len(values):,} {key}" for key, values in grid)
        made = (
            f"{count:,} variants ({specs:,} spec(s) x {axes or '1'})"
            if specs is not None
            else f"{count:,} variants of each spec ({axes})"
        )
        raise MadslError(
            f"the sweep makes {made}; a sweep makes at most {MAX_VARIANTS:,}",
            where,
            hint="vary fewer fields or values, or split the study into several sweep files",
        )


def _load_named(spec_path: Path, where: Location, ref: str) -> Any:
    """The spec a `specs:` entry names, held to the read policy: not a spec -> an error at the entry."""
    from madsl.lang.spec import load_spec
    from madsl.lang.spec.files import NOT_A_SPEC_EXPECTED, NotASpec, as_named

    shown = as_named(spec_path)
    try:
        return load_spec(shown, named=True)
    except NotASpec:
        raise MadslError(
            f"specs: {shown}" + (f" (matched by {ref})" if str(shown) != ref else "") + " is not a spec",
            where,
            expected=NOT_A_SPEC_EXPECTED,
        ) from None


def check_planned_runs(sweep: Sweep, cli: Any, variants: list[Variant]) -> int:
    """The runs `variants` plan under the command line's and the sweep's knobs `cli` (a
    runner Overrides), counted before one is planned: the task settings of one spec times
    its grid of lr, wd and seed, times the spec's variants. More than MAX_RUNS is an error
    at the sweep's size; returns the count."""
    per_file: dict[str, int] = {}
    total = 0
    for variant in variants:
        if variant.path not in per_file:
            per_file[variant.path] = _runs_of(variant.spec, variant.path, cli)
        total += per_file[variant.path]
    if total > MAX_RUNS:
        raise MadslError(
            f"{sweep.path}: the sweep plans {total:,} runs ({len(variants):,} variants); a plan holds at "
            f"most {MAX_RUNS:,}",
            sweep.where,
            hint="fewer variants, tasks or train: values (lr, wd, seed), or a protocol with fewer "
            "settings (baseline instead of paper)",
        )
    return total


def _runs_of(spec: Any, path: str, cli: Any) -> int:
    """The runs `madsl eval` plans of one spec, counted: its task settings (planned with one lr,
    wd and seed) times the lengths of its lr, wd and seed lists."""
    from madsl.runner.plan.evaluation import DEFAULT_PROTOCOL, plan_spec
    from madsl.runner.plan.overrides import Overrides, overrides_from_spec_eval
    from madsl.runner.plan.protocols import get_protocol

    from_spec = overrides_from_spec_eval(spec.eval, path, spec.source_map)
    merged = cli.over(from_spec.over(Overrides(protocol=DEFAULT_PROTOCOL)))
    protocol = get_protocol(merged.protocol)
    lrs, wds, seeds = merged.lrs or protocol.lrs, merged.wds or protocol.wds, merged.seeds or protocol.seeds
    one = dataclasses.replace(cli, lrs=tuple(lrs[:1]), wds=tuple(wds[:1]), seeds=tuple(seeds[:1]))
    return len(plan_spec(spec, path, one).runs) * len(lrs) * len(wds) * len(seeds)


# --- the sections --------------------------------------------------------------------------


def _spec_paths(located: Located) -> list[tuple[Path, Location, str]]:
    """Each spec file the `specs:` entries name (resolved, in order, once), with the entry that
    named it first and its text. Nothing is read: the read policy refuses at the entry."""
    from madsl.lang.spec.named import resolve_named

    specs = located.data["specs"]
    patterns = [specs] if isinstance(specs, str) else specs
    for index, pattern in enumerate(patterns):
        if not pattern.strip():
            where = located.value(("specs", index)) if not isinstance(specs, str) else located.value(("specs",))
            raise MadslError("specs: expected a spec file or glob, got a blank", where)
    out: dict[Path, tuple[Path, Location, str]] = {}
    for index, pattern in enumerate(patterns):
        where = located.value(("specs", index)) if not isinstance(specs, str) else located.value(("specs",))
        for match in resolve_named(pattern, Path(located.file), where, key="specs", naming="sweep file", globs=True):
            out.setdefault(match, (match, where, pattern))
    return list(out.values())


def _tasks(located: Located, tasks: tuple[str, ...] | None) -> list[str] | None:
    """The task names given, each a task's (or all)."""
    if tasks is None:
        return None
    value = located.data["tasks"]
    from madsl.tasks import TASKS

    names = set(TASKS) | {"all"}
    for index, name in enumerate(tasks):
        if name not in names:
            where = located.value(("tasks", index)) if not isinstance(value, str) else located.value(("tasks",))
            raise MadslError(
                f"unknown task {name!r}", where, expected=", ".join(sorted(names)), hint=did_you_mean(name, names)
            )
    return list(tasks)


def _once(values: list[Any], name: str, where: Callable[[int], Location]) -> None:
    """A value listed twice is a slip (its runs or variant would be planned once): an error at the repeat."""
    seen: set[Any] = set()  # hashable values (== as `in` compares: 2 and 2.0 are one); others one by one
    for index, value in enumerate(values):
        try:
            repeated = value in seen
            seen.add(value)
        except TypeError:  # a list or mapping
            repeated = value in values[:index]
        if repeated:
            raise MadslError(f"{name}: {value!r} is given twice", where(index), hint="list each value once")


# --- variants --------------------------------------------------------------------------------


def _check_field_path(spec: Any, key: str, located: Located) -> None:
    """`key` names a field of `spec`: a spec-wide field, or `layers.SYMBOL.PARAM` of a layer it uses."""
    where = located.key(("vary", key))
    parts = key.split(".")
    if parts[0] != "layers":
        if len(parts) != 1 or key not in SPEC_FIELDS:
            candidates = list(SPEC_FIELDS) + [
                f"layers.{s}.{p}" for s in spec.symbols_used() for p in spec.symbols[s].params
            ]
            raise MadslError(
                f"vary: {key!r} is not a field of spec {spec.name}",
                where,
                expected="a spec field (" + ", ".join(SPEC_FIELDS) + ") or layers.SYMBOL.PARAM",
                hint=did_you_mean(key, candidates),
            )
        return
    used = spec.symbols_used()
    if len(parts) != 3:
        raise MadslError(
            f"vary: {key!r}: a layer's field is written layers.SYMBOL.PARAM",
            where,
            hint=f"e.g. layers.{used[0]}.{next(iter(spec.symbols[used[0]].params), 'PARAM')}" if used else None,
        )
    symbol, param = parts[1], parts[2]
    if symbol not in used:
        raise MadslError(
            f"vary: spec {spec.name} has no layer {symbol!r}",
            where,
            expected="a symbol its model uses: " + ", ".join(used),
            hint=did_you_mean(symbol, used),
        )
    params = list(spec.symbols[symbol].params)
    if param not in params:
        raise MadslError(
            f"vary: layer {symbol} of spec {spec.name} ({spec.symbols[symbol].primitive}) has no parameter {param!r}",
            where,
            expected=", ".join(params),
            hint=did_you_mean(param, params),
        )


def variant_name(name: str, varied: dict[str, Any]) -> str:
    """hyena-sg[dim=64,H.order=3]: what varied, layer fields without their `layers.` prefix."""
    if not varied:
        return name
    shown = [f"{key.removeprefix('layers.')}={value}" for key, value in varied.items()]
    return f"{name}[{','.join(shown)}]"


def _variant(
    base: Any,
    spec_path: str,
    varied: dict[str, Any],
    located: Located,
    grid: list[tuple[str, list[Any]]],
    entry: Location,
) -> Variant:
    from madsl.graph import account
    from madsl.lang.budget import check
    from madsl.lang.spec import spec_with

    overrides: dict[str, Any] = {"name": variant_name(base.name, varied)}
    layers = copy.deepcopy(base.data.get("layers") or {})
    for key, value in varied.items():
        parts = key.split(".")
        if parts[0] == "layers":
            own = layers.get(parts[1])
            layers[parts[1]] = {**(own if isinstance(own, dict) else {}), parts[2]: value}
        else:
            overrides[key] = value
    if any(key.startswith("layers.") for key in varied):
        overrides["layers"] = layers
    name = overrides["name"]
    try:
        spec = spec_with(base, overrides) if varied else base
    except MadslError as err:
        raise _variant_error(name, err, located) from None
    count = layer_count(spec)
    if count > MAX_VARIANT_LAYERS:  # before it is accounted (or planned, or timed)
        where = entry
        if "topology" in varied:
            values = next(values for key, values in grid if key == "topology")
            where = located.value(("vary", "topology", values.index(varied["topology"])))
        raise MadslError(
            f"variant {name}: its topology expands to {count:,} layers; a sweep's variant has at most "
            f"{MAX_VARIANT_LAYERS:,}",
            where,
            hint="every variant is trained on the MAD tasks: check the repeat counts",
        )
    try:
        account_ = account(spec, seq_len=spec.budget_seq_len)
    except MadslError as err:
        raise _variant_error(name, err, located) from None
    violations = check(account_.totals, spec.budget)
    return Variant(spec=spec, path=spec_path, varied=varied, over_budget=[v.message() for v in violations])


def _variant_error(name: str, err: MadslError, located: Located) -> MadslError:
    messages = "; ".join(one.message for one in err.diagnostics)  # all of them, not just the first
    return MadslError(f"variant {name}: {messages}", located.key(("vary",)), expected=err.expected, hint=err.hint)


def layer_count(spec: Any) -> int:
    """The layers of a spec's expanded topology: every sequence mixer (each branch of a parallel
    one), every channel mixer a block gets and every injector. The topology is already within the block limit
    (MAX_BLOCKS, madsl/lang/topology/nodes.py), so the count is quick."""
    from madsl.lang import topology as topo

    count = 0
    for block in topo.blocks(spec.topology):
        count += len(block.mixer.branches) if isinstance(block.mixer, topo.Parallel) else 1
        count += (spec.channel_for(block) is not None) + (block.inject is not None)
    return count

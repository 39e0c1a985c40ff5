"""Search files (YAML) -> a checked `SearchFile`, every error located (file, line, column).

A search file is a spec without a topology: the spec fields every candidate shares (`dim`,
`layers`, `budget` with its `fit:`, ...), and in place of the topology the space to search,
the objectives and the algorithm:

    name: recall-hybrids
    dim: 128
    budget: {fixed_state: <= 4096, kv_cache: <= 65536, fit: [H.filter_states]}
    space: {sequence_mixers: [H, mA, Mb], channel_mixers: [Sg, MoE], blocks: {min: 2, max: 4}}
    objectives:
      score: {protocol: quick, tasks: [in-context-recall]}   # the MAD score, maximised
      minimize: [fixed_state]                                # accounted totals, minimised
    algorithm: {name: nsga2, population: 12, generations: 8, seed: 0}

The shared spec fields are checked by the spec loader itself (madsl.lang.spec), on a spec whose
topology uses every symbol of the space, so a search file's `layers:` and `budget:` read
exactly as a spec's. The space is madsl.search.reading_space.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from madsl.errors import Collector, Location, MadslError, did_you_mean
from madsl.lang import stdlib
from madsl.lang.spec import Spec, create_primitive, spec_with
from madsl.lang.spec.files import SPEC_KEYS, Locator, SourceMap
from madsl.lang.spec.symbols import symbol_table
from madsl.lang.topology.nodes import NO_CHANNEL
from madsl.lang.yamlsource import Located, load
from madsl.paths import safe_file_name
from madsl.primitives.base import ConfigError
from madsl.runner.common.choices import MAX_SEED
from madsl.search.config import ALGORITHMS, MINIMIZABLE, Algorithm, Objectives, SearchFile, Space
from madsl.search.reading_space import read_space

SEARCH_KEYS = ("name", "description", "space", "objectives", "algorithm")
SHARED_KEYS = tuple(k for k in SPEC_KEYS if k not in ("name", "description", "extends", "topology", "eval"))
REFUSED = {
    "topology": "a search file has a space: instead of a topology",
    "extends": "a search file names its spec fields itself",
    "eval": "the evaluation settings of a search go under objectives.score",
}
ALGORITHM_KEYS = ("name", "population", "generations", "offspring", "seed", "sample_size", "crossover")
MAX_NAME = 100  # characters: a candidate's file adds a hash, the state file the database's name


def load_search(path: str | Path) -> SearchFile:
    """Read and check a search file; a MadslError carries every error found, each located."""
    if not Path(path).is_file():
        raise MadslError(
            f"no such search file: {path}" if not Path(path).exists() else f"{path} is not a file",
            hint="a search file is YAML: name, dim, budget, space, objectives, algorithm (docs/search.md)",
        )
    located = load(path)
    if not isinstance(located.data, dict):
        raise MadslError(
            "a search file is a mapping with name, dim, space, objectives and algorithm",
            Location(str(path), 1, 1, located.line(1)),
        )
    errors = Collector(str(path))
    data = located.data
    with errors.check():
        _check_keys(located)
    name = algorithm = objectives = space = None
    with errors.check():
        name = _check_name(located)
    with errors.check():
        algorithm = read_algorithm(located)
    with errors.check():
        objectives = read_objectives(located)
    spec_data = {k: data[k] for k in SHARED_KEYS if k in data}
    symbols = _symbols(located, spec_data, errors)
    if symbols is not None and "space" in data:
        with errors.check():
            space = read_space(located, symbols, _default_channel(spec_data))
    if space is not None:
        with errors.check():
            _check_shared_spec(located, spec_data, space, name or "search")
    errors.raise_any()
    budget = spec_data.get("budget") or {}
    free = budget.get("fit", []) if isinstance(budget, dict) else []
    return SearchFile(
        path=str(path),
        name=name,
        description=str(data.get("description", "")),
        spec_data=spec_data,
        free=tuple([free] if isinstance(free, str) else free),
        space=space,
        objectives=objectives,
        algorithm=algorithm,
        located=located,
    )


def _check_keys(located: Located) -> None:
    data = located.data
    known = SEARCH_KEYS + SHARED_KEYS
    for key in data:
        if key in REFUSED:
            raise MadslError(f"{key}: {REFUSED[key]}", located.key((key,)), expected="one of " + ", ".join(known))
        if key not in known:
            raise MadslError(
                f"unknown key {key!r} in a search file",
                located.key((key,)),
                expected="one of " + ", ".join(known),
                hint=did_you_mean(str(key), known),
            )
    for key in ("name", "space", "objectives", "algorithm"):
        if key not in data:
            raise MadslError(
                f"a search file needs {key}:",
                Location(located.file, 1, 1, located.line(1)),
                hint="see docs/search.md for a complete search file",
            )


def _check_name(located: Located) -> str | None:
    """The search's name: it names files (the state, the output folder, each found `.mad`), so it is
    a plain file name, short enough to stay one with a database's name and a hash added to it."""
    if "name" not in located.data:
        return None  # _check_keys says it is missing
    name, where = located.data["name"], located.value(("name",))
    if not isinstance(name, str) or not name.strip():
        raise MadslError(f"name must be a non-empty string, got {name!r}", where)
    safe_file_name(name, "name:", where)
    if len(name) > MAX_NAME:
        raise MadslError(
            f"name: {len(name):,} characters is longer than a search's name can be",
            where,
            expected=f"at most {MAX_NAME} characters (the files it names add to it)",
        )
    return name


def _default_channel(spec_data: dict[str, Any]) -> str | None:
    value = spec_data.get("channel_mixer", "Sg")
    return None if value in (None, NO_CHANNEL) else value


def _symbols(located: Located, spec_data: dict[str, Any], errors: Collector) -> dict[str, Any] | None:
    """The symbol table the space is read against: the stdlib with the file's layers: applied
    (their errors go to `errors`, located; the spec check reports them again, once)."""
    layers = spec_data.get("layers") or {}
    if not isinstance(layers, dict):
        return None  # the spec check says what is wrong with it
    table, _ = symbol_table(layers, Locator(SourceMap(located, None)), errors)
    return table


def _check_shared_spec(located: Located, spec_data: dict[str, Any], space: Space, name: str) -> None:
    """The shared spec fields, checked by the spec loader on a spec that uses every symbol of the
    space (errors located in the search file); then the free parameters and hyperparameter values."""
    budget = spec_data.get("budget")
    free = budget.get("fit", []) if isinstance(budget, dict) else []
    symbols_used = set(space.sequence_mixers) | set(space.channel_mixers) - {NO_CHANNEL}
    for index, item in enumerate([free] if isinstance(free, str) else free if isinstance(free, list) else []):
        at = located.value(("budget", "fit", index) if isinstance(free, list) else ("budget", "fit"))
        symbol = str(item).partition(".")[0]
        if symbol not in symbols_used:
            raise MadslError(
                f"budget.fit: {item}: the space has no {symbol!r}",
                at,
                expected="a symbol of the space: " + ", ".join(sorted(symbols_used)),
            )
        if any(h.name == item for h in space.hyperparameters):
            raise MadslError(
                f"budget.fit: {item} is also a searched hyperparameter",
                at,
                hint="a parameter is either searched (space.hyperparameters) or solved (budget.fit)",
            )
    base = Spec(
        name="search",
        dim=0,
        topology_text="",
        topology=(),
        symbols={},
        data=dict(spec_data),
        path=Path(located.file),
        source_map=SourceMap(located, None),
    )
    spec = spec_with(base, {"name": name, "topology": _every_symbol(space)})
    _check_hyperparameter_values(located, spec, space)


def _every_symbol(space: Space) -> str:
    """A topology using every mixer of the space, each channel mixer at least once."""
    channels = list(space.channel_mixers) or [None]
    blocks = []
    for index in range(max(len(space.sequence_mixers), len(channels))):
        mixer = space.sequence_mixers[index % len(space.sequence_mixers)]
        channel = channels[index % len(channels)]
        blocks.append(mixer if channel is None else f"{mixer}-{channel}")
    return ":".join(blocks)


def _check_hyperparameter_values(located: Located, spec: Spec, space: Space) -> None:
    """Every choice, and both ends of every range, is a value the layer takes at the spec's width."""
    for hyper in space.hyperparameters:
        definition = spec.symbols[hyper.symbol]
        entry = stdlib.primitives()[definition.primitive]
        path = ("space", "hyperparameters", hyper.name)
        values = (
            [(v, path + (i,)) for i, v in enumerate(hyper.choices)]
            if hyper.choices
            else [(hyper.low, path + ("min",)), (hyper.high, path + ("max",))]
        )
        for value, at in values:
            try:
                create_primitive(entry, spec.dim, {**definition.params, hyper.param: value})
            except ConfigError as err:
                raise MadslError(
                    f"space.hyperparameters.{hyper.name}: {err.message}", located.value(at), hint=err.hint
                ) from None


def read_objectives(located: Located) -> Objectives:
    from madsl.runner.plan.setting_checks import Where
    from madsl.runner.plan.settings import BY_KEY

    section = located.data.get("objectives")
    if not isinstance(section, dict) or "score" not in section:
        raise MadslError(
            "objectives: expected a mapping with score: (the evaluation settings of the MAD score)",
            located.value(("objectives",)),
            hint="objectives: {score: {protocol: quick}}",
        )
    for key in section:
        if key not in ("score", "minimize"):
            raise MadslError(
                f"unknown key {key!r} in objectives:",
                located.key(("objectives", key)),
                expected="score, minimize",
                hint=did_you_mean(str(key), ("score", "minimize")),
            )
    score = section["score"] or {}
    if not isinstance(score, dict):
        raise MadslError(
            "objectives.score: expected a mapping of evaluation settings (protocol, tasks, ...)",
            located.value(("objectives", "score")),
            hint="score: {protocol: quick, tasks: [in-context-recall]}",
        )
    for key, value in score.items():
        if key not in BY_KEY:
            raise MadslError(
                f"unknown setting {key!r} in objectives.score",
                located.key(("objectives", "score", key)),
                expected=", ".join(BY_KEY),
                hint=did_you_mean(str(key), BY_KEY),
            )
        where = Where(lambda part, path, key=key: getattr(located, part)(("objectives", "score", key, *path)))
        BY_KEY[key].check(value, where, f"objectives.score.{key}")
    return Objectives(settings=dict(score), minimize=_minimize(located, section.get("minimize", [])))


def _minimize(located: Located, value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise MadslError(
            f"objectives.minimize: expected a list of {', '.join(MINIMIZABLE)}, got {value!r}",
            located.value(("objectives", "minimize")),
        )
    for index, item in enumerate(items):
        at = located.value(("objectives", "minimize", index) if isinstance(value, list) else ("objectives", "minimize"))
        if item not in MINIMIZABLE:
            raise MadslError(
                f"objectives.minimize: unknown quantity {item!r}",
                at,
                expected=", ".join(MINIMIZABLE),
                hint=did_you_mean(str(item), MINIMIZABLE),
            )
        if item in items[:index]:
            raise MadslError(f"objectives.minimize: {item} is given twice", at, hint="list each quantity once")
    return tuple(items)


def _algorithm_section(located: Located) -> dict[str, Any]:
    """The search file's `algorithm:` mapping: its keys known, the required ones there."""
    section = located.data.get("algorithm")
    if not isinstance(section, dict):
        raise MadslError(
            "algorithm: expected a mapping with name, population, generations, seed",
            located.value(("algorithm",)),
            hint="algorithm: {name: nsga2, population: 12, generations: 8}",
        )
    for key in section:
        if key not in ALGORITHM_KEYS:
            raise MadslError(
                f"unknown key {key!r} in algorithm:",
                located.key(("algorithm", key)),
                expected=", ".join(ALGORITHM_KEYS),
                hint=did_you_mean(str(key), ALGORITHM_KEYS),
            )
    for key in ("name", "population", "generations"):
        if key not in section:
            raise MadslError(
                f"algorithm: needs {key}",
                located.key(("algorithm",)),
                hint="algorithm: {name: nsga2, population: 12, generations: 8, seed: 0}",
            )
    return section


def read_algorithm(located: Located) -> Algorithm:
    section = _algorithm_section(located)
    name = section["name"]
    if name not in ALGORITHMS:
        raise MadslError(
            f"algorithm.name: unknown algorithm {name!r}",
            located.value(("algorithm", "name")),
            expected=", ".join(ALGORITHMS),
            hint=did_you_mean(str(name), ALGORITHMS),
        )
    for key, only in (("sample_size", "regularized-evolution"), ("crossover", "nsga2")):
        if key in section and name != only:
            raise MadslError(
                f"algorithm.{key} applies to {only} only, and this search is {name}",
                located.key(("algorithm", key)),
                hint=f"drop {key}",
            )
    number = _integers(located, section)
    crossover = section.get("crossover", 0.5)
    if isinstance(crossover, bool) or not isinstance(crossover, (int, float)) or not 0 <= crossover <= 1:
        raise MadslError(
            f"algorithm.crossover: expected a probability from 0 to 1, got {crossover!r}",
            located.value(("algorithm", "crossover")),
        )
    population = number["population"]
    sample_size = section.get("sample_size", min(population, max(2, population // 4)))
    if sample_size > population:
        raise MadslError(
            f"algorithm.sample_size: {sample_size} is more than the population of {population}",
            located.value(("algorithm", "sample_size")),
            hint="a tournament samples from the population",
        )
    return Algorithm(
        name=name,
        population=population,
        generations=number["generations"],
        offspring=number.get("offspring", population),
        seed=number.get("seed", 0),
        sample_size=sample_size,
        crossover=float(crossover),
    )


def _integers(located: Located, section: dict[str, Any]) -> dict[str, int]:
    """population, offspring, sample_size at least 1; generations at least 0; seed 0 to 2^32 - 1."""
    out = {}
    for key, low, high in (
        ("population", 1, 10_000),
        ("generations", 0, 10_000),
        ("offspring", 1, 10_000),
        ("sample_size", 1, 10_000),
        ("seed", 0, MAX_SEED),
    ):
        if key not in section:
            continue
        value = section[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise MadslError(
                f"algorithm.{key}: expected an integer from {low} to {high:,}, got {value!r}",
                located.value(("algorithm", key)),
                hint="a search needs at least one candidate" if key == "population" else None,
            )
        out[key] = value
    return out

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

from madsl.errors import Collector, Location, MadslError
from madsl.lang import stdlib
from madsl.lang import topology as topo
from madsl.lang.declare import Where
from madsl.lang.spec import Spec, create_primitive, spec_with
from madsl.lang.spec.files import Locator, SourceMap
from madsl.lang.spec.symbols import symbol_table
from madsl.lang.topology.nodes import NO_CHANNEL
from madsl.lang.yamlsource import Located, load
from madsl.paths import safe_file_name
from madsl.primitives.base import ConfigError
from madsl.search import keys
from madsl.search.config import Algorithm, Objectives, SearchFile, Space
from madsl.search.genome import channel_of, mixers_of
from madsl.search.reading_space import read_space

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
    spec_data = {k: data[k] for k in keys.SHARED_KEYS if k in data}
    symbols = _symbols(located, spec_data, errors)
    if symbols is not None and "space" in data:
        with errors.check():
            space = read_space(located, symbols, _default_channel(spec_data))
    references: dict[str, str] = {}
    if space is not None:
        with errors.check():
            _check_shared_spec(located, spec_data, space, name or "search")
        with errors.check():
            references = read_references(located, space, _default_channel(spec_data))
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
        references=references,
        located=located,
    )


def _check_keys(located: Located) -> None:
    """The file's keys as declared (madsl.search.keys): known, the required ones given."""
    keys.SEARCH_FILE.check_keys(located.data, Where(located))


def _check_name(located: Located) -> str | None:
    """The search's name: it names files (the state, the output folder, each found `.mad`), so it is
    a plain file name, short enough to stay one with a database's name and a hash added to it."""
    if "name" not in located.data:
        return None  # _check_keys says it is missing
    name, where = located.data["name"], located.value(("name",))
    keys.SEARCH_FILE.check_value("name", name, Where(located))
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
    for hyper in space.layer_hyperparameters:
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


def read_references(located: Located, space: Space, default_channel: str | None) -> dict[str, str]:
    """`references:` name -> topology, each a design of the space: its sequence and channel mixers
    the space's, its blocks within the space's range (its shape may be any); canonical."""
    section = located.data.get("references")
    if section is None:
        return {}
    keys.SEARCH_FILE.check_value("references", section, Where(located))
    out = {}
    for name, text in section.items():
        path = ("references", name)
        try:
            topology = topo.expand(topo.parse(text))
        except topo.TopologySyntaxError as err:
            span = err.span
            raise err.relocated(located.position(path, span.line, span.column, span.length)) from None
        blocks = list(topo.blocks(topology))
        for block in blocks:
            problem = _outside(space, block, default_channel)
            if problem:
                raise MadslError(
                    f"references.{name}: {text} is not in the space: {problem}",
                    located.value(path),
                    hint="a reference is a design the search could propose: the space's symbols, its number of blocks",
                )
        if not space.min_blocks <= len(blocks) <= space.max_blocks:
            raise MadslError(
                f"references.{name}: {text} has {len(blocks)} blocks",
                located.value(path),
                expected=f"{space.min_blocks} to {space.max_blocks} blocks (space.blocks)",
            )
        out[name] = topo.canonical(topology)
    return out


def _outside(space: Space, block: topo.Block, default_channel: str | None) -> str | None:
    """Why `block` is not one the space holds (None: it is)."""
    if block.inject is not None:
        return f"an injector ({topo.layer_text(block.inject)}>), which a search does not propose"
    mixers = mixers_of(block)
    for mixer in mixers:
        if mixer not in space.sequence_mixers:
            return f"{mixer} is not among its sequence_mixers ({', '.join(space.sequence_mixers)})"
    if len(mixers) > 1 and not space.parallel:
        return "a parallel block, and space.shapes does not list parallel"
    channel = channel_of(block)
    if channel == NO_CHANNEL:  # written `-none`
        channel = None
    elif channel is None and not all(m in space.mixes_channels for m in mixers):
        channel = default_channel  # the block takes the spec's channel mixer (madsl.lang.spec.Spec.channel_for)
    if channel not in space.channel_choices(mixers):
        return f"{channel or 'no channel mixer'} is not among the channel mixers of a {'/'.join(mixers)} block"
    return None


def read_objectives(located: Located) -> Objectives:
    """`objectives:` as declared: the score's evaluation settings, the quantities minimised."""
    values = keys.SEARCH_FILE.check_value("objectives", located.data.get("objectives"), Where(located))
    return Objectives(settings=dict(located.data["objectives"]["score"] or {}), minimize=values.get("minimize", ()))


def read_algorithm(located: Located) -> Algorithm:
    """`algorithm:` as declared, with what one key says of another."""
    section = keys.SEARCH_FILE.check_value("algorithm", located.data.get("algorithm"), Where(located))
    name = section["name"]
    for key, only in (("sample_size", "regularized-evolution"), ("crossover", "nsga2")):
        if key in section and name != only:
            raise MadslError(
                f"algorithm.{key} applies to {only} only, and this search is {name}",
                located.key(("algorithm", key)),
                hint=f"drop {key}",
            )
    population = section["population"]
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
        generations=section["generations"],
        offspring=section.get("offspring", population),
        seed=section.get("seed", 0),
        sample_size=sample_size,
        crossover=float(section.get("crossover", 0.5)),
    )

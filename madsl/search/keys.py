"""The keys of a search file, declared once (madsl.lang.declare): the file's own sections
(`space:`, `objectives:`, `algorithm:`) and, beside them, the spec fields every candidate shares,
read by the spec loader itself (`open` keys). madsl.search.reading reads a search file by these
declarations and `madsl schema --kind search` describes it by them. Torch-free.
"""

from __future__ import annotations

from typing import Any

from madsl.errors import MadslError
from madsl.lang.declare import REQUIRED, Choice, Custom, Key, Names, Number, Section, Text, Where
from madsl.lang.spec.files import SPEC_KEYS
from madsl.runner.common.choices import MAX_SEED
from madsl.runner.plan.settings import SETTINGS
from madsl.search.config import ALGORITHMS, MINIMIZABLE, SHAPES

MAX_SEARCH_BLOCKS = 256  # blocks of a candidate (a sweep's variant holds at most 512 layers); each is trained
MAX_CANDIDATES = 10_000  # a population, its offspring, a tournament, generations: more is a typo
SHARED_KEYS = tuple(k for k in SPEC_KEYS if k not in ("name", "description", "extends", "topology", "eval", "init"))
REFUSED = {
    "init": "a search's candidates train from scratch: saved weights are a spec file's init:",
    "topology": "a search file has a space: instead of a topology",
    "extends": "a search file names its spec fields itself",
    "eval": "the evaluation settings of a search go under objectives.score",
}


def _blocks(value: Any, where: Where, source: str) -> tuple[int, int]:
    """A number of blocks, or a range {min: N, max: M} of them: (low, high)."""
    if isinstance(value, dict):
        if set(value) != {"min", "max"}:
            raise MadslError(f"{source}: expected {{min: N, max: M}}, got {value!r}", where.value())
        low, high = (_BLOCK_COUNT.check(value[k], where.below(k), source) for k in ("min", "max"))
        if low > high:
            raise MadslError(f"the space is empty: blocks.min {low} is larger than blocks.max {high}", where.value())
        return low, high
    count = _BLOCK_COUNT.check(value, where, source)
    return count, count


_BLOCK_COUNT = Number(integer=True, minimum=1, maximum=MAX_SEARCH_BLOCKS, hint="how many blocks a candidate has")
_BLOCK_SCHEMA = {"type": "integer", "minimum": 1, "maximum": MAX_SEARCH_BLOCKS}


def _hyperparameters(value: Any, where: Where, source: str) -> dict[str, Any]:
    """`SYMBOL.param` -> choices or a range: the mapping's shape (its names and values are read
    against the symbols by madsl.search.reading_space)."""
    if not isinstance(value, dict):
        raise MadslError(
            f"{source}: expected a mapping of SYMBOL.param to choices or {{min, max}}, got {value!r}",
            where.value(),
            hint="hyperparameters: {mA.heads: [8, 16], H.order: {min: 2, max: 3}}",
        )
    return value


def _fill(value: Any, where: Where, source: str) -> list[float]:
    """A non-empty list of distinct fractions in (0, 1]."""
    if not isinstance(value, list) or not value:
        raise MadslError(f"{source}: expected a list of fractions", where.value(), hint="fill: [0.25, 0.5, 0.75, 1.0]")
    seen: list[float] = []
    for index, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, (int, float)) or not 0 < item <= 1:
            raise MadslError(
                f"{source}: expected a fraction above 0 and at most 1, got {item!r}",
                where.value(index),
                hint="a fraction of each state bound, e.g. 0.5",
            )
        if float(item) in seen:
            raise MadslError(f"{source}: {item!r} is given twice", where.value(index), hint="list each value once")
        seen.append(float(item))
    return seen


def _references(value: Any, where: Where, source: str) -> dict[str, str]:
    """A non-empty mapping of names to topology strings (each read against the space by
    madsl.search.reading)."""
    if not isinstance(value, dict) or not value:
        raise MadslError(
            f"{source}: expected a mapping of names to topologies, got {value!r}",
            where.value(),
            hint="references: {hyena: (H-Sg)x2, mamba: 4Mb}",
        )
    for name, text in value.items():
        if not isinstance(name, str) or not name.strip():
            raise MadslError(f"{source}: a reference's name must be a word, got {name!r}", where.key(name))
        if not isinstance(text, str):
            raise MadslError(
                f"{source}.{name}: expected a topology string, got {text!r}",
                where.value(name),
                hint="a topology of the space's symbols, e.g. (H-Sg)x2",
            )
    return dict(value)


SPACE = Section(
    "space:",
    (
        Key("sequence_mixers", Names("layer symbols"), "the sequence mixers the search may use", default=REQUIRED),
        Key("channel_mixers", Names("layer symbols"), "the channel mixers it may use (default: the channel_mixer)"),
        Key(
            "blocks",
            Custom(
                _blocks,
                {
                    "anyOf": [
                        _BLOCK_SCHEMA,
                        {
                            "type": "object",
                            "required": ["min", "max"],
                            "properties": {"min": _BLOCK_SCHEMA, "max": _BLOCK_SCHEMA},
                            "additionalProperties": False,
                        },
                    ]
                },
            ),
            "how many blocks a candidate has: a number, or {min: N, max: M}",
            default=REQUIRED,
        ),
        Key(
            "shapes",
            Names("shapes", unique=True, choices=SHAPES, item="shape"),
            "how blocks are arranged",
            default="sequence",
        ),
        Key(
            "fill",
            Custom(
                _fill,
                {
                    "type": "array",
                    "items": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                    "minItems": 1,
                    "uniqueItems": True,
                },
            ),
            "fractions of each state bound (fixed_state, conv_state, total_state) the free parameters "
            "are solved toward, one drawn per candidate and mutated like a hyperparameter: e.g. "
            "[0.25, 0.5, 0.75, 1.0], so the front spans the state axis (default: the bound itself)",
        ),
        Key(
            "hyperparameters",
            Custom(_hyperparameters, {"type": "object", "additionalProperties": {"type": ["array", "object"]}}),
            "named hyperparameters the search sets: SYMBOL.param: [choices] or {min: N, max: M}",
        ),
    ),
    description="the architectures the search may propose",
)
OBJECTIVES = Section(
    "objectives:",
    (
        Key(
            "score",
            Section("objectives.score", tuple(s.declared() for s in SETTINGS)),
            "the evaluation settings of the MAD score, maximised (protocol, tasks, ...)",
            default=REQUIRED,
        ),
        Key(
            "minimize",
            Names("accounted quantities", unique=True, choices=MINIMIZABLE, item="quantity"),
            "accounted totals, minimised",
        ),
    ),
)
ALGORITHM = Section(
    "algorithm:",
    (
        Key("name", Choice(ALGORITHMS, "algorithm"), "the search algorithm", default=REQUIRED),
        Key(
            "population",
            Number(integer=True, minimum=1, maximum=MAX_CANDIDATES, hint="a search needs at least one candidate"),
            "candidates of each generation",
            default=REQUIRED,
        ),
        Key(
            "generations",
            Number(integer=True, minimum=0, maximum=MAX_CANDIDATES),
            "generations after the first",
            default=REQUIRED,
        ),
        Key(
            "offspring",
            Number(integer=True, minimum=1, maximum=MAX_CANDIDATES),
            "children a generation (default: the population)",
        ),
        Key("seed", Number(integer=True, minimum=0, maximum=MAX_SEED), "the search's seed", default=0),
        Key(
            "sample_size",
            Number(integer=True, minimum=1, maximum=MAX_CANDIDATES),
            "regularized-evolution: the tournament's size (default: a quarter of the population, at least 2)",
        ),
        Key(
            "crossover",
            Number(minimum=0, maximum=1),
            "nsga2: the probability a child is a crossover of two parents",
            default=0.5,
        ),
    ),
)
SEARCH_FILE = Section(
    "a search file",
    (
        Key("name", Text("the search's name"), "the search's name: it names its files", default=REQUIRED),
        Key("description", Text(), "what the search is for"),
        Key("space", SPACE, SPACE.description, default=REQUIRED),
        Key("objectives", OBJECTIVES, "what the search optimises", default=REQUIRED),
        Key("algorithm", ALGORITHM, "how it searches", default=REQUIRED),
        Key(
            "references",
            Custom(_references, {"type": "object", "additionalProperties": {"type": "string"}, "minProperties": 1}),
            "hand-written designs of the space, name: topology, scored beside the initial population by "
            "`madsl search --calibrate` (they do not change what the search proposes)",
        ),
    ),
    description="a madsl search file: the spec fields every candidate shares, the space, objectives and "
    "algorithm (docs/search.md)",
    refused=REFUSED,
    open=SHARED_KEYS,
)

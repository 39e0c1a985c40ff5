"""A study file: the architectures, FLOP budgets and model sizes of an IsoFLOP study, with its
data and training recipe, read with every problem located (file, line, column).

    name: shakespeare-bytes
    data: bundled:tinyshakespeare       # a prepared token folder (madsl data prepare), relative to this file
    seq_len: 128
    architectures:                      # name: spec (the read policy of sweep files' `specs:`)
      transformer: bundled:scaling/transformer
      hyena: ../specs/scaling/hyena.mad
    budgets: [1e11, 3e11, 1e12]         # training FLOPs; or {FLOPS: {batch_size, sizes, seeds, lr}}
    sizes:                              # each: a width and a depth, or a parameter target
      - {dim: 32, repeat: 1}
      - {params: 2e5, repeat: 2}        # the width whose model is closest to 200k parameters
    seeds: 3                            # seed replicates of every run (default 1)
    recipe: {batch_size: 16, lr: paper} # madsl.runner.pretrain.recipe.PretrainSettings' fields;
                                        # lr: [1e-3, 3e-3] is a ladder: a run each

A size's `repeat` repeats the spec's topology (its depth), `dim` sets its width; a `params`
target is met by the width (a multiple of `dim_step`, 16 unless given) closest to it. The study's
name and its architectures' names become labels (and may become file names): each is a safe file
name (madsl.paths.safe_file_name). Sizes and budgets remember where they are written, so an error
found when planning (a width a layer cannot take, a budget below one step) points at them.
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from madsl.errors import Location, MadslError, did_you_mean
from madsl.lang.declare import REQUIRED, Choice, Custom, Key, Number, Section, Text, Where
from madsl.lang.yamlsource import load
from madsl.paths import safe_file_name
from madsl.runner.common.choices import MAX_SEED
from madsl.runner.pretrain.recipe import RECIPE  # (torch-free: the study reader stays light)

MAX_RUNS = 10_000  # a study is a grid of runs someone trains; more is a typo
MAX_SEEDS = 1_000  # replicates of one run; more is a typo (MAX_RUNS bounds the whole grid)
MAX_BUDGET = 1e30  # FLOPs; the largest training runs to date spend ~1e26: more is a typo (and overflows hours)
TOKEN_DTYPES = ("uint16", "uint32")  # madsl.corpus.info.DTYPES (not imported: the study reader stays light)

SIZE = Section(
    "a size",
    (
        Key("dim", Number(integer=True, minimum=1), "the model's width"),
        Key("params", Number(minimum=0, inclusive=False), "a parameter target: the width whose model is closest"),
        Key("repeat", Number(integer=True, minimum=1), "how many times the spec's topology repeats (its depth)", 1),
        Key("dim_step", Number(integer=True, minimum=1), "a params target's width is a multiple of this", 16),
    ),
    exactly_one=(("dim", "params"),),
)
_SIZES_SCHEMA = {"type": "array", "items": SIZE.schema(), "minItems": 1}
_BUDGET = Number(minimum=0, inclusive=False, maximum=MAX_BUDGET, hint="budgets are training FLOPs, e.g. 1e12")
BUDGET = Section(
    "a budget",
    (
        Key("batch_size", Number(integer=True, minimum=1), "the group's batch size (default: the recipe's)"),
        Key("sizes", Custom(lambda v, w, s: v, _SIZES_SCHEMA), "the group's sizes (default: the study's)"),
        Key(
            "seeds",
            Number(integer=True, minimum=1, maximum=MAX_SEEDS),
            "the group's seed replicates (default: the study's `seeds`)",
        ),
        Key("lr", RECIPE.by_name["lr"].kind, "the group's learning rate or ladder (default: the recipe's `lr`)"),
    ),
)


def _name_check(value: Any, where: Where, source: str) -> str:
    """A name that becomes a label (and may become a file name): a safe file name."""
    return safe_file_name(value, "the study's name", where.value())


def _groups_check(value: Any, where: Where, source: str) -> dict[str, tuple[str, ...]]:
    """name -> at least 3 distinct architecture names (checked against `architectures:` when the
    study is read, where they are known)."""
    if not isinstance(value, dict) or not value:
        raise MadslError(f"{source}: expected a mapping of names to lists of architectures", where.value())
    out = {}
    for name, members in value.items():
        safe_file_name(name, "a group's name", where.key(name))
        if not isinstance(members, list) or len(members) < 3 or len(set(map(str, members))) != len(members):
            raise MadslError(
                f"{source}: group {name} must list at least 3 distinct architectures (fewer correlate to nothing)",
                where.value(name),
            )
        out[name] = tuple(str(m) for m in members)
    return out


def _architectures_check(value: Any, where: Where, source: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not value:
        raise MadslError(
            f"{source}: expected a mapping of names to spec files",
            where.value(),
            hint="e.g. transformer: bundled:scaling/transformer",
        )
    for name, ref in value.items():
        safe_file_name(name, "architecture name", where.key(name))
        Text("a spec file").check(ref, where.below(name), f"architecture {name}")
    return value


STUDY_FILE = Section(
    "a study file",
    (
        Key("name", Custom(_name_check, {"type": "string", "pattern": r"\S"}), "the study's name", REQUIRED),
        Key("description", Text(), "what the study is for"),
        Key("data", Text("a token folder"), "a prepared token folder (madsl data prepare), or bundled:NAME", REQUIRED),
        Key("data_dtype", Choice(TOKEN_DTYPES, "token file dtype"), "the token files' dtype (default: the folder's)"),
        Key("data_vocab", Number(integer=True, minimum=1), "the vocabulary (default: the folder's)"),
        Key("seq_len", Number(integer=True, minimum=2), "tokens per training sequence", 256),
        Key(
            "architectures",
            Custom(
                _architectures_check, {"type": "object", "additionalProperties": {"type": "string"}, "minProperties": 1}
            ),
            "name: spec file (relative to this file) or bundled:NAME",
            REQUIRED,
        ),
        Key(
            "budgets",
            Custom(
                lambda v, w, s: v,
                {
                    "anyOf": [
                        {"type": "array", "items": _BUDGET.schema(), "minItems": 1},
                        {"type": "object", "additionalProperties": {"anyOf": [BUDGET.schema(), {"type": "null"}]}},
                    ]
                },
            ),
            "training FLOPs of the IsoFLOP groups: a list, or FLOPS: {batch_size, sizes, seeds, lr}",
            REQUIRED,
        ),
        Key("sizes", Custom(lambda v, w, s: v, _SIZES_SCHEMA), "the model sizes of every budget"),
        Key(
            "seeds",
            Number(integer=True, minimum=1, maximum=MAX_SEEDS),
            "seed replicates of every run: seeds recipe.seed, recipe.seed + 1, ... (each its own "
            "initialisation and data order)",
            1,
        ),
        Key(
            "groups",
            Custom(
                _groups_check,
                {
                    "type": "object",
                    "additionalProperties": {"type": "array", "items": {"type": "string"}, "minItems": 3},
                },
            ),
            "named sets of the study's architectures the MAD correlation is also taken over, fixed before "
            "the runs (e.g. a design chain: the paper's Fig. 5.1 claim); the correlation over all of them is "
            "always taken",
        ),
        Key("recipe", RECIPE, RECIPE.description),
    ),
    description="a madsl IsoFLOP study (docs/scaling.md)",
)


@dataclass(frozen=True)
class Size:
    """One model size: a width and a depth, or a parameter target (solved to a width)."""

    repeat: int = 1
    dim: int | None = None
    params: float | None = None
    dim_step: int = 16
    where: tuple = field(default=(), compare=False)  # its key path in the study file (for errors)

    def label(self) -> str:
        what = f"d{self.dim}" if self.dim is not None else f"p{self.params:.3g}"
        return f"{what}x{self.repeat}"


@dataclass(frozen=True)
class BudgetGroup:
    """An IsoFLOP group: a budget, its batch size (fixed within the group) and its sizes; its own
    seed replicates and learning rates where it sets them (None: the study's)."""

    flops: float
    sizes: tuple[Size, ...]
    batch_size: int
    where: tuple = field(default=(), compare=False)  # the budget's key path in the study file (for errors)
    seeds: int | None = None
    lr: Any = None  # a learning rate, `paper` or a list (a ladder)


@dataclass
class Study:
    name: str
    path: Path
    data: str
    seq_len: int
    architectures: dict[str, Any]  # name -> Spec
    spec_paths: dict[str, str]
    budgets: list[BudgetGroup]
    recipe: dict[str, Any] = field(default_factory=dict)
    seeds: int = 1  # replicates of every run, seeds recipe.seed, recipe.seed + 1, ...
    data_dtype: str | None = None
    data_vocab: int | None = None
    description: str = ""
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)  # name -> architectures (pre-registered)


def _size(where: Where, value: Any) -> Size:
    item = SIZE.check(value, where, "")
    size = {key: item.get(key, SIZE.by_name[key].default) for key in ("repeat", "dim", "params", "dim_step")}
    return Size(**size, where=where.path)


def _sizes(where: Where, value: Any) -> tuple[Size, ...]:
    if not isinstance(value, list) or not value:
        raise MadslError(
            "sizes must be a non-empty list of sizes",
            where.value(),
            hint="an IsoFLOP curve needs at least 3 sizes around its minimum",
        )
    sizes = tuple(_size(where.below(i), item) for i, item in enumerate(value))
    labels = [s.label() for s in sizes]
    for i, label in enumerate(labels):
        if label in labels[:i]:
            raise MadslError(f"the size {label} is listed twice", where.value(i))
    return sizes


def _budget(where: Where, value: Any, at_key: bool = False) -> float:
    try:
        return _BUDGET.check(value, where, "a budget")
    except MadslError as err:
        if at_key:  # a mapping's budget is its key: point there
            err.location = where.key()
        raise


def _budgets(where: Where, data: dict, batch_size: int) -> list[BudgetGroup]:
    value, shared = data["budgets"], data.get("sizes")
    if isinstance(value, list):
        if not value:
            raise MadslError("budgets must not be empty", where.value("budgets"))
        if shared is None:
            raise MadslError("a study whose budgets are a list needs `sizes:`", where.key())
        sizes = _sizes(where.below("sizes"), shared)
        groups = [
            BudgetGroup(_budget(where.below("budgets", i), v), sizes, batch_size, ("budgets", i))
            for i, v in enumerate(value)
        ]
    elif isinstance(value, dict) and value:
        groups = []
        for key, item in value.items():
            at = where.below("budgets", key)
            item = BUDGET.check(item, at, f"budget {key}")
            if "sizes" not in item and shared is None:
                raise MadslError(f"budget {key} has no sizes (and the study no `sizes:`)", at.value())
            sizes = (
                _sizes(at.below("sizes"), item["sizes"]) if "sizes" in item else _sizes(where.below("sizes"), shared)
            )
            flops, batch = _budget(at, key, at_key=True), item.get("batch_size", batch_size)
            groups.append(BudgetGroup(flops, sizes, batch, at.path, item.get("seeds"), item.get("lr")))
    else:
        raise MadslError(
            "budgets must be a list of FLOP budgets or a mapping of them to {batch_size, sizes, seeds, lr}",
            where.value("budgets"),
        )
    seen = [g.flops for g in groups]
    if len(set(seen)) != len(seen):
        raise MadslError("a budget is listed twice", where.value("budgets"))
    return sorted(groups, key=lambda g: g.flops)


def _architectures(where: Where, value: dict, path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    from madsl.lang.spec import load_spec
    from madsl.lang.spec.named import resolve_named

    specs, paths = {}, {}
    for name, ref in value.items():
        (file,) = resolve_named(ref, path, where.value(name), key=f"architectures.{name}", naming="study")
        specs[name], paths[name] = load_spec(file, named=True), str(file)
    return specs, paths


def _recipe(where: Where, recipe: dict[str, Any], seq_len: int) -> tuple[dict[str, Any], int]:
    """The recipe's settings (checked as declared, madsl.runner.pretrain.recipe.RECIPE) and the
    study's batch size."""
    recipe = dict(recipe)
    batch_size = recipe.pop("batch_size", RECIPE.by_name["batch_size"].default)
    eval_tokens = recipe.get("eval_tokens", RECIPE.by_name["eval_tokens"].default)
    if eval_tokens < seq_len:  # else the first evaluation fails, after the training before it
        given = "eval_tokens" in recipe
        raise MadslError(
            f"eval_tokens {eval_tokens:,}{'' if given else ' (the default)'} is fewer than one window "
            f"of seq_len {seq_len:,}",
            where.value("recipe", "eval_tokens") if given else where.value("seq_len"),
            hint="set recipe: {eval_tokens: N} to at least seq_len",
        )
    return recipe, batch_size


def load_study(path: str | Path) -> Study:
    """Read and check a study file (its specs loaded); raises a located MadslError."""
    path = Path(path)
    if not path.is_file():
        raise MadslError(
            f"no such study file: {path}" if not path.exists() else f"{path} is not a file",
            hint="a study file is YAML: name, data, seq_len, architectures, budgets, sizes, recipe (docs/scaling.md)",
        )
    located = load(path)
    where = Where(located)
    data = STUDY_FILE.check(located.data, where, "")
    seq_len = data.get("seq_len", STUDY_FILE.by_name["seq_len"].default)
    recipe, batch_size = _recipe(where, data.get("recipe") or {}, seq_len)
    specs, spec_paths = _architectures(where.below("architectures"), data["architectures"], path)
    study = Study(
        name=data["name"],
        path=path,
        data=data["data"],
        seq_len=seq_len,
        architectures=specs,
        spec_paths=spec_paths,
        budgets=_budgets(where, data, batch_size),
        recipe=recipe,
        seeds=data.get("seeds", 1),
        data_dtype=data.get("data_dtype"),
        data_vocab=data.get("data_vocab"),
        description=data.get("description") or "",
        groups=data.get("groups") or {},
    )
    for name, members in study.groups.items():
        for index, arch in enumerate(members):
            if arch not in specs:
                raise MadslError(
                    f"group {name}: {arch!r} is not an architecture of the study",
                    where.value("groups", name, index),
                    hint=did_you_mean(arch, specs),
                )
    for group in study.budgets:
        if recipe.get("seed", 0) + group_seeds(study, group) - 1 > MAX_SEED:
            raise MadslError(
                f"seeds: {group_seeds(study, group):,} replicates from seed {recipe.get('seed', 0):,} go past "
                f"{MAX_SEED:,} (2^32 - 1)",
                where.value(*group.where, "seeds") if group.seeds is not None else where.value("seeds"),
            )
    runs = len(specs) * sum(len(g.sizes) * group_seeds(study, g) * len(group_lrs(study, g)) for g in study.budgets)
    if runs > MAX_RUNS:
        raise MadslError(f"the study has {runs:,} runs; at most {MAX_RUNS:,}", where.value("budgets"))
    return study


def group_seeds(study: Study, group: BudgetGroup) -> int:
    """The seed replicates of each run of `group`: its own `seeds`, else the study's."""
    return group.seeds if group.seeds is not None else study.seeds


def group_lrs(study: Study, group: BudgetGroup) -> list[Any]:
    """The learning rates of each sized model of `group` (one, or a ladder's): its own `lr`, else the recipe's."""
    lrs = group.lr if group.lr is not None else study.recipe.get("lr", "paper")
    return lrs if isinstance(lrs, list) else [lrs]


def study_location(study: Study, *keys: Any) -> Location:
    """Where `keys` are written in the study file (for errors found when planning)."""
    return load(study.path).value(tuple(keys))

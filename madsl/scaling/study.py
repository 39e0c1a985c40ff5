"""A study file: the architectures, FLOP budgets and model sizes of an IsoFLOP study, with its
data and training recipe, read with every problem located (file, line, column).

    name: shakespeare-bytes
    data: bundled:tinyshakespeare       # a prepared token folder (madsl data prepare), relative to this file
    seq_len: 128
    architectures:                      # name: spec (the read policy of sweep files' `specs:`)
      transformer: bundled:scaling/transformer
      hyena: ../specs/scaling/hyena.mad
    budgets: [1e11, 3e11, 1e12]         # training FLOPs; or {FLOPS: {batch_size: N, sizes: [...]}}
    sizes:                              # each: a width and a depth, or a parameter target
      - {dim: 32, repeat: 1}
      - {params: 2e5, repeat: 2}        # the width whose model is closest to 200k parameters
    recipe: {batch_size: 16, lr: paper} # madsl.runner.pretrain.recipe.PretrainSettings' fields

A size's `repeat` repeats the spec's topology (its depth), `dim` sets its width; a `params`
target is met by the width (a multiple of `dim_step`, 16 unless given) closest to it. The study's
name and its architectures' names become labels (and may become file names): each is a safe file
name (madsl.paths.safe_file_name). Sizes and budgets remember where they are written, so an error
found when planning (a width a layer cannot take, a budget below one step) points at them.
Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from madsl.errors import Location, MadslError, did_you_mean
from madsl.lang.yamlsource import Located, load
from madsl.paths import safe_file_name
from madsl.runner.common.choices import MAX_SEED, TRAIN_PRECISIONS  # (torch-free: the study reader stays light)

STUDY_KEYS = (
    "name",
    "description",
    "data",
    "data_dtype",
    "data_vocab",
    "seq_len",
    "architectures",
    "budgets",
    "sizes",
    "recipe",
)
SIZE_KEYS = ("dim", "repeat", "params", "dim_step")
BUDGET_KEYS = ("batch_size", "sizes")
RECIPE_KEYS = (
    "lr",
    "batch_size",
    "wd",
    "beta1",
    "beta2",
    "warmup",
    "min_lr_ratio",
    "grad_clip",
    "eval_every",
    "eval_tokens",
    "seed",
    "precision",
)
MAX_RUNS = 10_000  # a study is a grid of runs someone trains; more is a typo
MAX_BUDGET = 1e30  # FLOPs; the largest training runs to date spend ~1e26: more is a typo (and overflows hours)
TOKEN_DTYPES = ("uint16", "uint32")  # madsl.corpus.info.DTYPES (not imported: the study reader stays light)
DEFAULT_EVAL_TOKENS = 65536  # madsl.runner.pretrain.recipe.PretrainSettings.eval_tokens


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
    """An IsoFLOP group: a budget, its batch size (fixed within the group) and its sizes."""

    flops: float
    sizes: tuple[Size, ...]
    batch_size: int
    where: tuple = field(default=(), compare=False)  # the budget's key path in the study file (for errors)


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
    data_dtype: str | None = None
    data_vocab: int | None = None
    description: str = ""


class _Reader:
    """Reads values of the study's YAML, each error at its place."""

    def __init__(self, located: Located):
        self.located = located

    def fail(
        self, path: tuple, message: str, hint: str | None = None, expected: str | None = None, at_key: bool = False
    ) -> MadslError:
        where = self.located.key(path) if at_key else self.located.value(path)
        return MadslError(message, where, hint=hint, expected=expected)

    def mapping(self, value: Any, path: tuple, allowed: tuple[str, ...], what: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(path, f"{what} must be a mapping, got {type(value).__name__}")
        for key in value:
            if key not in allowed:
                raise self.fail(
                    path + (key,),
                    f"unknown key {key!r} in {what}",
                    at_key=True,
                    hint=did_you_mean(str(key), allowed),
                    expected=", ".join(allowed),
                )
        return value

    def number(self, value: Any, path: tuple, what: str, *, integer: bool = False, low: float = 0.0) -> float:
        """A positive finite number; YAML reads `1e12` (no dot) as a string, so that is read too."""
        number = value
        if isinstance(value, str):
            try:
                number = float(value.replace("_", ""))
            except ValueError:
                number = None
        if (
            isinstance(number, bool)
            or not isinstance(number, (int, float))
            or not math.isfinite(number)
            or number <= low
        ):
            raise self.fail(path, f"{what} must be a {'whole ' if integer else ''}number above {low:g}, got {value!r}")
        if integer:
            if number != int(number):
                raise self.fail(path, f"{what} must be a whole number, got {value!r}")
            return int(number)
        return float(number)

    def text(self, value: Any, path: tuple, what: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(path, f"{what} must be a non-empty string, got {value!r}")
        return value


def _size(reader: _Reader, value: Any, path: tuple) -> Size:
    item = reader.mapping(value, path, SIZE_KEYS, "a size")
    if ("dim" in item) == ("params" in item):
        raise reader.fail(
            path,
            "a size gives either `dim` (a width) or `params` (a parameter target), "
            f"not {'both' if 'dim' in item else 'neither'}",
            hint="e.g. {dim: 64, repeat: 2} or {params: 2e5, repeat: 2}",
        )
    repeat = reader.number(item.get("repeat", 1), path + ("repeat",), "repeat", integer=True)
    step = reader.number(item.get("dim_step", 16), path + ("dim_step",), "dim_step", integer=True)
    if "dim" in item:
        return Size(
            repeat=repeat,
            dim=reader.number(item["dim"], path + ("dim",), "dim", integer=True),
            dim_step=step,
            where=path,
        )
    return Size(
        repeat=repeat, params=reader.number(item["params"], path + ("params",), "params"), dim_step=step, where=path
    )


def _sizes(reader: _Reader, value: Any, path: tuple) -> tuple[Size, ...]:
    if not isinstance(value, list) or not value:
        raise reader.fail(
            path,
            "sizes must be a non-empty list of sizes",
            hint="an IsoFLOP curve needs at least 3 sizes around its minimum",
        )
    sizes = tuple(_size(reader, item, path + (i,)) for i, item in enumerate(value))
    labels = [s.label() for s in sizes]
    for i, label in enumerate(labels):
        if label in labels[:i]:
            raise reader.fail(path + (i,), f"the size {label} is listed twice")
    return sizes


def _budget(reader: _Reader, value: Any, path: tuple, at_key: bool = False) -> float:
    try:
        flops = reader.number(value, path, "a budget")
    except MadslError as err:
        if at_key:  # a mapping's budget is its key: point there
            err.location = reader.located.key(path)
        raise
    if flops > MAX_BUDGET:
        raise reader.fail(
            path,
            f"a budget of {flops:.3g} FLOPs is more than {MAX_BUDGET:.0e}",
            at_key=at_key,
            hint="budgets are training FLOPs, e.g. 1e12; the largest runs to date spend about 1e26",
        )
    return flops


def _budgets(reader: _Reader, data: dict, batch_size: int) -> list[BudgetGroup]:
    if "budgets" not in data:
        raise reader.fail((), "a study needs `budgets:` (training FLOPs of its IsoFLOP groups)", at_key=True)
    value, shared = data["budgets"], data.get("sizes")
    if isinstance(value, list):
        if not value:
            raise reader.fail(("budgets",), "budgets must not be empty")
        if shared is None:
            raise reader.fail((), "a study whose budgets are a list needs `sizes:`", at_key=True)
        sizes = _sizes(reader, shared, ("sizes",))
        groups = [
            BudgetGroup(_budget(reader, v, ("budgets", i)), sizes, batch_size, ("budgets", i))
            for i, v in enumerate(value)
        ]
    elif isinstance(value, dict) and value:
        groups = []
        for key, item in value.items():
            path = ("budgets", key)
            item = reader.mapping(item if item is not None else {}, path, BUDGET_KEYS, f"budget {key}")
            if "sizes" not in item and shared is None:
                raise reader.fail(path, f"budget {key} has no sizes (and the study no `sizes:`)")
            sizes = (
                _sizes(reader, item["sizes"], path + ("sizes",))
                if "sizes" in item
                else _sizes(reader, shared, ("sizes",))
            )
            batch = reader.number(
                item.get("batch_size", batch_size), path + ("batch_size",), "batch_size", integer=True
            )
            groups.append(BudgetGroup(_budget(reader, key, path, at_key=True), sizes, batch, path))
    else:
        raise reader.fail(
            ("budgets",), "budgets must be a list of FLOP budgets or a mapping of them to {batch_size, sizes}"
        )
    seen = [g.flops for g in groups]
    if len(set(seen)) != len(seen):
        raise reader.fail(("budgets",), "a budget is listed twice")
    return sorted(groups, key=lambda g: g.flops)


def _name(reader: _Reader, value: Any, path: tuple, what: str, at_key: bool = False) -> str:
    """A name that becomes a label (and may become a file name): a safe file name, refused at its place."""
    where = reader.located.key(path) if at_key else reader.located.value(path)
    return safe_file_name(value, what, where)


def _architectures(reader: _Reader, data: dict, path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    from madsl.lang.spec import load_spec
    from madsl.lang.spec.named import resolve_named

    value = data.get("architectures")
    if not isinstance(value, dict) or not value:
        raise reader.fail(
            ("architectures",),
            "a study needs `architectures:`, a mapping of names to spec files",
            at_key="architectures" not in data,
            hint="e.g. transformer: bundled:scaling/transformer",
        )
    specs, paths = {}, {}
    for name, ref in value.items():
        where = reader.located.value(("architectures", name))
        _name(reader, name, ("architectures", name), "architecture name", at_key=True)
        ref = reader.text(ref, ("architectures", name), f"architecture {name}")
        (file,) = resolve_named(ref, path, where, key=f"architectures.{name}", naming="study")
        specs[name], paths[name] = load_spec(file, named=True), str(file)
    return specs, paths


def _recipe(reader: _Reader, data: dict, seq_len: int) -> tuple[dict[str, Any], int]:
    """The recipe's settings, each checked at its place, and the study's batch size."""
    recipe = dict(reader.mapping(data.get("recipe") or {}, ("recipe",), RECIPE_KEYS, "recipe"))
    batch_size = reader.number(recipe.pop("batch_size", 16), ("recipe", "batch_size"), "batch_size", integer=True)
    for key in ("wd", "grad_clip"):
        if key in recipe:
            recipe[key] = reader.number(recipe[key], ("recipe", key), key, low=-1e-300)
    for key in ("eval_every", "seed"):
        if key in recipe:
            recipe[key] = reader.number(recipe[key], ("recipe", key), key, integer=True, low=-1)
    if recipe.get("seed", 0) > MAX_SEED:
        raise reader.fail(("recipe", "seed"), f"seed {recipe['seed']:,} is above {MAX_SEED:,} (2^32 - 1)")
    for key in ("beta1", "beta2", "warmup", "min_lr_ratio"):
        if key in recipe:
            recipe[key] = reader.number(recipe[key], ("recipe", key), key, low=-1e-300)
            if recipe[key] >= 1:
                raise reader.fail(("recipe", key), f"{key} must be below 1, got {recipe[key]}")
    if "eval_tokens" in recipe:
        recipe["eval_tokens"] = reader.number(
            recipe["eval_tokens"], ("recipe", "eval_tokens"), "eval_tokens", integer=True
        )
    eval_tokens = recipe.get("eval_tokens", DEFAULT_EVAL_TOKENS)
    if eval_tokens < seq_len:  # else the first evaluation fails, after the training before it
        given = "eval_tokens" in recipe
        raise reader.fail(
            ("recipe", "eval_tokens") if given else ("seq_len",),
            f"eval_tokens {eval_tokens:,}{'' if given else ' (the default)'} is fewer than one window "
            f"of seq_len {seq_len:,}",
            hint="set recipe: {eval_tokens: N} to at least seq_len",
        )
    if "lr" in recipe and recipe["lr"] != "paper":
        try:
            recipe["lr"] = reader.number(recipe["lr"], ("recipe", "lr"), "lr")
        except MadslError:
            raise reader.fail(
                ("recipe", "lr"),
                f"lr must be a number above 0 or `paper`, got {recipe['lr']!r}",
                hint="paper: Table C.2's learning rate for the model's size",
            ) from None
    if recipe.get("precision", "fp32") not in TRAIN_PRECISIONS:
        raise reader.fail(
            ("recipe", "precision"), f"precision must be {' or '.join(TRAIN_PRECISIONS)}, got {recipe['precision']!r}"
        )
    return recipe, batch_size


def _optional_text(reader: _Reader, data: dict, key: str) -> str | None:
    if key not in data or data[key] is None:
        return None
    if not isinstance(data[key], str):
        raise reader.fail((key,), f"{key} must be text, got {type(data[key]).__name__}")
    return data[key]


def _data_dtype(reader: _Reader, data: dict) -> str | None:
    dtype = _optional_text(reader, data, "data_dtype")
    if dtype is not None and dtype not in TOKEN_DTYPES:
        raise reader.fail(
            ("data_dtype",), f"data_dtype {dtype!r} is not a token file dtype", expected=" or ".join(TOKEN_DTYPES)
        )
    return dtype


def load_study(path: str | Path) -> Study:
    """Read and check a study file (its specs loaded); raises a located MadslError."""
    path = Path(path)
    if not path.is_file():
        raise MadslError(
            f"no such study file: {path}" if not path.exists() else f"{path} is not a file",
            hint="a study file is YAML: name, data, seq_len, architectures, budgets, sizes, recipe (docs/scaling.md)",
        )
    located = load(path)
    reader = _Reader(located)
    data = reader.mapping(located.data if located.data is not None else {}, (), STUDY_KEYS, "a study file")
    for key in ("name", "data"):
        if key not in data:
            raise MadslError(f"a study needs `{key}:`", Location(str(path), 1, 1, located.line(1)))
    name = _name(reader, data["name"], ("name",), "the study's name")
    seq_len = reader.number(data.get("seq_len", 256), ("seq_len",), "seq_len", integer=True, low=1)
    recipe, batch_size = _recipe(reader, data, seq_len)
    specs, spec_paths = _architectures(reader, data, path)
    study = Study(
        name=name,
        path=path,
        data=reader.text(data["data"], ("data",), "data"),
        seq_len=seq_len,
        architectures=specs,
        spec_paths=spec_paths,
        budgets=_budgets(reader, data, batch_size),
        recipe=recipe,
        data_dtype=_data_dtype(reader, data),
        data_vocab=(
            reader.number(data["data_vocab"], ("data_vocab",), "data_vocab", integer=True)
            if "data_vocab" in data
            else None
        ),
        description=_optional_text(reader, data, "description") or "",
    )
    runs = len(specs) * sum(len(g.sizes) for g in study.budgets)
    if runs > MAX_RUNS:
        raise reader.fail(("budgets",), f"the study has {runs:,} runs; at most {MAX_RUNS:,}")
    return study


def study_location(study: Study, *keys: Any) -> Location:
    """Where `keys` are written in the study file (for errors found when planning)."""
    return load(study.path).value(tuple(keys))

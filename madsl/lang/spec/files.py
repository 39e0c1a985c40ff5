"""Spec files -> one merged mapping, and where each of its keys and values is written.

`extends:` names another spec whose keys this one inherits; this file's keys win,
and mappings (`layers:` per symbol, `budget:`, `eval:`) merge key by key. The
`SourceMap` answers "where is this key written" across the chain of files, so an
error in an inherited value points into the file that wrote it.

Every file a spec or a sweep file names is reached through one read policy
(madsl/lang/spec/named.py: relative paths inside the naming file's folder or $MADSL_SPEC_ROOT,
bundled specs, globs). A file reached this way that is not a spec is reported by name, without
printing any of its lines or values: one that does not parse as a YAML mapping, and a
`.yaml`/`.yml` file (a name configuration files share) with a key that is not a spec key
(`password:` in a `ci-secrets.yaml`). A `.mad` file is a spec by its name: its errors are shown
as those of any spec.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from madsl.errors import Location, MadslError
from madsl.lang.spec.named import SPEC_SUFFIXES, resolve_extends
from madsl.lang.yamlsource import KeyPath, Located, load

MERGED_SECTIONS = ("layers", "budget", "eval")


class SourceMap:
    """Where each key and value of a (possibly `extends`-merged) spec is written:
    in this file if it sets the key, else in the spec it extends."""

    def __init__(self, located: Located, parent: "SourceMap | None"):
        self.located, self.parent = located, parent
        self.mine = set(_paths(located.data))

    def _owner(self, key_path: KeyPath) -> "SourceMap":
        # the spec as a whole (a missing key) is this file's: never a line of a file it extends
        if not key_path or key_path in self.mine or self.parent is None:
            return self
        return self.parent._owner(key_path)

    def key(self, key_path: KeyPath) -> Location:
        return self._owner(key_path).located.key(key_path)

    def value(self, key_path: KeyPath) -> Location:
        return self._owner(key_path).located.value(key_path)

    def position(self, key_path: KeyPath, line: int, column: int, length: int = 1) -> Location:
        """Where character (`line`, `column`) of the string value at `key_path` is written."""
        return self._owner(key_path).located.position(key_path, line, column, length)

    def line(self, file: str, number: int) -> str:
        if self.located.file == file or self.parent is None:
            return self.located.line(number)
        return self.parent.line(file, number)


class Locator:
    """Locations by key path for errors: from the source map, or None for data without a file."""

    def __init__(self, source_map: SourceMap | None):
        self.source_map = source_map

    def key(self, *key_path: Any) -> Location | None:
        return self.source_map.key(key_path) if self.source_map else None

    def value(self, *key_path: Any) -> Location | None:
        return self.source_map.value(key_path) if self.source_map else None


def load_merged(path: Path, chain: tuple[Path, ...] = (), *, named: bool = False) -> tuple[dict, SourceMap]:
    """The spec at `path` with everything it `extends:` merged in, and its source map.

    `named`: another file named this one (a sweep's `specs:`; a file `extends:` reaches is named
    too), so it must read as a spec (the module docstring): `NotASpec` where it does not, raised
    before any of its lines could be shown."""
    reached = named or bool(chain)
    located = _load_spec_file(path, reached)
    file_data = located.data
    if reached and not reads_as_spec(file_data, path):
        raise NotASpec(path)
    if not isinstance(file_data, dict):
        if path.suffix not in SPEC_SUFFIXES:
            raise MadslError(
                f"{path} is not a spec file (not a YAML mapping)",
                Location(str(path)),
                hint="a spec is a .mad (YAML) file",
            )
        if file_data is None:
            raise MadslError(
                "the spec file is empty",
                Location(str(path), 1, 1, ""),
                expected="a mapping with at least name, dim and topology",
            )
        raise MadslError(
            "a spec must be a YAML mapping", located.value(()), expected="keys such as name, dim, topology"
        )
    parent_data: dict = {}
    parent_map: SourceMap | None = None
    if "extends" in file_data:
        where = located.value(("extends",))
        parent = resolve_extends(file_data["extends"], path, where)
        if parent in chain or parent == path.resolve():
            raise MadslError(
                f"extends makes a cycle: {' -> '.join(str(p) for p in chain + (parent,))}",
                where,
                hint="a spec cannot extend itself",
            )
        try:
            parent_data, parent_map = load_merged(as_named(parent), chain + (path.resolve(),))
        except NotASpec:
            raise MadslError(
                f"extends names {file_data['extends']}, which is not a spec", where, expected=NOT_A_SPEC_EXPECTED
            ) from None
    merged = merge(parent_data, {k: v for k, v in file_data.items() if k != "extends"})
    return merged, SourceMap(located, parent_map)


NOT_A_SPEC_EXPECTED = "a YAML mapping of spec keys such as name, dim, topology"


def as_named(resolved: Path) -> Path:
    """A file another file named, as errors should show it: relative to the working
    directory where it is under it (as CI annotations and editors want), else absolute."""
    try:
        return resolved.relative_to(Path.cwd().resolve())
    except ValueError:
        return resolved


# the top-level keys of a spec (keys.py gives each its type and checks the two agree)
SPEC_KEYS = (
    "name",
    "description",
    "extends",
    "dim",
    "vocab",
    "seq_len",
    "topology",
    "channel_mixer",
    "norm",
    "tie_embeddings",
    "positions",
    "embedding_std",
    "linear_std",
    "final_norm",
    "embedding_norm",
    "meta_tokens",
    "norm_eps",
    "embedding_scale",
    "residual_scale",
    "postnorm",
    "residual_factors",
    "logit_divisor",
    "logit_soft_cap",
    "init",
    "layers",
    "budget",
    "eval",
)


class NotASpec(Exception):
    """A file another file named is not a spec (see `reads_as_spec`); the namer reports it at
    its own entry, by name only."""


def reads_as_spec(data: Any, path: Path) -> bool:
    """Whether a file that another file named may be read as a spec, and so have its lines shown
    in errors: a YAML mapping, and, unless its real name ends in .mad, one whose keys are all
    spec keys (a `.yaml` file is as likely a CI configuration with secrets as a spec)."""
    if not isinstance(data, dict):
        return False
    if _real_suffix(path) == ".mad":
        return True
    return all(isinstance(key, str) and key in SPEC_KEYS for key in data)


def _real_suffix(path: Path) -> str:
    try:
        return path.resolve().suffix
    except (OSError, ValueError, RuntimeError):
        return path.suffix


def _load_spec_file(path: Path, named: bool = False) -> Located:
    try:
        return load(path)
    except MadslError as err:
        if err.location.line is None:  # unreadable, too large, not UTF-8: nothing of it is shown
            raise
        if named and _real_suffix(path) != ".mad":  # named by another file and not YAML: by name only
            raise NotASpec(path) from None
        if path.suffix in SPEC_SUFFIXES:
            raise
        # not named like a spec and not YAML: say so without printing a line of it
        raise MadslError(
            f"{path} is not a spec file (it is not YAML)", Location(str(path)), hint="a spec is a .mad (YAML) file"
        ) from None


def merge(base: dict, over: dict) -> dict:
    """`extends` semantics: mappings merge key by key (layers per symbol), other values replace."""
    out = dict(base)
    for key, value in over.items():
        if key in MERGED_SECTIONS and isinstance(value, dict) and isinstance(out.get(key), dict):
            merged = dict(out[key])
            for sub, sub_value in value.items():
                if key == "layers" and isinstance(sub_value, dict) and isinstance(merged.get(sub), dict):
                    merged[sub] = {**merged[sub], **sub_value}
                else:
                    merged[sub] = sub_value
            out[key] = merged
        else:
            out[key] = value
    return out


def _paths(data: Any, prefix: KeyPath = ()):
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        yield prefix + (key,)
        yield from _paths(value, prefix + (key,))

"""Spec files -> one merged mapping, and where each of its keys and values is written.

`extends:` names another spec whose keys this one inherits; this file's keys win,
and mappings (`layers:` per symbol, `budget:`, `eval:`) merge key by key. The
`SourceMap` answers "where is this key written" across the chain of files, so an
error in an inherited value points into the file that wrote it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from madsl.errors import Location, MadslError
from madsl.yamlsource import KeyPath, Located, load

MERGED_SECTIONS = ("layers", "budget", "eval")


class SourceMap:
    """Where each key and value of a (possibly `extends`-merged) spec is written:
    in this file if it sets the key, else in the spec it extends."""

    def __init__(self, located: Located, parent: "SourceMap | None"):
        self.located, self.parent = located, parent
        self.mine = set(_paths(located.data))

    def _owner(self, key_path: KeyPath) -> "SourceMap":
        if key_path in self.mine or self.parent is None:
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


def load_merged(path: Path, chain: tuple[Path, ...] = ()) -> tuple[dict, SourceMap]:
    """The spec at `path` with everything it `extends:` merged in, and its source map."""
    located = load(path)
    file_data = located.data
    if file_data is None:
        raise MadslError("the spec file is empty", Location(str(path), 1, 1, ""),
                         expected="a mapping with at least name, dim and topology")
    if not isinstance(file_data, dict):
        raise MadslError("a spec must be a YAML mapping", located.value(()),
                         expected="keys such as name, dim, topology")
    parent_data: dict = {}
    parent_map: SourceMap | None = None
    if "extends" in file_data:
        ref = file_data["extends"]
        if not isinstance(ref, str):
            raise MadslError("extends must be a path to another spec", located.value(("extends",)))
        parent = (path.parent / ref).resolve()
        if parent in chain or parent == path.resolve():
            raise MadslError(f"extends makes a cycle: {' -> '.join(str(p) for p in chain + (parent,))}",
                             located.value(("extends",)), hint="a spec cannot extend itself")
        if not parent.is_file():
            raise MadslError(f"extends names a spec that does not exist: {ref}", located.value(("extends",)),
                             hint=f"paths are relative to {path.parent}/")
        parent_data, parent_map = load_merged(parent, chain + (path.resolve(),))
    merged = merge(parent_data, {k: v for k, v in file_data.items() if k != "extends"})
    return merged, SourceMap(located, parent_map)


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
    if isinstance(data, dict):
        for key, value in data.items():
            yield prefix + (key,)
            yield from _paths(value, prefix + (key,))

"""Spec files -> one merged mapping, and where each of its keys and values is written.

`extends:` names another spec whose keys this one inherits; this file's keys win,
and mappings (`layers:` per symbol, `budget:`, `eval:`) merge key by key. The
`SourceMap` answers "where is this key written" across the chain of files, so an
error in an inherited value points into the file that wrote it.

What `extends:` may name is restricted, because spec files come from pull requests
and errors land in CI logs (an unrestricted path would read `/etc/passwd` and print
its lines in a YAML error):

    extends: base.mad              a relative path to a .mad/.yaml/.yml file in the extending
    extends: shared/base.mad       spec's directory or below it (symlinks resolved first), or
                                   anywhere inside $MADSL_SPEC_ROOT (directories joined by ':')
    extends: bundled:paper/mamba   a spec bundled with madsl (specs/ in a source checkout)

Absolute paths and anything that resolves outside those directories are refused with
an error at the `extends:` value; a file that does not parse as a spec mapping is
reported without printing its lines.
"""
from __future__ import annotations

import os
from pathlib import Path, PurePath
from typing import Any

from madsl.errors import Location, MadslError, did_you_mean
from madsl.resources import specs_dir
from madsl.yamlsource import KeyPath, Located, load

MERGED_SECTIONS = ("layers", "budget", "eval")
SPEC_SUFFIXES = (".mad", ".yaml", ".yml")
SPEC_ROOT_ENV = "MADSL_SPEC_ROOT"
BUNDLED_PREFIX = "bundled:"


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
    located = _load_spec_file(path)
    file_data = located.data
    if not isinstance(file_data, dict):
        if chain:  # reached through extends: report it there, without printing a line of it
            raise _NotASpec()
        if path.suffix not in SPEC_SUFFIXES:
            raise MadslError(f"{path} is not a spec file (not a YAML mapping)", Location(str(path)),
                             hint="a spec is a .mad (YAML) file")
        if file_data is None:
            raise MadslError("the spec file is empty", Location(str(path), 1, 1, ""),
                             expected="a mapping with at least name, dim and topology")
        raise MadslError("a spec must be a YAML mapping", located.value(()),
                         expected="keys such as name, dim, topology")
    parent_data: dict = {}
    parent_map: SourceMap | None = None
    if "extends" in file_data:
        where = located.value(("extends",))
        parent = resolve_extends(file_data["extends"], path, where)
        if parent in chain or parent == path.resolve():
            raise MadslError(f"extends makes a cycle: {' -> '.join(str(p) for p in chain + (parent,))}",
                             where, hint="a spec cannot extend itself")
        try:
            parent_data, parent_map = load_merged(_as_named(parent), chain + (path.resolve(),))
        except _NotASpec:
            raise MadslError(f"extends names {file_data['extends']}, which is not a spec", where,
                             expected="a YAML mapping with keys such as name, dim, topology") from None
    merged = merge(parent_data, {k: v for k, v in file_data.items() if k != "extends"})
    return merged, SourceMap(located, parent_map)


def _as_named(resolved: Path) -> Path:
    """A file `extends:` reached, named as errors should show it: relative to the working
    directory where it is under it (as CI annotations and editors want), else absolute."""
    try:
        return resolved.relative_to(Path.cwd().resolve())
    except ValueError:
        return resolved


class _NotASpec(Exception):
    """A file reached through `extends:` parsed as YAML but is not a mapping."""


def _load_spec_file(path: Path) -> Located:
    try:
        return load(path)
    except MadslError as err:
        if path.suffix in SPEC_SUFFIXES or err.location.line is None:
            raise
        # not named like a spec and not YAML: say so without printing a line of it
        raise MadslError(f"{path} is not a spec file (it is not YAML)", Location(str(path)),
                         hint="a spec is a .mad (YAML) file") from None


def spec_roots() -> list[Path]:
    """The directories named by $MADSL_SPEC_ROOT (':'-separated), resolved."""
    return [Path(p).expanduser().resolve() for p in os.environ.get(SPEC_ROOT_ENV, "").split(os.pathsep) if p]


def resolve_extends(ref: Any, spec_path: Path, where: Location) -> Path:
    """The file an `extends:` value names, if it is one a spec may extend (see the module docstring)."""
    allowed = (f"a relative path to a {'/'.join(SPEC_SUFFIXES)} file in this spec's directory or below "
               f"(or inside ${SPEC_ROOT_ENV}), or {BUNDLED_PREFIX}NAME for a bundled spec")
    if not isinstance(ref, str) or not ref.strip():
        raise MadslError("extends must be a path to another spec", where, expected=allowed)
    if ref.startswith(BUNDLED_PREFIX):
        return _bundled(ref[len(BUNDLED_PREFIX):], where)
    if PurePath(ref).is_absolute() or ref.startswith("~"):
        raise MadslError(f"extends may not name an absolute path: {ref}", where, expected=allowed,
                         hint="write the path relative to this spec's directory")
    home = spec_path.parent.resolve()
    target = (home / ref).resolve()  # symlinks followed: where the file really is
    roots = [home] + spec_roots()
    if not any(target.is_relative_to(root) for root in roots):
        raise MadslError(f"extends may not leave this spec's directory: {ref} resolves to {target}", where,
                         expected=allowed,
                         hint=f"move the base spec under {home}/, use a bundled spec ({BUNDLED_PREFIX}paper/mamba), "
                              f"or set {SPEC_ROOT_ENV} to a directory that holds both specs")
    if target.suffix not in SPEC_SUFFIXES:
        raise MadslError(f"extends must name a spec file ({', '.join(SPEC_SUFFIXES)}), got {ref}"
                         + (f" (a link to {target.name})" if target.name != PurePath(ref).name else ""),
                         where, expected=allowed)
    if not target.is_file():
        raise MadslError(f"extends names a spec that does not exist: {ref}", where,
                         hint=f"paths are relative to {spec_path.parent}/")
    return target


def _bundled(name: str, where: Location) -> Path:
    root = specs_dir()
    if root is None:
        raise MadslError(f"extends names the bundled spec {name!r}, but this installation has no bundled specs",
                         where, hint="bundled specs ship with a source checkout of madsl (its specs/ folder)")
    root = root.resolve()
    bundled = sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.mad"))
    target = (root / name).resolve()
    if target.suffix not in SPEC_SUFFIXES:
        target = target.with_name(target.name + ".mad")
    if not target.is_relative_to(root) or not target.is_file():
        raise MadslError(f"no bundled spec {name!r}", where, expected=f"{BUNDLED_PREFIX}NAME, NAME one of the "
                         f"specs under specs/ such as paper/mamba or topologies/base-750m",
                         hint=did_you_mean(name, bundled))
    return target


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

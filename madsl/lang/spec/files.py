"""Spec files -> one merged mapping, and where each of its keys and values is written.

`extends:` names another spec whose keys this one inherits; this file's keys win,
and mappings (`layers:` per symbol, `budget:`, `eval:`) merge key by key. The
`SourceMap` answers "where is this key written" across the chain of files, so an
error in an inherited value points into the file that wrote it.

One read policy covers every file that a spec or a sweep file names (`extends:`, a sweep's
`specs:`), because such files come from pull requests and errors land in CI logs (an
unrestricted path would read `/etc/passwd` and print its lines in a YAML error):

    base.mad                       a relative path to a .mad/.yaml/.yml file in the naming
    shared/base.mad                file's folder or below it (symlinks resolved first), or
                                   anywhere inside $MADSL_SPEC_ROOT (directories joined by ':')
    bundled:paper/mamba            a spec bundled with madsl (specs/ in a source checkout)
    paper/*-sg.mad                 a glob (`specs:` only), expanded inside those folders alone

Absolute paths, `~`, and anything that resolves outside those folders are refused with an
error at the entry, before the file is read. A file reached this way that is not a spec is
reported by name, without printing any of its lines or values: one that does not parse as a
YAML mapping, and a `.yaml`/`.yml` file (a name configuration files share) with a key that
is not a spec key (`password:` in a `ci-secrets.yaml`). A `.mad` file is a spec by its name:
its errors are shown as those of any spec.
"""
from __future__ import annotations

import fnmatch
import os
from pathlib import Path, PurePath
from typing import Any

from madsl.errors import Location, MadslError, did_you_mean
from madsl.resources import specs_dir
from madsl.lang.yamlsource import KeyPath, Located, load

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
            parent_data, parent_map = load_merged(as_named(parent), chain + (path.resolve(),))
        except NotASpec:
            raise MadslError(f"extends names {file_data['extends']}, which is not a spec", where,
                             expected=NOT_A_SPEC_EXPECTED) from None
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
SPEC_KEYS = ("name", "description", "extends", "dim", "vocab", "seq_len", "topology", "channel_mixer", "norm",
             "tie_embeddings", "positions", "embedding_std", "linear_std", "final_norm", "layers", "budget", "eval")


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
        raise MadslError(f"{path} is not a spec file (it is not YAML)", Location(str(path)),
                         hint="a spec is a .mad (YAML) file") from None


def spec_roots() -> list[Path]:
    """The directories named by $MADSL_SPEC_ROOT (':'-separated), resolved."""
    return [Path(p).expanduser().resolve() for p in os.environ.get(SPEC_ROOT_ENV, "").split(os.pathsep) if p]


GLOB_CHARACTERS = frozenset("*?[")


def resolve_extends(ref: Any, spec_path: Path, where: Location) -> Path:
    """The file an `extends:` value names, if it is one a spec may extend (see the module docstring)."""
    if not isinstance(ref, str) or not ref.strip():
        raise MadslError("extends must be a path to another spec", where, expected=_allowed("spec", globs=False))
    return resolve_named(ref, spec_path, where, key="extends", naming="spec")[0]


def _allowed(naming: str, globs: bool) -> str:
    return (f"a relative path{' or glob' if globs else ''} to a {'/'.join(SPEC_SUFFIXES)} file in this "
            f"{naming}'s directory or below (or inside ${SPEC_ROOT_ENV}), or {BUNDLED_PREFIX}NAME for a bundled spec")


def resolve_named(ref: str, naming_file: Path, where: Location, *, key: str, naming: str = "spec",
                  globs: bool = False) -> list[Path]:
    """The files (resolved, symlinks followed) that `ref`, the value of `key` in `naming_file`
    (a `naming`: spec or sweep file), names, where the read policy (the module docstring) lets
    it name them; else a MadslError at `where`, raised before any of them is opened. With
    `globs`, a glob is expanded inside the allowed folders alone and its matches come sorted;
    otherwise `ref` is one path (a list of one)."""
    allowed = _allowed(naming, globs)
    home = naming_file.parent.resolve()
    roots = [home] + spec_roots()
    is_glob = globs and bool(GLOB_CHARACTERS & set(ref))
    if "\0" in ref:
        raise MadslError(f"{key}: a path cannot contain a NUL character", where, expected=allowed)
    if ref.startswith(BUNDLED_PREFIX):
        name = ref[len(BUNDLED_PREFIX):]
        return _bundled_glob(name, ref, key, where) if is_glob else [_bundled(name, where)]
    if PurePath(ref).is_absolute() or ref.startswith("~"):
        raise MadslError(f"{key} may not name an absolute path: {ref}", where, expected=allowed,
                         hint=f"write the path relative to this {naming}'s directory")
    leave_hint = (f"move the spec under {home}/, use a bundled spec ({BUNDLED_PREFIX}paper/mamba), "
                  f"or set {SPEC_ROOT_ENV} to a directory that holds both files")
    if is_glob:
        parts = PurePath(ref).parts
        first = next(i for i, part in enumerate(parts) if GLOB_CHARACTERS & set(part))
        if ".." in parts[first:]:
            raise MadslError(f"{key} may not leave this {naming}'s directory: {ref} climbs out with '..' after a "
                             "wildcard", where, expected=allowed, hint="write the folders before the wildcard: "
                                                                       "shared/*.mad")
        base = _resolved(home.joinpath(*parts[:first]))
        if base is None or not _inside(base, roots):
            raise MadslError(f"{key} may not leave this {naming}'s directory: {ref} searches "
                             f"{base if base is not None else PurePath(*parts[:first])}", where, expected=allowed,
                             hint=leave_hint)
        matches, escaped = _glob_inside(base, parts[first:], roots)
        if escaped:
            raise MadslError(f"{key} may not leave this {naming}'s directory: {ref} matches through a link that "
                             "leads out of it", where, expected=allowed, hint=leave_hint)
        if not matches:
            raise MadslError(f"{key}: {ref!r} matches no file", where,
                             hint=f"paths are relative to the {naming}'s folder ({naming_file.parent})")
        return matches
    target = _resolved(home / ref)  # symlinks followed: where the file really is
    if target is None or not _inside(target, roots):
        raise MadslError(f"{key} may not leave this {naming}'s directory: {ref} resolves to "
                         f"{target if target is not None else ref}", where, expected=allowed, hint=leave_hint)
    if target.suffix not in SPEC_SUFFIXES:
        raise MadslError(f"{key} must name a spec file ({', '.join(SPEC_SUFFIXES)}), got {ref}"
                         + (f" (a link to {target.name})" if target.name != PurePath(ref).name else ""),
                         where, expected=allowed)
    if not _is(target, file=True):
        raise MadslError(f"{key} names a spec that does not exist: {ref}", where,
                         hint=f"paths are relative to {naming_file.parent}/")
    return [target]


def _resolved(path: Path) -> Path | None:
    try:
        return path.resolve()
    except (OSError, ValueError, RuntimeError):  # a name too long, a link loop
        return None


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path.is_relative_to(root) for root in roots)


def _is(path: Path, *, file: bool) -> bool:
    try:
        return path.is_file() if file else path.is_dir()
    except (OSError, ValueError):
        return False


def _glob_inside(base: Path, parts: tuple[str, ...], roots: list[Path]) -> tuple[list[Path], bool]:
    """The spec files (resolved, sorted by the name they matched as) that the glob `parts`
    matches under `base`, walking only folders that resolve inside `roots`, and whether a
    match or a folder on the way led outside them. As glob.glob: `*` and `?` do not match a
    leading '.', and `**` is `*`."""
    current, escaped = [base], False
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        found: list[Path] = []
        for folder in current:
            if GLOB_CHARACTERS & set(part):
                try:
                    names = os.listdir(folder)
                except OSError:
                    continue
                candidates = [folder / name for name in names if fnmatch.fnmatchcase(name, part)
                              and (part.startswith(".") or not name.startswith("."))]
            else:
                candidates = [folder / part]
            for candidate in candidates:
                real = _resolved(candidate)
                if real is None or not (_is(real, file=True) if last else _is(real, file=False)):
                    continue
                if not _inside(real, roots):
                    escaped = True
                    continue
                if last and real.suffix not in SPEC_SUFFIXES:
                    continue  # a glob picks the spec files among what it matches
                found.append(candidate)
        current = found
    named = sorted(set(current), key=str)
    return list(dict.fromkeys(path.resolve() for path in named)), escaped


def _bundled_glob(name: str, ref: str, key: str, where: Location) -> list[Path]:
    root = _bundled_root(name, where)
    parts = PurePath(name).parts
    if not parts or ".." in parts or PurePath(name).is_absolute():
        raise MadslError(f"no bundled spec {name!r}", where, expected=f"{BUNDLED_PREFIX}NAME with NAME under specs/")
    if PurePath(parts[-1]).suffix not in SPEC_SUFFIXES:
        parts = parts[:-1] + (parts[-1] + ".mad",)
    matches, _ = _glob_inside(root, parts, [root])
    if not matches:
        raise MadslError(f"{key}: {ref!r} matches no bundled spec", where,
                         hint="bundled specs are the .mad files under specs/, such as paper/mamba")
    return matches


def _bundled_root(name: str, where: Location) -> Path:
    root = specs_dir()
    if root is None:
        raise MadslError(f"{name!r} names a bundled spec, but this installation has no bundled specs",
                         where, hint="bundled specs ship with a source checkout of madsl (its specs/ folder)")
    return root.resolve()


def _bundled(name: str, where: Location) -> Path:
    root = specs_dir()
    if root is None:
        raise MadslError(f"extends names the bundled spec {name!r}, but this installation has no bundled specs",
                         where, hint="bundled specs ship with a source checkout of madsl (its specs/ folder)")
    root = root.resolve()
    bundled = sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.mad"))
    target = _resolved(root / name)
    if target is not None and target.suffix not in SPEC_SUFFIXES:
        target = target.with_name(target.name + ".mad")
    if target is None or not target.is_relative_to(root) or not _is(target, file=True):
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

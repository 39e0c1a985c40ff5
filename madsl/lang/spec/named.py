"""Which files a spec or a sweep file may name, resolved before any of them is read.

One read policy covers every file that a spec or a sweep file names (`extends:`, a sweep's
`specs:`, the saved models of a spec's `init:`, `resolve_folder`), because such files come from
pull requests and errors land in CI logs (an unrestricted path would read `/etc/passwd` and print
its lines in a YAML error):

    base.mad                       a relative path to a .mad/.yaml/.yml file in the naming
    shared/base.mad                file's folder or below it (symlinks resolved first), or
                                   anywhere inside $MADSL_SPEC_ROOT (directories joined by ':')
    bundled:paper/mamba            a spec bundled with madsl (specs/ in a source checkout)
    paper/*-sg.mad                 a glob (`specs:` only), expanded inside those folders alone

Absolute paths, `~`, and anything that resolves outside those folders are refused with an
error at the entry, before the file is read. A file reached this way that is not a spec is
reported by name, without printing any of its lines or values (madsl/lang/spec/files.py).
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path, PurePath
from typing import Any

from madsl.errors import Location, MadslError, did_you_mean
from madsl.resources import specs_dir

SPEC_SUFFIXES = (".mad", ".yaml", ".yml")
SPEC_ROOT_ENV = "MADSL_SPEC_ROOT"
BUNDLED_PREFIX = "bundled:"


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
    return (
        f"a relative path{' or glob' if globs else ''} to a {'/'.join(SPEC_SUFFIXES)} file in this "
        f"{naming}'s directory or below (or inside ${SPEC_ROOT_ENV}), or {BUNDLED_PREFIX}NAME for a bundled spec"
    )


def resolve_named(
    ref: str, naming_file: Path, where: Location, *, key: str, naming: str = "spec", globs: bool = False
) -> list[Path]:
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
        name = ref[len(BUNDLED_PREFIX) :]
        return _bundled_glob(name, ref, key, where) if is_glob else [_bundled(name, where)]
    if PurePath(ref).is_absolute() or ref.startswith("~"):
        raise MadslError(
            f"{key} may not name an absolute path: {ref}",
            where,
            expected=allowed,
            hint=f"write the path relative to this {naming}'s directory",
        )
    if is_glob:
        return _glob_named(ref, naming_file, roots, where, key=key, naming=naming, allowed=allowed)
    leave_hint = _leave_hint(home)
    target = _resolved(home / ref)  # symlinks followed: where the file really is
    if target is None or not _inside(target, roots):
        raise MadslError(
            f"{key} may not leave this {naming}'s directory: {ref} resolves to {target if target is not None else ref}",
            where,
            expected=allowed,
            hint=leave_hint,
        )
    if target.suffix not in SPEC_SUFFIXES:
        raise MadslError(
            f"{key} must name a spec file ({', '.join(SPEC_SUFFIXES)}), got {ref}"
            + (f" (a link to {target.name})" if target.name != PurePath(ref).name else ""),
            where,
            expected=allowed,
        )
    if not _is(target, file=True):
        raise MadslError(
            f"{key} names a spec that does not exist: {ref}", where, hint=f"paths are relative to {naming_file.parent}/"
        )
    return [target]


def resolve_folder(ref: Any, naming_file: Path | None, where: Location | None, *, key: str) -> Path:
    """The folder (resolved, symlinks followed) that `ref`, the value of `key` in `naming_file`,
    names, where the read policy lets a spec name it: a relative path in the spec's folder or
    below it, or inside $MADSL_SPEC_ROOT; else a MadslError at `where`, before anything in it is read.
    The folder need not exist yet (what reads it says so where it does not)."""
    allowed = f"a relative path to a folder in this spec's directory or below (or inside ${SPEC_ROOT_ENV})"
    if not isinstance(ref, str) or not ref.strip() or "\0" in ref:
        raise MadslError(f"{key} must be a path to a folder, got {ref!r}", where, expected=allowed)
    if PurePath(ref).is_absolute() or ref.startswith("~"):
        raise MadslError(
            f"{key} may not name an absolute path: {ref}",
            where,
            expected=allowed,
            hint="write the path relative to this spec's directory",
        )
    home = (naming_file.parent if naming_file is not None else Path.cwd()).resolve()
    target = _resolved(home / ref)
    if target is None or not _inside(target, [home] + spec_roots()):
        raise MadslError(
            f"{key} may not leave this spec's directory: {ref} resolves to {target if target is not None else ref}",
            where,
            expected=allowed,
            hint=f"move the folder under {home}/, or set {SPEC_ROOT_ENV} to a directory that holds it",
        )
    if target.exists() and not _is(target, file=False):
        raise MadslError(f"{key} names a file, not a folder: {ref}", where, hint=f"paths are relative to {home}/")
    return target


def _leave_hint(home: Path) -> str:
    return (
        f"move the spec under {home}/, use a bundled spec ({BUNDLED_PREFIX}paper/mamba), "
        f"or set {SPEC_ROOT_ENV} to a directory that holds both files"
    )


def _glob_named(
    ref: str, naming_file: Path, roots: list[Path], where: Location, *, key: str, naming: str, allowed: str
) -> list[Path]:
    """The files a glob `ref` matches inside the allowed folders `roots` (resolve_named, with
    `globs`), sorted; else a MadslError at `where`."""
    home = naming_file.parent.resolve()
    leave_hint = _leave_hint(home)
    parts = PurePath(ref).parts
    first = next(i for i, part in enumerate(parts) if GLOB_CHARACTERS & set(part))
    if ".." in parts[first:]:
        raise MadslError(
            f"{key} may not leave this {naming}'s directory: {ref} climbs out with '..' after a wildcard",
            where,
            expected=allowed,
            hint="write the folders before the wildcard: shared/*.mad",
        )
    base = _resolved(home.joinpath(*parts[:first]))
    if base is None or not _inside(base, roots):
        raise MadslError(
            f"{key} may not leave this {naming}'s directory: {ref} searches "
            f"{base if base is not None else PurePath(*parts[:first])}",
            where,
            expected=allowed,
            hint=leave_hint,
        )
    matches, escaped = _glob_inside(base, parts[first:], roots)
    if escaped:
        raise MadslError(
            f"{key} may not leave this {naming}'s directory: {ref} matches through a link that leads out of it",
            where,
            expected=allowed,
            hint=leave_hint,
        )
    if not matches:
        raise MadslError(
            f"{key}: {ref!r} matches no file",
            where,
            hint=f"paths are relative to the {naming}'s folder ({naming_file.parent})",
        )
    return matches


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
                candidates = [
                    folder / name
                    for name in names
                    if fnmatch.fnmatchcase(name, part) and (part.startswith(".") or not name.startswith("."))
                ]
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
        raise MadslError(
            f"{key}: {ref!r} matches no bundled spec",
            where,
            hint="bundled specs are the .mad files under specs/, such as paper/mamba",
        )
    return matches


def _bundled_root(name: str, where: Location) -> Path:
    root = specs_dir()
    if root is None:
        raise MadslError(
            f"{name!r} names a bundled spec, but this installation has no bundled specs",
            where,
            hint="bundled specs ship with a source checkout of madsl (its specs/ folder)",
        )
    return root.resolve()


def _bundled(name: str, where: Location) -> Path:
    root = specs_dir()
    if root is None:
        raise MadslError(
            f"extends names the bundled spec {name!r}, but this installation has no bundled specs",
            where,
            hint="bundled specs ship with a source checkout of madsl (its specs/ folder)",
        )
    root = root.resolve()
    bundled = sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.mad"))
    target = _resolved(root / name)
    if target is not None and target.suffix not in SPEC_SUFFIXES:
        target = target.with_name(target.name + ".mad")
    if target is None or not target.is_relative_to(root) or not _is(target, file=True):
        raise MadslError(
            f"no bundled spec {name!r}",
            where,
            expected=f"{BUNDLED_PREFIX}NAME, NAME one of the "
            f"specs under specs/ such as paper/mamba or topologies/base-750m",
            hint=did_you_mean(name, bundled),
        )
    return target

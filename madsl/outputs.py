"""Outputs (`compile -o`, `report --plot`, `export -o DIR`): a path is checked before the work
that fills it, and a command writes only the files it names.

A directory, a path under a file or a place that cannot be written is bad input (a
MadslError naming the option and the path, exit 2), found before anything is computed
or written; this module imports nothing heavy, so `madsl compile` stays torch-free.
An output is then written to a temporary file beside it and moved into place (temp_beside).
JSON printed or written is strict JSON: a number that is not finite is null (json_text).

A folder output (`export -o DIR`, `report --plot-sweeps DIR`) is the folder the user named,
symlinks resolved: its files are written into it one by one, each atomically, and nothing in it
is ever deleted. A folder that holds anything the command would not write is refused unless
the user says `--force`, which writes the command's files beside the others and touches
nothing else (check_output_dir).
"""
from __future__ import annotations

import json
import math
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from madsl.errors import MadslError


def check_output_path(path: str | os.PathLike, option: str) -> Path:
    """`path` as a Path, or a MadslError if a file cannot be written there."""
    path = Path(path)
    if str(path).strip() == "":
        raise MadslError(f"{option}: the path is empty")
    if path.is_dir():
        raise MadslError(f"{option} {path}: is a directory", hint="name a file inside it")
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise MadslError(f"{option} {path}: {ancestor} is not a directory")
    if path.exists() and not path.is_file():
        raise MadslError(f"{option} {path}: is not a regular file")
    writable = os.access(path, os.W_OK) if path.exists() else os.access(ancestor, os.W_OK | os.X_OK)
    if not writable:
        raise MadslError(f"{option} {path}: {'the file' if path.exists() else ancestor} is not writable")
    return path


def check_output_dir(path: str | os.PathLike, option: str, owns: Callable[[str], bool], *, force: bool,
                     writes: str) -> Path:
    """The folder `path` names (symlinks resolved; created later by the writer if missing), or a
    MadslError before any work: an empty path, a file, a place that cannot be written, or a
    folder holding entries the command does not write (`owns(name)` False) unless `force`.
    `writes` says what the command puts there, for the messages."""
    if str(path).strip() == "":
        raise MadslError(f"{option}: the path is empty")
    named = Path(path)
    folder = named.resolve()
    shown = named if folder == named.absolute() else f"{named} (-> {folder})"
    ancestor = folder
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        what = "is" if ancestor == folder else f"lies under {ancestor}, which is"
        raise MadslError(f"{option} {shown}: {what} not a directory", hint=f"name a folder: {writes} go into it")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise MadslError(f"{option} {shown}: {ancestor} is not writable")
    if folder.is_dir():
        entries = sorted(os.listdir(folder))
        for name in entries:
            entry = folder / name
            if owns(name) and (entry.is_symlink() or not entry.is_file()):
                raise MadslError(f"{option} {shown}: {name} there is not a regular file",
                                 hint=f"{writes} would replace it; move it away or name another folder")
        foreign = [name for name in entries if not owns(name)]
        if foreign and not force:
            listed = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise MadslError(f"{option} {shown}: the folder holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'}"
                             f" this command did not write ({listed})",
                             hint=f"name a new or empty folder, or add --force to write {writes} beside them "
                                  "(nothing else there is touched)")
    return folder


def write_file_atomic(path: Path, write: Callable[[str], None]) -> None:
    """`write(temporary_name)` fills a temporary file beside `path`, which then replaces `path`
    (a reader never sees half a file; a failed write leaves nothing behind)."""
    fd, tmp = temp_beside(path, suffix=".tmp")
    mode = stat.S_IMODE(os.fstat(fd).st_mode)  # a file written in place's (some writers create 0600 files)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def output_error(err: OSError, path: str | os.PathLike, option: str) -> MadslError:
    """A write that failed anyway (a full disk, a read-only filesystem) as a clear error."""
    return MadslError(f"{option} {path}: cannot be written ({err.strerror or err})")


def temp_beside(path: Path, suffix: str = "") -> tuple[int, str]:
    """A new temporary file beside `path`, to be written and then moved onto it (os.replace):
    an open descriptor and its name. Unlike mkstemp's owner-only 0600 it has the permissions a
    file written in place gets: the existing file's, else those the umask gives a new file (an
    output moved from a 0600 temporary was unreadable to the others its folder is shared with,
    and `madsl fit -o` over a spec changed the spec's mode)."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}{suffix}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
        except FileExistsError:
            continue
        if path.is_file():
            os.fchmod(fd, stat.S_IMODE(path.stat().st_mode))
        return fd, str(tmp)
    raise FileExistsError(f"no free temporary name beside {path}")


def finite_json(value: Any) -> Any:
    """`value` (dicts, lists, tuples, numbers, text) with every NaN or infinity as None: JSON has
    neither, and a reader's parser refuses Python's `NaN` / `Infinity`."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(item) for item in value]
    return value


def json_text(value: Any, **options: Any) -> str:
    """`value` as JSON with unknown (non-finite) numbers as null (`finite_json`); never NaN or Infinity."""
    return json.dumps(finite_json(value), allow_nan=False, **options)

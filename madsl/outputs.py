"""Output files (`compile -o`, `report --plot`): a path is checked before the work that fills it.

A directory, a path under a file or a place that cannot be written is bad input (a
MadslError naming the option and the path, exit 2), found before anything is computed
or written; this module imports nothing heavy, so `madsl compile` stays torch-free.
An output is then written to a temporary file beside it and moved into place (temp_beside).
"""
from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

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

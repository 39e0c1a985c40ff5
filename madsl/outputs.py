"""Output files (`compile -o`, `report --plot`): a path is checked before the work that fills it.

A directory, a path under a file or a place that cannot be written is bad input (a
MadslError naming the option and the path, exit 2), found before anything is computed
or written; this module imports nothing heavy, so `madsl compile` stays torch-free.
"""
from __future__ import annotations

import os
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

"""Outputs (`compile -o`, `report --plot`, `export -o DIR`): a path is checked before the work
that fills it, and a command writes only the files it names.

A directory, a path under a file or a place that cannot be written is bad input (a
MadslError naming the option and the path, exit 2), found before anything is computed
or written; this module imports nothing heavy, so `madsl compile` stays torch-free.
A file madsl writes whole (an output, a checkpoint, a model, a cache entry, token files) is
written atomically by the one implementation here (AtomicFile and its short forms write_atomic,
write_text_atomic, write_bytes_atomic; move_into_place for a folder): a temporary file beside
the target, with the permissions a file written in place gets (temp_beside), flushed and
fsynced, moved onto the target (os.replace) and the folder fsynced, so that a reader sees the
old file or the new one, never half of one, even after a crash or a power loss; a failed
write removes its temporary file.
JSON printed or written is strict JSON: a number that is not finite is null (json_text).

A folder output (`export -o DIR`, `report --plot-sweeps DIR`) is the folder the user named,
symlinks resolved: its files are written into it one by one, each atomically, and nothing in it
is ever deleted. A folder that holds anything the command would not write is refused unless
the user says `--force`, which writes the command's files beside the others and touches
nothing else (check_output_dir).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

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


def check_output_dir(
    path: str | os.PathLike,
    option: str,
    owns: Callable[[str], bool],
    *,
    force: bool,
    writes: str,
    owns_folders: Callable[[str], bool] = lambda name: False,
) -> Path:
    """The folder `path` names (symlinks resolved; created later by the writer if missing), or a
    MadslError before any work: an empty path, a file, a place that cannot be written, or a
    folder holding entries the command does not write (`owns(name)` False: its files;
    `owns_folders(name)`: its folders, such as a tracker's run folders) unless `force`.
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
            if owns_folders(name) and (entry.is_symlink() or not entry.is_dir()):
                raise MadslError(
                    f"{option} {shown}: {name} there is not a folder",
                    hint=f"{writes} would go into it; move it away or name another folder",
                )
            if owns(name) and not owns_folders(name) and (entry.is_symlink() or not entry.is_file()):
                raise MadslError(
                    f"{option} {shown}: {name} there is not a regular file",
                    hint=f"{writes} would replace it; move it away or name another folder",
                )
        foreign = [name for name in entries if not owns(name) and not owns_folders(name)]
        if foreign and not force:
            listed = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise MadslError(
                f"{option} {shown}: the folder holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'}"
                f" this command did not write ({listed})",
                hint=f"name a new or empty folder, or add --force to write {writes} beside them "
                "(nothing else there is touched)",
            )
    return folder


def output_error(err: OSError, path: str | os.PathLike, option: str) -> MadslError:
    """A write that failed anyway (a full disk, a read-only filesystem) as a clear error."""
    return MadslError(f"{option} {path}: cannot be written ({err.strerror or err})")


def temp_beside(path: Path, suffix: str = "", tag: str = "") -> tuple[int, str]:
    """A new temporary file `.<name>.[<tag>.]<random><suffix>` beside `path`, to be written and then
    moved onto it: an open descriptor and its name. Created with O_EXCL, so a link planted at the
    name is never followed. Unlike mkstemp's owner-only 0600 it has the permissions a file written
    in place gets: the existing file's, else those the umask gives a new file (an output moved
    from a 0600 temporary was unreadable to the others its folder is shared with, and
    `madsl fit -o` over a spec changed the spec's mode). AtomicFile is what uses it."""
    tag = f"{tag}." if tag else ""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{tag}{secrets.token_hex(4)}{suffix}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
        except FileExistsError:
            continue
        if path.is_file():
            os.fchmod(fd, stat.S_IMODE(path.stat().st_mode))
        return fd, str(tmp)
    raise FileExistsError(f"no free temporary name beside {path}")


# a folder that cannot be opened or fsynced here (another platform, a file system without it): the
# rename is done, and there is nothing more to ask of it
_NO_FOLDER_SYNC = {
    errno.EINVAL,
    errno.EBADF,
    errno.EACCES,
    errno.EPERM,
    errno.EISDIR,
    getattr(errno, "ENOTSUP", errno.EINVAL),
    getattr(errno, "EOPNOTSUPP", errno.EINVAL),
}


def fsync_folder(folder: str | os.PathLike) -> None:
    """Make a rename in `folder` durable (its entry survives a power loss)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as err:
        if err.errno in _NO_FOLDER_SYNC:
            return
        raise
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in _NO_FOLDER_SYNC:
            raise
    finally:
        os.close(fd)


class AtomicFile:
    """A file written under a temporary name beside `path` (temp_beside) and moved onto it whole.

    `file` is open for writing (`mode`, `encoding`). commit() flushes and fsyncs it, moves it onto
    `path` (os.replace: a link at `path` is replaced, never followed) and fsyncs the folder;
    discard() closes and removes it; commit() discards it when it fails. As a context manager it
    gives the open file, commits when the block ends and discards when the block raises. `tag`
    goes into the temporary's name (a checkpoint's host and pid, to find a killed writer's)."""

    def __init__(
        self,
        path: str | os.PathLike,
        mode: str = "wb",
        *,
        encoding: str | None = None,
        suffix: str = ".tmp",
        tag: str = "",
    ):
        self.path = Path(path)
        fd, self.name = temp_beside(self.path, suffix, tag)
        try:
            self.mode = stat.S_IMODE(os.fstat(fd).st_mode)
            self.file: IO[Any] = os.fdopen(fd, mode, encoding=encoding)
        except BaseException:
            os.close(fd)
            Path(self.name).unlink(missing_ok=True)
            raise

    def commit(self) -> Path:
        """fsync, move onto the target, fsync the folder; the target's path."""
        try:
            if self.file.closed:  # filled by name (write_atomic): fsync what is there now
                fd = os.open(self.name, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            else:
                self.file.flush()
                os.fsync(self.file.fileno())
                self.file.close()
            os.replace(self.name, self.path)
        except BaseException:
            self.discard()
            raise
        fsync_folder(self.path.parent)
        return self.path

    def discard(self) -> None:
        """Close and remove the temporary file (the target stays as it was)."""
        with contextlib.suppress(OSError):
            self.file.close()
        with contextlib.suppress(OSError):  # the folder itself may be what failed
            Path(self.name).unlink(missing_ok=True)

    def __enter__(self) -> IO[Any]:
        return self.file

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()


def write_atomic(path: str | os.PathLike, write: Callable[[str], None], *, suffix: str = ".tmp") -> Path:
    """`write(temporary_name)` fills a temporary file beside `path` (for writers that take a file
    name: safetensors, matplotlib), which is then committed as AtomicFile does; the temporary gets
    the permissions rule back afterwards (some writers create owner-only files)."""
    atomic = AtomicFile(path, suffix=suffix)
    atomic.file.close()
    try:
        write(atomic.name)
        os.chmod(atomic.name, atomic.mode)
    except BaseException:
        atomic.discard()
        raise
    return atomic.commit()


def write_text_atomic(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """`text` into `path`, atomically and durably (AtomicFile)."""
    with AtomicFile(path, "w", encoding=encoding) as f:
        f.write(text)
    return Path(path)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """`data` into `path`, atomically and durably (AtomicFile)."""
    with AtomicFile(path) as f:
        f.write(data)
    return Path(path)


def move_into_place(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Rename `source` (a folder written whole beside `target`) onto `target`, durably: the
    folder-level form of AtomicFile.commit, for a kept model's staging folder."""
    os.replace(source, target)
    fsync_folder(Path(target).parent)


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

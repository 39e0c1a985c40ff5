"""Checkpoint files: written atomically, read as data only.

A checkpoint lives beside a results database that others may be able to write to,
so reading one must never run code: files are loaded with `torch.load(...,
weights_only=True)`, whose unpickler builds tensors and plain containers (dict,
list, tuple, str, numbers, None) and refuses everything else. What a run keeps
is stored in those forms (numpy's RNG state as a tensor, not an ndarray).

A file is a madsl checkpoint when it loads that way and carries the format tag
and a version this madsl reads; anything else (a planted pickle, garbage bytes,
a truncated file, another program's torch file) is a `CheckpointError` naming
the file, and is neither executed nor touched. A symbolic link at the checkpoint or
its folder is refused the same way (never followed, never deleted), and a read or a
write that fails says why in words, with the path: "no space left on device" (also
where torch.save reports a full disk as "unexpected pos ..."), "permission denied",
"not a directory".
"""

from __future__ import annotations

import errno
import glob
import os
import pickle
import random
import socket
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from madsl.errors import Location, MadslError
from madsl.oserrors import os_error_words
from madsl.outputs import AtomicFile
from madsl.runner.common.process import pid_alive

FORMAT = "madsl-checkpoint"
VERSION = 2  # 1: madsl before data-only checkpoints (numpy arrays inside; no longer read)


class CheckpointError(MadslError):
    """A file at a checkpoint path that is not a checkpoint this madsl can resume from."""

    def __init__(self, path: Path, problem: str, hint: str | None = None):
        super().__init__(
            f"checkpoint {path} {problem}",
            Location(file=str(path)),
            hint=hint or "it was not loaded; delete it to start this run over",
        )
        self.path = path

    def __str__(self) -> str:  # what a failed run records: the problem and what to do
        return f"{self.message} ({self.hint})"


class CheckpointWriteError(CheckpointError):
    """A checkpoint that could not be written, and why in words (a full disk, permissions)."""

    def __init__(self, path: Path, err: OSError):
        words = os_error_words(err)
        where = f" ({err.filename})" if err.filename and str(err.filename) != str(path) else ""
        hint = {
            errno.ENOSPC: "free disk space and rerun: the run resumes from its last checkpoint",
            getattr(errno, "EDQUOT", -1): "free disk space and rerun: the run resumes from its last checkpoint",
            errno.ENOTDIR: f"a file stands where the folder {path.parent} belongs (or above it): move it away",
            errno.EACCES: f"make {path.parent} writable, or pass another --db",
            errno.EPERM: f"make {path.parent} writable, or pass another --db",
            errno.EROFS: "pass a --db on a writable file system",
        }.get(err.errno, "fix it and rerun")
        super().__init__(path, f"could not be written: {words}{where}", hint=hint)
        self.errno = err.errno


def _refuse_links(path: Path) -> None:
    """A symbolic link at the checkpoint or its folder: not madsl's, so neither followed nor deleted."""
    hint = "it and what it points to were left as they are; remove the link and rerun"
    if os.path.islink(path.parent):
        raise CheckpointError(
            path,
            f"lies in {path.parent}, a symbolic link: madsl does not follow links inside its results folder",
            hint=hint,
        )
    if os.path.islink(path):
        raise CheckpointError(
            path, "is a symbolic link: madsl does not follow links inside its results folder", hint=hint
        )


class _Sink:
    """The file torch.save writes through, keeping the OSError of a failed write: torch reports
    one as a RuntimeError of its own ("unexpected pos 463296 vs 463188")."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def flush(self) -> None:
        self.f.flush()


def _os_error_under(err: BaseException) -> OSError | None:
    """An OSError among the exceptions `err` was raised from or while handling."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def _disk_full(folder: Path, tmp: Path) -> OSError | None:
    """ENOSPC where the file system of `folder` has (almost) no space left for an unprivileged writer."""
    try:
        fs = os.statvfs(folder)
    except OSError:
        return None
    return (
        OSError(errno.ENOSPC, "No space left on device", str(tmp)) if fs.f_bavail * fs.f_frsize < 1024 * 1024 else None
    )


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Atomic and durable (madsl.outputs.AtomicFile): a temporary file beside it, fsynced, renamed
    over the old one, the folder fsynced.

    A write that fails (a full disk, an interrupt) removes its temporary file and leaves
    the previous checkpoint as it was; one that fails for the file system (a full disk,
    permissions, a file where the folder belongs) is a CheckpointWriteError saying so.
    A symbolic link at the checkpoint or its folder is a CheckpointError, left as it is.
    """
    _refuse_links(path)
    if path.parent.exists() and not path.parent.is_dir():
        raise CheckpointWriteError(path, OSError(errno.ENOTDIR, "Not a directory", str(path.parent)))
    atomic = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a new file (O_EXCL: never through a link planted at the name), named by host and pid
        atomic = AtomicFile(path, tag=f"{_HOST}.{os.getpid()}")
        sink = _Sink(atomic.file)
        try:
            torch.save({"format": FORMAT, "version": VERSION, **state}, sink)
        except RuntimeError as err:  # torch's own report of a failed write: find the real reason
            cause = sink.error or _os_error_under(err) or _disk_full(path.parent, Path(atomic.name))
            if cause is None:
                raise
            raise cause from None
        atomic.commit()
    except BaseException as err:
        if atomic is not None:
            atomic.discard()
        if isinstance(err, OSError):
            raise CheckpointWriteError(path, err) from None
        raise
    _remove_stale_temporaries(path)


_HOST = socket.gethostname().replace(".", "-").replace("/", "-") or "host"


def _remove_stale_temporaries(path: Path) -> None:
    """Temporary files that a process killed mid-write (kill -9) left beside `path`.

    Only this host's, and only those whose process is gone: a checkpoint folder may be
    shared by machines (a distributed executor), whose pids mean nothing here.
    """
    prefix = f".{path.name}.{_HOST}."
    for tmp in path.parent.glob(f"{glob.escape(prefix)}*.tmp"):
        pid = tmp.name[len(prefix) : -len(".tmp")].split(".")[0]  # .<name>.<host>.<pid>[.<random>].tmp
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)) and not tmp.is_symlink():
            tmp.unlink(missing_ok=True)


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    """The checkpoint at `path` (None if there is none); raises CheckpointError for anything else
    (a symbolic link at it or its folder included: not followed)."""
    _refuse_links(path)
    try:
        f = open(path, "rb", opener=_no_follow)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise CheckpointError(path, "is a directory, not a checkpoint") from None
    except OSError as err:
        hint = (
            f"a file stands where the folder {path.parent} belongs (or above it): move it away"
            if err.errno == errno.ENOTDIR
            else "fix it and rerun"
        )
        raise CheckpointError(path, f"cannot be read: {os_error_words(err)}", hint=hint) from None
    try:
        with f, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about pickles it did not write; the error says it
            data = torch.load(f, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # never suggest weights_only=False, as torch's own message does: that is the hole
        raise CheckpointError(
            path,
            "holds Python objects beyond tensors and plain data (unpickling it "
            "could run code), or is a checkpoint of madsl before format 2",
        ) from None
    except Exception as err:  # noqa: BLE001 - truncated zip, garbage bytes, a directory, unreadable: all the same
        raise CheckpointError(path, f"is not a readable checkpoint ({type(err).__name__})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(path, f"is not a madsl checkpoint (no '{FORMAT}' format tag)")
    if data.get("version") != VERSION:
        raise CheckpointError(path, f"has checkpoint format {data.get('version')!r}; this madsl reads {VERSION}")
    return data


def _no_follow(name: str, flags: int) -> int:
    return os.open(name, flags | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))


def rng_state() -> dict[str, Any]:
    """torch, numpy and Python RNG states, as tensors and plain data."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "bit_generator": str(name),
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    numpy = state["numpy"]
    np.random.set_state(
        (
            numpy["bit_generator"],
            numpy["keys"].numpy().astype(np.uint32),
            numpy["pos"],
            numpy["has_gauss"],
            numpy["cached_gaussian"],
        )
    )
    python = state["python"]
    random.setstate((python["version"], tuple(python["internal"]), python["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

"""Checkpoint files: written atomically, read as data only.

A checkpoint lives beside a results database that others may be able to write to,
so reading one must never run code: files are loaded with `torch.load(...,
weights_only=True)`, whose unpickler builds tensors and plain containers (dict,
list, tuple, str, numbers, None) and refuses everything else. What a run keeps
is stored in those forms (numpy's RNG state as a tensor, not an ndarray).

A file is a madsl checkpoint when it loads that way and carries the format tag
and a version this madsl reads; anything else (a planted pickle, garbage bytes,
a truncated file, another program's torch file) is a `CheckpointError` naming
the file, and is neither executed nor touched.
"""
from __future__ import annotations

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
from madsl.runner.store import pid_alive

FORMAT = "madsl-checkpoint"
VERSION = 2  # 1: madsl before data-only checkpoints (numpy arrays inside; no longer read)


class CheckpointError(MadslError):
    """A file at a checkpoint path that is not a checkpoint this madsl can resume from."""

    def __init__(self, path: Path, problem: str, hint: str | None = None):
        super().__init__(f"checkpoint {path} {problem}", Location(file=str(path)),
                         hint=hint or "it was not loaded; delete it to start this run over")
        self.path = path

    def __str__(self) -> str:  # what a failed run records: the problem and what to do
        return f"{self.message} ({self.hint})"


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Atomic: write a temporary file beside it, fsync, then rename over the old one.

    A write that fails (a full disk, an interrupt) removes its temporary file and leaves
    the previous checkpoint as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{_HOST}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save({"format": FORMAT, "version": VERSION, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
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
        pid = tmp.name[len(prefix):-len(".tmp")]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            tmp.unlink(missing_ok=True)


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    """The checkpoint at `path` (None if there is none); raises CheckpointError for anything else."""
    try:
        with open(path, "rb") as f, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about pickles it did not write; the error says it
            data = torch.load(f, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        return None
    except pickle.UnpicklingError:
        # never suggest weights_only=False, as torch's own message does: that is the hole
        raise CheckpointError(path, "holds Python objects beyond tensors and plain data (unpickling it "
                                    "could run code), or is a checkpoint of madsl before format 2") from None
    except Exception as err:  # noqa: BLE001 - truncated zip, garbage bytes, a directory, unreadable: all the same
        raise CheckpointError(path, f"is not a readable checkpoint ({type(err).__name__})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(path, f"is not a madsl checkpoint (no '{FORMAT}' format tag)")
    if data.get("version") != VERSION:
        raise CheckpointError(path, f"has checkpoint format {data.get('version')!r}; this madsl reads {VERSION}")
    return data


def rng_state() -> dict[str, Any]:
    """torch, numpy and Python RNG states, as tensors and plain data."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"bit_generator": str(name), "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    numpy = state["numpy"]
    np.random.set_state((numpy["bit_generator"], numpy["keys"].numpy().astype(np.uint32), numpy["pos"],
                         numpy["has_gauss"], numpy["cached_gaussian"]))
    python = state["python"]
    random.setstate((python["version"], tuple(python["internal"]), python["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

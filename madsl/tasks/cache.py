"""On-disk cache of generated splits (.npz), keyed by everything that determines the arrays.

key = sha256 of (task name, sorted settings, split, seed, GENERATOR_VERSION); a task
generated under other conventions than madsl's names them after its name ("compression@mad-lab").
Bump GENERATOR_VERSION whenever any generator's output changes, so stale
files are never read. Files are written to a temporary name and renamed
(os.replace), so a reader never sees a partial file, even with several
processes filling the same cache.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from madsl.tasks.base import Split, Task, TaskData

GENERATOR_VERSION = 1
_SMALL = np.int16  # token arrays are stored narrow when they fit, and read back as int64


def _json_default(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else str(value)  # numpy scalars as plain numbers


def default_cache_dir() -> Path:
    return Path(os.environ.get("MADSL_CACHE") or Path.home() / ".cache" / "madsl")


def cache_key(task_name: str, settings: Mapping[str, Any], split: Split, seed: int) -> str:
    identity = [task_name, sorted(settings.items()), split, int(seed), GENERATOR_VERSION]
    return hashlib.sha256(json.dumps(identity, default=_json_default).encode()).hexdigest()


def cache_path(task: Task, settings: Mapping[str, Any], split: Split, seed: int,
               cache_dir: str | os.PathLike | None = None) -> Path:
    full = task.settings(**settings)  # baseline-filled: equal settings share one file
    conventions = getattr(task, "conventions", "madsl")
    key = cache_key(task.name if conventions == "madsl" else f"{task.name}@{conventions}", full, split, seed)
    return Path(cache_dir or default_cache_dir()) / f"{task.name}-{split}-{key[:24]}.npz"


def load_or_generate(task: Task, settings: Mapping[str, Any], split: Split, seed: int,
                     cache_dir: str | os.PathLike | None = None) -> TaskData:
    """The split from the cache if present (and readable), else generated and stored."""
    path = cache_path(task, settings, split, seed, cache_dir)
    if path.exists():
        try:
            return _read(path)
        except (OSError, ValueError, KeyError, EOFError):
            pass  # unreadable (e.g. disk trouble): regenerate and overwrite
    data = task.generate(task.settings(**settings), split, seed)
    _write_atomic(path, data)
    return data


def _narrow(array: np.ndarray) -> np.ndarray:
    info = np.iinfo(_SMALL)
    if array.dtype == np.int64 and array.size and info.min <= array.min() and array.max() <= info.max:
        return array.astype(_SMALL)
    return array


def _write_atomic(path: Path, data: TaskData) -> None:
    arrays = {"inputs": _narrow(data.inputs), "targets": _narrow(data.targets)}
    plain = {}
    for key, value in data.meta.items():
        if isinstance(value, np.ndarray):
            arrays[f"meta.{key}"] = value
        else:
            plain[key] = value
    arrays["meta.json"] = np.array(json.dumps(plain, default=_json_default))
    arrays["dtypes.json"] = np.array(json.dumps({k: str(v.dtype) for k, v in
                                                 {"inputs": data.inputs, "targets": data.targets}.items()}))
    save_npz_atomic(path, arrays)


def save_npz_atomic(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez via a temporary file in the same folder: readers never see half a file, and a
    failed write leaves nothing behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read(path: Path) -> TaskData:
    with np.load(path, allow_pickle=False) as npz:
        dtypes = json.loads(str(npz["dtypes.json"]))
        meta: dict[str, Any] = json.loads(str(npz["meta.json"]))
        for name in npz.files:
            if name.startswith("meta.") and name != "meta.json":
                meta[name[len("meta."):]] = npz[name]
        return TaskData(npz["inputs"].astype(dtypes["inputs"]), npz["targets"].astype(dtypes["targets"]), meta)

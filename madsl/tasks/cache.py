"""On-disk cache of generated splits (.npz), keyed by everything that determines the arrays.

key = sha256 of (task name, sorted settings, split, seed, GENERATOR_VERSION); a task
generated under other conventions than madsl's names them after its name ("compression@mad-lab").
Bump GENERATOR_VERSION whenever any generator's output changes, so stale
files are never read. Files are written atomically (madsl.outputs.AtomicFile),
so a reader never sees a partial file, even with several
processes filling the same cache.

A cache folder can be written by others (a results folder's `data/`), so a file is read as
untrusted input: its arrays' headers are checked before anything is allocated (keys, dtypes,
shapes: those a generation of two rows of the same setting has, at the setting's row count),
then their values (tokens inside the vocabulary, targets inside the classes, finite numbers).
A file that fails any check (truncated, damaged, planted) is deleted with a RuntimeWarning and
generated again. A symbolic link (the file, or the folder when the caller names it) is refused
with a MadslError and left as it is, as is anything else that is not a regular file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import warnings
import zipfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from madsl.errors import MadslError
from madsl.tasks.base import IGNORE, Split, Task, TaskData

GENERATOR_VERSION = 1
_SMALL = np.int16  # token arrays are stored narrow when they fit, and read back as int64


def _json_default(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else str(value)  # numpy scalars as plain numbers


def default_cache_dir() -> Path:
    return Path(os.environ.get("MADSL_CACHE") or Path.home() / ".cache" / "madsl")


def cache_key(task_name: str, settings: Mapping[str, Any], split: Split, seed: int) -> str:
    identity = [task_name, sorted(settings.items()), split, int(seed), GENERATOR_VERSION]
    return hashlib.sha256(json.dumps(identity, default=_json_default).encode()).hexdigest()


def cache_path(
    task: Task, settings: Mapping[str, Any], split: Split, seed: int, cache_dir: str | os.PathLike | None = None
) -> Path:
    full = task.settings(**settings)  # baseline-filled: equal settings share one file
    conventions = getattr(task, "conventions", "madsl")
    key = cache_key(task.name if conventions == "madsl" else f"{task.name}@{conventions}", full, split, seed)
    return Path(cache_dir or default_cache_dir()) / f"{task.name}-{split}-{key[:24]}.npz"


def load_or_generate(
    task: Task, settings: Mapping[str, Any], split: Split, seed: int, cache_dir: str | os.PathLike | None = None
) -> TaskData:
    """The split from the cache if present and valid for its setting, else generated and stored.

    A cached file that cannot be read or does not hold what the setting generates is deleted
    (with a RuntimeWarning) and generated again; a symbolic link at the file (or at `cache_dir`,
    when given: a results folder's `data/`) or a file that is not a regular one is a MadslError
    naming it, and is left as it is. A write that fails (a full disk) only warns: it is a cache."""
    path = cache_path(task, settings, split, seed, cache_dir)
    _refuse_links(path, folder=cache_dir is not None)
    if os.path.lexists(path):
        try:
            return _read_checked(path, task, settings, split, seed)
        except _NotRegular:
            raise MadslError(
                f"{path} is not a regular file: madsl does not read it as its data cache "
                "(it was left as it is; remove it and rerun)"
            ) from None
        except Exception as err:  # noqa: BLE001 - whatever is wrong with the file, it is generated again
            _refuse_links(path, folder=cache_dir is not None)  # one planted since: refused, not replaced
            _discard(path, err)
    data = task.generate(task.settings(**settings), split, seed)
    try:
        _write_atomic(path, data)
    except OSError as err:
        warnings.warn(
            f"{path}: the generated data could not be cached ({_os_words(err)}); it is generated "
            "again when next needed",
            RuntimeWarning,
            stacklevel=2,
        )
    return data


class _NotRegular(Exception):
    """The cache path names a folder, a FIFO or a device: not a file madsl wrote."""


def _refuse_links(path: Path, folder: bool) -> None:
    for link in ([path.parent] if folder else []) + [path]:
        if os.path.islink(link):
            raise MadslError(
                f"{link} is a symbolic link: madsl does not follow links inside its data cache "
                "(it and what it points to were left as they are; remove the link and rerun)"
            )


def _discard(path: Path, err: BaseException) -> None:
    """Delete a cached file that failed its checks (madsl wrote it: it is a regular file, no link)."""
    reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            os.unlink(path)
            deleted = "deleted"
        else:
            deleted = "not deleted (not a regular file)"
    except FileNotFoundError:
        deleted = "gone"
    except OSError as unlink_err:
        deleted = f"not deleted ({_os_words(unlink_err)})"
    warnings.warn(
        f"{path}: not a valid cached split of its setting ({type(err).__name__}: {reason}); "
        f"{deleted}, and generated again",
        RuntimeWarning,
        stacklevel=3,
    )


def _os_words(err: OSError) -> str:
    from madsl.oserrors import os_error_words  # the one table of words for errno

    return os_error_words(err)


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
    arrays["dtypes.json"] = np.array(
        json.dumps({k: str(v.dtype) for k, v in {"inputs": data.inputs, "targets": data.targets}.items()})
    )
    save_npz_atomic(path, arrays)


def save_npz_atomic(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez via a temporary file in the same folder: readers never see half a file, and a
    failed write leaves nothing behind."""
    from madsl.outputs import AtomicFile

    path.parent.mkdir(parents=True, exist_ok=True)
    with AtomicFile(path) as f:
        np.savez(f, **arrays)


def _read(path: Path) -> TaskData:
    """A cached split as it was written (no checks: `_read_checked` is what the cache reads with)."""
    with np.load(path, allow_pickle=False) as npz:
        dtypes = json.loads(str(npz["dtypes.json"]))
        meta: dict[str, Any] = json.loads(str(npz["meta.json"]))
        for name in npz.files:
            if name.startswith("meta.") and name != "meta.json":
                meta[name[len("meta.") :]] = npz[name]
        return TaskData(npz["inputs"].astype(dtypes["inputs"]), npz["targets"].astype(dtypes["targets"]), meta)


# --- reading a cached file as untrusted input ----------------------------------------------------

PROBE_ROWS = 2  # rows of the generation whose arrays say what the setting's arrays look like
MAX_JSON_CHARS = 1 << 20  # meta.json, dtypes.json: a few hundred characters as madsl writes them
JSON_KEYS = ("meta.json", "dtypes.json")
DATA_KEYS = ("inputs", "targets")
PLAIN_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "float16", "float32", "float64", "bool")


class CacheFileError(ValueError):
    """A cached file that is not what madsl writes for its setting."""


def _read_checked(path: Path, task: Task, settings: Mapping[str, Any], split: Split, seed: int) -> TaskData:
    """The split in `path`, checked against what the setting generates before and after loading."""
    full = task.settings(**settings)
    rows = full.get(f"num_{split}_examples")
    rows = rows if isinstance(rows, int) and not isinstance(rows, bool) and rows >= 0 else None
    probe = _probe(task, full, split, seed)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise _NotRegular()
        size = os.fstat(f.fileno()).st_size
        with np.load(f, allow_pickle=False) as npz:
            headers = _headers(npz, size)
            _check_headers(headers, probe, rows)
            dtypes = _json(npz["dtypes.json"], "dtypes.json")
            meta = _json(npz["meta.json"], "meta.json")
            _check_json(dtypes, meta, probe)
            arrays = {name: npz[name] for name in headers if name not in JSON_KEYS}
    data = TaskData(
        arrays.pop("inputs").astype(dtypes["inputs"]),
        arrays.pop("targets").astype(dtypes["targets"]),
        {**meta, **{name[len("meta.") :]: array for name, array in arrays.items()}},
    )
    _check_values(data, task, full)
    return data


def _probe(task: Task, full: Mapping[str, Any], split: Split, seed: int) -> TaskData | None:
    """The setting generated at PROBE_ROWS rows (None where the rows are not a setting, or it fails)."""
    if not {"num_train_examples", "num_test_examples"} <= set(full):
        return None
    try:
        return task.generate(
            task.settings(**{**full, "num_train_examples": PROBE_ROWS, "num_test_examples": PROBE_ROWS}), split, seed
        )
    except Exception:  # noqa: BLE001 - a task that cannot make so few rows: the contract's checks only
        return None


def _headers(npz: Any, size: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each array's (shape, dtype) from its .npy header, nothing allocated: stored uncompressed (as
    np.savez writes), its data no larger than the member (which is no larger than the file)."""
    headers = {}
    members = {info.filename: info for info in npz.zip.infolist()}
    for name in npz.files:
        info = members.get(f"{name}.npy")
        if info is None:
            raise CacheFileError(f"{name} is not an array")
        if info.compress_type != zipfile.ZIP_STORED or info.file_size > size:
            raise CacheFileError(f"{name} is not stored as np.savez stores it")
        with npz.zip.open(info) as member:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(member)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(member)
            else:
                raise CacheFileError(f"{name}: .npy format {version}")
        if dtype.hasobject or fortran:
            raise CacheFileError(f"{name}: not a plain array ({dtype})")
        if math.prod(shape) * dtype.itemsize > info.file_size:
            raise CacheFileError(f"{name}: its header claims {shape} of {dtype}, more than the file holds")
        headers[name] = (tuple(shape), dtype)
    return headers


def _check_headers(headers: dict, probe: TaskData | None, rows: int | None) -> None:
    for name in (*DATA_KEYS, *JSON_KEYS):
        if name not in headers:
            raise CacheFileError(f"no {name}")
    for name in JSON_KEYS:
        shape, dtype = headers[name]
        if shape != () or dtype.kind != "U" or dtype.itemsize > 4 * MAX_JSON_CHARS:
            raise CacheFileError(f"{name} is not a JSON text")
    for name in DATA_KEYS:
        shape, dtype = headers[name]
        if not shape or (rows is not None and shape[0] != rows) or dtype.name not in PLAIN_DTYPES:
            raise CacheFileError(f"{name}: {shape} of {dtype}, expected {rows} rows of numbers")
    if headers["targets"][0][0] != headers["inputs"][0][0]:
        raise CacheFileError("inputs and targets have different row counts")
    extra = sorted(set(headers) - {*DATA_KEYS, *JSON_KEYS})
    if any(not name.startswith("meta.") for name in extra):
        raise CacheFileError(f"unexpected entry {next(n for n in extra if not n.startswith('meta.'))!r}")
    if probe is None:
        return
    expected_meta = {f"meta.{key}" for key, value in probe.meta.items() if isinstance(value, np.ndarray)}
    if set(extra) != expected_meta:
        raise CacheFileError(f"meta arrays {sorted(extra)}, expected {sorted(expected_meta)}")
    n = headers["inputs"][0][0]
    for name, want in (("inputs", probe.inputs), ("targets", probe.targets)):
        shape, dtype = headers[name]
        narrowed = want.dtype == np.int64 and dtype == _SMALL  # stored narrow, read back wide
        if shape[1:] != want.shape[1:] or not (dtype == want.dtype or narrowed):
            raise CacheFileError(f"{name}: {shape} of {dtype}, expected {(n, *want.shape[1:])} of {want.dtype}")
    for name in extra:
        shape, dtype = headers[name]
        want = probe.meta[name[len("meta.") :]]
        if (
            dtype != want.dtype
            or len(shape) != want.ndim
            or shape[1:] != want.shape[1:]
            or (shape and shape[0] not in (want.shape[0], n))
        ):
            raise CacheFileError(f"{name}: {shape} of {dtype}, expected {want.shape} of {want.dtype}")


def _json(array: np.ndarray, name: str) -> Any:
    text = str(array)
    if len(text) > MAX_JSON_CHARS:
        raise CacheFileError(f"{name} is too long")
    try:
        return json.loads(text)
    except RecursionError:
        raise CacheFileError(f"{name} is nested too deeply") from None


def _check_json(dtypes: Any, meta: Any, probe: TaskData | None) -> None:
    if (
        not isinstance(dtypes, dict)
        or set(dtypes) != set(DATA_KEYS)
        or any(not isinstance(v, str) or v not in PLAIN_DTYPES for v in dtypes.values())
    ):
        raise CacheFileError(f"dtypes.json is not a dtype per array: {str(dtypes)[:100]}")
    if not isinstance(meta, dict):
        raise CacheFileError("meta.json is not an object")
    if probe is None:
        return
    if dtypes != {"inputs": str(probe.inputs.dtype), "targets": str(probe.targets.dtype)}:
        raise CacheFileError(
            f"dtypes.json says {dtypes}; the setting generates {probe.inputs.dtype} and {probe.targets.dtype}"
        )
    plain = {k: v for k, v in probe.meta.items() if not isinstance(v, np.ndarray)}
    plain = json.loads(json.dumps(plain, default=_json_default))  # as it is stored
    if set(meta) != set(plain):
        raise CacheFileError(f"meta.json has keys {sorted(meta)}, expected {sorted(plain)}")
    for key, want in plain.items():
        if type(meta[key]) is not type(want):
            raise CacheFileError(f"meta.json: {key} is a {type(meta[key]).__name__}, expected a {type(want).__name__}")
    if "compression_position" in plain and meta["compression_position"] != plain["compression_position"]:
        raise CacheFileError(
            f"meta.json: compression_position {meta['compression_position']!r}, "
            f"expected {plain['compression_position']!r}"
        )


def _check_values(data: TaskData, task: Task, full: Mapping[str, Any]) -> None:
    """Tokens inside the vocabulary, class targets inside the classes (or IGNORE), finite numbers
    (NaN allowed in real-valued targets: unscored positions): what training can index and sum."""
    try:
        vocab, classes = int(task.vocab_size(full)), int(task.num_classes(full))
    except Exception:  # noqa: BLE001 - a task without them: its values are not bounded here
        vocab = classes = None
    inputs, targets = data.inputs, data.targets
    if inputs.dtype.kind in "iub":
        if inputs.size and (inputs.min() < 0 or (vocab is not None and inputs.max() >= max(vocab, 1))):
            raise CacheFileError(f"inputs: tokens {inputs.min()}..{inputs.max()} outside the vocabulary of {vocab}")
    elif not np.isfinite(inputs).all():
        raise CacheFileError("inputs: values that are not finite")
    if targets.dtype.kind in "iub":
        scored = targets[targets != IGNORE]
        if scored.size and (scored.min() < 0 or (classes is not None and scored.max() >= max(classes, 1))):
            raise CacheFileError(f"targets: classes {scored.min()}..{scored.max()} outside 0..{classes}")
    elif np.isinf(targets).any():
        raise CacheFileError("targets: infinite values")

"""Token files checked once: each file's sha256 and vocabulary check, remembered.

Opening a folder (madsl.corpus.tokens.open_tokens) checks every token file before a step runs:
its sha256 against tokens.json's files_sha256 (a run's identity is tokens.json's hash, so files
swapped for other tokens of the same size must not pass as the data a study already trained on)
and every id below the vocabulary. `scan_file` does both in one chunked pass (SCAN_CHUNK_BYTES at
a time, one vectorised max per chunk): about 0.7 s per GB read from the page cache on one core of
the development machine (sha256 alone takes as long; a cold disk is slower).

A file checked is remembered in cache_dir()/token-checks.json (madsl.paths.cache_dir) under a key
of what identifies its bytes without reading them: its resolved path, size, modification and
change times (ns), inode and device, and the dtype and vocabulary it was checked against; the
value is the sha256 found. Reopening a file whose key is remembered with the sha256 recorded costs
a stat and reading the cache (about 0.4 ms a folder). A file written since has another
change time, so another key. `prepare` remembers the files it writes (it hashed and checked them
as it wrote them).

The cache is untrusted input: one that is a link, not a regular file, larger than MAX_BYTES, not
JSON or not in the layout below is ignored (the files are checked again), never an error. It is
written atomically, and where it cannot be written (a read-only home) nothing is remembered.

    {"format": 1, "files": {key (sha256 hex): sha256 of the file's bytes (hex)}}   # oldest first
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import numpy as np

from madsl.corpus.info import DTYPES, SPLIT_FILES, TokenInfo
from madsl.errors import Location, MadslError
from madsl.paths import cache_dir

CACHE_NAME = "token-checks.json"
FORMAT = 1
MAX_ENTRIES = 1024  # files remembered; the oldest are forgotten first
MAX_BYTES = 256 << 10  # ~150 bytes an entry
SCAN_CHUNK_BYTES = 1 << 24  # how much of a token file one step of a scan reads
_HEX = re.compile(r"[0-9a-f]{64}")


def scan_file(path: Path, dtype: str, vocab_size: int) -> str:
    """The sha256 of `path`'s bytes, after checking every id is below `vocab_size`, in chunks: a
    MadslError names the first id outside the vocabulary, its position and value."""
    digest = hashlib.sha256()
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    buffer = bytearray(SCAN_CHUNK_BYTES - SCAN_CHUNK_BYTES % itemsize)
    position = 0
    with open(path, "rb") as f:
        while read := f.readinto(buffer):
            digest.update(memoryview(buffer)[:read])
            ids = np.frombuffer(buffer, dtype=DTYPES[dtype], count=read // itemsize)
            if ids.size and int(ids.max()) >= vocab_size:
                first = int(np.argmax(ids >= vocab_size))
                raise MadslError(
                    f"{path}: token {position + first:,} is id {int(ids[first]):,}, outside the "
                    f"vocabulary of {vocab_size:,}",
                    Location(file=str(path)),
                    hint="the vocabulary size or dtype declared is not the files' own",
                )
            position += ids.size
    return digest.hexdigest()


def checked_sha256(
    paths: list[Path], dtype: str, vocab_size: int, recorded: list[str | None], fresh: bool = False
) -> list[str]:
    """Each file's sha256, its ids checked below `vocab_size`: from the cache where a file is
    remembered with the sha256 `recorded` for it (None: any), else scanned and then remembered.
    `fresh`: scan every file whatever the cache says."""
    cache = {} if fresh else _load()
    keys = [_key(path, dtype, vocab_size) for path in paths]
    found, new = [], {}
    for path, key, want in zip(paths, keys, recorded):
        known = cache.get(key) if key else None
        if known is None or (want is not None and known != want):
            known = scan_file(path, dtype, vocab_size)
            if key and (want is None or known == want):
                new[key] = known
        found.append(known)
    if new:
        _save(new)
    return found


def remember(folder: Path, info: TokenInfo) -> None:
    """Remember the token files `prepare` just wrote (hashed and checked as they were written)."""
    keys = {_key(folder / name, info.dtype, info.vocab_size): info.files_sha256[name] for name in SPLIT_FILES.values()}
    if None not in keys:
        _save(keys)  # type: ignore[arg-type]


def _key(path: Path, dtype: str, vocab_size: int) -> str | None:
    try:
        st = os.stat(path)
        where = str(Path(path).resolve())
    except (OSError, RuntimeError):
        return None
    identity = [where, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, dtype, vocab_size]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()


def cache_path() -> Path:
    return cache_dir() / CACHE_NAME


def _load() -> dict[str, str]:
    """The cache's entries, or {} where it is missing or not what madsl writes (never an error)."""
    path = cache_path()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return {}
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return {}
            text = f.read(MAX_BYTES + 1)
        data: Any = json.loads(text) if len(text) <= MAX_BYTES else None
    except (OSError, ValueError, RecursionError):  # ValueError: not JSON, not UTF-8, a number too long
        return {}
    files = data.get("files") if isinstance(data, dict) and data.get("format") == FORMAT else None
    if not isinstance(files, dict) or len(files) > MAX_ENTRIES:
        return {}
    if not all(
        isinstance(k, str) and _HEX.fullmatch(k) and isinstance(v, str) and _HEX.fullmatch(v) for k, v in files.items()
    ):
        return {}
    return files


def _save(new: dict[str, str]) -> None:
    """Add `new` to the cache, forgetting the oldest beyond MAX_ENTRIES; a cache that cannot be
    written (or that is a link: neither followed nor replaced) is left as it is."""
    from madsl.outputs import write_text_atomic

    path = cache_path()
    files = _load()
    for key, sha in new.items():
        files.pop(key, None)
        files[key] = sha
    kept = dict(list(files.items())[-MAX_ENTRIES:])
    text = json.dumps({"format": FORMAT, "files": kept}, separators=(",", ":"))
    try:
        if path.is_symlink():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, text)
    except OSError:
        pass  # a read-only or full cache folder: the files are checked again next time

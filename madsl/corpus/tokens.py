"""Opening token files for training: `open_tokens(path) -> TokenData`, checked before any step runs.

A folder is either prepared (`madsl data prepare`: train.bin, val.bin and tokens.json) or holds
only nanoGPT's train.bin and val.bin; then the caller declares their dtype and vocabulary size
(nanoGPT keeps those in meta.pkl, which is never read here: unpickling a file can run code).
The splits are numpy memmaps, never loaded whole.

Every problem is a MadslError naming the file: a missing or empty file, a size that is not a whole
number of tokens (truncated, or the wrong dtype declared), tokens.json malformed or disagreeing
with the files, a token id outside the vocabulary (the first offending position and value).
Every open checks the files' bytes before any step runs: each file's sha256 against tokens.json's
files_sha256 (a nanoGPT folder has none: its hash is computed) and every id below the vocabulary,
in one chunked pass (madsl.corpus.checked: about 0.7 s per GB), remembered in the user's cache so
that reopening files unchanged since costs a stat; `verify=True` scans again whatever the cache
says. A token file or tokens.json that is a link leading out of the folder is refused, unread.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from madsl.corpus.checked import checked_sha256
from madsl.corpus.info import DTYPES, FORMAT_VERSION, INFO_FILE, SPLIT_FILES, TokenInfo, dtype_for_vocab, read_info
from madsl.errors import Location, MadslError
from madsl.paths import require_inside, require_path


@dataclass(frozen=True, eq=False)
class TokenData:
    """An opened folder of token files: the train and val splits as read-only 1-D memmaps, and
    what they hold (`info`; its `hash` identifies the data in a run's identity). Pickled (sent
    to another process), it travels as its folder and info and maps the files again there,
    rather than as a copy of every token."""

    path: Path
    train: np.ndarray
    val: np.ndarray
    info: TokenInfo

    def __reduce__(self):
        return _reopen, (self.path, self.info)

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size

    @property
    def dtype(self) -> str:
        return self.info.dtype

    @property
    def hash(self) -> str:
        return self.info.hash

    def split(self, name: str) -> np.ndarray:
        return self.train if name == "train" else self.val

    def file(self, split: str) -> Path:
        return self.path / SPLIT_FILES[split]

    def require_tokens(self, n: int) -> None:
        """A MadslError naming the file unless each split holds at least `n` tokens (one training
        window of seq_len L needs L + 1: the inputs and the next token of each)."""
        for split in SPLIT_FILES:
            have = len(self.split(split))
            if have < n:
                raise MadslError(
                    f"{self.file(split)}: {have:,} tokens, fewer than the {n:,} one window needs",
                    Location(file=str(self.file(split))),
                    hint="use a shorter sequence length, or more text",
                )

    def bits_per_byte(self, nats_per_token: float, split: str = "val") -> float | None:
        """A loss in nats per token of `split` as bits per byte of its text (None where the byte
        count is unknown: nanoGPT files)."""
        text_bytes = self.info.text_bytes(split)
        if not text_bytes:
            return None
        return nats_per_token / math.log(2) * self.info.tokens(split) / text_bytes


def _reopen(path: Path, info: TokenInfo) -> TokenData:
    """The memmaps of a TokenData unpickled: its files, checked against its info's sizes."""
    splits = {split: _open_split(path / name, info.dtype, info.tokens(split)) for split, name in SPLIT_FILES.items()}
    return TokenData(path, splits["train"], splits["val"], info)


def open_tokens(
    path: str | os.PathLike, *, dtype: Any = None, vocab_size: int | None = None, verify: bool = False
) -> TokenData:
    """The token files of folder `path`, checked (see the module docstring). `dtype` ("uint16",
    "uint32") and `vocab_size` are required for a folder without tokens.json, and must agree
    with it where it exists."""
    folder = require_path(path, "token folder")
    if not folder.is_dir():
        hint = "name the folder that holds train.bin and val.bin" if folder.is_file() else None
        raise MadslError(
            f"{folder}: {'not a folder' if folder.exists() else 'no such folder'}",
            Location(file=str(folder)),
            hint=hint,
        )
    declared = _dtype_name(dtype, folder) if dtype is not None else None
    if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1):
        raise MadslError(f"vocab_size {vocab_size!r}: not a positive integer")
    if (folder / INFO_FILE).exists() or (folder / INFO_FILE).is_symlink():
        info = read_info(require_inside(folder / INFO_FILE, folder))
        _check_declared(folder / INFO_FILE, info, declared, vocab_size)
        splits = {
            split: _open_split(folder / name, info.dtype, info.tokens(split)) for split, name in SPLIT_FILES.items()
        }
        _verify(folder, info, fresh=verify)
    else:
        info, splits = _open_nanogpt(folder, declared, vocab_size, verify)
    return TokenData(folder, splits["train"], splits["val"], info)


def _dtype_name(dtype: Any, folder: Path) -> str:
    try:
        resolved: np.dtype | None = np.dtype(dtype)
    except TypeError:
        resolved = None
    if resolved is None or resolved.name not in DTYPES or resolved.byteorder == ">":
        raise MadslError(
            f"{folder}: dtype {dtype!r} is not a token file dtype",
            Location(file=str(folder)),
            expected=" or ".join(DTYPES),
        )
    return resolved.name


def _check_declared(path: Path, info: TokenInfo, dtype: str | None, vocab_size: int | None) -> None:
    for what, declared, recorded in (("dtype", dtype, info.dtype), ("vocab_size", vocab_size, info.vocab_size)):
        if declared is not None and declared != recorded:
            raise MadslError(
                f"{path}: the files hold {what} {recorded}, not the {declared} declared",
                Location(file=str(path)),
                hint=f"drop the {what} given, or give {recorded}",
            )


def _open_split(path: Path, dtype: str, expected: int | None) -> np.ndarray:
    """`path` as a read-only memmap of `dtype`, after checking it exists, is not empty, holds a
    whole number of tokens and (when `expected` is given) exactly that many."""
    where = Location(file=str(path))
    require_inside(path, path.parent, "a token file")
    if not path.is_file():
        raise MadslError(f"{path}: {'not a regular file' if path.exists() else 'missing'}", where)
    size = path.stat().st_size
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    if size == 0:
        raise MadslError(f"{path}: the file is empty", where)
    if size % itemsize:
        raise MadslError(
            f"{path}: {size:,} bytes is not a whole number of {dtype} tokens ({itemsize} bytes each)",
            where,
            hint="the file is truncated, or its dtype is not the one declared",
        )
    if expected is not None and size // itemsize != expected:
        raise MadslError(
            f"{path}: holds {size // itemsize:,} tokens, but {INFO_FILE} says {expected:,}",
            where,
            hint="the file was changed or cut short after it was prepared; prepare it again",
        )
    return np.memmap(path, dtype=DTYPES[dtype], mode="r")


def _verify(folder: Path, info: TokenInfo, fresh: bool) -> None:
    names = list(SPLIT_FILES.values())
    recorded = [info.files_sha256[name] for name in names]
    found = checked_sha256([folder / name for name in names], info.dtype, info.vocab_size, list(recorded), fresh)
    for name, want, got in zip(names, recorded, found):
        if got != want:
            raise MadslError(
                f"{folder / name}: its bytes are not those {INFO_FILE} records (the file was "
                "changed after it was prepared)",
                Location(file=str(folder / name)),
                hint="prepare the folder again with `madsl data prepare`",
            )


def _open_nanogpt(folder: Path, dtype: str | None, vocab_size: int | None, fresh: bool) -> tuple[TokenInfo, dict]:
    """A folder of nanoGPT's train.bin and val.bin alone: opened with the declared dtype and
    vocabulary, every id scanned, hashed on the way."""
    if dtype is None or vocab_size is None:
        meta = " (madsl does not read its meta.pkl: unpickling can run code)" if (folder / "meta.pkl").exists() else ""
        raise MadslError(
            f"{folder}: no {INFO_FILE}; declare the token files' dtype and vocabulary size{meta}",
            Location(file=str(folder)),
            expected="dtype (uint16 or uint32) and vocab_size",
            hint="or make the folder with `madsl data prepare`, which records both",
        )
    if dtype == "uint16" and dtype_for_vocab(vocab_size) == "uint32":
        raise MadslError(
            f"{folder}: uint16 cannot hold the ids of a vocabulary of {vocab_size:,}",
            Location(file=str(folder)),
            hint="nanoGPT writes uint32 above 65,536 ids: declare uint32",
        )
    splits = {split: _open_split(folder / name, dtype, None) for split, name in SPLIT_FILES.items()}
    names = list(SPLIT_FILES.values())
    digests = dict(
        zip(names, checked_sha256([folder / name for name in names], dtype, vocab_size, [None, None], fresh))
    )
    info = TokenInfo(
        format_version=FORMAT_VERSION,
        tokenizer=None,
        tokenizer_sha256=None,
        vocab_size=vocab_size,
        dtype=dtype,
        train_tokens=len(splits["train"]),
        val_tokens=len(splits["val"]),
        train_bytes=None,
        val_bytes=None,
        split=None,
        val_fraction=None,
        sources=(),
        files_sha256=digests,
    ).with_hash()
    return info, splits

"""What a folder of token files holds: `TokenInfo`, kept as `tokens.json` beside train.bin and val.bin.

tokens.json is one flat JSON object whose keys are TokenInfo's fields. `hash` is the sha256 of
the canonical JSON (sorted keys, no spaces) of every other field; `files_sha256` among them holds
the sha256 of train.bin's and val.bin's bytes, so the hash covers the tokens and everything said
about them (tokenizer, vocabulary, dtype, counts, sources, split). It is computed once, when the
files are written; opening the folder recomputes it from the JSON alone (cheap) and checks the
files' sizes, and `open_tokens(..., verify=True)` rehashes the files themselves.

Token files are flat arrays of little-endian unsigned integers, as nanoGPT writes them:
uint16 for a vocabulary of up to 65,536 ids, uint32 above.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from madsl.errors import Location, MadslError

FORMAT_VERSION = 1
INFO_FILE = "tokens.json"
SPLIT_FILES = {"train": "train.bin", "val": "val.bin"}
DTYPES = {"uint16": "<u2", "uint32": "<u4"}  # name -> the numpy dtype of the files (little-endian)
UINT16_VOCAB = 65_536
PER_DOCUMENT = "per-document"  # the split rule prepare() uses (see madsl.corpus.prepare)
MAX_VOCAB = 1 << 32  # uint32's ids
MAX_INFO_BYTES = 16 << 20  # tokens.json holds a record per source named: a few hundred bytes each


def dtype_for_vocab(vocab_size: int) -> str:
    """The narrowest file dtype that holds every id below `vocab_size`."""
    return "uint16" if vocab_size <= UINT16_VOCAB else "uint32"


@dataclass(frozen=True)
class TokenInfo:
    """What a folder of token files holds (tokens.json's fields).

    tokenizer is "bytes" (UTF-8 bytes, vocabulary 256), a tokenizer file's name (its sha256 in
    tokenizer_sha256), or None for nanoGPT files opened without tokens.json. train_bytes and
    val_bytes count the UTF-8 bytes of the text each split was made from (None where unknown), so
    that bits per byte = loss in nats per token / ln 2 x tokens / bytes. sources lists what the
    text came from: {"name", "documents", "bytes", "sha256"} each."""

    format_version: int
    tokenizer: str | None
    tokenizer_sha256: str | None
    vocab_size: int
    dtype: str
    train_tokens: int
    val_tokens: int
    train_bytes: int | None
    val_bytes: int | None
    split: str | None
    val_fraction: float | None
    sources: tuple[dict, ...]
    files_sha256: dict[str, str]
    hash: str = field(default="")

    def tokens(self, split: str) -> int:
        return self.train_tokens if split == "train" else self.val_tokens

    def text_bytes(self, split: str) -> int | None:
        return self.train_bytes if split == "train" else self.val_bytes

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["sources"] = [dict(source) for source in self.sources]
        return data

    def with_hash(self) -> "TokenInfo":
        """This info with `hash` filled in from its other fields."""
        return replace(self, hash=content_hash(self))


def content_hash(info: TokenInfo) -> str:
    """sha256 of the canonical JSON of every field but `hash` (files_sha256 covers the token bytes)."""
    data = info.to_json()
    data.pop("hash")
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_info(path: Path, info: TokenInfo) -> None:
    from madsl.outputs import write_text_atomic

    write_text_atomic(path, json.dumps(info.to_json(), indent=2, sort_keys=True) + "\n")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


def _is_hex(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _is_source(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == {"name", "documents", "bytes", "sha256"}
        and isinstance(value["name"], str)
        and _is_count(value["documents"])
        and _is_count(value["bytes"])
        and _is_hex(value["sha256"])
    )


_FIELD_CHECKS = {  # field -> (test, what it must be)
    "format_version": (lambda v: v == FORMAT_VERSION, f"{FORMAT_VERSION}"),
    "tokenizer": (lambda v: v is None or (isinstance(v, str) and v != ""), "a tokenizer name or null"),
    "tokenizer_sha256": (lambda v: v is None or _is_hex(v), "a sha256 (64 hex digits) or null"),
    "vocab_size": (lambda v: _is_count(v) and 0 < v <= MAX_VOCAB, f"a positive integer up to {MAX_VOCAB:,}"),
    "dtype": (lambda v: v in DTYPES, " or ".join(DTYPES)),
    "train_tokens": (_is_count, "a count"),
    "val_tokens": (_is_count, "a count"),
    "train_bytes": (lambda v: v is None or _is_count(v), "a count or null"),
    "val_bytes": (lambda v: v is None or _is_count(v), "a count or null"),
    "split": (lambda v: v is None or isinstance(v, str), "a split rule or null"),
    "val_fraction": (
        lambda v: v is None or (isinstance(v, float) and 0 < v < 1 and math.isfinite(v)),
        "a number between 0 and 1, or null",
    ),
    "sources": (
        lambda v: isinstance(v, list) and all(_is_source(s) for s in v),
        'a list of {"name", "documents", "bytes", "sha256"}',
    ),
    "files_sha256": (
        lambda v: isinstance(v, dict) and set(v) == set(SPLIT_FILES.values()) and all(_is_hex(h) for h in v.values()),
        "the sha256 of train.bin and val.bin",
    ),
    "hash": (_is_hex, "a sha256 (64 hex digits)"),
}


def _names(names: list[str]) -> str:
    shown = ", ".join(repr(name) if len(name) <= 40 else repr(name[:37]) + "..." for name in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value)
    except ValueError:  # an integer too long to print
        text = "a number too long to show"
    return text if len(text) <= 60 else text[:57] + "..."


def _read_bounded(path: Path) -> str:
    """The text of `path`, a regular file of at most MAX_INFO_BYTES (a fifo is not waited on)."""
    where = Location(file=str(path))
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise MadslError(f"{path}: not a regular file", where)
            data = f.read(MAX_INFO_BYTES + 1)
        if len(data) > MAX_INFO_BYTES:
            raise MadslError(
                f"{path}: larger than {MAX_INFO_BYTES >> 20} MiB, not a tokens.json",
                where,
                hint="tokens.json is written by `madsl data prepare`; prepare the folder again",
            )
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise MadslError(f"{path}: cannot be read ({getattr(err, 'strerror', None) or err})", where) from None


def read_info(path: Path) -> TokenInfo:
    """tokens.json as a TokenInfo, or a MadslError naming the file: not JSON, a missing, extra or
    ill-typed field, or a hash that does not match the other fields (the file was edited)."""
    where = Location(file=str(path))
    text = _read_bounded(path)
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as err:
        raise MadslError(f"{path}: not JSON ({err.msg})", Location(str(path), err.lineno, err.colno)) from None
    except RecursionError:
        raise MadslError(f"{path}: not a tokens.json (nested deeper than the JSON reader goes)", where) from None
    except ValueError as err:  # NaN or Infinity; an integer of thousands of digits
        raise MadslError(f"{path}: not a tokens.json ({str(err)[:100]})", where) from None
    if not isinstance(data, dict):
        raise MadslError(f"{path}: not a JSON object", where)
    names = [f.name for f in fields(TokenInfo)]
    missing, extra = [n for n in names if n not in data], sorted(set(data) - set(names))
    if missing or extra:
        raise MadslError(
            f"{path}: "
            + "; ".join(
                ([f"missing {', '.join(missing)}"] if missing else []) + ([f"unknown {_names(extra)}"] if extra else [])
            ),
            where,
            hint="tokens.json is written by `madsl data prepare`; prepare the folder again",
        )
    for name, (test, expected) in _FIELD_CHECKS.items():
        if not test(data[name]):
            raise MadslError(f"{path}: {name} is {_shown(data[name])}", where, expected=expected)
    info = TokenInfo(**{**data, "sources": tuple(data["sources"])})
    if content_hash(info) != info.hash:
        raise MadslError(
            f"{path}: its hash does not match its other fields (the file was changed after it was written)",
            where,
            hint="prepare the folder again with `madsl data prepare`",
        )
    if dtype_for_vocab(info.vocab_size) == "uint32" and info.dtype == "uint16":
        raise MadslError(f"{path}: dtype uint16 cannot hold the ids of a vocabulary of {info.vocab_size}", where)
    return info

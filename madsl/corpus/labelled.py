"""Labelled texts in, the arrays the text-classification task reads out (`madsl data
prepare-labelled`, madsl.tasks.text_classification for the format).

    prepare_labelled("reviews/", "gpt-neo/tokenizer.json", "reviews-tokens", seq_len=512)

The source folder holds `train.jsonl` and `test.jsonl`: one JSON object a line, {"text": str,
"label": int}, classes 0 .. C-1 (C the largest label plus one, at least 2; every class has a
training text). Each text is encoded without special tokens, as `madsl data prepare` encodes
("bytes" or a local tokenizer.json, madsl.corpus.tokenizer); the vocabulary is the tokenizer's, or
the larger embedding of the model the set is for (`vocab_size`: a checkpoint's). A text longer than `seq_len` tokens is
an error naming its file and line unless `truncate`, which keeps its first `seq_len` tokens (seed
004's tokenizer call, truncation=True) and counts it in labelled.json. A blank line, an empty text,
a label that is not a non-negative integer, another key: errors, located. Nothing is guessed.

The four arrays and labelled.json are written atomically (labelled.json last, so a folder without
it is not prepared); a folder holding other files is refused unless `force`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np

from madsl.corpus.tokenizer import BYTES, load_tokenizer
from madsl.errors import Location, MadslError, option
from madsl.outputs import check_output_dir, output_error, write_atomic, write_text_atomic
from madsl.paths import require_path
from madsl.tasks.text_classification import (
    INFO_FILE,
    PAD,
    SPLITS,
    LabelledInfo,
    arrays_hash,
    split_files,
)

SOURCE_FILES = {split: f"{split}.jsonl" for split in SPLITS}
OWNED = frozenset({INFO_FILE, *(name for split in SPLITS for name in split_files(split))})
MAX_SEQ_LEN = 1 << 20


def prepare_labelled(
    source: str | os.PathLike,
    tokenizer: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    seq_len: int,
    truncate: bool = False,
    vocab_size: int | None = None,
    force: bool = False,
) -> LabelledInfo:
    """Encode `source`/train.jsonl and test.jsonl with `tokenizer` into `out_dir` (the module's
    docstring); `vocab_size`: the embedding's rows where a model has more than the tokenizer's ids
    (a checkpoint's vocabulary padded to a multiple of 8, Mamba's 50,280 for 50,277 ids)."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 1 <= seq_len <= MAX_SEQ_LEN:
        raise MadslError(f"{option('seq_len')} {seq_len!r}: not a length from 1 to {MAX_SEQ_LEN:,}")
    folder_in = require_path(source, "TEXTS")
    if not folder_in.is_dir():
        raise MadslError(
            f"{folder_in}: not a folder",
            Location(file=str(folder_in)),
            expected="a folder holding train.jsonl and test.jsonl",
        )
    require_path(out_dir, option("out_dir"))
    encoder = load_tokenizer(tokenizer)
    if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int)
                                   or vocab_size < encoder.vocab_size):  # fmt: skip
        raise MadslError(
            f"{option('vocab_size')} {vocab_size!r}: fewer rows than the tokenizer's {encoder.vocab_size:,} ids",
            hint="the embedding size of the model the set is for, at least the tokenizer's vocabulary",
        )
    encoded = {split: _encode_split(folder_in, split, encoder, seq_len, truncate) for split in SPLITS}
    num_classes = max(int(labels.max()) for _, labels, _ in encoded.values()) + 1
    _check_classes(folder_in, encoded, num_classes)
    arrays = {}
    for split, (tokens, labels, _) in encoded.items():
        tokens_name, labels_name = split_files(split)
        arrays[tokens_name], arrays[labels_name] = tokens, labels
    info = LabelledInfo(
        tokenizer=encoder.name,
        tokenizer_sha256=encoder.sha256,
        vocab_size=int(vocab_size if vocab_size is not None else encoder.vocab_size),
        num_classes=num_classes,
        seq_len=seq_len,
        counts={split: stats for split, (_, _, stats) in encoded.items()},
        sources={split: _sha256(folder_in / SOURCE_FILES[split]) for split in SPLITS},
        hash=arrays_hash(arrays),
    )
    folder = check_output_dir(
        out_dir, option("out_dir"), lambda name: name in OWNED, force=force, writes=", ".join(sorted(OWNED))
    )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / INFO_FILE).unlink(missing_ok=True)  # while the arrays change, the folder is not prepared
        for name, array in arrays.items():
            write_atomic(folder / name, lambda temporary, a=array: _save(temporary, a))
        write_text_atomic(folder / INFO_FILE, json.dumps(info.to_json(), indent=2) + "\n")
    except OSError as err:
        raise output_error(err, folder, option("out_dir")) from None
    return info


def _save(path: str, array: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    with open(path, "wb") as f:
        f.write(buffer.getvalue())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _encode_split(folder: Path, split: str, encoder, seq_len: int, truncate: bool):
    """(tokens int32 (N, seq_len) padded with PAD, labels int64 (N,), counts) of one .jsonl."""
    path = folder / SOURCE_FILES[split]
    if path.is_symlink() or not path.is_file():
        raise MadslError(
            f"{path}: {'a symbolic link' if path.is_symlink() else 'missing or not a regular file'}",
            Location(file=str(path)),
            expected=f'{SOURCE_FILES[split]} inside {folder}: one JSON object a line, {{"text": ..., "label": ...}}',
        )
    rows, labels, tokens_total, truncated = [], [], 0, 0
    with open(path, encoding="utf-8", errors="strict") as f:
        for number, line in enumerate(_lines(f, path), start=1):
            text, label = _example(line, path, number)
            ids = _ids(encoder, text, f"{path}:{number}")
            if len(ids) > seq_len:
                if not truncate:
                    raise MadslError(
                        f"{path}:{number}: {len(ids):,} tokens, more than {option('seq_len')} {seq_len:,}",
                        Location(file=str(path), line=number, column=1),
                        hint=f"a longer {option('seq_len')}, or {option('truncate')} to keep each text's first "
                        f"{option('seq_len')} tokens",
                    )
                ids, truncated = ids[:seq_len], truncated + 1
            row = np.full(seq_len, PAD, dtype=np.int32)
            row[: len(ids)] = ids
            rows.append(row)
            labels.append(label)
            tokens_total += len(ids)
    if not rows:
        raise MadslError(f"{path}: holds no texts", Location(file=str(path)))
    stats = {"examples": len(rows), "tokens": tokens_total, "truncated": truncated}
    return np.stack(rows), np.asarray(labels, dtype=np.int64), stats


def _lines(f, path: Path):
    try:
        yield from f
    except UnicodeDecodeError as err:
        raise MadslError(
            f"{path}: not UTF-8 text ({err.reason} at byte {err.start})", Location(file=str(path))
        ) from None


def _example(line: str, path: Path, number: int) -> tuple[str, int]:
    where = Location(file=str(path), line=number, column=1)
    expected = '{"text": "...", "label": 0}'
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        located = Location(file=str(path), line=number, column=err.colno)
        raise MadslError(f"{path}:{number}:{err.colno}: not JSON ({err.msg})", located, expected=expected) from None
    if not isinstance(record, dict) or set(record) != {"text", "label"}:
        raise MadslError(
            f"{path}:{number}: expected an object with exactly the keys text and label", where, expected=expected
        )
    text, label = record["text"], record["label"]
    if not isinstance(text, str) or not text:
        raise MadslError(f"{path}:{number}: text must be a non-empty string", where, expected=expected)
    if isinstance(label, bool) or not isinstance(label, int) or label < 0:
        raise MadslError(
            f"{path}:{number}: label {label!r} is not a class number (0, 1, ...)", where, expected=expected
        )
    return text, label


def _ids(encoder, text: str, where: str) -> np.ndarray:
    if encoder.name == BYTES:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
    ids, _, _ = encoder.encode(text, where)
    if ids.size == 0:
        raise MadslError(
            f"{where}: the tokenizer gives no tokens for this text", Location(file=where.rsplit(":", 1)[0])
        )
    return ids


def _check_classes(folder: Path, encoded: dict, num_classes: int) -> None:
    if num_classes < 2:
        raise MadslError(f"{folder}: every label is 0; a classification needs at least two classes")
    seen = set(np.unique(encoded["train"][1]).tolist())
    missing = sorted(set(range(num_classes)) - seen)
    if missing:
        raise MadslError(
            f"{folder / SOURCE_FILES['train']}: no training text has label {missing[0]} "
            f"(classes are 0..{num_classes - 1}, the largest label plus one)",
            Location(file=str(folder / SOURCE_FILES["train"])),
            hint="number the classes from 0 without gaps",
        )

"""One document into train.bin and val.bin, in bounded memory (`encode_document`).

A document is read in chunks (madsl.corpus.sources.read_chunks), never whole. The split is per
document: of its n tokens the first int(n x (1 - val_fraction)) go to train.bin (nanoGPT's rule)
and the rest to val.bin, so n must be known before a token is placed:

- "bytes": n is the file's size; each chunk's bytes go straight to their split.
- a tokenizer file: the text is encoded in pieces of about PIECE_CHARS characters, cut after a
  line break that a non-space character follows (else before a space), where the tokenizer's
  pre-tokenizer splits words too (unbroken text longer than MAX_PIECE_CHARS is refused), the ids
  written to a temporary file beside the output with each token's byte offset in the document,
  then copied to the two splits once n is known.

A piece is encoded with the end of the previous one before it as context (its tokens dropped), so
a tokenizer that marks the start of its input (a prefix space, sentencepiece's "▁") gives the
ids the whole document gives. That is checked at every cut: no token may span it, and the
context's tokens must be those the previous piece ended with; a tokenizer that fails this (one
whose normalizer strips the ends of its input) is refused, naming the byte offset, rather than
give other ids than the document encoded whole. A document of one piece is encoded whole.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from madsl.corpus.info import DTYPES
from madsl.corpus.sources import Document, SourceDigest, read_chunks
from madsl.corpus.tokenizer import ByteTokenizer, FileTokenizer
from madsl.errors import Location, MadslError
from madsl.outputs import AtomicFile

BYTES_CHUNK = 8 << 20  # bytes read at once for the bytes tokenizer
PIECE_CHARS = 1 << 17  # characters a tokenizer file encodes at once (~40 MB of the library's objects)
MAX_PIECE_CHARS = 1 << 20  # text without a line break or space longer than this is refused
CONTEXT_CHARS = 1024  # at most this much of the previous piece is encoded again before a piece
MAX_TRIES = 64  # places tried of each kind (after a line break, before a space) before the next kind
COPY_BYTES = 8 << 20


class SplitWriter:
    """One split's temporary file: token bytes appended as they come, counted and hashed."""

    def __init__(self, path: Path, dtype: str):
        self.atomic = AtomicFile(path)  # moved onto `path` by commit(), once every document is in
        self.file, self.temporary, self.dtype = self.atomic.file, self.atomic.name, np.dtype(DTYPES[dtype])
        self.sha, self.tokens, self.text_bytes = hashlib.sha256(), 0, 0

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.sha.update(data)
        self.tokens += len(data) // self.dtype.itemsize

    def commit(self) -> None:
        self.atomic.commit()

    def discard(self) -> None:
        self.atomic.discard()


def encode_document(
    encoder: ByteTokenizer | FileTokenizer,
    document: Document,
    val_fraction: float,
    writers: dict[str, SplitWriter],
    digest: SourceDigest,
) -> None:
    """Encode `document` and append its tokens to the train and val writers (module docstring)."""
    digest.begin(document)
    if isinstance(encoder, ByteTokenizer):
        _bytes_document(document, val_fraction, writers, digest)
    else:
        _file_document(encoder, document, val_fraction, writers, digest)


def _bytes_document(
    document: Document, val_fraction: float, writers: dict[str, SplitWriter], digest: SourceDigest
) -> None:
    train = int(document.size * (1 - val_fraction))
    dtype = writers["train"].dtype
    for chunk in read_chunks(document, BYTES_CHUNK):
        digest.update(chunk.data)
        ids = np.frombuffer(chunk.data, dtype=np.uint8).astype(dtype)
        cut = min(max(train - chunk.offset, 0), len(ids))
        writers["train"].write(ids[:cut].tobytes())
        writers["val"].write(ids[cut:].tobytes())
    writers["train"].text_bytes += train
    writers["val"].text_bytes += document.size - train


def _file_document(
    encoder: FileTokenizer,
    document: Document,
    val_fraction: float,
    writers: dict[str, SplitWriter],
    digest: SourceDigest,
) -> None:
    dtype, scratch = writers["train"].dtype, Path(writers["train"].temporary).parent
    with tempfile.TemporaryFile(dir=scratch) as ids_file, tempfile.TemporaryFile(dir=scratch) as starts_file:
        count = 0
        for ids, starts in _pieces(encoder, document, digest):
            ids_file.write(ids.astype(dtype).tobytes())
            starts_file.write(starts.astype("<i8").tobytes())
            count += len(ids)
        train = int(count * (1 - val_fraction))
        train_bytes = document.size
        if train < count:  # the bytes of text before the first val token's first character
            starts_file.seek(8 * train)
            train_bytes = int.from_bytes(starts_file.read(8), "little", signed=True)
        ids_file.seek(0)
        _copy(ids_file, train * dtype.itemsize, writers["train"])
        _copy(ids_file, (count - train) * dtype.itemsize, writers["val"])
    writers["train"].text_bytes += train_bytes
    writers["val"].text_bytes += document.size - train_bytes


def _copy(source: BinaryIO, size: int, writer: SplitWriter) -> None:
    while size > 0:
        block = source.read(min(size, COPY_BYTES))
        writer.write(block)
        size -= len(block)


def _pieces(
    encoder: FileTokenizer, document: Document, digest: SourceDigest
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each piece's ids and their tokens' byte offsets in the document."""
    buffer, offset = "", 0  # the text read but not yet encoded, and the byte offset of its start
    previous: _Piece | None = None
    for chunk in read_chunks(document, PIECE_CHARS):
        digest.update(chunk.data)
        buffer += chunk.text
        while len(buffer) >= PIECE_CHARS:
            cut = _cut(buffer, encoder)
            if cut is None:
                if len(buffer) > MAX_PIECE_CHARS:
                    raise MadslError(
                        f"{document.path}: {len(buffer):,} characters without a line break or space "
                        f"from byte {offset:,} on, more than {encoder.shown} is given at once "
                        f"({MAX_PIECE_CHARS:,})",
                        Location(file=document.path),
                        hint="break the text into lines, or use --tokenizer bytes",
                    )
                break
            previous = _encode_piece(encoder, document, buffer[:cut], offset, previous)
            buffer = buffer[cut:]
            offset += previous.size
            yield previous.ids, previous.starts
    if buffer:
        last = _encode_piece(encoder, document, buffer, offset, previous)
        yield last.ids, last.starts


def _cut(text: str, encoder: FileTokenizer) -> int | None:
    """The last place in `text` after a line break that a non-space character follows, else the
    last before a space that a non-space precedes, where the tokenizer's pre-tokenizer splits
    words too (a sentencepiece-style one keeps "end.\nNext" one word); None where there is none."""
    for places in (_after_line_breaks(text), _before_spaces(text)):
        for _, at in zip(range(MAX_TRIES), places):
            if encoder.splits_at(text, at):
                return at
    return None


def _after_line_breaks(text: str) -> Iterator[int]:
    at = text.rfind("\n", 0, len(text) - 1)
    while at >= 0:
        if not text[at + 1].isspace():
            yield at + 1
        at = text.rfind("\n", 0, at)


def _before_spaces(text: str) -> Iterator[int]:
    at = text.rfind(" ", 1)
    while at > 0:
        if not text[at - 1].isspace():
            yield at
        at = text.rfind(" ", 1, at - 1)


class _Piece:
    """An encoded piece: its text, byte size, ids and tokens' byte offsets in the document."""

    def __init__(self, text: str, offset: int, size: int, ids: np.ndarray, starts: np.ndarray):
        self.text, self.offset, self.size, self.ids, self.starts = text, offset, size, ids, starts

    def tail(self, context: str) -> tuple[int, list[tuple[int, int]]]:
        """Where `context` (this piece's last characters) starts, and this piece's tokens in it."""
        begin = self.offset + self.size - len(context.encode("utf-8"))
        first = int(np.searchsorted(self.starts, begin))
        return begin, list(zip(self.starts[first:].tolist(), self.ids[first:].tolist()))


def _encode_piece(
    encoder: FileTokenizer, document: Document, piece: str, offset: int, previous: _Piece | None
) -> _Piece:
    context = "" if previous is None else _context(previous.text, encoder)
    text = context + piece
    ids, starts, ends = encoder.encode(text, f"{document.path} (from byte {offset:,})")
    chars = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    byte_at = np.zeros(len(text) + 1, dtype=np.int64)  # character index -> UTF-8 bytes before it
    np.cumsum(1 + (chars >= 0x80) + (chars >= 0x800) + (chars >= 0x10000), out=byte_at[1:])
    starts = np.clip(starts, 0, len(text))
    keep = starts >= len(context)
    if previous is not None:
        begin, tail = previous.tail(context)
        absolute = begin + byte_at[starts]
        seen = list(zip(absolute[~keep].tolist(), ids[~keep].tolist()))
        if (
            (keep.any() and not keep[int(np.argmax(keep)) :].all())
            or ((starts < len(context)) & (ends > len(context))).any()
            or not _agree(seen, tail)
        ):
            raise MadslError(
                f"{document.path}: {encoder.shown} encodes the text differently when it is cut at byte "
                f"{offset:,} (a document over {PIECE_CHARS:,} characters is encoded in pieces cut "
                "between words)",
                Location(file=document.path),
                hint=f"split the text into files under {PIECE_CHARS:,} characters, each encoded whole",
            )
    size = int(byte_at[-1] - byte_at[len(context)])
    return _Piece(piece, offset, size, ids[keep], offset + byte_at[starts[keep]] - byte_at[len(context)])


def _context(text: str, encoder: FileTokenizer) -> str:
    """The end of the previous piece encoded again before the next: from a line's (or a word's)
    start within its last CONTEXT_CHARS characters."""
    tail = text[-CONTEXT_CHARS:]
    cut = _cut(tail, encoder)
    return tail[cut:] if cut is not None else tail


def _agree(seen: list[tuple[int, int]], tail: list[tuple[int, int]]) -> bool:
    """Whether the context's tokens, as encoded before the next piece, end as the previous piece
    ended: from the first token after the context's first that starts where one of the previous
    piece's did (the start of an input may be marked), both hold the same (offset, id)."""
    starts = {start: index for index, (start, _) in reversed(list(enumerate(tail)))}
    for j in range(1, len(seen)):
        if seen[j][0] > seen[0][0] and seen[j][0] in starts:
            return seen[j:] == tail[starts[seen[j][0]] :]
    return len(seen) <= 1 and len(tail) <= 1

"""The tokenizers `prepare` turns text into ids with: "bytes", or a local Hugging Face tokenizer.json.

"bytes" is the text's UTF-8 bytes, a vocabulary of 256 (the MAD paper's byte-level study). A
tokenizer file is read with the `tokenizers` library (Tokenizer.from_file; nothing is
downloaded) and recorded by its file name and sha256; its vocabulary is the largest id it knows
plus one, added tokens included. Text is encoded without the tokenizer's special tokens (no
BOS/EOS are added around a document).

`encode` gives a document's ids and, for the train/val split, how many UTF-8 bytes of the text
come before a token: for "bytes" exactly its index; for a tokenizer file the bytes before the
first character of the token's span (a token that covers part of a character, as byte-level BPE
makes, counts from that character's start).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from madsl.corpus.sources import Document
from madsl.errors import Location, MadslError

BYTES = "bytes"


@dataclass(frozen=True)
class Encoding:
    ids: np.ndarray  # int64, 1-D
    bytes_before: Callable[[int], int]  # token index -> UTF-8 bytes of the text before it


class ByteTokenizer:
    name = BYTES
    sha256 = None
    vocab_size = 256

    def encode(self, document: Document) -> Encoding:
        return Encoding(np.frombuffer(document.data, dtype=np.uint8).astype(np.int64), lambda index: index)


class FileTokenizer:
    """A Hugging Face tokenizer.json, read locally."""

    def __init__(self, path: Path):
        where = Location(file=str(path))
        try:
            from tokenizers import Tokenizer
        except ModuleNotFoundError:
            raise MadslError(f"{path}: reading a tokenizer file needs the `tokenizers` library, which is not "
                             "installed", where, hint="pip install 'madsl[torch]' (or pip install tokenizers)") \
                from None
        try:
            data = path.read_bytes()
            self._tokenizer: Any = Tokenizer.from_str(data.decode("utf-8"))
        except OSError as err:
            raise MadslError(f"{path}: cannot be read ({err.strerror or err})", where) from None
        except Exception as err:  # the library's parse errors are plain Exceptions
            raise MadslError(f"{path}: not a tokenizer file the `tokenizers` library reads "
                             f"({str(err).splitlines()[0] if str(err) else type(err).__name__})", where,
                             expected="a Hugging Face tokenizer.json") from None
        vocabulary = self._tokenizer.get_vocab(with_added_tokens=True)
        if not vocabulary:
            raise MadslError(f"{path}: the tokenizer has an empty vocabulary", where)
        self.path, self.name = path, path.name
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.vocab_size = max(max(vocabulary.values()) + 1, self._tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, document: Document) -> Encoding:
        encoded = self._tokenizer.encode(document.text, add_special_tokens=False)
        ids = np.asarray(encoded.ids, dtype=np.int64)
        if ids.size and int(ids.max()) >= self.vocab_size:  # a tokenizer whose model and vocabulary disagree
            raise MadslError(f"{self.path}: encoding {document.path} gave id {int(ids.max())}, outside its vocabulary "
                             f"of {self.vocab_size}", Location(file=str(self.path)))
        offsets, text = encoded.offsets, document.text
        return Encoding(ids, lambda index: len(text[:offsets[index][0]].encode("utf-8")))


def load_tokenizer(tokenizer: str | os.PathLike) -> ByteTokenizer | FileTokenizer:
    """"bytes", or the tokenizer.json at the path `tokenizer`; a MadslError names a missing file."""
    if str(tokenizer) == BYTES:
        return ByteTokenizer()
    path = Path(tokenizer)
    if not path.is_file():
        raise MadslError(f"{path}: {'not a regular file' if path.exists() else 'no such tokenizer file'}",
                         Location(file=str(path)), expected='"bytes" or a Hugging Face tokenizer.json file')
    return FileTokenizer(path)

"""The tokenizers `prepare` turns text into ids with: "bytes", or a local Hugging Face tokenizer.json.

"bytes" is the text's UTF-8 bytes, a vocabulary of 256 (the MAD paper's byte-level study). A
tokenizer file is read with the `tokenizers` library (Tokenizer.from_str; nothing is
downloaded: a URL is refused by name) and recorded by its file name and sha256; its vocabulary
is the largest id it knows plus one, added tokens included. Text is encoded without the
tokenizer's special tokens (no BOS/EOS are added around a document).

`FileTokenizer.encode` encodes one piece of text (madsl.corpus.encode cuts a document into
pieces) and gives each token's span in characters of the piece. The tokenizer file is untrusted
input as much as the text: a normalizer that makes a piece more than MAX_EXPANSION times longer
(a Replace of one character by a thousand reached 4.9 GB on 60 KB of text) is refused before
the piece is encoded, by normalizing it NORMALIZE_SPAN characters at a time.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from madsl.errors import Location, MadslError, option
from madsl.paths import require_path

BYTES = "bytes"
MAX_EXPANSION = 4  # normalized characters per character of text; NFKC's worst real text stays under 2
MAX_TOKENS_PER_CHAR = 4  # a byte-level tokenizer gives at most one token per UTF-8 byte of a character
NORMALIZE_SPAN = 1 << 14  # characters normalized at once by the expansion check (bounds its memory)
CUT_WINDOW = 256  # characters pre-tokenized either side of a place a document may be cut
MAX_TOKENIZER_BYTES = 512 << 20  # the largest tokenizer.json read (real ones are tens of MB)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


class ByteTokenizer:
    name = BYTES
    sha256 = None
    vocab_size = 256


class FileTokenizer:
    """A Hugging Face tokenizer.json, read locally."""

    def __init__(self, path: Path, shown: str):
        where = Location(file=shown)
        try:
            from tokenizers import Tokenizer
        except ModuleNotFoundError:
            raise MadslError(
                f"{shown}: reading a tokenizer file needs the `tokenizers` library, which is not installed",
                where,
                hint="pip install 'madsl[torch]' (or pip install tokenizers)",
            ) from None
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_TOKENIZER_BYTES + 1)
            if len(data) > MAX_TOKENIZER_BYTES:
                raise MadslError(
                    f"{shown}: larger than {MAX_TOKENIZER_BYTES >> 20} MiB, not a tokenizer file",
                    where,
                    expected="a Hugging Face tokenizer.json",
                )
            self._tokenizer: Any = Tokenizer.from_str(data.decode("utf-8"))
        except OSError as err:
            raise MadslError(f"{shown}: cannot be read ({err.strerror or err})", where) from None
        except MadslError:
            raise
        except Exception as err:  # the library's parse errors are plain Exceptions; UnicodeDecodeError too
            raise MadslError(
                f"{shown}: not a tokenizer file the `tokenizers` library reads "
                f"({str(err).splitlines()[0][:200] if str(err) else type(err).__name__})",
                where,
                expected="a Hugging Face tokenizer.json",
            ) from None
        vocabulary = self._tokenizer.get_vocab(with_added_tokens=True)
        if not vocabulary:
            raise MadslError(f"{shown}: the tokenizer has an empty vocabulary", where)
        self.path, self.shown, self.name = path, shown, path.name
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.vocab_size = max(max(vocabulary.values()) + 1, self._tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The ids of `text` (int64) and each token's first and last + 1 character in it; `where`
        (the document and byte offset) names the text in a MadslError."""
        self._check_expansion(text, where)
        encoded = self._tokenizer.encode(text, add_special_tokens=False)
        ids = np.asarray(encoded.ids, dtype=np.int64)
        if len(ids) > MAX_TOKENS_PER_CHAR * len(text) + 16:
            raise MadslError(
                f"{self.shown}: encoding {where} gave {len(ids):,} tokens for {len(text):,} characters",
                Location(file=self.shown),
                hint="the tokenizer expands text; use another tokenizer",
            )
        if ids.size and int(ids.max()) >= self.vocab_size:  # a tokenizer whose model and vocabulary disagree
            raise MadslError(
                f"{self.shown}: encoding {where} gave id {int(ids.max())}, outside its vocabulary of {self.vocab_size}",
                Location(file=self.shown),
            )
        spans = np.asarray(encoded.offsets, dtype=np.int64).reshape(-1, 2)
        return ids, spans[:, 0], spans[:, 1]

    def splits_at(self, text: str, at: int) -> bool:
        """Whether the tokenizer's pre-tokenizer puts no word across `text[at]`'s start and splits
        the text before it into the same words when the text ends there (GPT-2's "\r\n" before a
        letter is two words, at the end of a text one), looking CUT_WINDOW characters either side;
        True for a tokenizer without a pre-tokenizer."""
        pre = self._tokenizer.pre_tokenizer
        if pre is None:
            return True
        begin = max(0, at - CUT_WINDOW)
        words = [span for _, span in pre.pre_tokenize_str(text[begin : at + CUT_WINDOW])]
        if any(start < at - begin < end for start, end in words):
            return False
        before = [span for _, span in pre.pre_tokenize_str(text[begin:at])]
        return before == [(start, end) for start, end in words if end <= at - begin]

    def _check_expansion(self, text: str, where: str) -> None:
        normalizer = self._tokenizer.normalizer
        if normalizer is None:
            return
        for start in range(0, len(text), NORMALIZE_SPAN):
            span = text[start : start + NORMALIZE_SPAN]
            size = len(normalizer.normalize_str(span))
            if size > MAX_EXPANSION * len(span) + 64:
                raise MadslError(
                    f"{self.shown}: its normalizer turns {len(span):,} characters of {where} into "
                    f"{size:,}, more than {MAX_EXPANSION} times as many",
                    Location(file=self.shown),
                    hint="a normalizer that expands text this much is not one for training text",
                )


def load_tokenizer(tokenizer: str | os.PathLike) -> ByteTokenizer | FileTokenizer:
    """ "bytes", or the tokenizer.json at the path `tokenizer`; a MadslError names it as it was
    written: empty, a URL (nothing is downloaded), missing or not a regular file."""
    shown = os.fspath(tokenizer)
    if shown == BYTES:
        return ByteTokenizer()
    path = require_path(shown, option("tokenizer"))
    expected = '"bytes" or a Hugging Face tokenizer.json file'
    if _URL.match(shown):
        raise MadslError(
            f"{option('tokenizer')} {shown}: a URL, not a tokenizer file (nothing is downloaded)",
            Location(file=shown),
            expected=expected,
            hint="download the tokenizer.json and name the local file",
        )
    if not path.is_file():
        what = (
            "not a regular file"
            if path.exists()
            else "a symbolic link that leads nowhere (dangling, or a loop)"
            if path.is_symlink()
            else "no such tokenizer file"
        )
        raise MadslError(f"{shown}: {what}", Location(file=shown), expected=expected)
    return FileTokenizer(path, shown)

"""Where the text to prepare comes from: files, folders and the bundled corpora, as documents.

A source is a text file (one document), a folder (every file below it, recursively, in the
order of their paths: each a document) or `bundled:NAME` (a corpus shipped in
madsl/corpus/bundled/, see its README.md). Every document must be UTF-8 text: a file holding a
NUL byte (binary) or bytes that are not UTF-8 is refused by name, as are a file named twice, a
folder with no file, and a link to a folder inside a folder (named directly, it is read).

A source is recorded in tokens.json by its name (a file's or folder's own name, not where it
lies, so the same text prepared elsewhere gives the same hash), its count of documents and bytes,
and a sha256 over each document's name and bytes.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from madsl.errors import Location, MadslError, did_you_mean

BUNDLED_PREFIX = "bundled:"
BUNDLED_DIR = Path(__file__).parent / "bundled"


@dataclass(frozen=True)
class BundledCorpus:
    file: str  # in BUNDLED_DIR, gzip-compressed UTF-8 text
    sha256: str  # of the uncompressed text
    description: str


BUNDLED = {
    "tinyshakespeare": BundledCorpus(
        "tinyshakespeare.txt.gz", "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        "Tiny Shakespeare (1,115,394 bytes; karpathy/char-rnn), public domain"),
}


@dataclass(frozen=True)
class Document:
    name: str  # as recorded: "corpus/part1.txt" for a file of folder corpus/
    path: str  # where it was read from, for messages
    data: bytes
    text: str


@dataclass(frozen=True)
class Source:
    name: str  # as recorded: "bundled:NAME", or the file's or folder's own name
    files: tuple[tuple[str, Path], ...]  # (recorded name, path) of each document; empty for a bundled corpus


def list_sources(references: Sequence[str | os.PathLike]) -> list[Source]:
    """Each reference as a Source whose files are listed (nothing read yet), or a MadslError."""
    if not references:
        raise MadslError("no text to prepare", expected="text files, folders or bundled:NAME")
    sources, seen = [], {}
    for reference in references:
        source = _source(str(reference))
        for _, path in source.files:
            key = path.resolve()
            if key in seen:
                raise MadslError(f"{path}: named twice (also as {seen[key]})", Location(file=str(path)),
                                 hint="each document is read once; name it once")
            seen[key] = path
        if source.name in {s.name for s in sources} and not source.files:
            raise MadslError(f"{source.name}: named twice", hint="each corpus is read once; name it once")
        sources.append(source)
    return sources


def _source(reference: str) -> Source:
    if reference.startswith(BUNDLED_PREFIX):
        name = reference[len(BUNDLED_PREFIX):]
        if name not in BUNDLED:
            raise MadslError(f"no bundled corpus {name!r}", expected=", ".join(BUNDLED_PREFIX + n for n in BUNDLED),
                             hint=did_you_mean(name, BUNDLED))
        return Source(reference, ())
    path = Path(reference)
    where = Location(file=reference)
    if path.is_file():
        return Source(path.name, ((path.name, path),))
    if path.is_dir():
        name = path.resolve().name or "root"
        files = tuple((f"{name}/{relative}", path / relative) for relative in _files_below(path))
        if not files:
            raise MadslError(f"{reference}: the folder holds no file", where)
        return Source(name, files)
    what = "not a regular file or folder" if path.exists() else "no such file or folder"
    hint = f"a bundled corpus is named {BUNDLED_PREFIX}NAME" if reference in BUNDLED else None
    raise MadslError(f"{reference}: {what}", where, hint=hint)


def _files_below(folder: Path) -> list[str]:
    """Every file below `folder`, as sorted relative POSIX paths; a link to a folder or anything
    that is not a file (a fifo, a socket) is refused rather than skipped."""
    found = []
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            if os.path.islink(os.path.join(root, name)):
                raise MadslError(f"{os.path.join(root, name)}: a link to a folder (not followed)",
                                 Location(file=os.path.join(root, name)), hint="name the folder it links to itself")
        for name in files:
            path = Path(root, name)
            if not path.is_file():
                raise MadslError(f"{path}: not a regular file", Location(file=str(path)))
            found.append(path.relative_to(folder).as_posix())
    return sorted(found)


def read_documents(source: Source) -> Iterator[Document]:
    """The source's documents, one at a time, each checked to be UTF-8 text."""
    if not source.files:
        yield _bundled(source.name[len(BUNDLED_PREFIX):])
        return
    for name, path in source.files:
        try:
            data = path.read_bytes()
        except OSError as err:
            raise MadslError(f"{path}: cannot be read ({err.strerror or err})", Location(file=str(path))) from None
        yield Document(name, str(path), data, decode_text(data, str(path)))


def decode_text(data: bytes, where: str) -> str:
    """`data` as text, or a MadslError naming `where`: a NUL byte (a binary file) or not UTF-8."""
    nul = data.find(b"\0")
    if nul >= 0:
        raise MadslError(f"{where}: a binary file, not text (a NUL byte at offset {nul:,})", Location(file=where),
                         hint="name text files only (UTF-8)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise MadslError(f"{where}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start:,})",
                         Location(file=where), hint="convert it to UTF-8, or leave it out") from None


def _bundled(name: str) -> Document:
    corpus = BUNDLED[name]
    path = BUNDLED_DIR / corpus.file
    try:
        data = gzip.decompress(path.read_bytes())
    except (OSError, EOFError, zlib.error) as err:
        raise MadslError(f"{path}: the bundled corpus {name} cannot be read ({err})", Location(file=str(path)),
                         hint="reinstall madsl") from None
    if hashlib.sha256(data).hexdigest() != corpus.sha256:
        raise MadslError(f"{path}: the bundled corpus {name} is not the text madsl ships (its sha256 differs)",
                         Location(file=str(path)), hint="reinstall madsl")
    return Document(name, str(path), data, decode_text(data, str(path)))


class SourceDigest:
    """A source's record in tokens.json, summed over its documents as they are read."""

    def __init__(self, name: str):
        self.name, self.documents, self.bytes = name, 0, 0
        self._sha = hashlib.sha256()

    def add(self, document: Document) -> None:
        self.documents += 1
        self.bytes += len(document.data)
        self._sha.update(f"{document.name}\0{len(document.data)}\0".encode())
        self._sha.update(document.data)

    def record(self) -> dict:
        return {"name": self.name, "documents": self.documents, "bytes": self.bytes,
                "sha256": self._sha.hexdigest()}

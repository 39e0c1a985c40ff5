"""Where the text to prepare comes from: files, folders and the bundled corpora, as documents.

A source is a text file (one document), a folder (every file below it, recursively, in the
order of their paths: each a document) or `bundled:NAME` (a corpus shipped in
madsl/corpus/bundled/, see its README.md). Every document must be UTF-8 text: a file holding a
NUL byte (binary) or bytes that are not UTF-8 is refused by name, as are a file named twice, a
folder with no file, a link to a folder inside a folder (named directly, it is read), a link in a
folder that leads out of it (one to another file of the folder is read) and anything in a folder
that is not a regular file. A document is read in chunks (`read_chunks`), never whole: the
checks name the byte offset in the file.

A source is recorded in tokens.json by its name (a file's or folder's own name, not where it
lies, so the same text prepared elsewhere gives the same hash), its count of documents and bytes,
and a sha256 over each document's name and bytes.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import io
import os
import stat
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, Sequence

from madsl.errors import Location, MadslError, did_you_mean
from madsl.paths import require_inside, require_path

BUNDLED_PREFIX = "bundled:"
BUNDLED_DIR = Path(__file__).parent / "bundled"


@dataclass(frozen=True)
class BundledCorpus:
    file: str  # in BUNDLED_DIR, gzip-compressed UTF-8 text
    sha256: str  # of the uncompressed text
    description: str


BUNDLED = {
    "tinyshakespeare": BundledCorpus(
        "tinyshakespeare.txt.gz",
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        "Tiny Shakespeare (1,115,394 bytes; karpathy/char-rnn), public domain",
    ),
    "kjv": BundledCorpus(
        "kjv.txt.gz",
        "82fa5f3788c6a9a010fb128a0f0bf588984b5888a82058520620eded59b033ea",
        "the King James Bible (4,298,239 bytes; Debian's bible-kjv-text 4.38), public domain",
    ),
}


@dataclass(frozen=True)
class Document:
    name: str  # as recorded: "corpus/part1.txt" for a file of folder corpus/
    path: str  # where it is read from, for messages
    size: int  # its bytes
    data: bytes | None = None  # held in memory (a bundled corpus); None: read from `path` in chunks


@dataclass(frozen=True)
class Chunk:
    offset: int  # of its first byte in the document
    data: bytes
    text: str  # `data` decoded (a chunk ends on a character's boundary)


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
        source = _source(os.fspath(reference))
        for _, path in source.files:
            key = _where_it_lies(path)
            if key in seen:
                raise MadslError(
                    f"{path}: named twice (also as {seen[key]})",
                    Location(file=str(path)),
                    hint="each document is read once; name it once",
                )
            seen[key] = path
        if source.name in {s.name for s in sources} and not source.files:
            raise MadslError(f"{source.name}: named twice", hint="each corpus is read once; name it once")
        sources.append(source)
    return sources


def _where_it_lies(path: Path) -> Path:
    """A file's place (its folder resolved, its own name kept): a link is a document of its own,
    while `a.txt` and `./a.txt`, or a folder and a file in it, are one file named twice."""
    return Path(os.path.realpath(path.parent)) / path.name if path.is_symlink() else path.resolve()


def _source(reference: str) -> Source:
    if reference.startswith(BUNDLED_PREFIX):
        name = reference[len(BUNDLED_PREFIX) :]
        if name not in BUNDLED:
            raise MadslError(
                f"no bundled corpus {name!r}",
                expected=", ".join(BUNDLED_PREFIX + n for n in BUNDLED),
                hint=did_you_mean(name, BUNDLED),
            )
        return Source(reference, ())
    path = require_path(reference, "TEXT")  # an unset $CORPUS must not mean the current folder
    where = Location(file=reference)
    if path.is_file():
        return Source(path.name, ((path.name, path),))
    if path.is_dir():
        name = path.resolve().name or "root"
        files = tuple((f"{name}/{relative}", path / relative) for relative in _files_below(path))
        if not files:
            raise MadslError(f"{reference}: the folder holds no file", where)
        return Source(name, files)
    what = (
        "not a regular file or folder"
        if path.exists()
        else "a symbolic link that leads nowhere (dangling, or a loop)"
        if path.is_symlink()
        else "no such file or folder"
    )
    hint = f"a bundled corpus is named {BUNDLED_PREFIX}NAME" if reference in BUNDLED else None
    raise MadslError(f"{reference}: {what}", where, hint=hint)


def _files_below(folder: Path) -> list[str]:
    """Every file below `folder`, as sorted relative POSIX paths; a link to a folder, a link that
    leads out of `folder` (never read: `prepare corpus/` must not tokenize corpus/pw -> /etc/passwd)
    or anything that is not a file (a fifo, a socket, a dangling link) is refused rather than skipped."""
    found = []
    for root, dirs, files in os.walk(folder, onerror=_unreadable):
        for name in dirs:
            if os.path.islink(os.path.join(root, name)):
                raise MadslError(
                    f"{os.path.join(root, name)}: a link to a folder (not followed)",
                    Location(file=os.path.join(root, name)),
                    hint="name the folder it links to itself",
                )
        for name in files:
            path = Path(root, name)
            if path.is_symlink():
                if not path.exists():
                    raise MadslError(
                        f"{path}: a symbolic link that leads nowhere (dangling, or a loop)",
                        Location(file=str(path)),
                        hint="remove the link, or restore what it points to",
                    )
                require_inside(path, folder, "a file of the text folder")
            if not path.is_file():
                raise MadslError(
                    f"{path}: not a regular file (a fifo, socket or device)",
                    Location(file=str(path)),
                    hint="a text folder holds text files only",
                )
            found.append(path.relative_to(folder).as_posix())
    return sorted(found)


def _unreadable(err: OSError) -> None:
    raise MadslError(
        f"{err.filename}: the folder cannot be read ({err.strerror or err})", Location(file=str(err.filename))
    )


def read_documents(source: Source) -> Iterator[Document]:
    """The source's documents, one at a time (a file's size taken, nothing read yet)."""
    if not source.files:
        yield _bundled(source.name[len(BUNDLED_PREFIX) :])
        return
    for name, path in source.files:
        try:
            size = path.stat().st_size
        except OSError as err:
            raise MadslError(f"{path}: cannot be read ({err.strerror or err})", Location(file=str(path))) from None
        yield Document(name, str(path), size)


def read_chunks(document: Document, chunk_bytes: int) -> Iterator[Chunk]:
    """The document's bytes, `chunk_bytes` at a time (a chunk's end moved back to a character's
    boundary), each checked to be UTF-8 text: a NUL byte (a binary file), bytes that are not
    UTF-8, or a file whose size changed while it was read is a MadslError naming the byte offset."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset = 0
    with _opened(document) as f:
        while True:
            block = f.read(min(chunk_bytes, document.size - offset + 1))
            if offset + len(block) > document.size or (not block and offset < document.size):
                raise MadslError(
                    f"{document.path}: the file changed while it was read (its size was {document.size:,} bytes)",
                    Location(file=document.path),
                    hint="prepare it again",
                )
            final = offset + len(block) == document.size
            held = decoder.getstate()[0]  # the bytes of a character the last block cut, decoded with these
            text = _decode(decoder, held, block, final, offset - len(held), document.path)
            data = held + block[: len(block) - len(decoder.getstate()[0])]
            if data or final:
                yield Chunk(offset - len(held), data, text)
            offset += len(block)
            if final:
                return


@contextmanager
def _opened(document: Document) -> Iterator[BinaryIO]:
    if document.data is not None:
        yield io.BytesIO(document.data)
        return
    try:  # (non-blocking: a file swapped for a fifo since it was listed must not hang the read)
        fd = os.open(document.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        raise MadslError(
            f"{document.path}: cannot be read ({err.strerror or err})", Location(file=document.path)
        ) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise MadslError(f"{document.path}: not a regular file", Location(file=document.path))
        yield f


def _decode(decoder: codecs.IncrementalDecoder, held: bytes, block: bytes, final: bool, start: int, where: str) -> str:
    nul = block.find(b"\0")
    if nul >= 0:
        raise MadslError(
            f"{where}: a binary file, not text (a NUL byte at offset {start + len(held) + nul:,})",
            Location(file=where),
            hint="name text files only (UTF-8)",
        )
    try:
        return decoder.decode(block, final)
    except UnicodeDecodeError as err:  # err.start counts from the bytes held from the last block
        raise MadslError(
            f"{where}: not UTF-8 text (byte 0x{(held + block)[err.start]:02x} at offset {start + err.start:,})",
            Location(file=where),
            hint="convert it to UTF-8, or leave it out",
        ) from None


def _bundled(name: str) -> Document:
    corpus = BUNDLED[name]
    path = BUNDLED_DIR / corpus.file
    try:
        data = gzip.decompress(path.read_bytes())
    except (OSError, EOFError, zlib.error) as err:
        raise MadslError(
            f"{path}: the bundled corpus {name} cannot be read ({err})",
            Location(file=str(path)),
            hint="reinstall madsl",
        ) from None
    if hashlib.sha256(data).hexdigest() != corpus.sha256:
        raise MadslError(
            f"{path}: the bundled corpus {name} is not the text madsl ships (its sha256 differs)",
            Location(file=str(path)),
            hint="reinstall madsl",
        )
    return Document(name, str(path), len(data), data)


class SourceDigest:
    """A source's record in tokens.json, summed over its documents as they are read."""

    def __init__(self, name: str):
        self.name, self.documents, self.bytes = name, 0, 0
        self._sha = hashlib.sha256()

    def begin(self, document: Document) -> None:
        """A document starts: its name and size (its bytes follow, through `update`)."""
        self.documents += 1
        self.bytes += document.size
        self._sha.update(f"{document.name}\0{document.size}\0".encode())

    def update(self, data: bytes) -> None:
        self._sha.update(data)

    def record(self) -> dict:
        return {"name": self.name, "documents": self.documents, "bytes": self.bytes, "sha256": self._sha.hexdigest()}

"""Text in, token files out: `prepare(sources, tokenizer, out_dir)` writes train.bin, val.bin and
tokens.json (see madsl.corpus.info), and `resolve_tokens` gives a run its data from a name.

The split is per document: the last `val_fraction` of each document's tokens goes to val.bin
(a document of n tokens keeps its first int(n x (1 - val_fraction)) for training, nanoGPT's
rule), so the validation text samples every document, and a single text such as Tiny
Shakespeare splits as nanoGPT splits it: its last tenth is held out. The documents' tokens are
written one after another, in the order the sources were named (a folder's files in path order),
with nothing between them.

Memory stays bounded whatever the size of a document (madsl.corpus.encode): a 100 MB text file
peaks at about 120 MB of resident memory with "bytes" and 110 MB with a BPE tokenizer.json (the
command alone, Python and numpy, is about 55 MB); held whole, it peaked at 1.35 GB.

The output is written atomically: each file goes to a temporary name beside it and is moved into
place only once everything is read and encoded (tokens.json last: a folder without it is not
prepared), so a failure leaves any earlier preparation as it was. A folder holding anything else
is refused unless `force`. The same sources and tokenizer give the same bytes and the same hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

from madsl.corpus.checked import remember
from madsl.corpus.encode import SplitWriter, encode_document
from madsl.corpus.info import (
    FORMAT_VERSION,
    INFO_FILE,
    PER_DOCUMENT,
    SPLIT_FILES,
    TokenInfo,
    dtype_for_vocab,
    write_info,
)
from madsl.corpus.sources import BUNDLED, BUNDLED_PREFIX, Source, SourceDigest, list_sources, read_documents
from madsl.corpus.tokenizer import BYTES, load_tokenizer
from madsl.corpus.tokens import TokenData, open_tokens
from madsl.errors import Location, MadslError, option
from madsl.outputs import check_output_dir, fsync_folder, output_error
from madsl.paths import require_path

DEFAULT_VAL_FRACTION = 0.1
OWNED = frozenset({INFO_FILE, *SPLIT_FILES.values()})


def prepare(
    sources: Sequence[str | os.PathLike],
    tokenizer: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    force: bool = False,
) -> TokenInfo:
    """Tokenize `sources` (text files, folders, "bundled:NAME") with `tokenizer` ("bytes" or a
    tokenizer.json path) into train.bin, val.bin and tokens.json in `out_dir`; what was written."""
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
        raise MadslError(
            f"{option('val_fraction')} {val_fraction!r}: not a fraction between 0 and 1",
            expected="e.g. 0.1 (the last tenth of each document's tokens is held out)",
        )
    require_path(out_dir, option("out_dir"))
    encoder = load_tokenizer(tokenizer)
    listed = list_sources(sources)
    folder = check_output_dir(
        out_dir, option("out_dir"), lambda name: name in OWNED, force=force, writes="train.bin, val.bin and tokens.json"
    )
    _check_apart(folder, sources)
    dtype = dtype_for_vocab(encoder.vocab_size)
    created = not folder.exists()
    writers: dict[str, SplitWriter] = {}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        writers = {split: SplitWriter(folder / name, dtype) for split, name in SPLIT_FILES.items()}
        info = _encode(listed, encoder, float(val_fraction), writers, dtype)
        _check_both_splits(info, listed)
        (folder / INFO_FILE).unlink(missing_ok=True)  # while the .bin files change, the folder is not prepared
        for writer in writers.values():
            writer.commit()
        write_info(folder / INFO_FILE, info)
        remember(folder, info)  # its bytes were hashed and its ids checked as they were written
    except BaseException as err:
        for writer in writers.values():
            writer.discard()
        if created:
            shutil.rmtree(folder, ignore_errors=True)  # a folder this call made holds only its own files
        if isinstance(err, OSError):  # a full disk, a read-only filesystem
            raise output_error(err, folder, option("out_dir")) from None
        raise
    return info


def _encode(listed: list, encoder, val_fraction: float, writers: dict[str, SplitWriter], dtype: str) -> TokenInfo:
    """Every document of every source encoded into the splits' writers; the TokenInfo they make."""
    records = []
    for source in listed:
        digest = SourceDigest(source.name)
        for document in read_documents(source):
            encode_document(encoder, document, val_fraction, writers, digest)
        records.append(digest.record())
    return TokenInfo(
        FORMAT_VERSION,
        encoder.name,
        encoder.sha256,
        encoder.vocab_size,
        dtype,
        writers["train"].tokens,
        writers["val"].tokens,
        writers["train"].text_bytes,
        writers["val"].text_bytes,
        PER_DOCUMENT,
        val_fraction,
        tuple(records),
        {SPLIT_FILES[s]: w.sha.hexdigest() for s, w in writers.items()},
    ).with_hash()


def _check_apart(folder: Path, sources: Sequence[str | os.PathLike]) -> None:
    """The output folder must not lie in a text folder: its files would be read as text next time."""
    for reference in sources:
        text = Path(os.fspath(reference))
        if text.is_dir() and folder.is_relative_to(text.resolve()):
            raise MadslError(
                f"{option('out_dir')} {folder}: lies inside the text folder {os.fspath(reference)}",
                Location(file=os.fspath(reference)),
                hint="write the token files to a folder outside the text: its files are all read",
            )


def _check_both_splits(info: TokenInfo, listed: list[Source]) -> None:
    for split in SPLIT_FILES:
        if info.tokens(split) == 0:
            names = ", ".join(source.name for source in listed)
            raise MadslError(
                f"{names}: {info.train_tokens + info.val_tokens:,} tokens in all leave the {split} split empty",
                Location(file=names if len(listed) == 1 else None),
                hint="more text, or another val fraction",
            )


def bundled_folder_name(name: str) -> str:
    """The cache folder a bundled corpus is prepared into: its name and a key of everything that
    makes the files (format, the text's sha256, tokenizer, split)."""
    recipe = [FORMAT_VERSION, name, BUNDLED[name].sha256, BYTES, PER_DOCUMENT, DEFAULT_VAL_FRACTION]
    return f"{name}-{hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:16]}"


def resolve_tokens(
    reference: str,
    cache_dir: str | os.PathLike,
    *,
    dtype: object = None,
    vocab_size: int | None = None,
    verify: bool = False,
) -> TokenData:
    """A run's token data from its name: "bundled:NAME" is prepared with the bytes tokenizer once
    into cache_dir/<folder named by bundled_folder_name> and reused; anything else is a folder
    opened with open_tokens (dtype and vocab_size for a nanoGPT folder without tokens.json)."""
    reference = str(reference)
    if not reference.startswith(BUNDLED_PREFIX):
        return open_tokens(reference, dtype=dtype, vocab_size=vocab_size, verify=verify)
    list_sources([reference])  # an unknown name is refused here
    folder = Path(cache_dir) / bundled_folder_name(reference[len(BUNDLED_PREFIX) :])
    if not (folder / INFO_FILE).exists():
        _prepare_into_cache(reference, folder)
    return open_tokens(folder, verify=verify)


def _prepare_into_cache(reference: str, folder: Path) -> None:
    """Prepare into a fresh folder beside `folder`, then rename it into place: of processes that
    prepare at once, one rename wins and the others' folders are removed."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        fresh = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    except OSError as err:
        raise output_error(err, folder.parent, "cache_dir") from None
    try:
        prepare([reference], BYTES, fresh)
        os.rename(fresh, folder)  # not os.replace: the first of processes preparing at once wins
        fsync_folder(folder.parent)
    except OSError:
        if not (folder / INFO_FILE).exists():
            raise MadslError(
                f"{folder}: exists but holds no {INFO_FILE}",
                Location(file=str(folder)),
                hint="delete it: it is prepared again on the next run",
            ) from None
    finally:
        shutil.rmtree(fresh, ignore_errors=True)

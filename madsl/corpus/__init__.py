"""Real text for pretraining: token files, prepared from text or made by nanoGPT, and their batches.

    prepare(["corpus/", "notes.txt"], "bytes", "data/notes")   # text -> train.bin, val.bin, tokens.json
    data = open_tokens("data/notes")                           # checked by its bytes; splits as memmaps
    data.require_tokens(seq_len + 1)
    x, y = train_batch(data.train, batch_size, seq_len, seed, step)   # the same for the same (seed, step)
    x, y, scored = val_windows(data.val, seq_len, max_tokens)         # the same every time
    data.hash                                                  # identifies the data in a run's identity

A folder holds train.bin and val.bin (flat little-endian uint16 ids, uint32 above 65,536 ids:
nanoGPT's format) and tokens.json (TokenInfo: tokenizer, vocabulary, dtype, counts, the text's
bytes per split for bits per byte, the sources, a content hash). A folder of nanoGPT's files
alone is opened with its dtype and vocabulary declared. `madsl data prepare` is the command line.

Modules: info (TokenInfo, tokens.json, the hash), tokens (open_tokens, TokenData, the checks),
checked (each token file's sha256 and vocabulary check, remembered in the user's cache),
batches (train_batch, val_windows, unigram_entropy), sources (files, folders, bundled corpora,
read in chunks), tokenizer ("bytes", a tokenizer.json), encode (one document into the splits, in
bounded memory), prepare (prepare, resolve_tokens). They import numpy;
nothing of madsl's torch-free core imports them.
"""

from madsl.corpus.batches import ValWindows, train_batch, unigram_entropy, val_windows
from madsl.corpus.info import TokenInfo
from madsl.corpus.prepare import prepare, resolve_tokens
from madsl.corpus.sources import BUNDLED
from madsl.corpus.tokens import TokenData, open_tokens

__all__ = [
    "BUNDLED",
    "TokenData",
    "TokenInfo",
    "ValWindows",
    "open_tokens",
    "prepare",
    "resolve_tokens",
    "train_batch",
    "unigram_entropy",
    "val_windows",
]

"""Text classification on a labelled set of the user's own (seed 004's IMDB setting): texts
tokenized by `madsl data prepare-labelled` (madsl.corpus.labelled) into a folder this task reads.

    madsl data prepare-labelled reviews/ --tokenizer gpt-neo/tokenizer.json --seq-len 512 -o reviews-tokens
    madsl eval hybrid.mad --task text-classification --set data=reviews-tokens

The folder holds, per split, `{split}.npy` (int32 (N, seq_len) token ids, each text from the
first position, PAD = -1 after its last token) and `{split}-labels.npy` (int64 (N,) classes), and
`labelled.json` (LabelledInfo: the tokenizer, the vocabulary, the classes, the length, counts and
a hash of the four arrays' bytes). The head is "pooled" (madsl.runner.train.heads): the backbone
reads each text with its padding replaced by token 0, after its last token, where a causal model's
outputs for the text's tokens cannot see it; the mean of the outputs over the text's own tokens
goes through a linear layer with a bias, as the seed's HybridModelTextClassification reads GPT-Neo
and Mamba backbones (its batch size 1 pads nothing).

The data is named by its folder (`data`) and identified by its bytes: planning fills in
`data_sha256` from the arrays (checked against labelled.json's hash), so a run id changes when the
data does, and generating checks it again. The folder is read as untrusted input: every file by
name inside it (a link out of it is refused), headers before data, every value in range.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from madsl.errors import Location, MadslError
from madsl.tasks.base import Split, Task, TaskData

PAD = -1  # after a text's last token; the pooled head masks it
INFO_FILE = "labelled.json"
FORMAT = 1
SPLITS: tuple[Split, ...] = ("train", "test")
MAX_INFO_BYTES = 1 << 20


def split_files(split: str) -> tuple[str, str]:
    """The token and label files of a split."""
    return f"{split}.npy", f"{split}-labels.npy"


def arrays_hash(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over the arrays in split order (tokens, then labels), each as its dtype, shape and bytes."""
    digest = hashlib.sha256()
    for split in SPLITS:
        for name in split_files(split):
            array = np.ascontiguousarray(arrays[name])
            digest.update(f"{name}:{array.dtype.str}:{list(array.shape)}\n".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class LabelledInfo:
    """What labelled.json says of a prepared set."""

    tokenizer: str
    tokenizer_sha256: str | None
    vocab_size: int
    num_classes: int
    seq_len: int
    counts: dict[str, dict[str, int]]  # split -> {"examples", "tokens", "truncated"}
    sources: dict[str, str]  # split -> the sha256 of the .jsonl it was made from
    hash: str

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **self.__dict__}


def _refuse(folder: Path, message: str, hint: str | None = None) -> MadslError:
    return MadslError(
        f"{folder}: {message}",
        Location(file=str(folder)),
        hint=hint or "prepare it again: madsl data prepare-labelled TEXTS --tokenizer T --seq-len N -o DIR",
    )


def _read_inside(folder: Path, name: str, limit: int | None = None) -> bytes:
    """A regular file of `folder` by name, not followed out of it through a link."""
    path = folder / name
    if path.is_symlink() or not path.is_file():
        what = "a symbolic link" if path.is_symlink() else "missing or not a regular file"
        raise _refuse(folder, f"{name} is {what}", "the files of a prepared set are its own, inside its folder")
    with open(path, "rb") as f:
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise _refuse(folder, f"{name} is larger than {limit:,} bytes, not madsl's")
    return data


def read_info(folder: Path) -> LabelledInfo:
    """labelled.json of `folder`, every field checked."""
    try:
        raw = json.loads(_read_inside(folder, INFO_FILE, MAX_INFO_BYTES).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _refuse(folder, f"{INFO_FILE} is not JSON ({err})") from None
    fields = set(LabelledInfo.__dataclass_fields__)
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or set(raw) != fields | {"format"}:
        raise _refuse(folder, f"{INFO_FILE} is not a prepared labelled set of format {FORMAT}")
    ints = [raw["vocab_size"], raw["num_classes"], raw["seq_len"]]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in ints) or raw["num_classes"] < 2:
        raise _refuse(
            folder, f"{INFO_FILE}: vocab_size, num_classes (at least 2) and seq_len must be positive integers"
        )
    if not isinstance(raw["hash"], str) or len(raw["hash"]) != 64:
        raise _refuse(folder, f"{INFO_FILE}: hash is not a sha256")
    return LabelledInfo(**{key: raw[key] for key in fields})


def _load_array(folder: Path, name: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """An .npy file of the expected dtype and shape (its header read first; no pickles)."""
    import io

    data = _read_inside(folder, name)
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError) as err:
        raise _refuse(folder, f"{name} is not a .npy array ({err})") from None
    if array.dtype != np.dtype(dtype) or array.shape[1:] != shape[1:] or array.ndim != len(shape):
        raise _refuse(
            folder,
            f"{name} is {array.dtype} {list(array.shape)}; expected {dtype} (N{', ' if shape[1:] else ''}"
            f"{', '.join(map(str, shape[1:]))})",
        )
    return array


@lru_cache(maxsize=8)
def _open(folder_text: str, stamp: tuple) -> tuple[LabelledInfo, dict[str, np.ndarray]]:
    folder = Path(folder_text)
    info = read_info(folder)
    arrays: dict[str, np.ndarray] = {}
    for split in SPLITS:
        tokens_name, labels_name = split_files(split)
        tokens = _load_array(folder, tokens_name, "int32", (0, info.seq_len))
        labels = _load_array(folder, labels_name, "int64", (0,))
        if len(tokens) != len(labels) or len(tokens) == 0:
            raise _refuse(folder, f"{split}: {len(tokens)} texts and {len(labels)} labels (at least one of each)")
        if tokens.min() < PAD or tokens.max() >= info.vocab_size or (tokens[:, 0] == PAD).any():
            raise _refuse(
                folder,
                f"{tokens_name}: token ids outside the vocabulary of {info.vocab_size}, or a text without tokens",
            )
        if ((tokens[:, 1:] != PAD) & (tokens[:, :-1] == PAD)).any():
            raise _refuse(folder, f"{tokens_name}: a token after padding (padding follows a text's last token)")
        if labels.min() < 0 or labels.max() >= info.num_classes:
            raise _refuse(folder, f"{labels_name}: classes outside 0..{info.num_classes - 1}")
        arrays[tokens_name], arrays[labels_name] = tokens, labels
    if arrays_hash(arrays) != info.hash:
        raise _refuse(folder, f"the arrays' bytes do not hash to {INFO_FILE}'s hash (changed or damaged)")
    return info, arrays


def open_labelled(folder: str | os.PathLike) -> tuple[LabelledInfo, dict[str, np.ndarray]]:
    """A prepared labelled set: its info and arrays, checked (read again when a file changes)."""
    path = Path(folder)
    if not str(folder) or not path.is_dir():
        raise MadslError(
            f"text-classification data={str(folder)!r}: not a folder",
            hint="set data=DIR, a folder written by madsl data prepare-labelled",
        )
    stamp = []  # each file's own (not a link's target's) kind, inode, time and size: a change reads it again
    for name in (INFO_FILE, *(n for s in SPLITS for n in split_files(s))):
        try:
            st = os.lstat(path / name)
            stamp.append((name, st.st_mode, st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            stamp.append((name, None))
    return _open(str(path.resolve()), tuple(stamp))


class TextClassification(Task):
    name = "text-classification"
    head = "pooled"
    baseline = {"data": "", "data_sha256": ""}
    source = "seed 004 (sadmankiba/hybrid-model): IMDB sentiment, mean-pooled features and a linear head"
    generated = False  # the data is a folder of the user's, checked by open_labelled as it is read

    def resolve_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The setting with `data_sha256` filled from the data's bytes (what identifies a run's data);
        a setting without data (the baseline a protocol alone plans) is left as it is."""
        if not settings.get("data"):
            return dict(settings)
        info, _ = open_labelled(settings["data"])
        given = settings.get("data_sha256") or info.hash
        if given != info.hash:
            raise MadslError(
                f"text-classification data={settings['data']}: its arrays hash to {info.hash[:12]}..., "
                f"not the data_sha256 {str(given)[:12]}... given",
                hint="the data changed since the setting was written; leave data_sha256 out to take it as it is",
            )
        return {**settings, "data_sha256": info.hash}

    def check(self, settings: Mapping[str, Any]) -> None:
        open_labelled(settings["data"])
        self.resolve_settings(settings)

    def data_shape(self, settings: Mapping[str, Any]) -> tuple[int, int, int]:
        """(seq_len, train texts, test texts) as prepared: what a plan costs."""
        info = open_labelled(settings["data"])[0]
        return info.seq_len, info.counts["train"]["examples"], info.counts["test"]["examples"]

    def vocab_size(self, settings: Mapping[str, Any]) -> int:
        return open_labelled(settings["data"])[0].vocab_size

    def num_classes(self, settings: Mapping[str, Any]) -> int:
        return open_labelled(settings["data"])[0].num_classes

    def generate(self, settings: Mapping[str, Any], split: Split, seed: int) -> TaskData:
        """The split as prepared (the seed plays no part: the runner shuffles the training order)."""
        resolved = self.resolve_settings(settings)
        info, arrays = open_labelled(resolved["data"])
        tokens_name, labels_name = split_files(split)
        meta = {"pad": PAD, "truncated": info.counts[split]["truncated"]}
        return TaskData(arrays[tokens_name].astype(np.int64), arrays[labels_name].copy(), meta)


TASKS = (TextClassification(),)

"""A local Hugging Face checkpoint folder, read as untrusted input: config.json and the weights in
safetensors, one file or shards named by model.safetensors.index.json. A pickle file (*.bin, *.pt,
*.pth, *.pkl, *.ckpt: what torch.save writes) is refused by name and never opened: unpickling a
file can run any code it holds. Only the safetensors headers are read until every tensor has been
placed (madsl.weights.load); `Checkpoint.tensor` then reads one tensor's data."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from madsl.errors import MadslError
from madsl.model_file import safetensors_tensors

CONFIG, INDEX = "config.json", "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_INDEX_BYTES = 16 * 2**20  # a model of 100,000 tensors names them in a few MiB
AGAIN = "save the checkpoint again with transformers' save_pretrained (safetensors, its default)"


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder: its config.json and, for every tensor, the file holding it and its
    (shape, safetensors dtype) from that file's header."""

    directory: Path
    config: Path
    files: dict[str, Path]
    headers: dict[str, tuple[tuple[int, ...], str]]

    def tensor(self, name: str) -> Any:
        """The tensor `name` (read from its file; a torch tensor on the CPU)."""
        from safetensors import safe_open

        path = self.files[name]
        try:
            with safe_open(str(path), framework="pt") as f:
                return f.get_tensor(name)
        except Exception as err:  # noqa: BLE001 - safetensors' own errors: a file changed since its header
            raise MadslError(f"{path}: tensor {name!r} cannot be read ({type(err).__name__})", hint=AGAIN) from None


def read_checkpoint(directory: str | os.PathLike) -> Checkpoint:
    """The checkpoint in `directory`, or a MadslError naming what is wrong: not a folder, no
    config.json, a pickle file, no safetensors, a broken index or shard, a tensor in two shards."""
    folder = Path(directory)
    if not folder.is_dir():
        raise MadslError(
            f"{folder}: not a folder", hint="a Hugging Face checkpoint is a folder of config.json and *.safetensors"
        )
    entries = sorted(entry for entry in folder.iterdir() if entry.is_file())
    for entry in entries:
        if entry.name.endswith(PICKLE_SUFFIXES):
            raise MadslError(
                f"{entry}: a pickle file (torch.save), which madsl never loads: unpickling a file can run any code "
                "it holds",
                hint=f"{AGAIN}, and move {entry.name} out of the folder",
            )
    config = folder / CONFIG
    if not config.is_file():
        raise MadslError(f"{folder}: no {CONFIG}", hint="a Hugging Face checkpoint folder holds its config.json")
    weight_map = _index(folder) if (folder / INDEX).exists() else None
    shards = (
        sorted({folder / name for name in weight_map.values()})
        if weight_map is not None
        else [e for e in entries if e.suffix == ".safetensors"]
    )
    if not shards:
        raise MadslError(f"{folder}: no *.safetensors file", hint=AGAIN)
    files: dict[str, Path] = {}
    headers: dict[str, tuple[tuple[int, ...], str]] = {}
    for shard in shards:
        for name, header in safetensors_tensors(shard, AGAIN).items():
            if name in files:
                raise MadslError(f"{shard}: tensor {name!r} is also in {files[name]}", hint=AGAIN)
            files[name], headers[name] = shard, header
    if weight_map is not None:
        for name in sorted(set(weight_map) | set(files)):
            if name not in files or folder / weight_map.get(name, "") != files[name]:
                raise MadslError(
                    f"{folder / INDEX}: tensor {name!r} is in {files[name].name if name in files else 'no shard'}, "
                    f"the index says {weight_map.get(name, 'none')}",
                    hint=AGAIN,
                )
    return Checkpoint(folder, config, files, headers)


def _index(folder: Path) -> dict[str, str]:
    """model.safetensors.index.json's weight_map (tensor -> shard), each shard a plain file name of
    a *.safetensors file in this folder."""
    path = folder / INDEX
    try:
        if not stat.S_ISREG(os.stat(path).st_mode) or os.stat(path).st_size > MAX_INDEX_BYTES:
            raise ValueError(f"not a regular file of at most {MAX_INDEX_BYTES // 2**20} MiB")
        index = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as err:
        raise MadslError(f"{path}: not a safetensors index ({err})", hint=AGAIN) from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise MadslError(f'{path}: "weight_map" must map tensor names to file names', hint=AGAIN)
    for name in sorted(set(weight_map.values())):
        if Path(name).name != name or not name.endswith(".safetensors") or not (folder / name).is_file():
            raise MadslError(f'{path}: "weight_map" names {name!r}, not a *.safetensors file of {folder}', hint=AGAIN)
    return weight_map

"""A compiled madsl model out as a Hugging Face checkpoint: config.json + model.safetensors that
transformers' `AutoModelForCausalLM.from_pretrained` loads with no missing or unexpected keys
(`madsl export MODEL_DIR --to-hf MODEL_TYPE -o DIR`, `madsl.weights.export_hf`).

The config is the spec's `convert --to-hf` (madsl.hf_config.to_hf_config: the family's keys of
its layer stack; transformers' defaults for the rest, which the family's name map requires: its
norms' eps, the unclamped Mamba-2 step), and the tensors are the family's import map run
backwards: each model tensor written under its checkpoint name, a fused projection split into
its parts (q, k, v rows) along the first axis, stacked experts into one matrix each. A model
tensor the map does not place is refused by name before anything is written; a tied head is left
out, as transformers' save_pretrained leaves it. Both files are written atomically.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from madsl.errors import MadslError
from madsl.weights.mapping import family

WEIGHTS, CONFIG = "model.safetensors", "config.json"


def hf_tensors(model: Any, model_type: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config.json's data, checkpoint name -> tensor) of `model` (a madsl.model.Model with its
    spec) as the family `model_type` writes it."""
    from madsl.hf_config import to_hf_config

    mapper = family(model_type, "--to-hf")
    if model_type in getattr(mapper, "NOT_EXPORTED", {}):  # imported, but no class of transformers loads it
        reason, hint = mapper.NOT_EXPORTED[model_type]
        raise MadslError(f"--to-hf {model_type}: {reason}", hint=hint)
    config = to_hf_config(model.spec, model_type)
    mapper.check_config(config, "the config.json madsl writes")
    sources = mapper.sources(model, config)
    tensors: dict[str, Any] = {}
    for name, tensor in model.state_dict().items():
        parts = sources.get(name)
        if parts is None:
            raise MadslError(
                f"the model's {name!r} has no tensor of a {model_type} checkpoint to go to",
                hint=f"a layer or option the {model_type} family does not have: nothing was written",
            )
        if parts[0].stacked:  # experts: one transposed matrix each
            pieces = [matrix.T for matrix in tensor.unbind(0)]
        else:
            sizes = [part.placed_shape()[0] for part in parts] if len(parts) > 1 else [tensor.shape[0]]
            pieces = tensor.split(sizes, dim=0) if len(parts) > 1 else (tensor,)
        if len(pieces) != len(parts):
            raise MadslError(f"the model's {name!r} has {len(pieces)} experts; the checkpoint {len(parts)}")
        for part, piece in zip(parts, pieces):
            _put(tensors, part, piece.detach().to("cpu"), name)
    if hasattr(mapper, "constants"):  # tensors of the config the checkpoint holds (MiniMax's decay buffers)
        tensors.update(mapper.constants(config))
    return config, tensors


def _put(tensors: dict[str, Any], part: Any, piece: Any, name: str) -> None:
    """Write `piece` (what `part` placed in the model's `name`) back where it came from: the whole
    checkpoint tensor, or its rows `part.take` (the rest filled by the part that shares it)."""
    import torch

    if part.reshaped is not None:
        piece = piece.reshape(part.shape)
    if part.transposed:
        piece = piece.transpose(-1, -2)
    if part.offset:
        piece = piece - part.offset
    if part.row_scale:
        piece = piece.float() / part.row_factors(piece)
    if part.take is None:
        if tuple(piece.shape) != part.shape:
            raise MadslError(f"the model's {name!r} does not split into {part.name!r} of shape {list(part.shape)}")
        tensors[part.name] = piece.contiguous().clone()
        return
    whole = tensors.setdefault(part.name, torch.zeros(part.shape, dtype=piece.dtype))
    whole[..., part.take[0] : part.take[1], :] = piece


def export_hf(model: Any, model_type: str, out: str | os.PathLike, *, force: bool = False) -> Path:
    """Write `model` into the folder `out` as a `model_type` checkpoint (the module's docstring);
    a folder holding other files is refused unless `force` (they are left as they are)."""
    from safetensors.torch import save_file

    from madsl.outputs import check_output_dir, write_atomic, write_text_atomic

    folder = check_output_dir(
        out, "-o", lambda name: name in (WEIGHTS, CONFIG), force=force, writes=f"{WEIGHTS} and {CONFIG}"
    )
    config, tensors = hf_tensors(model, model_type)
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / WEIGHTS, lambda name: save_file(tensors, name, metadata={"format": "pt"}))
    write_text_atomic(folder / CONFIG, json.dumps(config, indent=2) + "\n")
    return folder

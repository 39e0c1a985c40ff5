"""A Hugging Face checkpoint folder -> the madsl model of its config.json with its weights
(`madsl.load_pretrained`, `madsl import`).

The config is converted as `madsl convert --from-hf` converts it (madsl.interop.huggingface), the
spec compiled on the meta device (nothing allocated), and the family's name map (mapping.py) checked
against the safetensors headers: a tensor it cannot place, one the model needs and the checkpoint
lacks, or one of another shape is refused by name before any data is read. Then the model is built
and every tensor loaded (load_state_dict, strict): nothing keeps its random initialisation.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from madsl.errors import MadslError
from madsl.weights.checkpoint import Checkpoint, read_checkpoint
from madsl.weights.mapping import assemble, family, place


class Imported(NamedTuple):
    """A checkpoint imported: the model (madsl.model.Model, weights loaded), the spec's data (what
    `madsl import -o` writes as YAML) and the converter's notes (keys defaulted or read as
    transformers' class reads them)."""

    model: Any
    spec: dict[str, Any]
    notes: list[str]


def import_checkpoint(directory: str | os.PathLike, name: str | None = None) -> Imported:
    """The checkpoint in `directory` (config.json + *.safetensors) as a madsl model with its weights,
    its spec and the conversion's notes; a MadslError naming the file and tensor on any mismatch."""
    import torch

    from madsl.compiler import compile_spec
    from madsl.interop.huggingface.config import Config
    from madsl.interop.huggingface.families import read_hf_config
    from madsl.lang.spec import spec_from_data

    checkpoint = read_checkpoint(directory)
    where = str(checkpoint.directory)
    config = Config.load(checkpoint.config).data
    mapper = family(str(config.get("model_type")), str(checkpoint.config))
    read = read_hf_config(checkpoint.config, name or checkpoint.directory.resolve().name or "imported")
    mapper.check_config(config, str(checkpoint.config))
    spec = spec_from_data(read.data)
    with torch.device("meta"):
        planned = compile_spec(spec)
    sources = mapper.sources(planned, config)
    if hasattr(mapper, "as_spelled"):  # a family whose checkpoints spell some tensors two ways (Kimi Linear's)
        sources = mapper.as_spelled(sources, checkpoint.headers)
    shapes = {key: tuple(t.shape) for key, t in planned.state_dict().items()}
    tied = mapper.TIED if "head.weight" not in shapes else {}
    headers, skipped = _without_skipped(checkpoint.headers, getattr(mapper, "SKIPPED", {}))
    if hasattr(mapper, "constants"):  # tensors of the config, not of the model (MiniMax's decay buffers)
        headers = _check_constants(checkpoint, headers, mapper.constants(config), where)
    # a shared tensor the checkpoint holds more than once (Zamba2's shared blocks, under each hybrid layer)
    copies = mapper.copies(sources, checkpoint.headers) if hasattr(mapper, "copies") else {}
    place(sources, shapes, headers, {**tied, **copies}, where)
    _check_tied_copies(checkpoint, tied)
    _check_tied_copies(checkpoint, copies, "the model holds the tensor once (a shared block): nothing was loaded")
    model = compile_spec(spec)
    model.load_state_dict(assemble(sources, checkpoint.tensor, model.state_dict()), strict=True)
    model.eval()
    return Imported(model, read.data, read.notes + skipped)


def _without_skipped(headers: dict, skipped: dict[str, str]) -> tuple[dict, list[str]]:
    """The checkpoint's tensors but those a family's language model does not hold and transformers'
    AutoModelForCausalLM does not load either (the family's `SKIPPED`: name pattern -> what they
    are: Qwen3-Next's multi-token prediction head), and a note on each kind left out."""
    import re

    kept, notes = dict(headers), []
    for pattern, what in skipped.items():
        names = sorted(name for name in kept if re.fullmatch(pattern, name))
        for name in names:
            del kept[name]
        if names:
            notes.append(
                f"not imported: {what} ({len(names)} tensors, {names[0]}, ...), which transformers' "
                "AutoModelForCausalLM does not load either"
            )
    return kept, notes


def _check_constants(checkpoint: Checkpoint, headers: dict, constants: dict[str, Any], where: str) -> dict:
    """The headers but the family's constants (tensors its config determines, which the madsl model
    computes itself), each of which the checkpoint holds equal to its value within its dtype's rounding."""
    import torch

    for name, expected in constants.items():
        if name not in headers:
            continue  # transformers computes it at load where it is left out
        stored = checkpoint.tensor(name)
        close = tuple(stored.shape) == tuple(expected.shape) and torch.allclose(
            stored.float(), expected.float(), rtol=max(1e-5, 4 * torch.finfo(stored.dtype).eps), atol=1e-30
        )
        if not close:
            raise MadslError(
                f"{where}: {name!r} is not the constant its config.json makes of it ({list(expected.shape)})",
                hint="transformers computes it from the config (the lightning attention's decay): nothing was loaded",
            )
    return {name: header for name, header in headers.items() if name not in constants}


def _check_tied_copies(checkpoint: Checkpoint, tied: dict[str, str], why: str | None = None) -> None:
    """A tied tensor the checkpoint holds anyway must be its original, bit for bit (`why`: the refusal's
    reason where the tie is not the embeddings')."""
    import torch

    for copy, original in tied.items():
        if copy in checkpoint.headers and not torch.equal(checkpoint.tensor(copy), checkpoint.tensor(original)):
            if why is not None:
                raise MadslError(f"{checkpoint.directory}: {copy!r} differs from {original!r}", hint=why)
            raise MadslError(
                f"{checkpoint.directory}: {copy!r} differs from {original!r}, which the tied embeddings make it",
                hint="the config ties the embeddings (tie_word_embeddings) but the checkpoint's output head is "
                "another: nothing was loaded",
            )


def load_pretrained(directory: str | os.PathLike, *, device: Any = None) -> Any:
    """The madsl model (madsl.model.Model, in eval mode) of a local Hugging Face checkpoint folder,
    with every weight loaded by the family's name map (docs/weights.md); its spec is `model.spec`."""
    model = import_checkpoint(directory).model
    return model.to(device) if device is not None else model

"""The name maps of the families madsl imports weights of, and the check that a checkpoint fills a
model exactly: every model tensor from checkpoint tensors of the right names and shapes, every
checkpoint tensor placed, read from the headers alone (nothing allocated), each refusal naming the
tensor.

A family is one module (lfm2.py, bamba.py, ...: one per family `convert --from-hf` reads) with
`check_config(config, path)` (what its layers cannot compute as madsl's, refused by key),
`sources(model, config)` (each model tensor -> its checkpoint parts, concatenated along the first
axis where there are several) and `TIED` (checkpoint tensors that repeat another where the model
ties its embeddings). Optionally:
`as_spelled(sources, headers)` where its checkpoints spell some tensors two ways (kimi_linear.py);
`SKIPPED` (name pattern -> what it is) for tensors a causal language model does not hold and
transformers' AutoModelForCausalLM does not load either (qwen3_next.py: the vision encoder, the
multi-token-prediction head), left out with a note; `constants(config)` for tensors the config
determines, checked on import and written on export (minimax.py: the lightning decay buffers);
`NOT_EXPORTED` (model_type -> (reason, hint)) for types it imports but no class of transformers
loads (minimax_m1); `copies(sources, headers)` (copy -> the tensor the map reads) for a shared tensor
its checkpoints may hold more than once, each copy checked equal to it bit for bit (zamba2.py).
`families()` registers it by model_type.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from madsl.errors import MadslError
from madsl.weights.parts import Part, Sources, model_shape

FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")


def families() -> dict[str, ModuleType]:
    """model_type -> the module that maps its checkpoints (one module a family)."""
    from madsl.weights import (
        bamba,
        falcon_h1,
        gpt_neo,
        granite,
        jamba,
        kimi_linear,
        lfm2,
        lfm2_moe,
        mamba,
        minimax,
        nemotron_h,
        qwen3_next,
        recurrent_gemma,
        rwkv7,
        xlstm,
        zamba2,
    )

    return {
        "bamba": bamba,
        "falcon_h1": falcon_h1,
        "gpt_neo": gpt_neo,
        "granitemoehybrid": granite,
        "jamba": jamba,
        "kimi_linear": kimi_linear,
        "lfm2": lfm2,
        "lfm2_moe": lfm2_moe,
        "mamba": mamba,
        "minimax": minimax,
        "minimax_m1": minimax,
        "nemotron_h": nemotron_h,
        "qwen3_next": qwen3_next,
        "qwen3_5": qwen3_next,
        "qwen3_5_moe": qwen3_next,
        "qwen3_5_text": qwen3_next,
        "qwen3_5_moe_text": qwen3_next,
        "recurrent_gemma": recurrent_gemma,
        "rwkv7": rwkv7,
        "xlstm": xlstm,
        "zamba2": zamba2,
    }


# families `madsl convert --from-hf` reads whose weights madsl does not import, and why
NOT_IMPORTED = {
    "hymba": (
        "Hymba's only implementation is NVIDIA's remote code, whose forward runs on CUDA kernels alone (flex "
        "attention, mamba-ssm): there are no logits on a CPU to check an import against",
        "`madsl convert --from-hf` converts its config.json to a spec (shapes and counts, no weights)",
    ),
}


def family(model_type: str, path: str) -> ModuleType:
    known = families()
    if model_type in NOT_IMPORTED:
        reason, hint = NOT_IMPORTED[model_type]
        raise MadslError(f'{path}: "model_type": madsl imports no {model_type!r} weights: {reason}', hint=hint)
    if model_type not in known:
        raise MadslError(
            f'{path}: "model_type": madsl imports no {model_type!r} weights yet',
            expected="model_type " + ", ".join(known),
            hint="`madsl convert --from-hf` converts its config.json to a spec (shapes and counts, no weights)",
        )
    return known[model_type]


def place(
    sources: Sources, planned: dict[str, tuple[int, ...]], headers: dict, tied: dict[str, str], where: str
) -> None:
    """Refuse, by name, a model tensor without a source, a checkpoint tensor the model lacks or one
    it has in another shape or kind, and a checkpoint tensor nothing places (`tied` ones excepted)."""
    for name, shape in planned.items():
        parts = sources.get(name)
        if parts is None:
            raise MadslError(f"{where}: madsl's map has no checkpoint tensor for the model's {name!r}")
        if model_shape(parts) != tuple(shape):
            raise MadslError(f"{where}: the map's parts of {name!r} do not make its shape {list(shape)}")
        for part in parts:
            _check_part(part, name, headers, where)
    used = {part.name for parts in sources.values() for part in parts}
    for name in sorted(set(headers) - used):
        if name not in tied:
            raise MadslError(
                f"{where}: the checkpoint has {name!r}, which madsl cannot place in the model",
                hint="a tensor of another model, or of a layer madsl's converter does not build: nothing was loaded",
            )
        if headers[name][0] != headers.get(tied[name], (None,))[0]:
            raise MadslError(f"{where}: {name!r} has shape {list(headers[name][0])}; the tied {tied[name]!r} another")


def _check_part(part: Part, name: str, headers: dict, where: str) -> None:
    if part.name not in headers:
        raise MadslError(
            f"{where}: the checkpoint lacks {part.name!r} (the model's {name!r})",
            hint="madsl does not initialise a tensor at random: nothing was loaded",
        )
    shape, dtype = headers[part.name]
    if tuple(shape) != part.shape:
        raise MadslError(
            f"{where}: tensor {part.name!r} has shape {list(shape)}; the model config.json describes needs "
            f"{list(part.shape)} (its {name!r})"
        )
    if dtype not in FLOAT_DTYPES:
        raise MadslError(f"{where}: tensor {part.name!r} is {dtype}; the model's {name!r} is floating point")


def assemble(sources: Sources, read: Any, like: dict[str, Any]) -> dict[str, Any]:
    """The state dict: each model tensor from its parts (`read(name)` gives a checkpoint tensor),
    concatenated along the first axis where there are several (stacked, transposed, where they
    are experts' matrices), in the model tensor's dtype."""
    import torch

    state = {}
    for name, target in like.items():
        parts = [read(part.name) for part in sources[name]]
        if sources[name][0].stacked:
            tensor = torch.stack([part.T for part in parts])
        else:
            parts = [part.placed(tensor) for part, tensor in zip(sources[name], parts)]
            tensor = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        state[name] = tensor.to(target.dtype)
    return state

"""Falcon-H1 (TII, `model_type: falcon_h1`, transformers' FalconH1ForCausalLM): where each checkpoint
tensor goes in the madsl model `madsl convert --from-hf` makes of its config (every layer attention
beside Mamba-2 on one pre-norm input, `[A | M2]-Sg`; the parallel branch that has a `qkv` is the
attention, the other the Mamba-2, in whichever order the spec writes them).

    model.embed_tokens.weight                      embedding.weight
    model.final_layernorm.weight                   final_norm.weight
    lm_head.weight                                 head.weight (untied), or none (tied)
    model.layers.i.input_layernorm.weight          body.i.mixer.norm.weight
    model.layers.i.self_attn.{q,k,v}_proj          body.i.mixer.branches.a.qkv (q, k, v rows)
                                                   x attention_in_multiplier (weights; key_multiplier
                                                   too on k's weight and bias)
    model.layers.i.self_attn.o_proj                body.i.mixer.branches.a.out x attention_out_multiplier
    model.layers.i.mamba.in_proj                   body.i.mixer.branches.m.in_proj, its z, x, B, C and
                                                   dt rows x ssm_multipliers (and the weight x
                                                   ssm_in_multiplier): transformers' mup_vector
    model.layers.i.mamba.conv1d                    body.i.mixer.branches.m.conv.conv
    model.layers.i.mamba.{dt_bias,A_log,D}         body.i.mixer.branches.m.{dt_bias,A_log,D}
    model.layers.i.mamba.norm.weight               body.i.mixer.branches.m.norm_weight (mamba_rms_norm)
    model.layers.i.mamba.out_proj                  body.i.mixer.branches.m.out_proj x ssm_out_multiplier
    model.layers.i.pre_ff_layernorm.weight         body.i.channel.norm.weight
    model.layers.i.feed_forward.gate_proj          body.i.channel.layer.w1 x mlp_multipliers[0]
    model.layers.i.feed_forward.up_proj            body.i.channel.layer.w3
    model.layers.i.feed_forward.down_proj          body.i.channel.layer.w2 x mlp_multipliers[1]

Each µP multiplier that transformers applies right before a linear map (to its input: attention
in, SSM in) or right after it (to its output: key, attention out, the mup_vector, SSM out, the
MLP's) is folded into that map on import (parts.Part.row_scale: a multiplier of the input scales
the weight, one of the output the weight and the bias) and divided out on export, whose config
states them at 1. The embedding and lm_head multipliers are the spec's `embedding_scale` and
`logit_divisor` (the converter's), which a tied embedding needs. transformers' mup_vector is a
buffer it does not save (persistent=False): a checkpoint holding one is refused by name, as every
tensor madsl cannot place is. Refused by key: a multiplier that is not a positive finite number (it
could not be divided out again), a `hidden_act` other than silu, a `partial_rotary_factor` (Falcon-H1
rotates whole heads whatever it says) and a clamping `time_step_limit` (madsl.weights.mamba2).
"""

from __future__ import annotations

import math
import re
from typing import Any

from madsl.errors import MadslError
from madsl.weights.mamba2 import check_mamba2_config
from madsl.weights.parts import Part, Sources, one, qkv

TOP = {
    "embedding.weight": "model.embed_tokens.weight",
    "final_norm.weight": "model.final_layernorm.weight",
    "head.weight": "lm_head.weight",
}
SCALARS = {  # the multipliers folded into the weights: madsl's name -> Falcon-H1's key (FalconH1Config: 1.0)
    "attention_in": "attention_in_multiplier",
    "attention_out": "attention_out_multiplier",
    "key": "key_multiplier",
    "ssm_in": "ssm_in_multiplier",
    "ssm_out": "ssm_out_multiplier",
}
LISTS = {"ssm": ("ssm_multipliers", 5), "mlp": ("mlp_multipliers", 2)}  # z, x, B, C, dt; gate, down
RULES = (  # (madsl name after `body.i.`, the branch named by kind; Falcon-H1's after `model.layers.i.`; multiplier)
    (r"mixer\.norm\.weight", "input_layernorm.weight", None),
    (r"channel\.norm\.weight", "pre_ff_layernorm.weight", None),
    (r"channel\.layer\.w1\.(weight|bias)", r"feed_forward.gate_proj.\1", "mlp_gate"),
    (r"channel\.layer\.w3\.(weight|bias)", r"feed_forward.up_proj.\1", None),
    (r"channel\.layer\.w2\.(weight|bias)", r"feed_forward.down_proj.\1", "mlp_down"),
    (r"attention\.out\.(weight|bias)", r"self_attn.o_proj.\1", "attention_out"),
    (r"mamba\.out_proj\.(weight|bias)", r"mamba.out_proj.\1", "ssm_out"),
    (r"mamba\.conv\.conv\.(weight|bias)", r"mamba.conv1d.\1", None),
    (r"mamba\.(dt_bias|A_log|D)", r"mamba.\1", None),
    (r"mamba\.norm_weight", "mamba.norm.weight", None),
)


def _multiplier(value: Any, key: str, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise MadslError(
            f'{path}: "{key}" is {value!r}; madsl folds Falcon-H1\'s multipliers into the weights and divides '
            "them out again on export, so each is a positive finite number",
            hint="the µP multipliers of the released Falcon-H1 models are positive",
        )
    return float(value)


def multipliers(config: dict[str, Any], path: str) -> dict[str, float]:
    """The multipliers the map folds into the weights, at FalconH1Config's defaults where absent (a
    list null: all 1), each checked."""
    out = {name: _multiplier(config.get(key, 1.0), key, path) for name, key in SCALARS.items()}
    for name, (key, length) in LISTS.items():
        values = config.get(key) or [1.0] * length
        if not isinstance(values, list) or len(values) != length:
            raise MadslError(f'{path}: "{key}" is {values!r}; Falcon-H1 reads a list of {length} multipliers')
        for index, value in enumerate(values):
            out[f"{name}{index}"] = _multiplier(value, f"{key}[{index}]", path)
    out["mlp_gate"], out["mlp_down"] = out.pop("mlp0"), out.pop("mlp1")
    return out


def check_config(config: dict[str, Any], path: str) -> None:
    """What madsl's layers cannot compute as Falcon-H1's, refused by its key (the converter checks
    the rest; the spec states the norms' eps, so any rms_norm_eps imports)."""
    multipliers(config, path)
    if config.get("hidden_act", "silu") != "silu":
        raise MadslError(
            f'{path}: "hidden_act" is {config["hidden_act"]!r}; madsl\'s SwiGLU and Mamba-2 use silu',
            hint="madsl imports Falcon-H1 checkpoints with hidden_act silu (transformers' default)",
        )
    rope = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else config
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise MadslError(
            f'{path}: "partial_rotary_factor" is {rope["partial_rotary_factor"]!r}; transformers\' Falcon-H1 '
            "rotates whole heads whatever it says, and madsl would rotate a part",
            hint="drop partial_rotary_factor",
        )
    check_mamba2_config(config, path, None, "Falcon-H1")


def _scaled(parts: tuple[Part, ...], factors: tuple[float, ...]) -> tuple[Part, ...]:
    """`parts`, each with its rows times its factor (none where it is 1)."""
    return tuple(
        part if factor == 1.0 else part._replace(row_scale=((part.shape[0], factor),))
        for part, factor in zip(parts, factors)
    )


def _attention(layer: Any, prefix: str, kind: str, shape: tuple[int, ...], mult: dict[str, float]) -> tuple[Part, ...]:
    """The fused q, k, v projection: the input's attention_in_multiplier scales the weights, the
    key_multiplier k's weight and bias."""
    parts = qkv(layer, *(f"{prefix}self_attn.{x}_proj.{kind}" for x in "qkv"), shape)
    inward = mult["attention_in"] if kind == "weight" else 1.0
    return _scaled(parts, (inward, inward * mult["key"], inward))


def _in_proj(layer: Any, name: str, shape: tuple[int, ...], mult: dict[str, float]) -> tuple[Part, ...]:
    """The Mamba-2 input projection: its z, x, B, C and dt rows times ssm_multipliers (transformers'
    mup_vector on its output), the weight also times ssm_in_multiplier (on its input)."""
    inward = mult["ssm_in"] if name.endswith("weight") else 1.0
    width = layer.groups * layer.d_state
    rows = (layer.d_inner, layer.d_inner, width, width, layer.heads)
    runs = tuple((count, inward * mult[f"ssm{i}"]) for i, count in enumerate(rows))
    return (Part(name, shape, row_scale=() if all(f == 1.0 for _, f in runs) else runs),)


def sources(model: Any, config: dict[str, Any]) -> Sources:
    """Each tensor of the model's state dict -> the Falcon-H1 checkpoint tensor it is made of."""
    mult = multipliers(config, "config.json")
    state = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    out: Sources = {name: one(source, state[name]) for name, source in TOP.items() if name in state}
    for name, shape in state.items():
        match = re.fullmatch(r"body\.(\d+)\.(?:mixer\.branches\.(\d+)\.)?(.+)", name)
        if match is None:
            continue
        block, branch, rest = match.groups()
        prefix = f"model.layers.{block}."
        if branch is not None:
            layer = model.get_submodule(f"body.{block}.mixer.branches.{branch}")
            if rest in ("qkv.weight", "qkv.bias"):
                out[name] = _attention(layer, prefix, rest[4:], shape, mult)
                continue
            if rest in ("in_proj.weight", "in_proj.bias"):
                out[name] = _in_proj(layer, f"{prefix}mamba.{rest}", shape, mult)
                continue
            rest = ("attention." if hasattr(layer, "qkv") else "mamba.") + rest
        for pattern, target, factor in RULES:
            if re.fullmatch(pattern, rest):
                part = Part(prefix + re.sub(pattern, target, rest), shape)
                out[name] = _scaled((part,), (mult[factor] if factor else 1.0,))
                break
    return out


# where the embeddings are tied (the model has no head), a checkpoint may still hold lm_head: the embedding's copy
TIED = {"lm_head.weight": "model.embed_tokens.weight"}

"""Bamba (IBM, `model_type: bamba`, transformers' BambaForCausalLM): where each checkpoint tensor
goes in the madsl model `madsl convert --from-hf` makes of its config (Mamba-2 and attention
layers, each followed by a SwiGLU MLP).

    model.embed_tokens.weight                         embedding.weight
    model.final_layernorm.weight                      final_norm.weight
    lm_head.weight                                    head.weight (untied), or none (tied)
    model.layers.i.input_layernorm.weight             body.i.mixer.norm.weight
    model.layers.i.mamba.{in_proj,out_proj}           body.i.mixer.layer.{in_proj,out_proj} (M2)
    model.layers.i.mamba.conv1d                       body.i.mixer.layer.conv.conv
    model.layers.i.mamba.{dt_bias,A_log,D}            body.i.mixer.layer.{dt_bias,A_log,D}
    model.layers.i.mamba.norm.weight                  body.i.mixer.layer.norm_weight
    model.layers.i.self_attn.{q,k,v}_proj             body.i.mixer.layer.qkv (one projection: q, k, v rows)
    model.layers.i.self_attn.o_proj                   body.i.mixer.layer.out
    model.layers.i.pre_ff_layernorm.weight            body.i.channel.norm.weight
    model.layers.i.feed_forward.{gate,up,down}_proj   body.i.channel.layer.w{1,3,2} (SwiGLU)

The layers compute what transformers' do: madsl's Mamba-2 splits in_proj as Bamba's mixer does (z,
then x B C through the causal depthwise conv, then dt), adds D x before the gate, and normalises
y * silu(z) per group with the gated RMSNorm; its attention rotates the first half of each head
(rotate-half, Bamba's fixed partial rotary) and its SwiGLU is down(silu(gate x) * up x). madsl's
RMSNorms (the layers', the final one and the Mamba-2 gate's) have eps 1e-5, so a config whose
`rms_norm_eps` is another is refused by name; so is a `time_step_limit` that clamps dt (madsl's
Mamba-2 does not clamp).
"""

from __future__ import annotations

from typing import Any

from madsl.weights.mamba2 import check_mamba2_config
from madsl.weights.parts import Sources, layered

RULES = (  # (madsl name after `body.i.`, Bamba's after `model.layers.i.`)
    (r"mixer\.norm\.weight", "input_layernorm.weight"),
    (r"channel\.norm\.weight", "pre_ff_layernorm.weight"),
    (r"channel\.layer\.w1\.weight", "feed_forward.gate_proj.weight"),
    (r"channel\.layer\.w3\.weight", "feed_forward.up_proj.weight"),
    (r"channel\.layer\.w2\.weight", "feed_forward.down_proj.weight"),
    (r"mixer\.layer\.(in_proj|out_proj)\.(weight|bias)", r"mamba.\1.\2"),
    (r"mixer\.layer\.conv\.conv\.(weight|bias)", r"mamba.conv1d.\1"),
    (r"mixer\.layer\.(dt_bias|A_log|D)", r"mamba.\1"),
    (r"mixer\.layer\.norm_weight", "mamba.norm.weight"),
    (r"mixer\.layer\.out\.(weight|bias)", r"self_attn.o_proj.\1"),
)


def check_config(config: dict[str, Any], path: str) -> None:
    """What madsl's layers cannot compute as Bamba's, refused by its key (the converter checks the rest)."""
    check_mamba2_config(config, path, "rms_norm_eps", "Bamba")


def sources(model: Any, config: dict[str, Any]) -> Sources:
    """Each tensor of the model's state dict -> the Bamba checkpoint tensors it is made of."""
    top = {
        "embedding.weight": "model.embed_tokens.weight",
        "final_norm.weight": "model.final_layernorm.weight",
        "head.weight": "lm_head.weight",
    }
    return layered(model, top, RULES)


# where the embeddings are tied (the model has no head), a checkpoint may still hold lm_head: the embedding's copy
TIED = {"lm_head.weight": "model.embed_tokens.weight"}

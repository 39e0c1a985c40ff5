"""Jamba (AI21, `model_type: jamba`, transformers' JambaForCausalLM): where each checkpoint tensor
goes in the madsl model `madsl convert --from-hf` makes of its config (Mamba-1 and attention layers,
each followed by a SwiGLU MLP or a mixture of SwiGLU experts).

    model.embed_tokens.weight                          embedding.weight
    model.final_layernorm.weight                       final_norm.weight
    lm_head.weight                                     head.weight (untied), or none (tied)
    model.layers.i.input_layernorm.weight              body.i.mixer.norm.weight
    model.layers.i.mamba.X                             body.i.mixer.layer.X (Mb: in_proj, conv1d, x_proj,
                                                       dt_proj, A_log, D, out_proj, {dt,b,c}_layernorm)
    model.layers.i.self_attn.{q,k,v}_proj              body.i.mixer.layer.qkv (one projection: q, k, v rows)
    model.layers.i.self_attn.o_proj                    body.i.mixer.layer.out
    model.layers.i.pre_ff_layernorm.weight             body.i.channel.norm.weight
    model.layers.i.feed_forward.{gate,up,down}_proj    body.i.channel.layer.w{1,3,2} (SwiGLU)
    model.layers.i.feed_forward.router.weight          body.i.channel.layer.router.weight (MoE)
    model.layers.i.feed_forward.experts.e.gate_proj    body.i.channel.layer.w_gate[e] (transposed; up: w_up,
                                                       down: w_down)

The layers compute what transformers' do: madsl's Mamba with `inner_norms` normalises dt, B and C
after x_proj at the model's `rms_norm_eps` (the spec's `norm_eps`, every norm's), its attention has
no position embedding and no bias, and its MoE with `normalize_top: false` weighs the chosen experts
by their probabilities of a softmax over all of them, as JambaTopKRouter does.
"""

from __future__ import annotations

from typing import Any

from madsl.weights.parts import Sources, expert_matrices, layered

RULES = (  # (madsl name after `body.i.`, Jamba's after `model.layers.i.`)
    (r"mixer\.norm\.weight", "input_layernorm.weight"),
    (r"channel\.norm\.weight", "pre_ff_layernorm.weight"),
    (r"channel\.layer\.w1\.weight", "feed_forward.gate_proj.weight"),
    (r"channel\.layer\.w3\.weight", "feed_forward.up_proj.weight"),
    (r"channel\.layer\.w2\.weight", "feed_forward.down_proj.weight"),
    (r"channel\.layer\.router\.weight", "feed_forward.router.weight"),
    (r"mixer\.layer\.out\.weight", "self_attn.o_proj.weight"),
    (r"mixer\.layer\.(.+)", r"mamba.\1"),  # madsl's Mamba keeps Jamba's (mamba-ssm's) names
)
EXPERT_MATRICES = {"w_gate": "gate_proj", "w_up": "up_proj", "w_down": "down_proj"}


def check_config(config: dict[str, Any], path: str) -> None:
    """Nothing to refuse beyond what the converter refuses: madsl builds every norm at the config's
    rms_norm_eps, and Jamba has no other option madsl's layers lack."""


def sources(model: Any, config: dict[str, Any]) -> Sources:
    """Each tensor of the model's state dict -> the Jamba checkpoint tensors it is made of."""
    top = {
        "embedding.weight": "model.embed_tokens.weight",
        "final_norm.weight": "model.final_layernorm.weight",
        "head.weight": "lm_head.weight",
    }
    experts = "model.layers.{block}.feed_forward.experts.{expert}.{matrix}.weight"
    return {**layered(model, top, RULES), **expert_matrices(model, EXPERT_MATRICES, experts)}


# where the embeddings are tied (the model has no head), a checkpoint may still hold lm_head: the embedding's copy
TIED = {"lm_head.weight": "model.embed_tokens.weight"}

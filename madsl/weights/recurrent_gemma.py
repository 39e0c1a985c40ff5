"""RecurrentGemma (Google, `model_type: recurrent_gemma`, transformers' RecurrentGemmaForCausalLM;
Griffin's architecture): where each checkpoint tensor goes in the madsl model `madsl convert
--from-hf` makes of its config (Griffin's recurrent block or local attention in every block, each
followed by a GeGLU MLP with biases).

    model.embed_tokens.weight, lm_head.weight            embedding.weight, head.weight (tied: none)
    model.final_norm.weight                              final_norm.weight, plus 1
    model.layers.i.temporal_pre_norm.weight              body.i.mixer.norm.weight, plus 1
    model.layers.i.channel_pre_norm.weight               body.i.channel.norm.weight, plus 1
    model.layers.i.temporal_block.{linear_x,linear_y,linear_out,conv_1d}.{weight,bias}
                                                         body.i.mixer.layer.{the same} (RG)
    model.layers.i.temporal_block.rg_lru.{recurrent_param, input_gate_weight, input_gate_bias,
        recurrent_gate_weight, recurrent_gate_bias}      body.i.mixer.layer.{the same}
    model.layers.i.temporal_block.{q,k,v}_proj.*         body.i.mixer.layer.qkv.* (q, k, v rows; A)
    model.layers.i.temporal_block.o_proj.{weight,bias}   body.i.mixer.layer.out.{weight,bias}
    model.layers.i.mlp_block.{gate,up,down}_proj.*       body.i.channel.layer.w{1,3,2}.* (Sg)

Every norm is Gemma's: x * (1 + w) in float32 at rms_norm_eps (the spec's norm_eps), so madsl's
RMSNorm holds 1 + w (`Part.offset`; export subtracts it). madsl's RG is RecurrentGemmaRecurrentBlock
(GeLU's tanh approximation on linear_y, the RG-LRU's block-diagonal gates, c = 8, sqrt(1 - a^2)
but at position 0); the attention is local over attention_window_size tokens, rotary on the first
partial_rotary_factor of each head (rotate-half), its o_proj with a bias; the MLP is
`Sg{activation: gelu}`; the embedding times sqrt(hidden_size) in bfloat16 (embedding_scale) and
the logits soft-capped at logits_soft_cap (logit_soft_cap) are the spec's. Refused by key:
hidden_activation gelu (the exact erf GeLU, which madsl's RG and Sg do not compute).
"""

from __future__ import annotations

from typing import Any

from madsl.errors import MadslError
from madsl.weights.parts import Part, Sources, layered

RULES = (  # (madsl name after `body.i.`, RecurrentGemma's after `model.layers.i.`)
    (r"mixer\.norm\.weight", "temporal_pre_norm.weight"),
    (r"channel\.norm\.weight", "channel_pre_norm.weight"),
    (r"mixer\.layer\.((?:linear_[xy]|linear_out|conv_1d)\.(?:weight|bias))", r"temporal_block.\1"),
    (r"mixer\.layer\.((?:input|recurrent)_gate_(?:weight|bias)|recurrent_param)", r"temporal_block.rg_lru.\1"),
    (r"mixer\.layer\.out\.(weight|bias)", r"temporal_block.o_proj.\1"),
    (r"channel\.layer\.w1\.(weight|bias)", r"mlp_block.gate_proj.\1"),
    (r"channel\.layer\.w3\.(weight|bias)", r"mlp_block.up_proj.\1"),
    (r"channel\.layer\.w2\.(weight|bias)", r"mlp_block.down_proj.\1"),
)
NORMS = ("final_norm.weight", ".mixer.norm.weight", ".channel.norm.weight")


def check_config(config: dict[str, Any], path: str) -> None:
    """The exact (erf) GeLU, which madsl's RG and Sg do not compute (they compute its tanh
    approximation, gelu_pytorch_tanh), refused by its key."""
    if config.get("hidden_activation", "gelu_pytorch_tanh") == "gelu":
        raise MadslError(
            f"{path}: \"hidden_activation\" is 'gelu' (the exact, erf GeLU); madsl's RG and Sg compute GeLU's "
            "tanh approximation (gelu_pytorch_tanh, as RecurrentGemma's checkpoints): other logits",
            hint="a checkpoint with hidden_activation gelu_pytorch_tanh",
        )


def sources(model: Any, config: dict[str, Any]) -> Sources:
    """Each tensor of the model's state dict -> the RecurrentGemma checkpoint tensors it is made of."""
    top = {
        "embedding.weight": "model.embed_tokens.weight",
        "final_norm.weight": "model.final_norm.weight",
        "head.weight": "lm_head.weight",
    }
    out = layered(model, top, RULES, attention="temporal_block")
    for name, parts in out.items():
        if name.endswith(NORMS):  # Gemma's norm: x * (1 + w), madsl's holds 1 + w
            out[name] = tuple(Part(part.name, part.shape, offset=1.0) for part in parts)
    return out


TIED = {"lm_head.weight": "model.embed_tokens.weight"}

"""GPT-Neo (EleutherAI, `model_type: gpt_neo`, transformers' GPTNeoForCausalLM: gpt-neo-125M and its
sizes): where each checkpoint tensor goes in the madsl model `madsl convert --from-hf` makes of its
config (global and local attention layers, each followed by an MLP).

    transformer.wte.weight, transformer.wpe.weight      embedding.weight, positions.weight
    transformer.ln_f.{weight,bias}                      final_norm.{weight,bias}
    lm_head.weight                                      none (tied), or head.weight
    transformer.h.i.ln_1.{weight,bias}                  body.i.mixer.norm.{weight,bias}
    transformer.h.i.attn.attention.{q,k,v}_proj.weight  body.i.mixer.layer.qkv.weight (q, k, v rows)
    transformer.h.i.attn.attention.out_proj.*           body.i.mixer.layer.out.*
    transformer.h.i.ln_2.{weight,bias}                  body.i.channel.norm.{weight,bias}
    transformer.h.i.mlp.c_fc.*, c_proj.*                body.i.channel.layer.fc.*, proj.* (Mlp)

madsl computes GPTNeoAttention's unscaled q.k (scale 1.0), its local layers' window (the token and
the window_size - 1 before it), LayerNorms at layer_norm_epsilon and the tanh-approximated GELU.
"""

from __future__ import annotations

from typing import Any

from madsl.weights.parts import Sources, layered

RULES = (  # (madsl name after `body.i.`, GPT-Neo's after `transformer.h.i.`)
    (r"mixer\.norm\.(weight|bias)", r"ln_1.\1"),
    (r"channel\.norm\.(weight|bias)", r"ln_2.\1"),
    (r"mixer\.layer\.out\.(weight|bias)", r"attn.attention.out_proj.\1"),
    (r"channel\.layer\.fc\.(weight|bias)", r"mlp.c_fc.\1"),
    (r"channel\.layer\.proj\.(weight|bias)", r"mlp.c_proj.\1"),
)


def check_config(config: dict[str, Any], path: str) -> None:
    """Nothing beyond the converter's refusals: the spec states the norms' eps and the window."""


def sources(model: Any, config: dict[str, Any]) -> Sources:
    """Each tensor of the model's state dict -> the GPT-Neo checkpoint tensors it is made of."""
    top = {
        "embedding.weight": "transformer.wte.weight",
        "positions.weight": "transformer.wpe.weight",
        "final_norm.weight": "transformer.ln_f.weight",
        "final_norm.bias": "transformer.ln_f.bias",
        "head.weight": "lm_head.weight",
    }
    return layered(model, top, RULES, attention="attn.attention", layers="transformer.h")


TIED = {"lm_head.weight": "transformer.wte.weight"}

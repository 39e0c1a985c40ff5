"""xLSTM (NX-AI, `model_type: xlstm`, transformers' xLSTMForCausalLM: xLSTM-7B's layout): where each
checkpoint tensor goes in the madsl model `madsl convert --from-hf` makes of its config (an mLSTM
layer and a SwiGLU in every block).

    backbone.embeddings.weight, backbone.out_norm.weight, lm_head.weight   embedding, final_norm, head
    backbone.blocks.i.norm_mlstm.weight, norm_ffn.weight  body.i.mixer.norm.weight, body.i.channel.norm.weight
    backbone.blocks.i.mlstm_layer.{q,k,v}.weight          body.i.mixer.layer.{q,k,v}_proj.weight
    backbone.blocks.i.mlstm_layer.{i,f}gate_preact.*      body.i.mixer.layer.{i,f}gate.*
    backbone.blocks.i.mlstm_layer.ogate_preact.weight     body.i.mixer.layer.o_proj.weight
    backbone.blocks.i.mlstm_layer.out_proj.weight         body.i.mixer.layer.out_proj.weight
    backbone.blocks.i.mlstm_layer.multihead_norm.weight   body.i.mixer.layer.norm_weight
    backbone.blocks.i.ffn.proj_up_gate, proj_up, proj_down  body.i.channel.layer.w1, w3, w2 (SwiGLU)

madsl's mL with xLSTM-7B's options (soft-capped gates, the zero initial stabiliser, the per-head
norm at norm_eps) computes xLSTM's mLSTM; the block norms and the final one are at norm_eps (the
spec's norm_eps), the logits soft-capped at output_logit_soft_cap (the spec's logit_soft_cap).
Refused by key: weight_mode "fused" (its q, k, v and gates stored as one matrix, which this map
does not split).
"""

from __future__ import annotations

from typing import Any

from madsl.errors import MadslError
from madsl.weights.parts import Sources, layered

RULES = (  # (madsl name after `body.i.`, xLSTM's after `backbone.blocks.i.`)
    (r"mixer\.norm\.weight", "norm_mlstm.weight"),
    (r"channel\.norm\.weight", "norm_ffn.weight"),
    (r"mixer\.layer\.([qkv])_proj\.weight", r"mlstm_layer.\1.weight"),
    (r"mixer\.layer\.([if])gate\.(weight|bias)", r"mlstm_layer.\1gate_preact.\2"),
    (r"mixer\.layer\.o_proj\.weight", "mlstm_layer.ogate_preact.weight"),
    (r"mixer\.layer\.out_proj\.weight", "mlstm_layer.out_proj.weight"),
    (r"mixer\.layer\.norm_weight", "mlstm_layer.multihead_norm.weight"),
    (r"channel\.layer\.w1\.weight", "ffn.proj_up_gate.weight"),
    (r"channel\.layer\.w3\.weight", "ffn.proj_up.weight"),
    (r"channel\.layer\.w2\.weight", "ffn.proj_down.weight"),
)


def check_config(config: dict[str, Any], path: str) -> None:
    """A fused weight layout, which this map does not split, refused by its key."""
    if config.get("weight_mode", "single") != "single":
        raise MadslError(
            f'{path}: "weight_mode" is {config["weight_mode"]!r}; madsl imports xLSTM checkpoints stored '
            "with weight_mode single (q, k, v and the gates as separate matrices)",
            hint="save the checkpoint with weight_mode: single",
        )


def sources(model: Any, config: dict[str, Any]) -> Sources:
    """Each tensor of the model's state dict -> the xLSTM checkpoint tensors it is made of."""
    top = {
        "embedding.weight": "backbone.embeddings.weight",
        "final_norm.weight": "backbone.out_norm.weight",
        "head.weight": "lm_head.weight",
    }
    return layered(model, top, RULES, layers="backbone.blocks")


TIED = {"lm_head.weight": "backbone.embeddings.weight"}

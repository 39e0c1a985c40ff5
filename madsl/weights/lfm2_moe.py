"""LFM2-MoE (Liquid AI, `model_type: lfm2_moe`, transformers' Lfm2MoeForCausalLM): LFM2's name map
(lfm2.py: its conv and attention layers, norms and dense first layers' SwiGLUs) and its mixtures of
experts:

    model.layers.i.feed_forward.gate.weight              body.i.channel.layer.router.weight
    model.layers.i.feed_forward.expert_bias               body.i.channel.layer.selection_bias (a buffer)
    model.layers.i.feed_forward.experts.e.w{1,3,2}.weight body.i.channel.layer.{w_gate,w_up,w_down}[e],
                                                          each transposed

madsl's MoE with `scores: sigmoid` routes as Lfm2MoeTopKRouter: the sigmoid of each router logit,
the experts with the largest scores plus the expert bias chosen and weighted by their scores
(divided by their sum where norm_topk_prob; Liquid's adds 1e-6 to the sum, a difference below
float32's resolution of these weights), times routed_scaling_factor.
"""

from __future__ import annotations

from typing import Any

from madsl.weights import lfm2
from madsl.weights.parts import Sources, expert_matrices, layered

RULES = (
    *lfm2.RULES,
    (r"channel\.layer\.router\.weight", "feed_forward.gate.weight"),
    (r"channel\.layer\.selection_bias", "feed_forward.expert_bias"),
)
EXPERT_MATRICES = {"w_gate": "w1", "w_up": "w3", "w_down": "w2"}


def check_config(config: dict[str, Any], path: str) -> None:
    """LFM2's refusals (another norm eps, a partial rotary factor), which LFM2-MoE shares."""
    lfm2.check_config(config, path)


def sources(model: Any, config: dict[str, Any]) -> Sources:
    """Each tensor of the model's state dict -> the LFM2-MoE checkpoint tensors it is made of."""
    top = {
        "embedding.weight": "model.embed_tokens.weight",
        "final_norm.weight": "model.embedding_norm.weight",
        "head.weight": "lm_head.weight",
    }
    experts = "model.layers.{block}.feed_forward.experts.{expert}.{matrix}.weight"
    return {**layered(model, top, RULES), **expert_matrices(model, EXPERT_MATRICES, experts)}


TIED = lfm2.TIED

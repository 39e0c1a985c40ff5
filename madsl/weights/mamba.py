"""Mamba (`model_type: mamba`, transformers' MambaForCausalLM: state-spaces/mamba-130m-hf and its
sizes): where each checkpoint tensor goes in the madsl model `madsl convert --from-hf` makes of its
config (one Mamba-1 mixer a block, no MLP).

    backbone.embeddings.weight              embedding.weight
    backbone.norm_f.weight                  final_norm.weight
    lm_head.weight                          head.weight (untied), or none (tied)
    backbone.layers.i.norm.weight           body.i.mixer.norm.weight
    backbone.layers.i.mixer.X               body.i.mixer.layer.X (in_proj, conv1d, x_proj, dt_proj,
                                            A_log, D, out_proj: mamba-ssm's names, madsl's Mb's)

madsl's Mb computes MambaMixer's slow path (in_proj into x and z, the causal depthwise conv with
SiLU, x_proj into dt, B and C, softplus(dt_proj(dt)), the selective scan with D, y * silu(z),
out_proj) and its blocks are MambaBlock's x + mixer(RMSNorm(x)) at the config's layer_norm_epsilon
(the spec's norm_eps).
"""

from __future__ import annotations

from typing import Any

from madsl.weights.parts import Sources, layered

RULES = (  # (madsl name after `body.i.`, Mamba's after `backbone.layers.i.`)
    (r"mixer\.norm\.weight", "norm.weight"),
    (r"mixer\.layer\.(.+)", r"mixer.\1"),
)


def check_config(config: dict[str, Any], path: str) -> None:
    """Nothing beyond the converter's refusals: the spec states the norms' eps."""


def sources(model: Any, config: dict[str, Any]) -> Sources:
    """Each tensor of the model's state dict -> the Mamba checkpoint tensors it is made of."""
    top = {
        "embedding.weight": "backbone.embeddings.weight",
        "final_norm.weight": "backbone.norm_f.weight",
        "head.weight": "lm_head.weight",
    }
    return layered(model, top, RULES, layers="backbone.layers")


TIED = {"lm_head.weight": "backbone.embeddings.weight"}

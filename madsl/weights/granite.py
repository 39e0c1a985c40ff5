"""Granite 4.0 hybrid (IBM, `model_type: granitemoehybrid`, transformers'
GraniteMoeHybridForCausalLM): where each checkpoint tensor goes in the madsl model `madsl convert
--from-hf` makes of its config (Mamba-2 and attention layers, each followed by a SwiGLU, or by a
mixture of SwiGLU experts beside that SwiGLU as the shared expert).

    model.embed_tokens.weight, model.norm.weight, lm_head.weight   embedding, final_norm, head
    model.layers.i.input_layernorm.weight               body.i.mixer.norm.weight
    model.layers.i.post_attention_layernorm.weight      body.i.channel.norm.weight
    model.layers.i.mamba.*                              body.i.mixer.layer.* as Bamba's (bamba.py)
    model.layers.i.self_attn.{q,k,v}_proj, o_proj       body.i.mixer.layer.qkv (q, k, v rows), out
    model.layers.i.shared_mlp.input_linear.weight       (Sg, or the MoE's shared) w1: its first half of
                                                        rows, w3: its second half
    model.layers.i.shared_mlp.output_linear.weight      w2
    model.layers.i.block_sparse_moe.router.layer.weight body.i.channel.layer.router.weight
    model.layers.i.block_sparse_moe.input_linear.weight (experts, 2 x width, hidden): w_gate its first
                                                        half, w_up its second, each transposed
    model.layers.i.block_sparse_moe.output_linear.weight (experts, hidden, width): w_down, transposed

The layers compute what transformers' do once the spec states Granite's µP-style multipliers: the
embedding times `embedding_scale` (embedding_multiplier), each block part's output times
`residual_scale` (residual_multiplier) before its residual add, the logits divided by
`logit_divisor` (logits_scaling), the attention's softmax scale `scale` (attention_multiplier), and
every norm at `norm_eps` (rms_norm_eps, the Mamba-2 gated norm's too); the experts are routed by a
softmax over the top-k logits, madsl's default. Refused by key: a clamping `time_step_limit`.
"""

from __future__ import annotations

from typing import Any

from madsl.weights import bamba
from madsl.weights.mamba2 import check_mamba2_config
from madsl.weights.parts import Part, Sources, layered

RULES = (  # (madsl name after `body.i.`, Granite's after `model.layers.i.`)
    (r"mixer\.norm\.weight", "input_layernorm.weight"),
    (r"channel\.norm\.weight", "post_attention_layernorm.weight"),
    (r"channel\.layer\.(shared\.)?w2\.weight", "shared_mlp.output_linear.weight"),
    (r"channel\.layer\.router\.weight", "block_sparse_moe.router.layer.weight"),
    *(rule for rule in bamba.RULES if rule[0].startswith(r"mixer\.layer")),
)


def check_config(config: dict[str, Any], path: str) -> None:
    """A clamping time_step_limit (the spec states the norms' eps, so any rms_norm_eps imports)."""
    check_mamba2_config(config, path, None, "Granite 4.0")


def sources(model: Any, config: dict[str, Any]) -> Sources:
    """Each tensor of the model's state dict -> the Granite checkpoint tensors it is made of."""
    top = {"embedding.weight": "model.embed_tokens.weight", "final_norm.weight": "model.norm.weight"}
    top["head.weight"] = "lm_head.weight"
    out = layered(model, top, RULES)
    for name, tensor in model.state_dict().items():
        block, _, rest = name.removeprefix("body.").partition(".channel.layer.")
        prefix = f"model.layers.{block}."
        shape = tuple(tensor.shape)
        if rest in ("w1.weight", "w3.weight", "shared.w1.weight", "shared.w3.weight"):  # the fused gate | up
            rows = shape[0]
            half = (0, rows) if rest.endswith("w1.weight") else (rows, 2 * rows)
            out[name] = (Part(f"{prefix}shared_mlp.input_linear.weight", (2 * rows, shape[1]), take=half),)
        elif rest in ("w_gate", "w_up"):  # (experts, hidden, width) from (experts, 2 x width, hidden)
            experts, hidden, width = shape
            half = (0, width) if rest == "w_gate" else (width, 2 * width)
            fused = f"{prefix}block_sparse_moe.input_linear.weight"
            out[name] = (Part(fused, (experts, 2 * width, hidden), take=half, transposed=True),)
        elif rest == "w_down":  # (experts, width, hidden) from (experts, hidden, width)
            experts, width, hidden = shape
            out[name] = (
                Part(f"{prefix}block_sparse_moe.output_linear.weight", (experts, hidden, width), transposed=True),
            )
    return out


TIED = {"lm_head.weight": "model.embed_tokens.weight"}

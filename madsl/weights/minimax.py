"""MiniMax-Text-01 (`model_type: minimax`, transformers' MiniMaxForCausalLM) and MiniMax-M1
(`minimax_m1`: the same layers and tensor names, MiniMax's own config keys): where each checkpoint
tensor goes in the madsl model `madsl convert --from-hf` makes of its config (lightning attention
and softmax attention layers, each followed by a mixture of SwiGLU experts).

    model.embed_tokens.weight, model.norm.weight, lm_head.weight   embedding, final_norm, head
    model.layers.i.input_layernorm.weight               body.i.mixer.norm.weight
    model.layers.i.post_attention_layernorm.weight      body.i.channel.norm.weight
    model.layers.i.self_attn.qkv_proj.weight            body.i.mixer.layer.qkv_proj.weight (Lt: per head
                                                        q, k, v rows of head_dim each, as transformers splits it)
    model.layers.i.self_attn.{output_gate,out_proj,norm}.weight   body.i.mixer.layer.{output_gate,out_proj,norm}.weight
    model.layers.i.self_attn.{slope_rate,query_decay,key_decay,diagonal_decay}   none: constants of the config
                                                        (transformers saves its decay buffers; MiniMax-M1's code
                                                        has none), checked on import, written on export
    model.layers.i.self_attn.{q,k,v}_proj.weight        body.i.mixer.layer.qkv.weight (A: q, k, v rows)
    model.layers.i.self_attn.o_proj.weight              body.i.mixer.layer.out.weight
    model.layers.i.block_sparse_moe.gate.weight         body.i.channel.layer.router.weight
    model.layers.i.block_sparse_moe.experts.e.w1.weight body.i.channel.layer.w_gate[e] (transposed; w3: w_up,
                                                        w2: w_down)

The layers compute what transformers' do once the spec states MiniMax's residual wiring: `postnorm`
(each residual taken after its norm) and `residual_factors` (each kind's alpha and beta), every norm
between layers at `norm_eps` (rms_norm_eps). madsl's lightning attention is MiniMaxLightningAttention's
recurrence (its block form is the same sum, computed in other groupings: block_size changes rounding
only), its slopes 2^(-8(h+1)/heads) scaled by the layer's `decay_scale`, its output norm at eps 1e-6;
the experts are routed by a softmax over the top-k logits (MiniMaxTopKRouter's softmax over all,
renormalised over the top k). MiniMax-M1's attention rotates the first rotary_dim channels of each
head (`rotary_fraction`), its layers take the residual after the norm where `postnorm` says so, and
its code scales layer l's slopes by 1 - l / (layers - 1) + 1e-5 (the converter's `decay_scale`).
Refused by key: MiniMax-M1's lightning layers at a head count that is not a power of two (its code
then interleaves ALiBi's slopes, which madsl's schedule is not). Not exported: minimax_m1
(`NOT_EXPORTED`: transformers has no class that would load it).
"""

from __future__ import annotations

import math
from typing import Any

from madsl.errors import Location, MadslError
from madsl.weights.parts import Sources, expert_matrices, layered

RULES = (  # (madsl name after `body.i.`, MiniMax's after `model.layers.i.`)
    (r"mixer\.norm\.weight", "input_layernorm.weight"),
    (r"channel\.norm\.weight", "post_attention_layernorm.weight"),
    (r"channel\.layer\.router\.weight", "block_sparse_moe.gate.weight"),
    (r"mixer\.layer\.out\.weight", "self_attn.o_proj.weight"),
    (r"mixer\.layer\.(qkv_proj|output_gate|out_proj|norm)\.weight", r"self_attn.\1.weight"),
)
EXPERT_MATRICES = {"w_gate": "w1", "w_up": "w3", "w_down": "w2"}
BLOCK_SIZE = 256  # MiniMaxConfig's block_size default


def check_config(config: dict[str, Any], path: str) -> None:
    """MiniMax-M1's lightning layers at a head count that is not a power of two (the converter
    refuses the rest: rope scaling, a shared expert, another activation)."""
    if config.get("model_type") != "minimax_m1" or 0 not in config.get("attn_type_list", ()):
        return
    heads = config.get("num_attention_heads")
    if isinstance(heads, int) and heads > 0 and not math.log2(heads).is_integer():
        raise MadslError(
            f"\"num_attention_heads\": {heads} is not a power of two, where MiniMax-M1's code interleaves ALiBi's "
            "slopes of the next power of two; madsl's lightning attention has the schedule 2^(-8(h+1)/heads) of "
            "transformers' MiniMaxLightningAttention",
            Location(path),
            hint="a power-of-two head count (MiniMax-M1's is 64)",
        )


def sources(model: Any, config: dict[str, Any]) -> Sources:
    """Each tensor of the model's state dict -> the MiniMax checkpoint tensors it is made of."""
    top = {
        "embedding.weight": "model.embed_tokens.weight",
        "final_norm.weight": "model.norm.weight",
        "head.weight": "lm_head.weight",
    }
    experts = "model.layers.{block}.block_sparse_moe.experts.{expert}.{matrix}.weight"
    return {**layered(model, top, RULES), **expert_matrices(model, EXPERT_MATRICES, experts)}


def constants(config: dict[str, Any]) -> dict[str, Any]:
    """The decay buffers transformers' MiniMaxLightningAttention saves with its weights, as its
    get_slope_rate and decay_factors compute them (float32) from the config: no parameter of the
    madsl model (its lightning layers compute their decay from the spec)."""
    import torch

    if config.get("model_type") == "minimax_m1":  # MiniMax-M1's code has no decay buffers: its slopes are computed
        return {}
    heads, layers = config["num_attention_heads"], config["num_hidden_layers"]
    block = config.get("block_size", BLOCK_SIZE)
    out = {}
    for index, kind in enumerate(_layer_kinds(config)):
        if kind != "linear_attention":
            continue
        base = 1 / (2 ** (8 / heads))  # in transformers' order of operations, so equal bit for bit
        slope = (base ** (torch.arange(heads) + 1) * (1 - index / (layers - 1 + 1e-5) + 1e-5))[:, None, None]
        steps = torch.arange(block) + 1
        diagonal = slope * (steps[:, None] - steps[None, :])[None, None, :, :]
        prefix = f"model.layers.{index}.self_attn."
        out[prefix + "slope_rate"] = slope
        out[prefix + "query_decay"] = torch.exp(-slope * steps[:, None])
        out[prefix + "key_decay"] = torch.exp(-slope * (block - steps[:, None]))
        out[prefix + "diagonal_decay"] = torch.exp(torch.where(diagonal >= 0, -diagonal, float("-inf")))
    return out


def _layer_kinds(config: dict[str, Any]) -> list[str]:
    """Each layer's kind as the converter reads it: layer_types, else MiniMaxConfig's default
    (attention at every even index)."""
    kinds = config.get("layer_types")
    if kinds is None:
        kinds = ["full_attention" if (i + 1) % 2 else "linear_attention" for i in range(config["num_hidden_layers"])]
    return kinds


# model_types madsl imports but does not write: (why, what to do instead)
NOT_EXPORTED = {
    "minimax_m1": (
        "transformers has no MiniMax-M1 class (its checkpoints run MiniMax's own code, MiniMaxM1ForCausalLM), so "
        "AutoModelForCausalLM could not load the checkpoint: nothing was written",
        "--to-hf minimax: the same layers and tensors, as transformers' MiniMaxForCausalLM (postnorm: true)",
    )
}

# where the embeddings are tied (the model has no head), a checkpoint may still hold lm_head: the embedding's copy
TIED = {"lm_head.weight": "model.embed_tokens.weight"}

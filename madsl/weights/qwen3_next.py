"""Qwen3-Next and Qwen3.5 (`model_type: qwen3_next`, `qwen3_5_text`, `qwen3_5_moe_text`, and the
vision-language `qwen3_5` / `qwen3_5_moe`, whose language model is imported; transformers'
Qwen3NextForCausalLM, Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM): where each checkpoint tensor goes
in the madsl model `madsl convert --from-hf` makes of its config (Gated DeltaNet and gated attention
layers, each followed by a SwiGLU or a mixture of SwiGLU experts beside a gated shared expert).

P is `model.` (`model.language_model.` in a vision-language checkpoint), L is P + `layers.i.`:

    P embed_tokens.weight, lm_head.weight           embedding.weight, head.weight (untied)
    P norm.weight, L input_layernorm.weight,        final_norm.weight, body.i.mixer.norm.weight,
    L post_attention_layernorm.weight               body.i.channel.norm.weight: each 1 + w
    L self_attn.q_proj.weight                       body.i.mixer.layer.qkv.weight: each head's query rows
                                                    first, its gate rows after k and v (see below)
    L self_attn.{k,v}_proj.weight, o_proj.weight    qkv.weight (k, v rows), out.weight
    L self_attn.{q,k}_norm.weight                   body.i.mixer.layer.{q,k}_norm.weight: each 1 + w
    L linear_attn.in_proj_qkvz.weight (Qwen3-Next)  q_proj, k_proj, v_proj, g_proj (see below)
    L linear_attn.in_proj_ba.weight (Qwen3-Next)    b_proj, a_proj (see below)
    L linear_attn.in_proj_qkv.weight (Qwen3.5)      q_proj, k_proj, v_proj: its rows in that order
    L linear_attn.in_proj_{z,b,a}.weight (Qwen3.5)  g_proj, b_proj, a_proj
    L linear_attn.conv1d.weight, A_log, dt_bias     conv.conv.weight, A_log, dt_bias
    L linear_attn.norm.weight, out_proj.weight      o_norm.weight (w: a plain gated RMSNorm), o_proj.weight
    L mlp.{gate,up,down}_proj.weight                body.i.channel.layer.w{1,3,2}.weight (SwiGLU)
    L mlp.gate.weight, shared_expert_gate.weight    router.weight, shared_gate.weight (MoE)
    L mlp.shared_expert.{gate,up,down}_proj.weight  shared.w{1,3,2}.weight
    L mlp.experts.e.{gate,up,down}_proj.weight      w_gate, w_up, w_down [e], each transposed

The fused layouts, as transformers' modules split them: q_proj's rows are (query, gate) per head,
head_dim each, and madsl's qkv holds every query row, then k, v, then every gate row. Qwen3-Next's
in_proj_qkvz groups its rows per key head h: q_h, k_h (key head width each), then the value heads
h serves (value_heads / heads of them, in order) v, then z; in_proj_ba per key head: b, then a, one
row per value head it serves (fix_query_key_value_ordering). madsl's q, k, v, g, b and a projections
take those rows head by head, so the conv's channels (q, k, v) and the value heads keep their order.

The norms compute x * (1 + w) (zero-centred): madsl's RMSNorms hold 1 + w (in float32, as
transformers rounds it) and export subtracts 1 again; the Gated DeltaNet's output norm is a plain
w. Every norm is at rms_norm_eps (the spec's norm_eps, the attention's qk_norm_eps, the DeltaNet's
norm_eps), and the DeltaNet's q and k are L2-normalised as transformers' l2norm does, x / sqrt(||x||^2
+ 1e-6) (its l2norm_eps). The rotary frequencies of Qwen3.5's multimodal rotary (mrope_section) are those of the
text positions alone, which all three of its sections share. Refused by key: `attention_bias` (the
doubled q_proj's bias would have to be split per head). Not imported, and said in the notes: the
multi-token prediction head (`mtp.*`) and a vision-language checkpoint's vision encoder
(`model.visual.*`), which transformers' AutoModelForCausalLM does not load either.
"""

from __future__ import annotations

from typing import Any

from madsl.errors import MadslError
from madsl.weights.parts import Part, Sources, expert_matrices, layered

VISION_LANGUAGE = ("qwen3_5", "qwen3_5_moe")
RULES = (  # (madsl name after `body.i.`, the checkpoint's after `layers.i.`); norms and fused layouts below
    (r"mixer\.layer\.out\.weight", "self_attn.o_proj.weight"),
    (r"mixer\.layer\.conv\.conv\.weight", "linear_attn.conv1d.weight"),
    (r"mixer\.layer\.(A_log|dt_bias)", r"linear_attn.\1"),
    (r"mixer\.layer\.o_norm\.weight", "linear_attn.norm.weight"),
    (r"mixer\.layer\.o_proj\.weight", "linear_attn.out_proj.weight"),
    (r"channel\.layer\.w1\.weight", "mlp.gate_proj.weight"),
    (r"channel\.layer\.w3\.weight", "mlp.up_proj.weight"),
    (r"channel\.layer\.w2\.weight", "mlp.down_proj.weight"),
    (r"channel\.layer\.router\.weight", "mlp.gate.weight"),
    (r"channel\.layer\.shared_gate\.weight", "mlp.shared_expert_gate.weight"),
    (r"channel\.layer\.shared\.w1\.weight", "mlp.shared_expert.gate_proj.weight"),
    (r"channel\.layer\.shared\.w3\.weight", "mlp.shared_expert.up_proj.weight"),
    (r"channel\.layer\.shared\.w2\.weight", "mlp.shared_expert.down_proj.weight"),
)
NORMS = {  # zero-centred norms: madsl's weight is 1 + the checkpoint's
    "mixer.norm.weight": "input_layernorm.weight",
    "channel.norm.weight": "post_attention_layernorm.weight",
    "mixer.layer.q_norm.weight": "self_attn.q_norm.weight",
    "mixer.layer.k_norm.weight": "self_attn.k_norm.weight",
}
EXPERT_MATRICES = {"w_gate": "gate_proj", "w_up": "up_proj", "w_down": "down_proj"}
# checkpoint tensors transformers' AutoModelForCausalLM leaves out of these families' language models
SKIPPED = {
    r"mtp\..+": "the multi-token prediction head",
    r"model\.visual\..+": "the vision encoder",
}


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: a vision-language config's text_config, else the config."""
    text = config.get("text_config") if config.get("model_type") in VISION_LANGUAGE else None
    return text if isinstance(text, dict) else config


def check_config(config: dict[str, Any], path: str) -> None:
    """An attention bias: the doubled q_proj's bias interleaves query and gate per head, which
    madsl's map takes apart row by row for weights only."""
    if text_config(config).get("attention_bias"):
        key = '"text_config"."attention_bias"' if text_config(config) is not config else '"attention_bias"'
        raise MadslError(
            f"{path}: {key} is true: madsl imports Qwen3-Next and Qwen3.5 attention without biases",
            hint="the published checkpoints have none (attention_bias: false)",
        )


def sources(model: Any, config: dict[str, Any]) -> Sources:
    """Each tensor of the model's state dict -> the checkpoint tensors it is made of."""
    prefix = "model.language_model." if config.get("model_type") in VISION_LANGUAGE else "model."
    top = {"embedding.weight": f"{prefix}embed_tokens.weight", "head.weight": "lm_head.weight"}
    state = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    out = layered(model, top, RULES, layers=f"{prefix}layers")
    out["final_norm.weight"] = (Part(f"{prefix}norm.weight", state["final_norm.weight"], offset=1.0),)
    fused = config.get("model_type") == "qwen3_next"
    experts = f"{prefix}layers.{{block}}.mlp.experts.{{expert}}.{{matrix}}.weight"
    out.update(expert_matrices(model, EXPERT_MATRICES, experts))
    blocks = sorted({int(name.split(".")[1]) for name in state if name.startswith("body.")})
    for i in blocks:
        layer, ours = f"{prefix}layers.{i}.", f"body.{i}."
        for name, source in NORMS.items():
            if ours + name in state:
                out[ours + name] = (Part(layer + source, state[ours + name], offset=1.0),)
        mixer = model.get_submodule(f"body.{i}.mixer.layer")
        if ours + "mixer.layer.qkv.weight" in state:
            out[ours + "mixer.layer.qkv.weight"] = gated_qkv(mixer, layer + "self_attn.")
        elif ours + "mixer.layer.q_proj.weight" in state:
            parts = delta_net_fused(mixer, layer) if fused else delta_net_split(mixer, layer)
            out.update({f"{ours}mixer.layer.{name}": value for name, value in parts.items()})
    return out


def gated_qkv(attention: Any, prefix: str) -> tuple[Part, ...]:
    """madsl's qkv (every query head, k, v, every gate head) from q_proj's (query, gate) per head."""
    heads, width, dim = attention.heads, attention.head_dim, attention.qkv.weight.shape[1]
    q_proj = (f"{prefix}q_proj.weight", (2 * heads * width, dim))
    kv = (attention.kv_heads * width, dim)
    query = [Part(*q_proj, take=(2 * h * width, (2 * h + 1) * width)) for h in range(heads)]
    gate = [Part(*q_proj, take=((2 * h + 1) * width, (2 * h + 2) * width)) for h in range(heads)]
    return (*query, Part(f"{prefix}k_proj.weight", kv), Part(f"{prefix}v_proj.weight", kv), *gate)


def delta_net_fused(layer: Any, prefix: str) -> dict[str, tuple[Part, ...]]:
    """Qwen3-Next's Gated DeltaNet projections from in_proj_qkvz and in_proj_ba, grouped per key head."""
    heads, key, serves = layer.key_heads, layer.key_dim, layer.heads // layer.key_heads
    value = serves * layer.value_dim  # the value (and z) rows one key head's group holds
    dim = layer.q_proj.weight.shape[1]
    group = 2 * key + 2 * value
    qkvz = (f"{prefix}linear_attn.in_proj_qkvz.weight", (heads * group, dim))
    ba = (f"{prefix}linear_attn.in_proj_ba.weight", (heads * 2 * serves, dim))

    def rows(source: tuple[str, tuple[int, int]], stride: int, width: int, offset: int) -> tuple[Part, ...]:
        """Each key head's `width` rows from `offset` in its group of `stride` rows."""
        return tuple(Part(*source, take=(h * stride + offset, h * stride + offset + width)) for h in range(heads))

    return {
        "q_proj.weight": rows(qkvz, group, key, 0),
        "k_proj.weight": rows(qkvz, group, key, key),
        "v_proj.weight": rows(qkvz, group, value, 2 * key),
        "g_proj.weight": rows(qkvz, group, value, 2 * key + value),
        "b_proj.weight": rows(ba, 2 * serves, serves, 0),
        "a_proj.weight": rows(ba, 2 * serves, serves, serves),
    }


def delta_net_split(layer: Any, prefix: str) -> dict[str, tuple[Part, ...]]:
    """Qwen3.5's Gated DeltaNet projections: in_proj_qkv's rows q, k, v; in_proj_z, _b, _a as they stand."""
    keys, values = layer.key_heads * layer.key_dim, layer.heads * layer.value_dim
    dim = layer.q_proj.weight.shape[1]
    qkv = (f"{prefix}linear_attn.in_proj_qkv.weight", (2 * keys + values, dim))
    return {
        "q_proj.weight": (Part(*qkv, take=(0, keys)),),
        "k_proj.weight": (Part(*qkv, take=(keys, 2 * keys)),),
        "v_proj.weight": (Part(*qkv, take=(2 * keys, 2 * keys + values)),),
        "g_proj.weight": (Part(f"{prefix}linear_attn.in_proj_z.weight", (values, dim)),),
        "b_proj.weight": (Part(f"{prefix}linear_attn.in_proj_b.weight", (layer.heads, dim)),),
        "a_proj.weight": (Part(f"{prefix}linear_attn.in_proj_a.weight", (layer.heads, dim)),),
    }


# where the embeddings are tied (the model has no head), a checkpoint may still hold lm_head: the embedding's copy
TIED = {"lm_head.weight": "model.embed_tokens.weight"}

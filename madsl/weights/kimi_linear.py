"""Kimi Linear (Moonshot AI, `model_type: kimi_linear`, transformers' KimiLinearForCausalLM): where
each checkpoint tensor goes in the madsl model `madsl convert --from-hf` makes of its config (KDA and
MLA layers, each followed by a SwiGLU or by SwiGLU experts beside a shared SwiGLU).

    model.embed_tokens.weight, model.norm.weight, lm_head.weight   embedding, final_norm, head
    model.layers.i.input_layernorm.weight               body.i.mixer.norm.weight
    model.layers.i.post_attention_layernorm.weight      body.i.channel.norm.weight
    KDA: model.layers.i.self_attn.
      {q,k,v}_proj.weight, b_proj.weight, o_proj.weight body.i.mixer.layer.{q,k,v,b,o}_proj.weight
      {q,k,v}_conv1d.weight (three depthwise convs)     body.i.mixer.layer.conv.conv.weight (their rows: q, k, v)
      f_a_proj, f_b_proj (the forget gate's low rank)   body.i.mixer.layer.f_proj.{0,1}.weight
      g_a_proj, g_b_proj (the output gate's low rank)   body.i.mixer.layer.g_proj.{0,1}.weight
      A_log (1, 1, heads, 1), dt_bias                   body.i.mixer.layer.A_log (heads,), dt_bias
      o_norm.weight (the gated RMSNorm)                 body.i.mixer.layer.o_norm.weight
    MLA: model.layers.i.self_attn.
      q_proj, or q_a_proj, q_a_layernorm, q_b_proj      body.i.mixer.layer.*, the same names
      kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj
    model.layers.i.mlp.{gate,up,down}_proj.weight       body.i.channel.layer.w{1,3,2}.weight (Sg)
      (transformers' save_pretrained writes them under block_sparse_moe.: either is read)
    model.layers.i.block_sparse_moe.
      gate.weight                                       body.i.channel.layer.router.weight
      gate.e_score_correction_bias                      body.i.channel.layer.selection_bias (a buffer)
      experts.e.w{1,3,2}.weight                         body.i.channel.layer.{w_gate,w_up,w_down}[e], transposed
      shared_experts.{gate,up,down}_proj.weight         body.i.channel.layer.shared.w{1,3,2}.weight

The layers compute what transformers' do: KDA's short convolutions with SiLU, the forget gate
-exp(A_log) softplus(f_b(f_a x) + dt_bias) per key channel, beta = sigmoid(b_proj x), q and k
L2-normalised (q scaled by head_dim^-1/2), the delta rule, the output RMSNorm at rms_norm_eps gated by
sigmoid(g_b(g_a x)); MLA without rotary (NoPE) at the softmax scale (nope + rope)^-1/2, its two
RMSNorms at transformers' fixed 1e-6 and its step cache the normed latent and the rope key; the
mixture of experts as KimiLinearTopkRouter routes (MoE scores: sigmoid with the correction bias;
madsl divides by the chosen scores' sum, transformers by the sum plus 1e-20, below float32's
resolution). Refused by key (madsl.interop.huggingface.kimi_linear): group-limited routing and a
softmax router.
"""

from __future__ import annotations

from typing import Any

from madsl.weights.parts import Part, Sources, expert_matrices, layered

LOW_RANK = {"f_proj.0": "f_a_proj", "f_proj.1": "f_b_proj", "g_proj.0": "g_a_proj", "g_proj.1": "g_b_proj"}
RULES = (  # (madsl name after `body.i.`, Kimi Linear's after `model.layers.i.`)
    (r"mixer\.norm\.weight", "input_layernorm.weight"),
    (r"channel\.norm\.weight", "post_attention_layernorm.weight"),
    *((rf"mixer\.layer\.{ours}\.weight", f"self_attn.{theirs}.weight") for ours, theirs in LOW_RANK.items()),
    (r"mixer\.layer\.(.+)", r"self_attn.\1"),  # KDA's other tensors and MLA's: the same names
    (r"channel\.layer\.w1\.weight", "mlp.gate_proj.weight"),
    (r"channel\.layer\.w3\.weight", "mlp.up_proj.weight"),
    (r"channel\.layer\.w2\.weight", "mlp.down_proj.weight"),
    (r"channel\.layer\.router\.weight", "block_sparse_moe.gate.weight"),
    (r"channel\.layer\.selection_bias", "block_sparse_moe.gate.e_score_correction_bias"),
    (r"channel\.layer\.shared\.w1\.weight", "block_sparse_moe.shared_experts.gate_proj.weight"),
    (r"channel\.layer\.shared\.w3\.weight", "block_sparse_moe.shared_experts.up_proj.weight"),
    (r"channel\.layer\.shared\.w2\.weight", "block_sparse_moe.shared_experts.down_proj.weight"),
)
EXPERT_MATRICES = {"w_gate": "w1", "w_up": "w3", "w_down": "w2"}
# Moonshot's checkpoints hold a dense layer's SwiGLU under mlp., transformers' save_pretrained under
# block_sparse_moe. (its conversion mapping renames one to the other both ways): either spelling is read
SPELLINGS = ((".mlp.", ".block_sparse_moe."),)


def check_config(config: dict[str, Any], path: str) -> None:
    """Nothing beyond what the converter refuses: it states every norm's eps and the routing in the spec."""


def sources(model: Any, config: dict[str, Any]) -> Sources:
    """Each tensor of the model's state dict -> the Kimi Linear checkpoint tensors it is made of."""
    top = {
        "embedding.weight": "model.embed_tokens.weight",
        "final_norm.weight": "model.norm.weight",
        "head.weight": "lm_head.weight",
    }
    out = layered(model, top, RULES)
    experts = "model.layers.{block}.block_sparse_moe.experts.{expert}.{matrix}.weight"
    out.update(expert_matrices(model, EXPERT_MATRICES, experts))
    for name, tensor in model.state_dict().items():
        block, _, rest = name.removeprefix("body.").partition(".mixer.layer.")
        prefix = f"model.layers.{block}.self_attn."
        if rest == "conv.conv.weight":  # one packed conv of q, k and v channels: three checkpoint convs
            rows = tensor.shape[0] // 3
            out[name] = tuple(Part(f"{prefix}{x}_conv1d.weight", (rows, *tensor.shape[1:])) for x in "qkv")
        elif rest == "A_log":  # (heads,) here, (1, 1, heads, 1) in the checkpoint: the same numbers
            heads = tensor.shape[0]
            out[name] = (Part(f"{prefix}A_log", (1, 1, heads, 1), reshaped=(heads,)),)
    return out


def as_spelled(sources: Sources, headers: dict[str, Any]) -> Sources:
    """`sources` with each checkpoint name the checkpoint lacks in its other spelling (SPELLINGS)
    where the checkpoint holds that one: a dense SwiGLU under mlp. or block_sparse_moe."""
    out = {}
    for name, parts in sources.items():
        renamed = []
        for part in parts:
            if part.name not in headers:
                for ours, theirs in SPELLINGS:
                    other = part.name.replace(ours, theirs)
                    if other != part.name and other in headers:
                        part = part._replace(name=other)
                        break
            renamed.append(part)
        out[name] = tuple(renamed)
    return out


TIED: dict[str, str] = {}  # KimiLinearForCausalLM never ties its head (the converter unties every spec)

"""LFM2 (Liquid AI, `model_type: lfm2`) config.json <-> madsl spec.

`layer_types` (or, in earlier configs, the attention layers' `full_attn_idxs`) names each layer
"conv" (a gated short convolution, madsl's `GConv`) or "full_attention" (grouped-query attention
with an RMSNorm on each head's queries and keys, and rotary embeddings); every layer is followed
by a SwiGLU MLP. The MLP's width is intermediate_size (or block_ff_dim) as it stands, or, with
block_auto_adjust_ff_dim (the released models), 2/3 of it, times block_ffn_dim_multiplier, rounded
up to a multiple of block_multiple_of: LFM2-1.2B's 12288 is 8192. The embeddings are tied unless
tie_embedding (or tie_word_embeddings) says not.
"""

from __future__ import annotations

from typing import Any

from madsl.interop.huggingface.base import Family, Stack, attention, head_dim, rope, spec_data
from madsl.interop.huggingface.config import Config

KINDS = {"conv": "GConv", "full_attention": "A"}


class Lfm2(Family):
    model_type, title, architecture, tied_by_default = "lfm2", "LFM2", "Lfm2ForCausalLM", True

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers")
        kinds = _layer_kinds(cfg, n)
        theta, fraction = rope(cfg, 1e6)
        layers = {
            "GConv": {"d_conv": cfg.count("conv_L_cache"), "bias": cfg.flag("conv_bias", False)},
            "A": attention(
                cfg,
                head_dim(cfg, dim, "head_dim"),
                rotary=True,
                rotary_base=theta,
                rotary_fraction=fraction,
                bias_key=None,
                qk_norm=True,
            ),
            "Sg": {"inner": _mlp_width(cfg)},
        }
        key = "tie_embedding" if "tie_embedding" in cfg.data else "tie_word_embeddings"
        return spec_data(
            cfg, name, self, dim, [f"{KINDS[kind]}-Sg" for kind in kinds], layers, tied=cfg.flag(key, True)
        )

    def write(self, spec: Any) -> dict[str, Any]:
        stack = Stack(spec, self)
        stack.refuse_kinds(
            {"gated_conv", "attention", "swiglu"}, "a gated short convolution (GConv) or attention, then a SwiGLU (Sg)"
        )
        if any(c is None or c.name != "swiglu" for _, c in stack.layers):
            stack.refuse("every LFM2 layer is followed by a SwiGLU (Sg)")
        out = stack.common(self.model_type)
        out["layer_types"] = [{"gated_conv": "conv", "attention": "full_attention"}[m.name] for m, _ in stack.layers]
        out.update(stack.attention(rotary=True))
        a, conv, mlp = stack.kinds.get("attention"), stack.kinds.get("gated_conv"), stack.kinds["swiglu"]
        if a is not None:
            if not a.qk_norm or a.bias:
                stack.refuse("LFM2's attention normalises queries and keys (qk_norm: true) and has no bias")
            out["rope_theta"] = a.rotary_base
            if a.inner_head_dim * a.heads != spec.dim:
                out["head_dim"] = a.inner_head_dim
            if a.rotary_fraction != 1.0:
                out["partial_rotary_factor"] = a.rotary_fraction
        if conv is not None:
            out.update({"conv_L_cache": conv.d_conv, "conv_bias": conv.bias})
        if mlp.bias:
            stack.refuse("LFM2's MLPs have no bias")
        out.update({"intermediate_size": mlp.inner, "block_auto_adjust_ff_dim": False})
        return out


def _layer_kinds(cfg: Config, n: int) -> list[str]:
    """Each layer's kind, as Lfm2Config reads them: `layer_types`, else attention at `full_attn_idxs`
    (earlier configs), else attention in every layer."""
    if cfg.data.get("layer_types") is not None:
        kinds = cfg.words("layer_types", KINDS)
        if len(kinds) != n:
            raise cfg.error("layer_types", f"{len(kinds)} layers, but num_hidden_layers is {n}")
        return kinds
    attention_at = set(cfg.integers("full_attn_idxs", n)) if cfg.data.get("full_attn_idxs") is not None else None
    return ["full_attention" if attention_at is None or i in attention_at else "conv" for i in range(n)]


def _mlp_width(cfg: Config) -> int:
    """The SwiGLU's width, as Hugging Face's Lfm2MLP computes it (block_ff_dim wins over intermediate_size)."""
    width = cfg.count("block_ff_dim" if "block_ff_dim" in cfg.data else "intermediate_size")
    if not cfg.flag("block_auto_adjust_ff_dim", True):
        return width
    width = int(2 * width / 3)
    multiplier = (
        cfg.number("block_ffn_dim_multiplier", 1.0, positive=True)
        if cfg.data.get("block_ffn_dim_multiplier", 1.0) is not None
        else None
    )
    if multiplier is not None:
        multiple = cfg.count("block_multiple_of", default=256)
        width = multiple * ((int(multiplier * width) + multiple - 1) // multiple)
    if width < 1:
        raise cfg.error(
            "block_ff_dim" if "block_ff_dim" in cfg.data else "intermediate_size",
            f"gives an MLP {width} wide after block_auto_adjust_ff_dim",
        )
    return width

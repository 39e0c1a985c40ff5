"""LFM2 and LFM2-MoE (Liquid AI, `model_type: lfm2`, `lfm2_moe`) config.json <-> madsl spec.

`layer_types` (or, in earlier configs, the attention layers' `full_attn_idxs`) names each layer
"conv" (a gated short convolution, madsl's `GConv`) or "full_attention" (grouped-query attention
with an RMSNorm on each head's queries and keys, and rotary embeddings); every layer is followed
by a SwiGLU MLP. The MLP's width is intermediate_size (or block_ff_dim) as it stands, or, with
block_auto_adjust_ff_dim (the released models), 2/3 of it, times block_ffn_dim_multiplier, rounded
up to a multiple of block_multiple_of: LFM2-1.2B's 12288 is 8192. The embeddings are tied unless
tie_embedding (or tie_word_embeddings) says not.

LFM2-MoE stacks the same layers (`layer_types`); its first num_dense_layers layers are followed by a
SwiGLU of intermediate_size (no auto-adjusting), the others by a mixture of num_experts SwiGLU
experts of moe_intermediate_size, num_experts_per_tok of them per token, routed by sigmoid scores
(the expert bias a buffer that picks, as Nemotron-H's correction bias: MoE scores: sigmoid).
"""

from __future__ import annotations

from typing import Any

from madsl.errors import Location, MadslError
from madsl.interop.huggingface.base import Family, Stack, attention, head_dim, rope, spec_data, spelled
from madsl.interop.huggingface.config import Config

KINDS = {"conv": "GConv", "full_attention": "A"}


# the keys LFM2 and LFM2-MoE default alike (transformers' Lfm2Config and Lfm2MoeConfig)
LFM2_DEFAULTS = {"num_key_value_heads": 8, "conv_bias": False, "conv_L_cache": 3, "tie_word_embeddings": True}


def _mixers(cfg: Config, dim: int) -> dict[str, Any]:
    """The gated short convolution's and attention's settings (LFM2's and LFM2-MoE's alike)."""
    theta, fraction = rope(cfg, 1e6)
    return {
        "GConv": {"d_conv": cfg.count("conv_L_cache"), "bias": cfg.flag("conv_bias")},
        "A": attention(
            cfg,
            head_dim(cfg, dim, "head_dim"),
            rotary=True,
            rotary_base=theta,
            rotary_fraction=fraction,
            bias_key=None,
            qk_norm=True,
        ),
    }


def _tied(cfg: Config) -> bool:
    """tie_embedding, which the config classes read over tie_word_embeddings."""
    return cfg.flag(spelled(cfg, "tie_word_embeddings", "tie_embedding"))


class Lfm2(Family):
    model_type, title, architecture, tied_by_default = "lfm2", "LFM2", "Lfm2ForCausalLM", True
    config_class = "Lfm2Config"
    # transformers' Lfm2Config defaults, taken where a config leaves a key out
    defaults = {
        **LFM2_DEFAULTS,
        "block_auto_adjust_ff_dim": True,
        "block_ffn_dim_multiplier": 1.0,
        "block_multiple_of": 256,
    }

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers")
        kinds = _layer_kinds(cfg, n)
        layers = {**_mixers(cfg, dim), "Sg": {"inner": _mlp_width(cfg)}}
        return spec_data(cfg, name, self, dim, [f"{KINDS[kind]}-Sg" for kind in kinds], layers, tied=_tied(cfg))

    def write(self, spec: Any) -> dict[str, Any]:
        stack = Stack(spec, self)
        stack.refuse_kinds(
            {"gated_conv", "attention", "swiglu"}, "a gated short convolution (GConv) or attention, then a SwiGLU (Sg)"
        )
        if any(c is None or c.name != "swiglu" for _, c in stack.layers):
            stack.refuse("every LFM2 layer is followed by a SwiGLU (Sg)")
        out = _write_mixers(stack, self.model_type)
        mlp = stack.kinds["swiglu"]
        if mlp.bias:
            stack.refuse("LFM2's MLPs have no bias")
        out.update({"intermediate_size": mlp.inner, "block_auto_adjust_ff_dim": False})
        return out


def _write_mixers(stack: Stack, model_type: str) -> dict[str, Any]:
    """The config fields of the stack, its layer kinds and their mixers' settings (LFM2's and LFM2-MoE's alike)."""
    out = stack.common(model_type)
    out["layer_types"] = [{"gated_conv": "conv", "attention": "full_attention"}[m.name] for m, _ in stack.layers]
    out.update(stack.attention(rotary=True))
    a, conv = stack.kinds.get("attention"), stack.kinds.get("gated_conv")
    if a is not None:
        if not a.qk_norm or a.bias:
            stack.refuse(
                f"{stack.family.title}'s attention normalises queries and keys (qk_norm: true) and has no bias"
            )
        out["rope_theta"] = a.rotary_base
        if a.inner_head_dim * a.heads != stack.spec.dim:
            out["head_dim"] = a.inner_head_dim
        if a.rotary_fraction != 1.0:
            out["partial_rotary_factor"] = a.rotary_fraction
    if conv is not None:
        out.update({"conv_L_cache": conv.d_conv, "conv_bias": conv.bias})
    return out


def _layer_kinds(cfg: Config, n: int, *, by_index: bool = True) -> list[str]:
    """Each layer's kind, as the config classes read them: `layer_types`, else (LFM2's earlier
    configs, `by_index`) attention at `full_attn_idxs`. A config with neither is refused: it does not
    say which layers are attention (Lfm2Config would make every layer attention, Lfm2MoeConfig fails)."""
    if cfg.data.get("layer_types") is None and by_index and cfg.data.get("full_attn_idxs") is not None:
        attention_at = set(cfg.integers("full_attn_idxs", n))
        return ["full_attention" if i in attention_at else "conv" for i in range(n)]
    if cfg.data.get("layer_types") is None:
        raise MadslError(
            'missing key "layer_types": the config does not say which layers are attention',
            Location(cfg.path),
            hint='e.g. "layer_types": ["conv", "conv", "full_attention", ...]'
            + (', or "full_attn_idxs": [2, 5, ...]' if by_index else ""),
        )
    kinds = cfg.words("layer_types", KINDS)
    if len(kinds) != n:
        raise cfg.error("layer_types", f"{len(kinds)} layers, but num_hidden_layers is {n}")
    return kinds


def _mlp_width(cfg: Config) -> int:
    """The SwiGLU's width, as Hugging Face's Lfm2MLP computes it (block_ff_dim wins over intermediate_size)."""
    if "intermediate_size" not in cfg.data and "block_ff_dim" not in cfg.data:
        raise MadslError(
            'missing key "intermediate_size" (or "block_ff_dim"): the MLP\'s width',
            Location(cfg.path),
            hint="an LFM2 config.json states one: madsl takes no default for a size that says which model it is",
        )
    width = cfg.count(spelled(cfg, "intermediate_size", "block_ff_dim"))
    if not cfg.flag("block_auto_adjust_ff_dim"):
        return width
    width = int(2 * width / 3)
    multiplier = (
        cfg.number("block_ffn_dim_multiplier", positive=True)
        if cfg.data.get("block_ffn_dim_multiplier", 1.0) is not None
        else None
    )
    if multiplier is not None:
        multiple = cfg.count("block_multiple_of")
        width = multiple * ((int(multiplier * width) + multiple - 1) // multiple)
    if width < 1:
        raise cfg.error(
            "block_ff_dim" if "block_ff_dim" in cfg.data else "intermediate_size",
            f"gives an MLP {width} wide after block_auto_adjust_ff_dim",
        )
    return width


class Lfm2Moe(Family):
    model_type, title, architecture, tied_by_default = "lfm2_moe", "LFM2-MoE", "Lfm2MoeForCausalLM", True
    config_class = "Lfm2MoeConfig"
    # transformers' Lfm2MoeConfig defaults, taken where a config leaves a key out
    defaults = {
        **LFM2_DEFAULTS,
        "num_dense_layers": 2,
        "use_expert_bias": True,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
    }

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers")
        kinds = _layer_kinds(cfg, n, by_index=False)
        dense = cfg.count("num_dense_layers", 0)
        experts, active = cfg.count("num_experts"), cfg.count("num_experts_per_tok")
        if active > experts:
            raise cfg.error("num_experts_per_tok", f"{active} exceeds num_experts={experts}")
        layers = _mixers(cfg, dim)
        if dense:
            layers["Sg"] = {"inner": cfg.count("intermediate_size")}
        if dense < n:
            layers["MoE"] = {
                "experts": experts,
                "expert_width": cfg.count("moe_intermediate_size"),
                "active": active,
                # Lfm2MoeTopKRouter: sigmoid scores, chosen with expert_bias (a buffer) where use_expert_bias
                "scores": "sigmoid",
                "selection_bias": cfg.flag("use_expert_bias"),
                "normalize_top": cfg.flag("norm_topk_prob"),
                "route_scale": cfg.number("routed_scaling_factor", positive=True),
            }
        blocks = [f"{KINDS[kind]}-{'Sg' if i < dense else 'MoE'}" for i, kind in enumerate(kinds)]
        return spec_data(cfg, name, self, dim, blocks, layers, tied=_tied(cfg))

    def write(self, spec: Any) -> dict[str, Any]:
        stack = Stack(spec, self)
        stack.refuse_kinds(
            {"gated_conv", "attention", "swiglu", "moe"},
            "a gated short convolution (GConv) or attention, then a SwiGLU (Sg) or a mixture of experts (MoE)",
        )
        channels = ["none" if c is None else c.name for _, c in stack.layers]
        dense = channels.index("moe") if "moe" in channels else len(channels)
        if channels != ["swiglu"] * dense + ["moe"] * (len(channels) - dense):
            stack.refuse(
                "LFM2-MoE's first layers are followed by a SwiGLU (Sg), all the others by a mixture of experts"
            )
        out = _write_mixers(stack, self.model_type)
        mlp, moe = stack.kinds.get("swiglu"), stack.kinds.get("moe")
        if mlp is not None:
            if mlp.bias:
                stack.refuse("LFM2-MoE's MLPs have no bias")
            out["intermediate_size"] = mlp.inner
        if moe is not None:
            stack.refuse_moe_options(moe)
            if moe.shared_width or not moe.gated or moe.activation != "silu" or moe.router_bias or moe.dense_down:
                stack.refuse(
                    "LFM2-MoE's experts are SwiGLUs, with no shared expert and a router without bias",
                    "shared_width: 0, gated: true, activation: silu, router_bias: false",
                )
            if moe.scores != "sigmoid":
                stack.refuse("LFM2-MoE's router scores experts with a sigmoid", "scores: sigmoid")
            out.update(
                {
                    "num_experts": moe.experts,
                    "num_experts_per_tok": moe.active,
                    "moe_intermediate_size": moe.expert_width,
                    "use_expert_bias": moe.selection_bias,
                    "norm_topk_prob": moe.normalize_top,
                    "routed_scaling_factor": moe.route_scale,
                }
            )
        out["num_dense_layers"] = dense
        return out

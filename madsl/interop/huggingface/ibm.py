"""IBM's Mamba-2 hybrids, config.json <-> madsl spec: Granite 4.0 hybrids (`granitemoehybrid`) and
Bamba (`bamba`). Both stack Mamba-2 and attention layers, each followed by the same channel mixer,
with Bamba's Mamba mixer (width expand x hidden_size = mamba_n_heads x mamba_d_head):

    granitemoehybrid  `layer_types`, "mamba" or "attention" per layer; every layer followed by a
                      mixture of experts with a shared SwiGLU expert, or by the shared SwiGLU alone
                      where num_local_experts is 0; NoPE or rotary attention (position_embedding_type)
    bamba             `attn_layer_indices`, the attention layers by index, Mamba-2 elsewhere; every
                      layer followed by a SwiGLU MLP of intermediate_size; rotary attention on half
                      of each head (partial_rotary_factor 0.5)
"""

from __future__ import annotations

from typing import Any

from madsl.interop.huggingface.base import Family, Stack, attention, head_dim, ignored, mamba2, rope, spec_data
from madsl.interop.huggingface.config import Config

# Bamba's, Granite's and Falcon-H1's Mamba-2 keys (madsl.interop.huggingface.base.MAMBA2_KEYS -> config keys)
IBM_MAMBA2 = {
    "heads": "mamba_n_heads",
    "head_dim": "mamba_d_head",
    "state": "mamba_d_state",
    "groups": "mamba_n_groups",
    "conv": "mamba_d_conv",
    "expand": "mamba_expand",
    "bias": "mamba_proj_bias",
    "conv_bias": "mamba_conv_bias",
}
# the Mamba-2 defaults of transformers' GraniteMoeHybridConfig and BambaConfig (alike)
IBM_MAMBA2_DEFAULTS = {
    "mamba_n_heads": 128,
    "mamba_d_head": "auto",
    "mamba_n_groups": 1,
    "mamba_d_state": 256,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
}


def _layer_types_key(cfg: Config) -> str:
    """layer_types, or layers_block_type, transformers' other name of it (the two must agree where both are written)."""
    if "layers_block_type" not in cfg.data:
        return "layer_types"
    if "layer_types" in cfg.data and cfg.data["layer_types"] != cfg.data["layers_block_type"]:
        raise cfg.error("layers_block_type", "differs from layer_types", "keep one of the two, or make them agree")
    return "layers_block_type"


def _mamba(cfg: Config, dim: int) -> dict[str, Any]:
    return mamba2(cfg, dim, IBM_MAMBA2, width=cfg.count("mamba_expand") * dim, of=" (mamba_expand x hidden_size)")


def _write_mamba(stack: Stack) -> dict[str, Any]:
    m = stack.mamba2()
    if m is None:
        return {}
    if m.d_inner != m.expand * stack.spec.dim:
        stack.refuse(
            f"{stack.family.title}'s Mamba layers are mamba_expand x hidden_size wide; the M2 layers are "
            f"{m.n_heads} heads x {m.head_dim} = {m.d_inner}",
            "drop M2.heads, or set it to expand x dim / head_dim",
        )
    return {
        "mamba_n_heads": m.n_heads,
        "mamba_d_head": m.head_dim,
        "mamba_d_state": m.d_state,
        "mamba_n_groups": m.groups,
        "mamba_d_conv": m.d_conv,
        "mamba_expand": m.expand,
        "mamba_proj_bias": m.bias,
        "mamba_conv_bias": m.conv_bias,
    }


def _one_channel_mixer(stack: Stack, what: str) -> str:
    channels = {None if c is None else c.name for _, c in stack.layers}
    if len(channels) != 1 or None in channels:
        stack.refuse(
            f"every {stack.family.title} layer has the same channel mixer ({what}); the spec has "
            f"{sorted(map(str, channels))}"
        )
    return channels.pop()


class GraniteHybrid(Family):
    model_type, title, architecture, tied_by_default = (
        "granitemoehybrid",
        "Granite 4.0 hybrid",
        "GraniteMoeHybridForCausalLM",
        False,
    )
    # transformers' names (and the earlier ones, which it maps to them) -> madsl's symbols
    KINDS = {"mamba": "M2", "attention": "A", "linear_attention": "M2", "full_attention": "A"}
    config_class = "GraniteMoeHybridConfig"
    # transformers' GraniteMoeHybridConfig defaults, taken where a config leaves a key out
    defaults = {
        "num_key_value_heads": None,  # null: as many as the attention heads
        "attention_bias": False,
        "position_embedding_type": None,  # null: no position embedding (NoPE)
        "router_aux_loss_coef": 0.001,
        "tie_word_embeddings": False,
        # µP-style multipliers and the norms' epsilon, as GraniteMoeHybridConfig defaults them
        "embedding_multiplier": 1.0,
        "residual_multiplier": 1.0,
        "attention_multiplier": 1.0,
        "logits_scaling": 1.0,
        "rms_norm_eps": 1e-6,
        **IBM_MAMBA2_DEFAULTS,
    }
    # spec keys <- Granite's multipliers (the attention's, its softmax scale, goes to the A layer)
    MULTIPLIERS = {
        "embedding_scale": "embedding_multiplier",
        "residual_scale": "residual_multiplier",
        "logit_divisor": "logits_scaling",
    }

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        data = self._read(cfg, name)
        eps = cfg.number("rms_norm_eps", positive=True)  # every norm's, the Mamba-2 gated one's too
        if "M2" in data["layers"]:
            data["layers"]["M2"]["norm_eps"] = eps
        scales = {key: cfg.number(granite, positive=True) for key, granite in self.MULTIPLIERS.items()}
        return {**data, "norm_eps": eps, **scales}

    def _read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers")
        key = _layer_types_key(cfg)
        kinds = [self.KINDS[kind] for kind in cfg.words(key, self.KINDS)]
        if len(kinds) != n:
            raise cfg.error(key, f"{len(kinds)} layers, but num_hidden_layers is {n}")
        experts = cfg.count("num_local_experts", 0)
        shared = cfg.count("shared_intermediate_size")
        channel = "MoE" if experts else "Sg"
        blocks = [f"{kind}-{channel}" for kind in kinds]
        if cfg.data.get("position_embedding_type", cfg.defaults["position_embedding_type"]) is None:
            if "position_embedding_type" not in cfg.data:
                cfg.take_default("position_embedding_type", None)
            position = "nope"  # null: no position embedding, as transformers' model reads it
        else:
            position = cfg.word("position_embedding_type", ("nope", "rope"))
        theta, _ = rope(cfg, 10000.0) if position == "rope" else (None, 1.0)
        layers: dict[str, dict[str, Any]] = {
            "A": {
                **attention(cfg, head_dim(cfg, dim), rotary=position == "rope", rotary_base=theta),
                # GraniteMoeHybridAttention's softmax scale is attention_multiplier itself (1.0 by default)
                "scale": cfg.number("attention_multiplier", positive=True),
            },
            "Sg": {"inner": shared},
        }
        if "M2" in kinds:
            layers["M2"] = _mamba(cfg, dim)
        if experts:
            active = cfg.count("num_experts_per_tok")
            if active > experts:
                raise cfg.error("num_experts_per_tok", f"{active} exceeds num_local_experts={experts}")
            layers["MoE"] = {
                "experts": experts,
                "expert_width": cfg.count("intermediate_size"),
                "active": active,
                "shared_width": shared,
                "aux_loss_weight": cfg.number("router_aux_loss_coef", positive=False),
            }
        return spec_data(cfg, name, self, dim, blocks, layers)

    def write(self, spec: Any) -> dict[str, Any]:
        stack = Stack(spec, self)
        stack.refuse_kinds(
            {"mamba2", "attention", "swiglu", "moe"},
            "Mamba-2 (M2) or attention, then a SwiGLU (Sg) or a mixture of experts with a shared "
            "expert (MoE{shared_width>0}) in every layer",
        )
        _one_channel_mixer(stack, "a SwiGLU, or a mixture of experts with a shared expert")
        out = stack.common(self.model_type)
        out["layer_types"] = [{"mamba2": "mamba", "attention": "attention"}[m.name] for m, _ in stack.layers]
        a, moe, mlp = (stack.kinds.get(k) for k in ("attention", "moe", "swiglu"))
        out.update(stack.attention(rotary=None, scaled=True))
        if a is not None:
            if a.inner_head_dim * a.heads != spec.dim or a.qk_norm or a.rotary_fraction != 1.0:
                stack.refuse(
                    "Granite's attention heads are hidden_size / heads wide, rotary on the whole head, "
                    "with no query-key norm"
                )
            out.update({"attention_bias": a.bias, "position_embedding_type": "rope" if a.rotary else "nope"})
            # GraniteMoeHybridAttention scales q.k by attention_multiplier; madsl's default 1 / sqrt(head_dim) stated
            out["attention_multiplier"] = a.scale if a.scale is not None else a.inner_head_dim**-0.5
            if a.rotary:
                out["rope_theta"] = a.rotary_base
        out.update(_write_mamba(stack))
        m2 = stack.kinds.get("mamba2")
        if m2 is not None and m2.norm_eps != spec.norm_eps:
            stack.refuse("Granite's norms share one rms_norm_eps", f"M2{{norm_eps={spec.norm_eps:g}}}")
        out.update({granite: getattr(spec, key) for key, granite in self.MULTIPLIERS.items()})
        out["rms_norm_eps"] = spec.norm_eps
        if moe is not None:
            stack.refuse_moe_options(moe)
            if not moe.shared_width or not moe.gated or moe.activation != "silu" or moe.router_bias:
                stack.refuse(
                    "Granite 4.0's mixture of experts always has a shared expert, SwiGLU experts and a "
                    "router without bias",
                    "set MoE.shared_width",
                )
            out.update(
                {
                    "num_local_experts": moe.experts,
                    "num_experts_per_tok": moe.active,
                    "intermediate_size": moe.expert_width,
                    "shared_intermediate_size": moe.shared_width,
                    "router_aux_loss_coef": moe.aux_loss_weight,
                }
            )
        else:
            if mlp.bias:
                stack.refuse("Granite's shared MLP has no bias")
            out.update({"num_local_experts": 0, "num_experts_per_tok": 0, "shared_intermediate_size": mlp.inner})
        return out


class Bamba(Family):
    model_type, title, architecture, tied_by_default = "bamba", "Bamba", "BambaForCausalLM", False
    config_class = "BambaConfig"
    # transformers' BambaConfig defaults (those of Bamba-9B), taken where a config leaves a key out
    defaults = {
        "num_key_value_heads": 8,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        **IBM_MAMBA2_DEFAULTS,
    }

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers")
        if "attn_layer_indices" not in cfg.data:
            cfg.take_default("attn_layer_indices", None)  # no attention layer: Mamba-2 in every layer
        at = set(cfg.integers("attn_layer_indices", n)) if cfg.data.get("attn_layer_indices") is not None else set()
        blocks = ["A-Sg" if i in at else "M2-Sg" for i in range(n)]
        theta, _ = rope(cfg, 10000.0, 0.5)
        # BambaConfig rotates half of each head, whatever partial_rotary_factor says
        ignored(cfg, "partial_rotary_factor", 0.5, "rotates half of each head (0.5)")
        layers: dict[str, dict[str, Any]] = {
            "A": attention(cfg, head_dim(cfg, dim, "head_dim"), rotary=True, rotary_base=theta, rotary_fraction=0.5),
            "Sg": {"inner": cfg.count("intermediate_size"), "bias": cfg.flag("mlp_bias")},
        }
        if len(at) < n:
            layers["M2"] = _mamba(cfg, dim)
        return spec_data(cfg, name, self, dim, blocks, layers)

    def write(self, spec: Any) -> dict[str, Any]:
        stack = Stack(spec, self)
        stack.refuse_kinds({"mamba2", "attention", "swiglu"}, "Mamba-2 (M2) or attention, then a SwiGLU (Sg)")
        _one_channel_mixer(stack, "a SwiGLU")
        out = stack.common(self.model_type)
        out["attn_layer_indices"] = stack.positions(0, "attention")
        a, mlp = stack.kinds.get("attention"), stack.kinds["swiglu"]
        out.update(stack.attention(rotary=True))
        if a is not None:
            if a.qk_norm:
                stack.refuse("Bamba's attention has no query-key norm")
            out.update(
                {
                    "head_dim": a.inner_head_dim,
                    "attention_bias": a.bias,
                    "rope_theta": a.rotary_base,
                    "partial_rotary_factor": a.rotary_fraction,
                }
            )
        out.update(_write_mamba(stack))
        out.update({"intermediate_size": mlp.inner, "mlp_bias": mlp.bias})
        return out

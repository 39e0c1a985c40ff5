"""Jamba (AI21, `model_type: jamba`) config.json <-> madsl spec: attention where
i % attn_layer_period == attn_layer_offset, else Mamba-1; a mixture of experts where
i % expert_layer_period == expert_layer_offset (and num_experts > 1), else a SwiGLU MLP.
Jamba's Mamba layers normalise dt, B and C after x_proj (JambaMambaMixer's dt_layernorm,
b_layernorm, c_layernorm, with rms_norm_eps): madsl's Mamba with `inner_norms`.
"""

from __future__ import annotations

from typing import Any

from madsl.errors import MadslError
from madsl.interop.huggingface.base import Family, Stack, attention, head_dim, ignored, period, spec_data, spelled
from madsl.interop.huggingface.config import Config


class Jamba(Family):
    model_type, title, architecture, tied_by_default = "jamba", "Jamba", "JambaForCausalLM", False
    config_class = "JambaConfig"
    # transformers' JambaConfig defaults (those of Jamba-v0.1), taken where a config leaves a key out
    defaults = {
        "num_key_value_heads": 8,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_dt_rank": "auto",
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "router_aux_loss_coef": 0.001,
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-6,
    }

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers")
        periods = {}
        for kind in ("attn", "expert"):
            every, offset = cfg.count(f"{kind}_layer_period"), cfg.count(f"{kind}_layer_offset", 0)
            if offset >= every:
                raise cfg.error(f"{kind}_layer_offset", f"{offset} is not below {kind}_layer_period={every}")
            periods[kind] = (every, offset)
        experts, active = cfg.count(spelled(cfg, "num_experts", "num_local_experts")), cfg.count("num_experts_per_tok")
        if active > experts:
            raise cfg.error("num_experts_per_tok", f"{active} exceeds num_experts={experts}")
        blocks = []
        for i in range(n):
            mixer = "A" if i % periods["attn"][0] == periods["attn"][1] else "Mb"
            routed = experts > 1 and i % periods["expert"][0] == periods["expert"][1]
            blocks.append(f"{mixer}-{'MoE' if routed else 'Sg'}")
        if "mamba_dt_rank" not in cfg.data:
            cfg.take_default("mamba_dt_rank", "auto")
        dt_rank = (
            -(-dim // 16)
            if cfg.data.get("mamba_dt_rank", "auto") == "auto"  # ceil(hidden_size / 16)
            else cfg.count("mamba_dt_rank", hint='a positive integer, or "auto" (hidden_size / 16)')
        )
        inner = cfg.count("intermediate_size")
        eps = cfg.number(
            "rms_norm_eps", positive=True
        )  # every norm's: the layers', the final one and the Mamba's inner ones
        ignored(cfg, "attention_bias", False, "builds its attention without bias")
        layers = {
            "Mb": {
                "d_state": cfg.count("mamba_d_state"),
                "d_conv": cfg.count("mamba_d_conv"),
                "expand": cfg.count("mamba_expand"),
                "dt_rank": dt_rank,
                "bias": cfg.flag("mamba_proj_bias"),
                "conv_bias": cfg.flag("mamba_conv_bias"),
                "inner_norms": True,  # JambaMambaMixer always builds them
                "inner_norm_eps": eps,
            },
            # Jamba's attention has no position embedding: the Mamba layers carry positions
            "A": attention(cfg, head_dim(cfg, dim), rotary=False, bias_key=None),  # no bias, whatever it says
            "Sg": {"inner": inner},
            "MoE": {
                "experts": experts,
                "expert_width": inner,
                "active": active,
                "aux_loss_weight": cfg.number("router_aux_loss_coef", positive=False),
                "normalize_top": False,  # JambaTopKRouter: the top-k of a softmax over all, not renormalised
            },
        }
        return {**spec_data(cfg, name, self, dim, blocks, layers), "norm_eps": eps}

    def write(self, spec: Any) -> dict[str, Any]:
        stack = Stack(spec, self)
        stack.refuse_kinds(
            {"mamba", "attention", "swiglu", "moe"},
            "Mamba-1 (Mb) or attention, then a SwiGLU (Sg) or a mixture of experts (MoE)",
        )
        if any(channel is None for _, channel in stack.layers):
            raise MadslError(
                f"{spec.name}: every Jamba layer has an MLP or a mixture of experts",
                hint="give every block a channel mixer (Sg or MoE)",
            )
        n = len(stack.layers)
        out = stack.common(self.model_type)
        out.update(stack.attention(rotary=False))
        for kind, role, name in (("attn", 0, "attention"), ("expert", 1, "moe")):
            found = period(stack.positions(role, name), n)
            if found is None:
                raise MadslError(
                    f"{spec.name}: the {name} layers at {stack.positions(role, name)} are not every "
                    f"k-th layer; Jamba places them by {kind}_layer_period and {kind}_layer_offset"
                )
            out[f"{kind}_layer_period"], out[f"{kind}_layer_offset"] = found
        out.update(_channel_fields(stack))
        mamba = stack.kinds.get("mamba")
        if mamba is not None:
            out.update(
                {
                    "mamba_d_state": mamba.d_state,
                    "mamba_d_conv": mamba.d_conv,
                    "mamba_expand": mamba.expand,
                    "mamba_dt_rank": mamba.rank,
                    "mamba_proj_bias": mamba.bias,
                    "mamba_conv_bias": mamba.conv_bias,
                }
            )
            if not mamba.inner_norms or mamba.inner_norm_eps != spec.norm_eps:
                stack.refuse(
                    "Jamba's Mamba layers normalise dt, B and C at the model's rms_norm_eps",
                    hint=f"Mb{{inner_norms=true, inner_norm_eps={spec.norm_eps:g}}}",
                )
        out["rms_norm_eps"] = spec.norm_eps
        a = stack.kinds.get("attention")
        if a is not None and (a.inner_head_dim * a.heads != spec.dim or a.bias or a.qk_norm):
            stack.refuse("Jamba's attention is hidden_size / heads wide per head, without bias or query-key norm")
        return out


def _channel_fields(stack: Stack) -> dict[str, Any]:
    """Jamba's MLP and expert fields: one intermediate_size for both, SwiGLU experts, no shared expert."""
    moe, mlp = stack.kinds.get("moe"), stack.kinds.get("swiglu")
    if moe is not None:
        stack.refuse_moe_options(moe)
    if moe is not None and (moe.shared_width or not moe.gated or moe.activation != "silu"):
        stack.refuse("Jamba's experts are SwiGLUs, with no shared expert")
    if moe is not None and (moe.normalize_top or moe.leaky_routing or moe.router_bias or moe.dense_down):
        stack.refuse(
            "Jamba's router has no bias and weighs the chosen experts by their probabilities of a "
            "softmax over all experts",
            hint="MoE{normalize_top=false}",
        )
    if moe is not None and mlp is not None and moe.expert_width != mlp.inner:
        stack.refuse(
            f"Jamba's experts and MLPs share intermediate_size; MoE.expert_width={moe.expert_width}, "
            f"Sg.inner={mlp.inner}"
        )
    if mlp is not None and mlp.bias:
        stack.refuse("Jamba's MLPs have no bias")
    out = {
        "intermediate_size": mlp.inner if mlp is not None else moe.expert_width,
        "num_experts": moe.experts if moe is not None else 1,
        "num_experts_per_tok": moe.active if moe is not None else 1,
    }
    if moe is not None:
        out["router_aux_loss_coef"] = moe.aux_loss_weight
    return out

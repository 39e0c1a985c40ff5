"""Nemotron-H (NVIDIA, `model_type: nemotron_h`: Nemotron-H, Nemotron-Nano-v2, NVIDIA-Nemotron-3)
config.json <-> madsl spec.

The stack is one entry per Megatron layer, each a pre-norm residual unit, written either way:

    hybrid_override_pattern  a string, one character per layer: M Mamba-2, * attention, - MLP, E MoE
    layers_block_type        a list (transformers 5, Nemotron-3.5): "mamba" (or "linear_attention"),
                             "attention" (or "full_attention"), "mlp", "moe"

A madsl block is a sequence layer and the channel layer after it (madsl.interop.megatron pairs them), so
52 Megatron layers of which 24 are MLPs are 28 blocks. Mamba-2 is mamba_num_heads x mamba_head_dim
wide (Nemotron-Nano-9B-v2: 128 x 80 on a 4480-wide model), whatever `expand` says; the MLPs and
the experts are squared-ReLU MLPs of two matrices (Mlp{activation: relu2}, MoE{gated: false}), the
experts with a shared expert of moe_shared_expert_intermediate_size beside them.
"""

from __future__ import annotations

import json
from typing import Any

from madsl.errors import Location, MadslError
from madsl.interop.huggingface.base import Family, Stack, attention, head_dim, ignored, mamba2, spec_data, spelled
from madsl.interop.huggingface.config import Config
from madsl.interop.megatron import megatron_blocks
from madsl.lang.topology import MAX_BLOCKS

# layers_block_type's words (and their names before transformers 5) -> the pattern's characters
BLOCK_TYPES = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-", "moe": "E"}
NEMOTRON_MAMBA2 = {
    "heads": "mamba_num_heads",
    "head_dim": "mamba_head_dim",
    "state": "ssm_state_size",
    "groups": "n_groups",
    "conv": "conv_kernel",
    "expand": "expand",
    "bias": "use_bias",
    "conv_bias": "use_conv_bias",
}


class NemotronH(Family):
    model_type, title, architecture, tied_by_default = "nemotron_h", "Nemotron-H", "NemotronHForCausalLM", False
    config_class = "NemotronHConfig"
    # transformers' NemotronHConfig defaults, taken where a config leaves a key out
    defaults = {
        "num_key_value_heads": 8,
        "head_dim": 128,
        "mlp_hidden_act": "relu2",
        "mlp_bias": False,
        "ssm_state_size": 128,
        "mamba_num_heads": 128,
        "mamba_head_dim": 64,
        "n_groups": 8,
        "conv_kernel": 4,
        "expand": 2,
        "use_bias": False,
        "use_conv_bias": True,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
    }
    SYMBOLS = {"mamba": "M2", "attention": "A", "mlp": "Mlp", "moe": "MoE"}
    ACTIVATIONS = {"relu2": "relu2", "gelu_pytorch_tanh": "gelu"}

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim = cfg.count("hidden_size")
        pattern, key = layer_pattern(cfg)
        try:
            blocks = megatron_blocks(pattern, self.SYMBOLS)
        except MadslError as err:
            raise _located(cfg, key, pattern, err) from None
        activation = self.ACTIVATIONS[cfg.word("mlp_hidden_act", self.ACTIVATIONS)]
        layers: dict[str, dict[str, Any]] = {}  # the settings of the kinds the stack has (their keys alone)
        if "M" in pattern:
            layers["M2"] = mamba2(cfg, dim, _mamba_keys(cfg), width=None)
        if "*" in pattern:  # NoPE, no bias (whatever attention_bias says): Nemotron-H's attention
            layers["A"] = attention(cfg, _head_dim(cfg, dim), rotary=False, bias_key=None)
            ignored(cfg, "attention_bias", False, "builds its attention without bias")
        if "-" in pattern:
            layers["Mlp"] = {
                "inner": cfg.count("intermediate_size"),
                "bias": cfg.flag("mlp_bias"),
                "activation": activation,
            }
        # transformers' NemotronHForCausalLM never ties its head to the embedding
        ignored(cfg, "tie_word_embeddings", False, "never ties the output head to the embedding")
        if "E" in pattern:
            layers["MoE"] = _experts(cfg, activation)
        return spec_data(cfg, name, self, dim, blocks, layers, tied=False)

    def write(self, spec: Any) -> dict[str, Any]:
        from madsl.interop.megatron import to_megatron_pattern

        stack = Stack(spec, self)
        stack.refuse_kinds(
            {"mamba2", "attention", "mlp", "moe"},
            "Mamba-2 (M2) or attention, then an MLP (Mlp), a mixture of experts (MoE) or none",
        )
        out = stack.common(self.model_type)
        out["hybrid_override_pattern"] = pattern = to_megatron_pattern(spec)
        out["num_hidden_layers"] = len(pattern)  # Megatron layers: a sequence layer and an MLP are two
        out.update(stack.attention(rotary=False))
        a, m, mlp, moe = stack.kinds.get("attention"), stack.mamba2(), stack.kinds.get("mlp"), stack.kinds.get("moe")
        if a is not None:
            if a.qk_norm:
                stack.refuse("Nemotron-H's attention has no query-key norm")
            out.update({"head_dim": a.inner_head_dim, "attention_bias": a.bias})
        if m is not None:
            out.update(
                {
                    "mamba_num_heads": m.n_heads,
                    "mamba_head_dim": m.head_dim,
                    "ssm_state_size": m.d_state,
                    "n_groups": m.groups,
                    "conv_kernel": m.d_conv,
                    "expand": m.expand,
                    "use_bias": m.bias,
                    "use_conv_bias": m.conv_bias,
                }
            )
        names = {v: k for k, v in self.ACTIVATIONS.items()}
        if mlp is not None:
            out.update({"intermediate_size": mlp.width, "mlp_bias": mlp.bias, "mlp_hidden_act": names[mlp.activation]})
        if moe is not None:
            out.update(_write_experts(stack, moe, mlp, names))
        return out


def _mamba_keys(cfg: Config) -> dict[str, str]:
    """Nemotron-H's Mamba-2 keys, with the names NemotronHConfig reads over them (mamba_n_groups, ...)."""
    aliases = {
        "groups": "mamba_n_groups",
        "conv": "mamba_d_conv",
        "expand": "mamba_expand",
        "conv_bias": "mamba_conv_bias",
    }
    return {part: spelled(cfg, key, aliases[part]) if part in aliases else key for part, key in NEMOTRON_MAMBA2.items()}


def _head_dim(cfg: Config, dim: int) -> int:
    """The attention heads' width: head_dim, else NemotronHConfig's 128 (attention_head_dim, the
    earlier configs' name, is not read by transformers' class: said where it differs)."""
    width = head_dim(cfg, dim, "head_dim")
    ignored(cfg, "attention_head_dim", width, f"builds heads of head_dim = {width}")
    return width


def layer_pattern(cfg: Config) -> tuple[str, str]:
    """The stack as a Megatron pattern, from hybrid_override_pattern or layers_block_type (the two
    must agree where both are written), and the key it came from. num_hidden_layers, where written
    (transformers' class counts the stack's entries), must count the same layers."""
    # layer_types: transformers' other name of layers_block_type
    list_key = "layers_block_type" if "layers_block_type" in cfg.data else "layer_types"
    has_pattern, has_list = "hybrid_override_pattern" in cfg.data, list_key in cfg.data
    if not has_pattern and not has_list:
        raise MadslError(
            'no layer stack: a Nemotron-H config.json states "hybrid_override_pattern" (one '
            'character per layer) or "layers_block_type" (a list of layer kinds)',
            Location(cfg.path),
            hint='e.g. "layers_block_type": ["mamba", "moe", "attention", "mlp", ...]',
        )
    # transformers' class counts the layers of the stack itself: num_hidden_layers, where written, must agree
    n = cfg.layers("num_hidden_layers", per_block=2) if "num_hidden_layers" in cfg.data else None
    key = "hybrid_override_pattern" if has_pattern else list_key
    pattern = cfg.pattern(key, "M*-E") if has_pattern else ""
    if has_list:
        from_list = "".join(BLOCK_TYPES[kind] for kind in cfg.words(list_key, BLOCK_TYPES))
        if has_pattern and from_list != pattern:
            raise cfg.error(
                list_key,
                f"says {_short(from_list)} where hybrid_override_pattern says {_short(pattern)}",
                "keep one of the two, or make them agree",
            )
        pattern = from_list
    if n is not None and len(pattern) != n:
        raise cfg.error(key, f"{len(pattern)} layers, but num_hidden_layers is {n}")
    if not 0 < len(pattern) <= 2 * MAX_BLOCKS:  # before any block is built
        raise cfg.error(
            key, f"{len(pattern):,} layers; madsl accounts stacks of 1 to {MAX_BLOCKS:,} blocks (2 layers each)"
        )
    return pattern, key


def _short(pattern: str) -> str:
    return repr(pattern) if len(pattern) <= 60 else f"{pattern[:56]!r}... ({len(pattern)} layers)"


def _located(cfg: Config, key: str, pattern: str, err: MadslError) -> MadslError:
    """A pairing error of the pattern located at its key (and at the character, where the pattern is
    written as it reads)."""
    at = cfg.where(key)
    position = err.location.column
    if key == "hybrid_override_pattern" and at.source_line is not None and position is not None:
        start = at.source_line.find(json.dumps(pattern), at.column)
        if start >= 0:
            at = Location(at.file, at.line, start + 1 + position, at.source_line)
    where = f"{json.dumps(key)}[{position - 1}]" if key != "hybrid_override_pattern" and position else json.dumps(key)
    return MadslError(f"{where}: {err.message}", at, expected=err.expected, hint=err.hint)


def _experts(cfg: Config, activation: str) -> dict[str, Any]:
    """Nemotron-H's mixture of experts: squared-ReLU MLP experts (two matrices) and a shared expert,
    the routed experts through a latent projection where moe_latent_size is set (NVIDIA-Nemotron-3-Super)."""
    experts, active = cfg.count(spelled(cfg, "n_routed_experts", "num_local_experts")), cfg.count("num_experts_per_tok")
    if active > experts:
        raise cfg.error("num_experts_per_tok", f"{active} exceeds n_routed_experts={experts}")
    if cfg.flag("mlp_bias"):  # the shared expert and the latent projections take mlp_bias
        raise cfg.error(
            "mlp_bias",
            "true: Nemotron-H's shared expert (and latent projections) then have biases; madsl's MoE has none",
            "madsl converts Nemotron-H mixtures of experts with mlp_bias: false",
        )
    groups, kept = cfg.count("n_group"), cfg.count("topk_group")
    if kept < groups:  # DeepSeek-V3's group-limited routing: experts only from the best topk_group groups
        raise cfg.error(
            "topk_group",
            f"{kept} of n_group={groups} groups: the experts are picked from the best groups only, "
            "which madsl's router does not do",
            "madsl converts Nemotron-H mixtures of experts whose topk_group equals n_group (1 and 1 by default)",
        )
    params = {
        "experts": experts,
        "expert_width": cfg.count("moe_intermediate_size"),
        "active": active,
        "shared_width": cfg.count("moe_shared_expert_intermediate_size"),
        "gated": False,
        "activation": activation,
        # NemotronHTopkRouter: sigmoid scores, chosen with e_score_correction_bias (a buffer)
        "scores": "sigmoid",
        "selection_bias": True,
        "normalize_top": cfg.flag("norm_topk_prob"),
        "route_scale": cfg.number("routed_scaling_factor", positive=True),
    }
    if cfg.data.get("moe_latent_size") is not None:
        params["latent_width"] = cfg.count("moe_latent_size")
    return params


def _write_experts(stack: Stack, moe: Any, mlp: Any, names: dict[str, str]) -> dict[str, Any]:
    stack.refuse_moe_options(moe, "latent_width")  # moe_latent_size; no gate on the shared expert
    if moe.gated or not moe.shared_width or moe.router_bias or moe.dense_down or moe.leaky_routing:
        stack.refuse(
            "Nemotron-H's experts are MLPs of two matrices (MoE gated: false) with a shared expert "
            "(shared_width > 0) and a router without bias",
            "gated: false, shared_width: N",
        )
    if moe.scores != "sigmoid" or not moe.selection_bias:
        stack.refuse(
            "Nemotron-H's router picks experts by sigmoid scores plus a correction bias",
            "scores: sigmoid, selection_bias: true",
        )
    if mlp is not None and mlp.bias:
        stack.refuse("Nemotron-H's shared expert takes the MLPs' mlp_bias; madsl's MoE has no bias", "Mlp bias: false")
    if moe.activation not in names or mlp is not None and mlp.activation != moe.activation:
        stack.refuse("Nemotron-H's MLPs and experts share one activation, relu2 or gelu (mlp_hidden_act)")
    return {
        "n_routed_experts": moe.experts,
        "moe_intermediate_size": moe.expert_width,
        "num_experts_per_tok": moe.active,
        "moe_shared_expert_intermediate_size": moe.shared_width,
        "moe_latent_size": moe.latent_width or None,
        "mlp_bias": False,  # the shared expert's and the latent projections'
        "mlp_hidden_act": names[moe.activation],
        "norm_topk_prob": moe.normalize_top,
        "routed_scaling_factor": moe.route_scale,
        "n_group": 1,  # no group-limited routing
        "topk_group": 1,
    }

"""Qwen3-Next (Qwen, `model_type: qwen3_next`) config.json <-> madsl spec.

`layer_types` names each layer "linear_attention" (a Gated DeltaNet, madsl's `GDN`) or
"full_attention" (gated attention, `A`); without it every full_attention_interval-th layer is
attention (Qwen3NextConfig's default 4). The Gated DeltaNet has linear_num_key_heads key heads of
linear_key_head_dim and linear_num_value_heads (a multiple of them) value heads of
linear_value_head_dim, a short convolution of linear_conv_kernel_dim taps, the decay gate and the
output gate: `GDN{heads, head_dim, value_heads, expand_v, gated, output_gate}`, its q and k L2-normalised as
transformers' l2norm does (`l2norm_eps: 1e-6`). The attention has
an RMSNorm on each head's queries and keys and an output gate from a doubled query projection
(`A{qk_norm, output_gate}`), rotary on partial_rotary_factor of each head (0.25 by default).

Layer i is followed by a mixture of num_experts SwiGLU experts of moe_intermediate_size, top
num_experts_per_tok, beside a shared SwiGLU expert of shared_expert_intermediate_size whose output
a sigmoid gate scales (`MoE{shared_width, shared_gate}`), where num_experts > 0, i is not in
mlp_only_layers and (i + 1) % decoder_sparse_step == 0; else by a SwiGLU of intermediate_size. The
router's softmax over all experts, its top num_experts_per_tok renormalised where norm_topk_prob
(`MoE{normalize_top}`; Qwen3.5 MoE's always are).

Every norm is at rms_norm_eps (the spec's `norm_eps`; the attention's q and k norms'
`qk_norm_eps`, the Gated DeltaNet's output norm's `norm_eps`).
"""

from __future__ import annotations

from typing import Any

from madsl.interop.huggingface.base import Family, Stack, attention, head_dim, rope, spec_data
from madsl.interop.huggingface.config import Config

KINDS = {"linear_attention": "GDN", "full_attention": "A"}
L2_EPS = 1e-6  # transformers' l2norm of the Gated DeltaNet's q and k (and fla's): x / sqrt(||x||^2 + 1e-6)
NAMES = {"delta_net": "linear_attention", "attention": "full_attention"}


class Qwen3Next(Family):
    model_type, title, architecture, tied_by_default = "qwen3_next", "Qwen3-Next", "Qwen3NextForCausalLM", False
    config_class = "Qwen3NextConfig"
    # transformers' Qwen3NextConfig defaults, taken where a config leaves a key out
    defaults = {
        "num_key_value_heads": 2,
        "head_dim": 256,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "decoder_sparse_step": 1,
        "full_attention_interval": 4,
        "router_aux_loss_coef": 0.001,
        "rms_norm_eps": 1e-6,
        "norm_topk_prob": True,
    }

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers")
        cfg.word("hidden_act", ("silu",))  # the MLPs' and the experts' SwiGLU, the conv's SiLU
        kinds = _layer_kinds(cfg, n)
        routed = self.routed_layers(cfg, n)
        blocks = [f"{KINDS[kind]}-{'MoE' if i in routed else 'Sg'}" for i, kind in enumerate(kinds)]
        theta, fraction = rope(cfg, 10000.0, _rotary_fraction(cfg))
        gated_attention = attention(
            cfg, head_dim(cfg, dim, "head_dim"), rotary=True, rotary_base=theta, rotary_fraction=fraction, qk_norm=True
        )
        eps = cfg.number("rms_norm_eps", positive=True)  # every norm's: blocks, final, q and k, the GDN's output
        layers: dict[str, dict[str, Any]] = {
            "GDN": {**delta_net(cfg), "norm_eps": eps, "l2norm_eps": L2_EPS},
            "A": {**gated_attention, "output_gate": True, "qk_norm_eps": eps},
        }
        if len(routed) < n:
            layers["Sg"] = {"inner": cfg.count("intermediate_size")}
        if routed:
            layers["MoE"] = {**_experts(cfg), **self.routing(cfg)}
        return {**spec_data(cfg, name, self, dim, blocks, layers), "norm_eps": eps}

    def routing(self, cfg: Config) -> dict[str, Any]:
        """The router's renormalisation of the top experts (norm_topk_prob), where it is not madsl's default."""
        return {} if cfg.flag("norm_topk_prob") else {"normalize_top": False}

    def write(self, spec: Any) -> dict[str, Any]:
        stack = Stack(spec, self)
        stack.refuse_kinds(
            {"delta_net", "attention", "swiglu", "moe"},
            "a Gated DeltaNet (GDN) or gated attention, then a SwiGLU (Sg) or a mixture of experts (MoE)",
        )
        if any(channel is None for _, channel in stack.layers):
            stack.refuse("every Qwen3-Next layer is followed by a SwiGLU or a mixture of experts")
        out = stack.common(self.model_type)
        out["layer_types"] = [NAMES[m.name] for m, _ in stack.layers]
        out["hidden_act"] = "silu"
        out.update(stack.attention(rotary=True))
        a = stack.kinds.get("attention")
        if a is not None:
            if not (a.qk_norm and a.output_gate):
                stack.refuse(
                    "Qwen3-Next's attention normalises queries and keys and gates its output",
                    "qk_norm: true, output_gate: true",
                )
            out.update(
                {
                    "head_dim": a.inner_head_dim,
                    "attention_bias": a.bias,
                    "rope_theta": a.rotary_base,
                    "partial_rotary_factor": a.rotary_fraction,
                }
            )
        out.update(write_delta_net(stack))
        out.update(self.write_channels(stack))
        out["rms_norm_eps"] = write_eps(stack)
        return out

    def routed_layers(self, cfg: Config, n: int) -> set[int]:
        """The layers with a mixture of experts, as Qwen3NextDecoderLayer places them."""
        if cfg.count("num_experts", 0) == 0:
            return set()
        every = cfg.count("decoder_sparse_step")
        if "mlp_only_layers" not in cfg.data:
            cfg.take_default("mlp_only_layers", [])
        dense = set(cfg.integers("mlp_only_layers", n)) if cfg.data.get("mlp_only_layers") is not None else set()
        return {i for i in range(n) if i not in dense and (i + 1) % every == 0}

    def write_channels(self, stack: Stack) -> dict[str, Any]:
        """num_experts and its keys, mlp_only_layers (the SwiGLU layers among experts), intermediate_size."""
        out: dict[str, Any] = {"num_experts": 0, "mlp_only_layers": [], "decoder_sparse_step": 1}
        out.update(_write_channels(stack))
        if "moe" in stack.kinds:
            out["mlp_only_layers"] = stack.positions(1, "swiglu")
            out["norm_topk_prob"] = stack.kinds["moe"].normalize_top
        return out


# the keys Qwen3.5's text configs default alike (transformers' Qwen3_5TextConfig, Qwen3_5MoeTextConfig)
QWEN3_5_DEFAULTS = {
    key: value
    for key, value in Qwen3Next.defaults.items()
    if key not in ("decoder_sparse_step", "router_aux_loss_coef", "num_key_value_heads", "norm_topk_prob")
}


class Qwen3_5Text(Qwen3Next):
    """Qwen3.5's language model (`qwen3_5_text`): Qwen3-Next's layers, each followed by a SwiGLU."""

    model_type, title, architecture = "qwen3_5_text", "Qwen3.5", "Qwen3_5ForCausalLM"
    config_class = "Qwen3_5TextConfig"
    defaults = {**QWEN3_5_DEFAULTS, "num_key_value_heads": 4}

    def routed_layers(self, cfg: Config, n: int) -> set[int]:
        return set()

    def write_channels(self, stack: Stack) -> dict[str, Any]:
        if "moe" in stack.kinds:
            stack.refuse("every Qwen3.5 layer is followed by a SwiGLU (Qwen3.5 MoE: qwen3_5_moe_text)")
        return _write_channels(stack)


class Qwen3_5MoeText(Qwen3Next):
    """Qwen3.5 MoE's language model (`qwen3_5_moe_text`): Qwen3-Next's layers, each followed by its
    mixture of experts (no dense layers: mlp_only_layers and decoder_sparse_step are not read)."""

    model_type, title, architecture = "qwen3_5_moe_text", "Qwen3.5 MoE", "Qwen3_5MoeForCausalLM"
    config_class = "Qwen3_5MoeTextConfig"
    defaults = {**QWEN3_5_DEFAULTS, "num_key_value_heads": 2, "router_aux_loss_coef": 0.001}

    def routed_layers(self, cfg: Config, n: int) -> set[int]:
        for key in ("mlp_only_layers", "decoder_sparse_step"):
            if cfg.data.get(key) not in (None, [], 1):
                cfg.notes.append(f"{key} is not read: transformers' {cfg.config_class} puts experts in every layer")
        return set(range(n))

    def routing(self, cfg: Config) -> dict[str, Any]:
        return {}  # Qwen3_5MoeTopKRouter always renormalises the top experts' probabilities

    def write_channels(self, stack: Stack) -> dict[str, Any]:
        if "swiglu" in stack.kinds:
            stack.refuse("every Qwen3.5 MoE layer is followed by a mixture of experts (Qwen3.5: qwen3_5_text)")
        moe = stack.kinds.get("moe")
        if moe is not None and not moe.normalize_top:
            stack.refuse("Qwen3.5 MoE's router renormalises its top experts' probabilities", "normalize_top: true")
        return _write_channels(stack)


def _layer_kinds(cfg: Config, n: int) -> list[str]:
    """layer_types, else attention every full_attention_interval-th layer (as Qwen3NextConfig builds it)."""
    if cfg.data.get("layer_types") is None:
        every = cfg.count("full_attention_interval")
        return ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    kinds = cfg.words("layer_types", KINDS)
    if len(kinds) != n:
        raise cfg.error("layer_types", f"{len(kinds)} layers, but num_hidden_layers is {n}")
    return kinds


def _rotary_fraction(cfg: Config) -> float:
    """partial_rotary_factor where the config states it (in rope_parameters, which rope() reads, or
    at the top level), else the config class's 0.25, listed."""
    section = cfg.section("rope_parameters")
    if section is not None and "partial_rotary_factor" in section.data:
        return 1.0  # rope() reads it from rope_parameters
    if "partial_rotary_factor" in cfg.data:
        return cfg.number("partial_rotary_factor", positive=True)
    return cfg.take_default("partial_rotary_factor", 0.25)


def delta_net(cfg: Config) -> dict[str, Any]:
    """The Gated DeltaNet's settings (Qwen3-Next's and Qwen3.5's linear_* keys)."""
    heads, value_heads = cfg.count("linear_num_key_heads"), cfg.count("linear_num_value_heads")
    if value_heads % heads:
        raise cfg.error(
            "linear_num_value_heads",
            f"{value_heads} is not a multiple of linear_num_key_heads={heads}",
            "each key head serves linear_num_value_heads / linear_num_key_heads value heads",
        )
    key_width, value_width = cfg.count("linear_key_head_dim"), cfg.count("linear_value_head_dim")
    if value_width % key_width:
        raise cfg.error(
            "linear_value_head_dim",
            f"{value_width} is not a multiple of linear_key_head_dim={key_width}: madsl's DeltaNet has "
            "values expand_v x the key width",
            "madsl converts value heads as wide as the key heads, or a whole multiple of them",
        )
    params: dict[str, Any] = {
        "heads": heads,
        "head_dim": key_width,
        "expand_v": value_width // key_width,
        "d_conv": cfg.count("linear_conv_kernel_dim"),
        "gated": True,
        "output_gate": True,
    }
    if value_heads != heads:
        params["value_heads"] = value_heads
    return params


def write_delta_net(stack: Stack) -> dict[str, Any]:
    """The linear_* keys of the spec's Gated DeltaNet (none without one)."""
    g = stack.kinds.get("delta_net")
    if g is None:
        return {}
    if not (g.gated and g.output_gate and g.d_conv):
        stack.refuse(
            f"{stack.family.title}'s Gated DeltaNet has the decay gate, the output gate and a short convolution",
            "gated: true, output_gate: true, d_conv: 4",
        )
    return {
        "linear_num_key_heads": g.heads,
        "linear_num_value_heads": g.v_heads,
        "linear_key_head_dim": g.key_dim,
        "linear_value_head_dim": g.value_dim,
        "linear_conv_kernel_dim": g.d_conv,
    }


def write_eps(stack: Stack) -> float:
    """rms_norm_eps: the spec's norm_eps, which the attention's q and k norms and the Gated DeltaNet's
    output norm share in Qwen3-Next and Qwen3.5 (checked last, with the L2 norms' fixed epsilon, so
    that a layer the family lacks is named first)."""
    eps = stack.spec.norm_eps
    a, g = stack.kinds.get("attention"), stack.kinds.get("delta_net")
    if g is not None and g.l2norm_eps != L2_EPS:
        stack.refuse(
            f"{stack.family.title}'s Gated DeltaNet divides q and k by sqrt(||x||^2 + {L2_EPS:g})",
            f"l2norm_eps: {L2_EPS:g}",
        )
    for layer, key in ((a, "qk_norm_eps"), (g, "norm_eps")):
        if layer is not None and getattr(layer, key) != eps:
            stack.refuse(
                f"{stack.family.title}'s norms share one rms_norm_eps (the spec's norm_eps {eps:g})",
                f"{key}: {eps:g}",
            )
    return eps


def _experts(cfg: Config) -> dict[str, Any]:
    """SwiGLU experts, a router without bias, and the shared SwiGLU expert with its sigmoid gate."""
    experts, active = cfg.count("num_experts"), cfg.count("num_experts_per_tok")
    if active > experts:
        raise cfg.error("num_experts_per_tok", f"{active} exceeds num_experts={experts}")
    return {
        "experts": experts,
        "expert_width": cfg.count("moe_intermediate_size"),
        "active": active,
        "shared_width": cfg.count("shared_expert_intermediate_size"),
        "shared_gate": True,
        "aux_loss_weight": cfg.number("router_aux_loss_coef", positive=False),
    }


def _write_channels(stack: Stack) -> dict[str, Any]:
    """intermediate_size, and num_experts and its keys."""
    moe, mlp = stack.kinds.get("moe"), stack.kinds.get("swiglu")
    out: dict[str, Any] = {}
    if mlp is not None:
        if mlp.bias:
            stack.refuse(f"{stack.family.title}'s MLPs have no bias")
        out["intermediate_size"] = mlp.inner
    if moe is not None:
        stack.refuse_moe_options(moe, "shared_gate")
        if not (moe.shared_width and moe.shared_gate) or not moe.gated or moe.activation != "silu":
            stack.refuse(
                f"{stack.family.title}'s experts are SwiGLUs beside a shared SwiGLU expert with its gate",
                "shared_width: N, shared_gate: true",
            )
        if moe.router_bias or moe.dense_down or moe.leaky_routing or moe.scores != "softmax" or moe.route_scale != 1:
            stack.refuse(f"{stack.family.title}'s router has no bias and routes each token to its top-k experts")
        out.update(
            {
                "num_experts": moe.experts,
                "num_experts_per_tok": moe.active,
                "moe_intermediate_size": moe.expert_width,
                "shared_expert_intermediate_size": moe.shared_width,
                "router_aux_loss_coef": moe.aux_loss_weight,
            }
        )
    return out

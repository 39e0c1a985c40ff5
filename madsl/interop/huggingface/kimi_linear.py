"""Kimi Linear (Moonshot AI, `model_type: kimi_linear`) config.json <-> madsl spec.

Each layer is Kimi Delta Attention ("linear_attention", madsl's `KDA`) or multi-head latent
attention ("full_attention", `MLA`), named by `layer_types`, else by linear_attn_config's 1-indexed
full_attn_layers and kda_layers (both written: Moonshot's checkpoints), else every fourth layer
from the fifth (KimiLinearConfig's default). KDA has linear_num_heads heads of linear_head_dim
(linear_attn_config's num_heads and head_dim over the top-level keys), values as wide as keys and
a short convolution of linear_conv_kernel_dim taps (short_conv_kernel_size), its gated output
norm at rms_norm_eps and q and k L2-normalised as transformers' l2norm: `KDA{heads, head_dim,
expand_v: 1, d_conv, norm_eps, l2norm_eps: 1e-6}`. MLA is transformers' KimiLinearAttention,
without rotary (NoPE, whatever mla_use_nope says): `MLA{heads, q_lora_rank, kv_lora_rank,
qk_nope_head_dim, qk_rope_head_dim, v_head_dim, rotary: false, bias}`.

Each layer is followed by a SwiGLU of intermediate_size ("dense") or by num_experts SwiGLU
experts of moe_intermediate_size, top num_experts_per_token, beside a shared SwiGLU of
num_shared_experts x moe_intermediate_size ("sparse", `MoE{shared_width}`), named by
`mlp_layer_types`, else dense for the first first_k_dense_replace layers (1). The experts are routed
as KimiLinearTopkRouter routes them: sigmoid scores, chosen with the e_score_correction_bias buffer,
weighted by their scores (renormalised where moe_renormalize), times routed_scaling_factor
(`MoE{scores: sigmoid, selection_bias: true, normalize_top, route_scale}`); group-limited routing
(topk_group below num_expert_group) and a moe_router_activation_func other than sigmoid (which
transformers' class ignores and Moonshot's own code reads) are refused by key. Every norm around the
layers (the blocks', the final one) is at rms_norm_eps (the spec's norm_eps). transformers reads
the checkpoint's num_experts, num_experts_per_token and num_shared_experts over its own
num_local_experts, num_experts_per_tok and n_shared_experts; both are read. The output head is
never tied to the embedding (KimiLinearForCausalLM ignores tie_word_embeddings, said where true).
"""

from __future__ import annotations

import json
from typing import Any

from madsl.interop.huggingface.base import Family, Stack, ignored, spec_data, spelled
from madsl.interop.huggingface.config import Config
from madsl.interop.huggingface.shown import kind

KINDS = {"linear_attention": "KDA", "full_attention": "MLA"}
NAMES = {"kda": "linear_attention", "mla": "full_attention"}
MLP_KINDS = {"dense": "Sg", "sparse": "MoE"}
# the checkpoint's key and transformers' own, which it reads under the first where both are written
EXPERTS = ("num_experts", "num_local_experts")
RENORMALIZE = ("moe_renormalize", "norm_topk_prob")
GROUPS = ("num_expert_group", "n_group")
ACTIVE = ("num_experts_per_token", "num_experts_per_tok")
SHARED = ("num_shared_experts", "n_shared_experts")
# linear_attn_config's keys and the top-level keys they take the place of
LINEAR = {
    "num_heads": "linear_num_heads",
    "head_dim": "linear_head_dim",
    "short_conv_kernel_size": "linear_conv_kernel_dim",
}
L2NORM_EPS = 1e-6  # transformers' and fla's l2norm of KDA's q and k, fixed
PAD_TOKEN = 163839  # KimiLinearConfig's pad_token_id, an embedding row where the vocabulary is larger


class KimiLinear(Family):
    model_type, title, architecture, tied_by_default = "kimi_linear", "Kimi Linear", "KimiLinearForCausalLM", False
    config_class = "KimiLinearConfig"
    # transformers' KimiLinearConfig defaults, taken where a config leaves a key out
    defaults = {
        "hidden_act": "silu",
        "attention_bias": False,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "num_shared_experts": 1,
        "linear_num_heads": 32,
        "linear_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "first_k_dense_replace": 1,
        "rms_norm_eps": 1e-5,
        "moe_renormalize": True,
        "routed_scaling_factor": 2.446,
        "num_expert_group": 1,
        "topk_group": 1,
    }

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers")
        cfg.word("hidden_act", ("silu",))  # the MLPs' and the experts' SwiGLU, the convs' SiLU
        kinds, channels = _layer_kinds(cfg, n), _mlp_kinds(cfg, n)
        blocks = [f"{KINDS[kind]}-{MLP_KINDS[mlp]}" for kind, mlp in zip(kinds, channels)]
        layers: dict[str, dict[str, Any]] = {}
        eps = cfg.number("rms_norm_eps", positive=True)  # the blocks' and final norms', KDA's gated one
        if "linear_attention" in kinds:
            # q and k L2-normalised as transformers' l2norm (fla's use_qk_l2norm_in_kernel): x / sqrt(|x|^2 + 1e-6)
            layers["KDA"] = {**_delta_attention(cfg), "norm_eps": eps, "l2norm_eps": L2NORM_EPS}
        if "full_attention" in kinds:
            layers["MLA"] = _latent_attention(cfg)
        if "dense" in channels:
            layers["Sg"] = {"inner": cfg.count("intermediate_size")}
        if "sparse" in channels:
            layers["MoE"] = _experts(cfg)
        ignored(cfg, "moe_layer_freq", 1, "places experts by mlp_layer_types or first_k_dense_replace alone")
        # transformers' KimiLinearForCausalLM never ties its head to the embedding
        ignored(cfg, "tie_word_embeddings", False, "never ties the output head to the embedding")
        return {**spec_data(cfg, name, self, dim, blocks, layers, tied=False), "norm_eps": eps}

    def write(self, spec: Any) -> dict[str, Any]:
        stack = Stack(spec, self)
        stack.refuse_kinds(
            {"kda", "mla", "swiglu", "moe"},
            "Kimi Delta Attention (KDA) or multi-head latent attention (MLA), then a SwiGLU (Sg) or experts (MoE)",
        )
        if any(channel is None for _, channel in stack.layers):
            stack.refuse("every Kimi Linear layer is followed by a SwiGLU or a mixture of experts")
        if spec.tie_embeddings:
            stack.refuse(
                "transformers' KimiLinearForCausalLM never ties its output head to the embedding",
                "tie_embeddings: false",
            )
        out = stack.common(self.model_type)
        out["layer_types"] = [NAMES[m.name] for m, _ in stack.layers]
        out["mlp_layer_types"] = ["sparse" if c.name == "moe" else "dense" for _, c in stack.layers]
        out["hidden_act"] = "silu"
        out["rms_norm_eps"] = spec.norm_eps
        if spec.vocab <= PAD_TOKEN:  # KimiLinearConfig's pad_token_id must be a row of the embedding
            out["pad_token_id"] = None
        out.update(_write_delta_attention(stack))
        out.update(_write_latent_attention(stack))
        out.update(_write_channels(stack))
        return out


def _layer_kinds(cfg: Config, n: int) -> list[str]:
    """layer_types, else linear_attn_config's full_attn_layers and kda_layers, else KimiLinearConfig's
    default (attention at the 0-based layers 4, 8, ...), as KimiLinearConfig builds them."""
    if cfg.data.get("layer_types") is not None:
        kinds = cfg.words("layer_types", KINDS)
        if len(kinds) != n:
            raise cfg.error("layer_types", f"{len(kinds)} layers, but num_hidden_layers is {n}")
        return kinds
    section = cfg.section("linear_attn_config")
    lists = ("full_attn_layers", "kda_layers")
    if section is not None and all(key in section.data for key in lists):
        kinds: list[str | None] = [None] * n
        for key, named in zip(lists, ("full_attention", "linear_attention")):
            for number in _layer_numbers(section, key, n):
                if kinds[number - 1] is not None:
                    raise section.error(key, f"layer {number} is in both full_attn_layers and kda_layers")
                kinds[number - 1] = named
        missing = next((i for i, named in enumerate(kinds) if named is None), None)
        if missing is not None:
            raise section.error("kda_layers", f"layer {missing + 1} is in neither full_attn_layers nor kda_layers")
        return [named for named in kinds if named is not None]
    if section is not None and any(key in section.data for key in lists):
        cfg.notes.append(
            f"linear_attn_config's {' and '.join(k for k in lists if k in section.data)} is not read: transformers' "
            "KimiLinearConfig reads full_attn_layers and kda_layers together"
        )
    kinds = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n)]
    return cfg.take_default("layer_types", kinds, "KimiLinearConfig's: attention at every fourth layer from the fifth")


def _layer_numbers(section: Config, key: str, n: int) -> list[int]:
    """A list of 1-indexed layer numbers (Moonshot's checkpoints count layers from 1)."""
    value = section.data[key]
    if type(value) is not list:
        raise section.error(key, f"expected a list of layer numbers, got {kind(value)}", "e.g. [4, 8, 12]")
    for i, item in enumerate(value):
        if type(item) is not int or not 1 <= item <= n:
            raise section.error(
                key, f"entry {i + 1} is not a layer number from 1 to {n}", "layers are counted from 1 here", index=i
            )
    return value


def _mlp_kinds(cfg: Config, n: int) -> list[str]:
    """mlp_layer_types, else dense for the first first_k_dense_replace layers and experts after."""
    if cfg.data.get("mlp_layer_types") is not None:
        kinds = cfg.words("mlp_layer_types", MLP_KINDS)
        if len(kinds) != n:
            raise cfg.error("mlp_layer_types", f"{len(kinds)} layers, but num_hidden_layers is {n}")
        return kinds
    dense = cfg.count("first_k_dense_replace", minimum=0)
    return ["dense" if i < dense else "sparse" for i in range(n)]


def _delta_attention(cfg: Config) -> dict[str, Any]:
    """KDA's settings: linear_attn_config's keys where written, else the top-level linear_* keys."""
    section = cfg.section("linear_attn_config")
    sizes = {}
    for key, top in LINEAR.items():
        source = section if section is not None and key in section.data else cfg
        sizes[key] = source.count(key if source is section else top)
    return {
        "heads": sizes["num_heads"],
        "head_dim": sizes["head_dim"],
        "expand_v": 1,
        "d_conv": sizes["short_conv_kernel_size"],
    }


def _latent_attention(cfg: Config) -> dict[str, Any]:
    """KimiLinearAttention's settings: MLA without rotary (transformers' class applies none)."""
    ignored(cfg, "mla_use_nope", True, "builds its MLA without rotary (NoPE) whatever mla_use_nope says")
    if cfg.data.get("q_lora_rank") is None:
        rank = None if "q_lora_rank" in cfg.data else cfg.take_default("q_lora_rank", None)
    else:
        rank = cfg.count("q_lora_rank")
    rope = cfg.count("qk_rope_head_dim")
    ignored(cfg, "head_dim", rope, f"sets head_dim to qk_rope_head_dim ({rope}); MLA's widths are its own keys")
    return {
        "heads": cfg.count("num_attention_heads"),
        "q_lora_rank": rank,
        "kv_lora_rank": cfg.count("kv_lora_rank"),
        "qk_nope_head_dim": cfg.count("qk_nope_head_dim"),
        "qk_rope_head_dim": rope,
        "v_head_dim": cfg.count("v_head_dim"),
        "rotary": False,
        "bias": cfg.flag("attention_bias"),
    }


def _experts(cfg: Config) -> dict[str, Any]:
    """SwiGLU experts, a router without bias, and the shared SwiGLU of num_shared_experts experts' width."""
    experts = cfg.count(_spelled(cfg, *EXPERTS))
    active_key = _spelled(cfg, *ACTIVE)
    active = cfg.count(active_key)
    if active > experts:
        raise cfg.error(active_key, f"{active} exceeds the {experts} experts")
    width = cfg.count("moe_intermediate_size")
    shared = cfg.count(_spelled(cfg, *SHARED), minimum=0)
    _refuse_other_routing(cfg)
    return {
        "experts": experts,
        "expert_width": width,
        "active": active,
        "shared_width": shared * width,
        # KimiLinearTopkRouter: sigmoid scores, chosen with e_score_correction_bias (a buffer)
        "scores": "sigmoid",
        "selection_bias": True,
        "normalize_top": cfg.flag(_spelled(cfg, *RENORMALIZE)),
        "route_scale": cfg.number("routed_scaling_factor", positive=True),
    }


def _refuse_other_routing(cfg: Config) -> None:
    """Moonshot's softmax router (transformers' class ignores the key) and group-limited routing."""
    if "moe_router_activation_func" in cfg.data and cfg.word("moe_router_activation_func") != "sigmoid":
        raise cfg.error(
            "moe_router_activation_func",
            f"{json.dumps(cfg.data['moe_router_activation_func'])}: Moonshot's code then scores experts by a softmax, "
            "transformers' KimiLinearTopkRouter by a sigmoid whatever this says; madsl imports neither reading",
            "madsl converts Kimi Linear routers with moe_router_activation_func: sigmoid (Moonshot's checkpoints)",
        )
    groups_key = _spelled(cfg, *GROUPS)
    groups, kept = cfg.count(groups_key), cfg.count("topk_group")
    if kept < groups:  # DeepSeek-V3's group-limited routing: experts only from the best topk_group groups
        raise cfg.error(
            "topk_group",
            f"{kept} of {groups_key}={groups} groups: the experts are picked from the best groups only, "
            "which madsl's router does not do",
            "madsl converts Kimi Linear mixtures of experts whose topk_group equals num_expert_group (1 and 1)",
        )


def _spelled(cfg: Config, checkpoint: str, own: str) -> str:
    """The checkpoint's key, which transformers reads over its own (`own`) where both are written
    (said where they differ); `own` where only it is written; else the checkpoint's (its default)."""
    if checkpoint in cfg.data:
        return spelled(cfg, own, checkpoint)
    return own if own in cfg.data else checkpoint


def _write_delta_attention(stack: Stack) -> dict[str, Any]:
    k = stack.kinds.get("kda")
    if k is None:
        return {}
    if k.expand_v != 1 or k.v_heads != k.heads or k.gate_bias or not k.d_conv:
        stack.refuse(
            "Kimi Linear's KDA has values as wide as its keys, one value head per key head, a short "
            "convolution and no output-gate bias",
            "expand_v: 1, value_heads: null, d_conv: 4, gate_bias: false",
        )
    if k.l2norm_eps != L2NORM_EPS:
        stack.refuse(
            f"Kimi Linear's KDA L2-normalises q and k as x / sqrt(|x|^2 + {L2NORM_EPS:g}) (transformers' l2norm)",
            f"KDA{{l2norm_eps={L2NORM_EPS:g}}}",
        )
    if k.norm_eps != stack.spec.norm_eps:
        stack.refuse(
            "Kimi Linear's KDA output norm has the model's rms_norm_eps", f"KDA{{norm_eps={stack.spec.norm_eps:g}}}"
        )
    return {"linear_num_heads": k.heads, "linear_head_dim": k.key_dim, "linear_conv_kernel_dim": k.d_conv}


def _write_latent_attention(stack: Stack) -> dict[str, Any]:
    a = stack.kinds.get("mla")
    if a is None:
        return {}
    if a.rotary:
        stack.refuse("Kimi Linear's MLA has no rotary embeddings (NoPE)", "rotary: false on the MLA layers")
    return {
        "num_attention_heads": a.heads,
        "q_lora_rank": a.q_lora_rank,
        "kv_lora_rank": a.kv_lora_rank,
        "qk_nope_head_dim": a.qk_nope_head_dim,
        "qk_rope_head_dim": a.qk_rope_head_dim,
        "v_head_dim": a.v_head_dim,
        "attention_bias": a.bias,
        "mla_use_nope": True,
    }


def _write_channels(stack: Stack) -> dict[str, Any]:
    moe, mlp = stack.kinds.get("moe"), stack.kinds.get("swiglu")
    out: dict[str, Any] = {}
    if mlp is not None:
        if mlp.bias:
            stack.refuse("Kimi Linear's MLPs have no bias", "bias: false")
        out["intermediate_size"] = mlp.width
    if moe is None:
        return out
    stack.refuse_moe_options(moe)
    if not moe.gated or moe.activation != "silu" or moe.router_bias or moe.dense_down or moe.leaky_routing:
        stack.refuse(
            "Kimi Linear's experts are SwiGLUs, routed without a router bias to each token's top-k",
            "gated: true, activation: silu",
        )
    if moe.shared_width % moe.expert_width:
        stack.refuse(
            f"Kimi Linear's shared expert is num_shared_experts x moe_intermediate_size wide; {moe.shared_width} "
            f"is not a multiple of expert_width {moe.expert_width}",
            f"shared_width: a multiple of {moe.expert_width}",
        )
    if moe.scores != "sigmoid" or not moe.selection_bias:
        stack.refuse(
            "Kimi Linear's router picks experts by sigmoid scores plus a correction bias",
            "scores: sigmoid, selection_bias: true",
        )
    out.update(
        {
            "num_experts": moe.experts,
            "num_experts_per_token": moe.active,
            "num_shared_experts": moe.shared_width // moe.expert_width,
            "moe_intermediate_size": moe.expert_width,
            "moe_renormalize": moe.normalize_top,
            "routed_scaling_factor": moe.route_scale,
            "num_expert_group": 1,  # no group-limited routing
            "topk_group": 1,
        }
    )
    return out

"""MiniMax-Text-01 and MiniMax-M1 (MiniMax, `model_type: minimax`, `minimax_m1`) config.json <-> madsl spec.

Each layer is MiniMax's lightning attention ("linear_attention", madsl's `Lt`) or softmax attention
("full_attention", `A`), named by `layer_types` (minimax; without it every other layer from the
first is attention, MiniMaxConfig's default) or by `attn_type_list` (minimax_m1: 1 softmax, 0
lightning). Both kinds have num_attention_heads heads of head_dim (null: hidden_size / heads);
lightning layer l of N scales its decay slopes by 1 - l / (N - 1 + 1e-5) + 1e-5, as transformers'
MiniMaxLightningAttention does (`Lt{decay_scale}`, each layer its own). The attention has
num_key_value_heads key/value heads, no bias and rotary embeddings (the whole head in transformers'
MiniMaxForCausalLM; rotary_dim of each head in MiniMax-M1's own code), over sliding_window tokens
where it is set (`A{window}`). Every layer is followed by a mixture of num_local_experts
(`num_experts`, its alias, read over it) SwiGLU experts of intermediate_size, top
num_experts_per_tok, with a router without bias.

MiniMax-M1's configs name their own code (MiniMaxM1ForCausalLM, `model_type: minimax_m1`), which
transformers does not ship; its layers are MiniMax-Text-01's, which transformers ships as
MiniMaxForCausalLM: madsl reads both as that class builds them, and says so in the spec's
description. Both add each sublayer's residual after its norm (the normed input, scaled by the
*_alpha_factor keys: MiniMax-M1's postnorm), where madsl's blocks add it before: the same
parameters, state and FLOPs, said in the description too.
"""

from __future__ import annotations

import math
from typing import Any

from madsl.errors import Location, MadslError
from madsl.interop.huggingface.base import Family, Stack, attention, head_dim, ignored, rope, spec_data, spelled
from madsl.interop.huggingface.config import Config

NAMES = {"lightning": "linear_attention", "attention": "full_attention"}
# a spec's decay scale is written where it is within this of the class's: the 1e-5 terms of the schedule
# (1.0 for the first layer, 1 - l / (N - 1) + 1e-5 without the denominator's) land on the same layer
DECAY_TOLERANCE = 1.5e-5
RESIDUAL_NOTE = (
    "; its layers add the residual after each norm (the normed input, scaled by the alpha factors), "
    "madsl's blocks before it: the same parameters, state and FLOPs"
)


def decay_scale(layer: int, layers: int) -> float:
    """MiniMaxLightningAttention's factor on layer `layer`'s slopes, to 12 significant digits."""
    return float(f"{1 - layer / (layers - 1 + 1e-5) + 1e-5:.12g}")


class MiniMax(Family):
    model_type, title, architecture, tied_by_default = "minimax", "MiniMax", "MiniMaxForCausalLM", False
    config_class = "MiniMaxConfig"
    # transformers' MiniMaxConfig defaults, taken where a config leaves a key out
    defaults = {
        "num_key_value_heads": 8,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "router_aux_loss_coef": 0.001,
    }

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers")
        cfg.word("hidden_act", ("silu",))  # the experts' SwiGLU, lightning attention's SiLU
        kinds = self.layer_kinds(cfg, n)
        width = head_dim(cfg, dim, "head_dim")
        blocks = [
            ("A" if kind == "full_attention" else f"Lt{{decay_scale={decay_scale(i, n)!r}}}") + "-MoE"
            for i, kind in enumerate(kinds)
        ]
        layers: dict[str, dict[str, Any]] = {"MoE": _experts(cfg)}
        if "linear_attention" in kinds:
            layers["Lt"] = {"heads": cfg.count("num_attention_heads"), "head_dim": width}
        if "full_attention" in kinds:
            layers["A"] = self.softmax_attention(cfg, width)
        return spec_data(cfg, name, self, dim, blocks, layers, note=self.description_note(cfg))

    def description_note(self, cfg: Config) -> str:
        return RESIDUAL_NOTE

    def layer_kinds(self, cfg: Config, n: int) -> list[str]:
        """layer_types, else attention at every even index (MiniMaxConfig's default)."""
        if cfg.data.get("layer_types") is None:
            ignored(cfg, "attn_type_list", None, "reads layer_types (MiniMax-M1's code reads attn_type_list)")
            kinds = ["full_attention" if (i + 1) % 2 else "linear_attention" for i in range(n)]
            return cfg.take_default("layer_types", kinds, "MiniMaxConfig's: attention at every other layer")
        kinds = cfg.words("layer_types", set(NAMES.values()))
        if len(kinds) != n:
            raise cfg.error("layer_types", f"{len(kinds)} layers, but num_hidden_layers is {n}")
        return kinds

    def softmax_attention(self, cfg: Config, width: int) -> dict[str, Any]:
        theta, fraction = rope(cfg, 1e6)
        if fraction != 1.0:
            cfg.notes.append(
                "partial_rotary_factor is not read: transformers' MiniMaxForCausalLM rotates the whole head"
            )
        fraction = self.rotary(cfg, width)
        # MiniMaxAttention has no bias (attention_bias is not a MiniMaxConfig key)
        params = attention(cfg, width, rotary=True, rotary_base=theta, rotary_fraction=fraction, bias_key=None)
        if cfg.data.get("sliding_window") is not None:
            params["window"] = cfg.count("sliding_window")
        return params

    def rotary(self, cfg: Config, width: int) -> float:
        return 1.0

    def write(self, spec: Any) -> dict[str, Any]:
        stack = Stack(spec, self, varying=frozenset({"decay_scale"}))
        stack.refuse_kinds({"lightning", "attention", "moe"}, "lightning attention (Lt) or attention (A), then MoE")
        if any(c is None or c.name != "moe" for _, c in stack.layers):
            stack.refuse(f"every {self.title} layer is followed by its mixture of experts (MoE)")
        n = len(stack.layers)
        for i, (mixer, _) in enumerate(stack.layers):
            if mixer.name == "lightning" and not math.isclose(
                mixer.decay_scale, decay_scale(i, n), abs_tol=DECAY_TOLERANCE
            ):
                stack.refuse(
                    f"{self.title}'s lightning layer {i} of {n} scales its slopes by 1 - {i}/({n} - 1) + 1e-5 = "
                    f"{decay_scale(i, n):.6g}; the spec's has decay_scale {mixer.decay_scale}",
                    "decay_scale as `madsl convert --from-hf` writes it, layer by layer",
                )
        out = stack.common(self.model_type)
        out.update(self.write_kinds([NAMES[m.name] for m, _ in stack.layers]))
        out["hidden_act"] = "silu"
        out.update(self.write_heads(stack))
        out.update(_write_experts(stack))
        return out

    def write_kinds(self, kinds: list[str]) -> dict[str, Any]:
        return {"layer_types": kinds}

    def write_heads(self, stack: Stack) -> dict[str, Any]:
        """num_attention_heads and head_dim (shared by both kinds), and the attention's keys."""
        lt, a = stack.kinds.get("lightning"), stack.kinds.get("attention")
        first = lt if lt is not None else a
        if lt is not None and a is not None and (lt.heads, lt.inner_head_dim) != (a.heads, a.inner_head_dim):
            stack.refuse(f"{self.title}'s lightning and softmax attention share num_attention_heads and head_dim")
        out = {"num_attention_heads": first.heads, "head_dim": first.inner_head_dim}
        if a is None:
            return out
        if not a.rotary or a.qk_norm or a.output_gate or a.scale is not None or a.bias or a.out_bias:
            stack.refuse(
                f"{self.title}'s attention is rotary, without bias, query-key norm or output gate",
                "rotary: true, bias: false",
            )
        out.update(
            {
                "num_key_value_heads": a.key_value_heads,
                "rope_theta": a.rotary_base,
                "sliding_window": a.window,
                **self.write_rotary(stack, a),
            }
        )
        return out

    def write_rotary(self, stack: Stack, a: Any) -> dict[str, Any]:
        if a.rotary_fraction != 1.0:
            stack.refuse("transformers' MiniMaxForCausalLM rotates the whole head", "rotary_fraction: 1.0")
        return {}


class MiniMaxM1(MiniMax):
    """MiniMax-M1 (`minimax_m1`): MiniMax-Text-01's layers, in MiniMax's own config keys."""

    model_type, title, architecture = "minimax_m1", "MiniMax-M1", "MiniMaxM1ForCausalLM"
    config_class = "MiniMaxConfig"  # MiniMax-M1's own class has the same defaults

    def description_note(self, cfg: Config) -> str:
        """postnorm false: the residual before each norm, as madsl's blocks (the same parameters either way)."""
        said = (
            "; MiniMax-M1's code (MiniMaxM1ForCausalLM) is not in transformers: its layers are "
            "MiniMax-Text-01's, which transformers builds as MiniMaxForCausalLM"
        )
        postnorm = cfg.flag("postnorm") if "postnorm" in cfg.data else True  # as MiniMax-M1's released configs
        return said + RESIDUAL_NOTE if postnorm else said

    def layer_kinds(self, cfg: Config, n: int) -> list[str]:
        """attn_type_list: 1 softmax attention, 0 lightning attention, one a layer."""
        if cfg.count("shared_intermediate_size", minimum=0, default=0):
            raise cfg.error(
                "shared_intermediate_size",
                "a shared expert beside the routed ones (gated by shared_moe_mode) is not converted: the released "
                "MiniMax-M1 configs have none, and its layout is not in transformers' MiniMaxForCausalLM",
                "shared_intermediate_size: 0",
            )
        if "attn_type_list" not in cfg.data:
            raise MadslError(
                'missing key "attn_type_list"',
                Location(cfg.path),
                hint="a MiniMax-M1 config.json states each layer's kind there: madsl takes no default for it",
            )
        value = cfg.data["attn_type_list"]
        if type(value) is not list or len(value) != n or any(type(v) is not int or v not in (0, 1) for v in value):
            raise cfg.error("attn_type_list", f"expected a list of {n} entries, each 0 (lightning) or 1 (attention)")
        return ["full_attention" if v else "linear_attention" for v in value]

    def rotary(self, cfg: Config, width: int) -> float:
        """rotary_dim of each head (MiniMax-M1's code), absent: the whole head."""
        if "rotary_dim" not in cfg.data:
            cfg.take_default("rotary_dim", width, "the whole head, as MiniMax-M1's code reads it")
            return 1.0
        rotary = cfg.count("rotary_dim", maximum=width, hint=f"at most head_dim={width}")
        return rotary / width

    def write_kinds(self, kinds: list[str]) -> dict[str, Any]:
        return {
            "attn_type_list": [int(kind == "full_attention") for kind in kinds],
            "shared_intermediate_size": 0,
            "postnorm": True,
        }

    def write_rotary(self, stack: Stack, a: Any) -> dict[str, Any]:
        rotary = a.rotary_fraction * a.inner_head_dim
        if rotary != int(rotary):
            stack.refuse(f"rotary over {rotary} channels of each head: MiniMax-M1's rotary_dim is whole channels")
        return {"rotary_dim": int(rotary)}


def _experts(cfg: Config) -> dict[str, Any]:
    """SwiGLU experts of intermediate_size, a router without bias, no shared expert."""
    experts = cfg.count(spelled(cfg, "num_local_experts", "num_experts"))
    active = cfg.count("num_experts_per_tok")
    if active > experts:
        raise cfg.error("num_experts_per_tok", f"{active} exceeds the {experts} experts")
    return {
        "experts": experts,
        "expert_width": cfg.count("intermediate_size"),
        "active": active,
        "aux_loss_weight": cfg.number("router_aux_loss_coef", positive=False),
    }


def _write_experts(stack: Stack) -> dict[str, Any]:
    moe = stack.kinds["moe"]
    stack.refuse_moe_options(moe)
    if moe.shared_width or not moe.gated or moe.activation != "silu":
        stack.refuse(f"{stack.family.title}'s experts are SwiGLUs, without a shared expert", "shared_width: 0")
    if moe.router_bias or moe.dense_down or moe.leaky_routing:
        stack.refuse(f"{stack.family.title}'s router has no bias and routes each token to its top-k experts")
    return {
        "num_local_experts": moe.experts,
        "num_experts_per_tok": moe.active,
        "intermediate_size": moe.expert_width,
        "router_aux_loss_coef": moe.aux_loss_weight,
    }

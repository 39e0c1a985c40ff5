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
description. Each layer joins its attention and its experts to the stream as
`alpha * residual + beta * output`, alpha and beta per kind (full_attn_alpha_factor, ...; MiniMax-M1:
layernorm_full_attention_alpha, ...; 1 where left out: the spec's `residual_factors` of A, Lt and MoE),
the residual taken after each norm (the spec's `postnorm`: always in transformers' MiniMaxDecoderLayer,
MiniMax-M1's `postnorm` key, false where left out, as its code reads it); every norm between layers
has rms_norm_eps (the spec's `norm_eps`).
"""

from __future__ import annotations

import math
from typing import Any

from madsl.errors import Location, MadslError
from madsl.graph import build_graph
from madsl.interop.huggingface.base import Family, Stack, attention, head_dim, ignored, rope, spec_data, spelled
from madsl.interop.huggingface.config import Config
from madsl.structure import plan_blocks

NAMES = {"lightning": "linear_attention", "attention": "full_attention"}
# a spec's decay scale is written where it is within this of the class's: the 1e-5 terms of the schedule
# (1.0 for the first layer, 1 - l / (N - 1) + 1e-5 without the denominator's) land on the same layer
DECAY_TOLERANCE = 1.5e-5
RESIDUAL_NOTE = (
    "; its layers add the residual after each norm (the normed input: postnorm), scaled by the alpha factors"
)
# the spec's residual_factors symbols -> their (alpha, beta) keys in MiniMaxConfig, and in MiniMax-M1's config
FACTOR_KEYS = {
    "A": ("full_attn_alpha_factor", "full_attn_beta_factor"),
    "Lt": ("linear_attn_alpha_factor", "linear_attn_beta_factor"),
    "MoE": ("mlp_alpha_factor", "mlp_beta_factor"),
}
M1_FACTOR_KEYS = {
    "A": ("layernorm_full_attention_alpha", "layernorm_full_attention_beta"),
    "Lt": ("layernorm_linear_attention_alpha", "layernorm_linear_attention_beta"),
    "MoE": ("layernorm_mlp_alpha", "layernorm_mlp_beta"),
}
PRIMITIVES = {"A": "attention", "Lt": "lightning", "MoE": "moe"}


def decay_scale(layer: int, layers: int, offset: float = 1e-5) -> float:
    """MiniMaxLightningAttention's factor on layer `layer`'s slopes, to 12 significant digits; `offset`
    0: MiniMax-M1's code's, `slope_rate * (1 - idx / (len(self.layers) - 1) + 1e-05)`."""
    return float(f"{1 - layer / (layers - 1 + offset) + 1e-5:.12g}")


class MiniMax(Family):
    model_type, title, architecture, tied_by_default = "minimax", "MiniMax", "MiniMaxForCausalLM", False
    config_class = "MiniMaxConfig"
    # transformers' MiniMaxConfig defaults, taken where a config leaves a key out
    defaults = {
        "num_key_value_heads": 8,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "router_aux_loss_coef": 0.001,
        "rms_norm_eps": 1e-5,
        **{key: 1 for pair in FACTOR_KEYS.values() for key in pair},
    }
    factor_keys = FACTOR_KEYS
    decay_offset = 1e-5  # transformers' denominator, num_hidden_layers - 1 + 1e-5

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers")
        cfg.word("hidden_act", ("silu",))  # the experts' SwiGLU, lightning attention's SiLU
        kinds = self.layer_kinds(cfg, n)
        width = head_dim(cfg, dim, "head_dim")
        blocks = [
            ("A" if kind == "full_attention" else f"Lt{{decay_scale={decay_scale(i, n, self.decay_offset)!r}}}")
            + "-MoE"
            for i, kind in enumerate(kinds)
        ]
        layers: dict[str, dict[str, Any]] = {"MoE": _experts(cfg)}
        if "linear_attention" in kinds:
            layers["Lt"] = {"heads": cfg.count("num_attention_heads"), "head_dim": width}
        if "full_attention" in kinds:
            layers["A"] = self.softmax_attention(cfg, width)
        data = spec_data(cfg, name, self, dim, blocks, layers, note=self.description_note(cfg))
        factors = {}
        for symbol, (alpha, beta) in self.factor_keys.items():
            pair = (cfg.number(alpha, positive=False), cfg.number(beta, positive=False))
            if symbol in data["layers"] and pair != (1.0, 1.0):
                factors[symbol] = {"alpha": pair[0], "beta": pair[1]}
        data["norm_eps"] = cfg.number("rms_norm_eps", positive=True)
        data["postnorm"] = self.postnorm(cfg)
        if factors:
            data["residual_factors"] = factors
        return data

    def postnorm(self, cfg: Config) -> bool:
        """transformers' MiniMaxDecoderLayer takes each residual after its norm, always."""
        return True

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
        stack = Stack(spec, self, varying=frozenset({"decay_scale"}), residual=True)
        stack.refuse_kinds({"lightning", "attention", "moe"}, "lightning attention (Lt) or attention (A), then MoE")
        if any(c is None or c.name != "moe" for _, c in stack.layers):
            stack.refuse(f"every {self.title} layer is followed by its mixture of experts (MoE)")
        out = stack.common(self.model_type)
        out.update(self.write_kinds([NAMES[m.name] for m, _ in stack.layers]))
        out["hidden_act"] = "silu"
        out.update(self.write_heads(stack))
        out.update(_write_experts(stack))
        self.check_decay(stack)
        out.update(self.write_residual(stack))
        return out

    def check_decay(self, stack: Stack) -> None:
        """Each lightning layer's decay_scale is the class's for its place in the stack."""
        n = len(stack.layers)
        if n == 1 and self.decay_offset == 0 and stack.layers[0][0].name == "lightning":
            stack.refuse(f"{self.title}'s code divides by num_hidden_layers - 1 in a lightning layer's decay")
        for i, (mixer, _) in enumerate(stack.layers):
            if mixer.name == "lightning" and not math.isclose(
                mixer.decay_scale, decay_scale(i, n, self.decay_offset), abs_tol=DECAY_TOLERANCE
            ):
                stack.refuse(
                    f"{self.title}'s lightning layer {i} of {n} scales its slopes by 1 - {i}/({n} - 1) + 1e-5 = "
                    f"{decay_scale(i, n, self.decay_offset):.6g}; the spec's has decay_scale {mixer.decay_scale}",
                    "decay_scale as `madsl convert --from-hf` writes it, layer by layer",
                )

    def write_kinds(self, kinds: list[str]) -> dict[str, Any]:
        return {"layer_types": kinds}

    def write_postnorm(self, stack: Stack) -> dict[str, Any]:
        if not stack.spec.postnorm:
            stack.refuse(f"{self.title}'s layers take each residual after its norm", "postnorm: true")
        return {}

    def write_residual(self, stack: Stack) -> dict[str, Any]:
        """rms_norm_eps and each kind's alpha and beta (one pair a kind: every part of it the same)."""
        spec = stack.spec
        if (spec.residual_scale, spec.embedding_scale, spec.logit_divisor, spec.logit_soft_cap) != (1, 1, 1, None):
            stack.refuse(
                f"{self.title} has no residual scale, embedding scale, logit divisor or logit soft cap",
                "residual_scale: 1 (the kinds' beta factors are residual_factors)",
            )
        pairs: dict[str, tuple[float, float]] = {}
        for block in plan_blocks(build_graph(spec)):
            for node in (*block.mixers, block.channel):
                pair = spec.residual_factors.get(node["layer"].symbol, (1.0, 1.0))
                if pairs.setdefault(node["primitive"].name, pair) != pair:
                    stack.refuse(
                        f"{self.title} has one alpha and one beta a layer kind; two {node['primitive'].name} "
                        "layers of the spec's residual_factors differ"
                    )
        out: dict[str, Any] = {"rms_norm_eps": spec.norm_eps, **self.write_postnorm(stack)}
        for symbol, (alpha, beta) in self.factor_keys.items():
            out[alpha], out[beta] = pairs.get(PRIMITIVES[symbol], (1.0, 1.0))
        return out

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

    factor_keys = M1_FACTOR_KEYS
    decay_offset = 0.0  # MiniMax-M1's code divides by len(layers) - 1 (its modeling_minimax_m1.py)
    defaults = {**MiniMax.defaults, **{key: 1 for pair in M1_FACTOR_KEYS.values() for key in pair}}

    def description_note(self, cfg: Config) -> str:
        said = (
            "; MiniMax-M1's code (MiniMaxM1ForCausalLM) is not in transformers: its layers are "
            "MiniMax-Text-01's, which transformers builds as MiniMaxForCausalLM"
        )
        return said + RESIDUAL_NOTE if self.postnorm(cfg) else said

    def postnorm(self, cfg: Config) -> bool:
        """MiniMax-M1's `postnorm`: false where left out, as its MiniMaxM1DecoderLayer reads it."""
        if "postnorm" not in cfg.data:
            return cfg.take_default("postnorm", False, "MiniMax-M1's code: getattr(config, 'postnorm', False)")
        return cfg.flag("postnorm")

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
        if n == 1 and value == [0]:
            raise cfg.error(
                "num_hidden_layers", "MiniMax-M1's code divides by num_hidden_layers - 1 in a lightning layer's decay"
            )
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
        }

    def write_postnorm(self, stack: Stack) -> dict[str, Any]:
        """MiniMax-M1 states postnorm, either way."""
        return {"postnorm": stack.spec.postnorm}

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

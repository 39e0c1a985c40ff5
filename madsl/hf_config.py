"""Hugging Face `config.json` of hybrid model families <-> madsl specs (`madsl convert --from-hf/--to-hf`).

Each family writes the layer stack its own way; all three stack pre-norm residual layers,
each a sequence mixer (Mamba or attention) followed by a channel mixer, which is a madsl
block:

    jamba             Jamba (AI21): attention where i % attn_layer_period == attn_layer_offset,
                      else Mamba-1; a mixture of experts where i % expert_layer_period ==
                      expert_layer_offset (and num_experts > 1), else a SwiGLU MLP
    nemotron_h        Nemotron-H (NVIDIA): the Megatron `hybrid_override_pattern`, one character
                      per layer (madsl/convert.py): M Mamba-2, * attention, - squared-ReLU MLP
    granitemoehybrid  Granite 4.0 hybrids (IBM): `layer_types`, "mamba" (Mamba-2) or "attention"
                      per layer, every layer followed by a mixture of experts with a shared
                      expert, or by the shared SwiGLU MLP alone when num_local_experts is 0

Reading a config gives a spec with its width, vocabulary, layer stack and every layer's sizes
(heads, key/value heads, head width, state size, conv taps, MLP and expert widths, experts and
active experts), so that `madsl compile` and `madsl check` account it (embeddings and an untied
head included, as these models count their parameters) and gate it on a budget. Writing goes
the other way, for a spec whose stack the family can express; where it cannot (a layer kind the
family lacks, attention positions that are not periodic for Jamba, two settings of one layer
kind), the error says why. Fields that do not change what madsl accounts (token ids, dropout,
initialisation, multipliers, dtype) are not read; what madsl counts differently is listed in
docs/convert.md.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from madsl.convert import compact, megatron_blocks
from madsl.errors import Location, MadslError
from madsl.graph import build_graph
from madsl.hf_config_file import Config, _look_alike, _shown
from madsl.structure import SETTINGS, plan_blocks, refuse_beyond_stack


# ---- the layer settings every family shares ---------------------------------------------------------

def _attention(cfg: Config, head_dim: int, *, rotary: bool, rotary_base: float | None = None,
               bias_key: str = "attention_bias") -> dict[str, Any]:
    heads = cfg.count("num_attention_heads")
    kv_heads = cfg.count("num_key_value_heads")
    if heads % kv_heads:
        raise cfg.error("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads={heads}",
                        "grouped-query attention shares each key/value head among heads / kv_heads query heads")
    params: dict[str, Any] = {"heads": heads, "head_dim": head_dim, "rotary": rotary,
                              "bias": cfg.flag(bias_key, False)}
    if kv_heads != heads:
        params["kv_heads"] = kv_heads
    if rotary and rotary_base is not None:
        params["rotary_base"] = rotary_base
    return params


def _mamba2(cfg: Config, dim: int, *, heads: str, head_dim: str, state: str, groups: str, conv: str,
            expand: str, bias: str, conv_bias: str) -> dict[str, Any]:
    n_heads, factor = cfg.count(heads), cfg.count(expand)
    width = factor * dim // n_heads if cfg.data.get(head_dim) == "auto" else cfg.count(head_dim)
    if n_heads * width != factor * dim:
        raise cfg.error(heads, f"{n_heads} heads x {width} = {n_heads * width} channels, but madsl's Mamba-2 "
                               f"is {expand} x hidden_size = {factor * dim} wide",
                        "madsl's M2 derives its heads from expand * dim / head_dim")
    return {"d_state": cfg.count(state), "d_conv": cfg.count(conv), "expand": factor, "head_dim": width,
            "groups": cfg.count(groups), "bias": cfg.flag(bias), "conv_bias": cfg.flag(conv_bias)}


def _model(cfg: Config, name: str, family: "Family", dim: int, blocks: list[str],
           layers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The spec's data: only the symbols the stack uses get settings (madsl refuses the others)."""
    used = {part for block in blocks for part in block.split("-")}
    return {"name": name,
            "description": f"converted from a {family.title} config.json" + (
                f" ({Path(cfg.path).name})" if not cfg.path.startswith("<") else ""),
            "dim": dim, "vocab": cfg.count("vocab_size"),
            "tie_embeddings": cfg.flag("tie_word_embeddings", family.tied_by_default),
            "norm": "rms", "channel_mixer": "none", "topology": compact(blocks),
            "layers": {symbol: params for symbol, params in layers.items() if symbol in used}}


def _head_dim(cfg: Config, dim: int, key: str | None = None) -> int:
    heads = cfg.count("num_attention_heads")
    if key is not None and cfg.data.get(key) is not None:
        return cfg.count(key)
    if dim % heads:
        raise cfg.error("num_attention_heads", f"{heads} does not divide hidden_size={dim}")
    return dim // heads


# ---- the other direction: a spec's stack, one setting per layer kind -----------------------------------

class Stack:
    """A spec as the families write it, read from its plan: per layer, the sequence mixer's and
    the channel mixer's primitives (None: no channel mixer), and one setting per primitive kind.
    The plan must be a plain stack (`madsl.structure`); a layer's own settings are allowed where
    every layer of its kind has them."""

    def __init__(self, spec: Any, family: "Family"):
        self.spec, self.family = spec, family
        if spec.norm != "rms":
            raise MadslError(f"{spec.name}: {family.title} uses RMSNorm; the spec has norm: {spec.norm}")
        if not spec.final_norm:
            raise MadslError(f"{spec.name}: {family.title} has a final norm; the spec has final_norm: false")
        if spec.vocab is None:
            raise MadslError(f"{spec.name}: a config.json states vocab_size", hint="set `vocab:` in the spec")
        plan = build_graph(spec)
        refuse_beyond_stack(plan, f"{family.title} config.json", allow=frozenset({SETTINGS}))
        self.layers: list[tuple[Any, Any]] = [
            (block.mixers[0]["primitive"], None if block.channel is None else block.channel["primitive"])
            for block in plan_blocks(plan)]
        self.kinds: dict[str, Any] = {}
        for prims in self.layers:
            for prim in prims:
                if prim is None:
                    continue
                seen = self.kinds.setdefault(prim.name, prim)
                if seen != prim:
                    changed = [k for k, v in prim.config().items() if seen.config()[k] != v]
                    raise MadslError(f"{spec.name}: two {prim.name} layers differ in {', '.join(changed)}; "
                                     f"a {family.title} config.json has one setting per layer kind")

    def refuse_kinds(self, allowed: set[str], what: str) -> None:
        for name in self.kinds:
            if name not in allowed:
                raise MadslError(f"{self.spec.name}: {self.family.title} has no {name} layer",
                                 expected=what)

    def positions(self, role: int, name: str) -> list[int]:
        return [i for i, prims in enumerate(self.layers) if prims[role] is not None and prims[role].name == name]

    def common(self, model_type: str) -> dict[str, Any]:
        return {"model_type": model_type, "architectures": [self.family.architecture],
                "hidden_size": self.spec.dim, "num_hidden_layers": len(self.layers),
                "vocab_size": self.spec.vocab, "tie_word_embeddings": self.spec.tie_embeddings}

    def attention(self, *, rotary: bool | None) -> dict[str, Any]:
        a = self.kinds.get("attention")
        if a is None:
            return {}
        if a.window is not None:
            raise MadslError(f"{self.spec.name}: sliding-window attention (window={a.window}) is not written "
                             f"to a {self.family.title} config.json", hint="window: null")
        if rotary is not None and a.rotary != rotary:
            raise MadslError(f"{self.spec.name}: {self.family.title}'s attention "
                             f"{'uses' if rotary else 'has no'} rotary position embeddings",
                             hint=f"set rotary: {str(rotary).lower()} on the attention layers")
        return {"num_attention_heads": a.heads, "num_key_value_heads": a.key_value_heads}


def _period(positions: list[int], n: int) -> tuple[int, int] | None:
    """(period, offset) with positions == [i < n: i % period == offset], the smallest period."""
    if not positions:
        return n + 1, n  # no such layer: a period longer than the stack
    for period in range(1, n + 1):
        offset = positions[0] % period
        if offset == positions[0] and [i for i in range(n) if i % period == offset] == positions:
            return period, offset
    return None


# ---- the families ---------------------------------------------------------------------------------------

class Family:
    model_type: str
    title: str
    architecture: str
    tied_by_default: bool

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        raise NotImplementedError

    def write(self, spec: Any) -> dict[str, Any]:
        raise NotImplementedError


class Jamba(Family):
    model_type, title, architecture, tied_by_default = "jamba", "Jamba", "JambaForCausalLM", False

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers")
        periods = {}
        for kind in ("attn", "expert"):
            period, offset = cfg.count(f"{kind}_layer_period"), cfg.count(f"{kind}_layer_offset", 0)
            if offset >= period:
                raise cfg.error(f"{kind}_layer_offset", f"{offset} is not below {kind}_layer_period={period}")
            periods[kind] = (period, offset)
        experts, active = cfg.count("num_experts"), cfg.count("num_experts_per_tok")
        if active > experts:
            raise cfg.error("num_experts_per_tok", f"{active} exceeds num_experts={experts}")
        blocks = []
        for i in range(n):
            mixer = "A" if i % periods["attn"][0] == periods["attn"][1] else "Mb"
            routed = experts > 1 and i % periods["expert"][0] == periods["expert"][1]
            blocks.append(f"{mixer}-{'MoE' if routed else 'Sg'}")
        dt_rank = (-(-dim // 16) if cfg.data.get("mamba_dt_rank") == "auto"  # ceil(hidden_size / 16)
                   else cfg.count("mamba_dt_rank", hint='a positive integer, or "auto" (hidden_size / 16)'))
        inner = cfg.count("intermediate_size")
        layers = {
            "Mb": {"d_state": cfg.count("mamba_d_state"), "d_conv": cfg.count("mamba_d_conv"),
                   "expand": cfg.count("mamba_expand"), "dt_rank": dt_rank,
                   "bias": cfg.flag("mamba_proj_bias"), "conv_bias": cfg.flag("mamba_conv_bias")},
            # Jamba's attention has no position embedding: the Mamba layers carry positions
            "A": _attention(cfg, _head_dim(cfg, dim), rotary=False),
            "Sg": {"inner": inner},
            "MoE": {"experts": experts, "expert_width": inner, "active": active,
                    "aux_loss_weight": cfg.number("router_aux_loss_coef", 0.001, positive=False)},
        }
        return _model(cfg, name, self, dim, blocks, layers)

    def write(self, spec: Any) -> dict[str, Any]:
        stack = Stack(spec, self)
        stack.refuse_kinds({"mamba", "attention", "swiglu", "moe"},
                           "Mamba-1 (Mb) or attention, then a SwiGLU (Sg) or a mixture of experts (MoE)")
        if any(channel is None for _, channel in stack.layers):
            raise MadslError(f"{spec.name}: every Jamba layer has an MLP or a mixture of experts",
                             hint="give every block a channel mixer (Sg or MoE)")
        n = len(stack.layers)
        out = stack.common(self.model_type)
        out.update(stack.attention(rotary=False))
        for kind, role, name in (("attn", 0, "attention"), ("expert", 1, "moe")):
            found = _period(stack.positions(role, name), n)
            if found is None:
                raise MadslError(f"{spec.name}: the {name} layers at {stack.positions(role, name)} are not every "
                                 f"k-th layer; Jamba places them by {kind}_layer_period and {kind}_layer_offset")
            out[f"{kind}_layer_period"], out[f"{kind}_layer_offset"] = found
        moe, mlp = stack.kinds.get("moe"), stack.kinds.get("swiglu")
        if moe is not None and moe.shared_width:
            raise MadslError(f"{spec.name}: Jamba's mixture of experts has no shared expert")
        if moe is not None and mlp is not None and moe.expert_width != mlp.inner:
            raise MadslError(f"{spec.name}: Jamba's experts and MLPs share intermediate_size; "
                             f"MoE.expert_width={moe.expert_width}, Sg.inner={mlp.inner}")
        if mlp is not None and mlp.bias:
            raise MadslError(f"{spec.name}: Jamba's MLPs have no bias")
        out["intermediate_size"] = mlp.inner if mlp is not None else moe.expert_width
        out["num_experts"] = moe.experts if moe is not None else 1
        out["num_experts_per_tok"] = moe.active if moe is not None else 1
        if moe is not None:
            out["router_aux_loss_coef"] = moe.aux_loss_weight
        mamba = stack.kinds.get("mamba")
        if mamba is not None:
            out.update({"mamba_d_state": mamba.d_state, "mamba_d_conv": mamba.d_conv, "mamba_expand": mamba.expand,
                        "mamba_dt_rank": mamba.rank, "mamba_proj_bias": mamba.bias,
                        "mamba_conv_bias": mamba.conv_bias})
        attention = stack.kinds.get("attention")
        if attention is not None and (attention.inner_head_dim * attention.heads != spec.dim or attention.bias):
            raise MadslError(f"{spec.name}: Jamba's attention is hidden_size / heads wide per head, without bias")
        return out


class NemotronH(Family):
    model_type, title, architecture, tied_by_default = "nemotron_h", "Nemotron-H", "NemotronHForCausalLM", False
    SYMBOLS = {"mamba": "M2", "attention": "A", "mlp": "Mlp", "moe": "MoE"}
    ACTIVATIONS = {"relu2": "relu2", "gelu_pytorch_tanh": "gelu"}

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        # Megatron layers: a madsl block is one or two of them (a sequence layer and its MLP)
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers", per_block=2)
        pattern = cfg.pattern("hybrid_override_pattern", "M*-E")
        if len(pattern) != n:
            raise cfg.error("hybrid_override_pattern", f"{len(pattern)} layers, but num_hidden_layers is {n}")
        if "E" in pattern:
            raise cfg.error("hybrid_override_pattern", f"layer {pattern.index('E') + 1} is a mixture of experts "
                            "(E): Nemotron-H's experts are squared-ReLU MLPs (two matrices each), madsl's "
                            "are SwiGLU (three); converting them would miscount every expert",
                            "convert the pattern alone with madsl convert --from-megatron and set MoE's sizes")
        try:
            blocks = megatron_blocks(pattern, self.SYMBOLS)
        except MadslError as err:  # located at the character, where the pattern is written as it reads
            at = cfg.where("hybrid_override_pattern")
            start = -1 if at.source_line is None else at.source_line.find(json.dumps(pattern), at.column)
            if start >= 0 and err.location.column is not None:
                at = Location(at.file, at.line, start + 1 + err.location.column, at.source_line)
            raise MadslError(f'"hybrid_override_pattern": {err.message}', at, expected=err.expected,
                             hint=err.hint) from None
        activation = cfg.word("mlp_hidden_act", self.ACTIVATIONS, "relu2")
        layers = {
            "M2": _mamba2(cfg, dim, heads="mamba_num_heads", head_dim="mamba_head_dim", state="ssm_state_size",
                          groups="n_groups", conv="conv_kernel", expand="expand", bias="use_bias",
                          conv_bias="use_conv_bias"),
            # NoPE: Nemotron-H's attention has no position embedding
            "A": _attention(cfg, _head_dim(cfg, dim, "attention_head_dim" if "attention_head_dim" in cfg.data
                                           else "head_dim"), rotary=False),
            "Mlp": {"inner": cfg.count("intermediate_size"), "bias": cfg.flag("mlp_bias", False),
                    "activation": self.ACTIVATIONS[activation]},
        }
        return _model(cfg, name, self, dim, blocks, layers)

    def write(self, spec: Any) -> dict[str, Any]:
        from madsl.convert import to_megatron_pattern

        stack = Stack(spec, self)
        stack.refuse_kinds({"mamba2", "attention", "mlp"}, "Mamba-2 (M2) or attention, then an MLP (Mlp) or none")
        out = stack.common(self.model_type)
        out["hybrid_override_pattern"] = pattern = to_megatron_pattern(spec)
        out["num_hidden_layers"] = len(pattern)  # Megatron layers: a sequence layer and an MLP are two
        out.update(stack.attention(rotary=False))
        attention, mamba, mlp = (stack.kinds.get(k) for k in ("attention", "mamba2", "mlp"))
        if attention is not None:
            out.update({"attention_head_dim": attention.inner_head_dim, "attention_bias": attention.bias})
        if mamba is not None:
            out.update({"mamba_num_heads": mamba.heads, "mamba_head_dim": mamba.head_dim,
                        "ssm_state_size": mamba.d_state, "n_groups": mamba.groups, "conv_kernel": mamba.d_conv,
                        "expand": mamba.expand, "use_bias": mamba.bias, "use_conv_bias": mamba.conv_bias})
        if mlp is not None:
            names = {v: k for k, v in self.ACTIVATIONS.items()}
            out.update({"intermediate_size": mlp.width, "mlp_bias": mlp.bias, "mlp_hidden_act": names[mlp.activation]})
        return out


class GraniteHybrid(Family):
    model_type, title, architecture, tied_by_default = ("granitemoehybrid", "Granite 4.0 hybrid",
                                                        "GraniteMoeHybridForCausalLM", False)
    KINDS = {"mamba": "M2", "attention": "A"}

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers")
        kinds = cfg.words("layer_types", self.KINDS)
        if len(kinds) != n:
            raise cfg.error("layer_types", f"{len(kinds)} layers, but num_hidden_layers is {n}")
        experts = cfg.count("num_local_experts", 0)
        shared = cfg.count("shared_intermediate_size")
        channel = "MoE" if experts else "Sg"
        blocks = [f"{self.KINDS[kind]}-{channel}" for kind in kinds]
        position = cfg.word("position_embedding_type", ("nope", "rope"), "nope")
        layers: dict[str, dict[str, Any]] = {
            "A": _attention(cfg, _head_dim(cfg, dim), rotary=position == "rope",
                            rotary_base=cfg.number("rope_theta", 10000.0, positive=True)),
            "Sg": {"inner": shared},
        }
        if "mamba" in kinds:
            layers["M2"] = _mamba2(cfg, dim, heads="mamba_n_heads", head_dim="mamba_d_head",
                                   state="mamba_d_state", groups="mamba_n_groups", conv="mamba_d_conv",
                                   expand="mamba_expand", bias="mamba_proj_bias", conv_bias="mamba_conv_bias")
        if experts:
            active = cfg.count("num_experts_per_tok")
            if active > experts:
                raise cfg.error("num_experts_per_tok", f"{active} exceeds num_local_experts={experts}")
            layers["MoE"] = {"experts": experts, "expert_width": cfg.count("intermediate_size"), "active": active,
                             "shared_width": shared,
                             "aux_loss_weight": cfg.number("router_aux_loss_coef", 0.0, positive=False)}
        return _model(cfg, name, self, dim, blocks, layers)

    def write(self, spec: Any) -> dict[str, Any]:
        stack = Stack(spec, self)
        stack.refuse_kinds({"mamba2", "attention", "swiglu", "moe"},
                           "Mamba-2 (M2) or attention, then a SwiGLU (Sg) or a mixture of experts with a shared "
                           "expert (MoE{shared_width>0}) in every layer")
        channels = {None if c is None else c.name for _, c in stack.layers}
        if len(channels) != 1 or None in channels:
            raise MadslError(f"{spec.name}: every Granite 4.0 layer has the same channel mixer (a SwiGLU, or a "
                             f"mixture of experts with a shared expert); the spec has {sorted(map(str, channels))}")
        out = stack.common(self.model_type)
        out["layer_types"] = [{"mamba2": "mamba", "attention": "attention"}[m.name] for m, _ in stack.layers]
        attention, mamba, moe, mlp = (stack.kinds.get(k) for k in ("attention", "mamba2", "moe", "swiglu"))
        out.update(stack.attention(rotary=None))
        if attention is not None:
            if attention.inner_head_dim * attention.heads != spec.dim:
                raise MadslError(f"{spec.name}: Granite's attention heads are hidden_size / heads wide")
            out.update({"attention_bias": attention.bias,
                        "position_embedding_type": "rope" if attention.rotary else "nope"})
            if attention.rotary:
                out["rope_theta"] = attention.rotary_base
        if mamba is not None:
            out.update({"mamba_n_heads": mamba.heads, "mamba_d_head": mamba.head_dim, "mamba_d_state": mamba.d_state,
                        "mamba_n_groups": mamba.groups, "mamba_d_conv": mamba.d_conv, "mamba_expand": mamba.expand,
                        "mamba_proj_bias": mamba.bias, "mamba_conv_bias": mamba.conv_bias})
        if moe is not None:
            if not moe.shared_width:
                raise MadslError(f"{spec.name}: Granite 4.0's mixture of experts always has a shared expert",
                                 hint="set MoE.shared_width")
            out.update({"num_local_experts": moe.experts, "num_experts_per_tok": moe.active,
                        "intermediate_size": moe.expert_width, "shared_intermediate_size": moe.shared_width,
                        "router_aux_loss_coef": moe.aux_loss_weight})
        else:
            if mlp.bias:
                raise MadslError(f"{spec.name}: Granite's shared MLP has no bias")
            out.update({"num_local_experts": 0, "num_experts_per_tok": 0, "shared_intermediate_size": mlp.inner})
        return out


FAMILIES: dict[str, Family] = {f.model_type: f for f in (Jamba(), NemotronH(), GraniteHybrid())}
Config.family_titles = {name: f.title for name, f in FAMILIES.items()}


def family(model_type: str, cfg: Config | None = None) -> Family:
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    message = f"madsl converts no {_shown(model_type)} configs"
    expected = "model_type " + ", ".join(FAMILIES)
    if cfg is not None:
        raise MadslError(f'"model_type": {message}', cfg.where("model_type"), expected=expected,
                         hint=_look_alike(model_type))
    raise MadslError(message, expected=expected)


def from_hf_config(source: str | Path | dict[str, Any], name: str = "converted") -> dict[str, Any]:
    """The spec data (for spec_from_data, or YAML) of a Hugging Face config.json (a path, or the
    parsed JSON object) of a hybrid family this module knows (FAMILIES)."""
    cfg = Config.of(source) if isinstance(source, dict) else Config.load(source)
    return family(cfg.word("model_type"), cfg).read(cfg, name)


def to_hf_config(spec: Any, model_type: str) -> dict[str, Any]:
    """The config.json fields of the family `model_type` that describe a spec's stack (a Spec or a path)."""
    from madsl.spec import Spec, load_spec

    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    return family(model_type).write(spec)

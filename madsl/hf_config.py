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
import math
import re
from pathlib import Path
from typing import Any

from madsl import topology as topo
from madsl.convert import compact, megatron_blocks
from madsl.errors import Location, MadslError


class Config:
    """A config.json: its values, and where each top-level key is (for located errors)."""

    def __init__(self, data: dict[str, Any], text: str, path: str):
        self.data, self.text, self.path = data, text, path

    @classmethod
    def load(cls, path: str | Path) -> "Config":
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as err:
            raise MadslError(f"cannot read {path}: {err.strerror}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            line = text.splitlines()[err.lineno - 1] if text.splitlines() else ""
            raise MadslError(f"not valid JSON: {err.msg}", Location(str(path), err.lineno, err.colno, line)) from None
        if not isinstance(data, dict):
            raise MadslError("a config.json holds one JSON object", Location(str(path), 1, 1))
        return cls(data, text, str(path))

    def where(self, key: str) -> Location:
        match = re.search(re.escape(json.dumps(key)) + r"\s*:", self.text)
        if match is None:
            return Location(self.path)
        start = match.start()
        line_start = self.text.rfind("\n", 0, start) + 1
        line_end = self.text.find("\n", start)
        line = self.text[line_start:line_end if line_end >= 0 else len(self.text)]
        return Location(self.path, self.text.count("\n", 0, start) + 1, start - line_start + 1, line,
                        len(json.dumps(key)))

    def error(self, key: str, message: str, hint: str | None = None) -> MadslError:
        return MadslError(f"{key}: {message}", self.where(key), hint=hint)

    def get(self, key: str, kind: type | tuple[type, ...]) -> Any:
        if key not in self.data:
            raise MadslError(f"missing key {key!r}", Location(self.path),
                             hint=f"a {self.data.get('model_type', 'hybrid')} config.json states {key!r}")
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            names = " or ".join({int: "an integer", bool: "true or false", str: "a string", list: "a list",
                                 float: "a number", type(None): "null"}[k] for k in kinds)
            raise self.error(key, f"expected {names}, got {value!r}")
        return value

    def count(self, key: str, minimum: int = 1) -> int:
        value = self.get(key, int)
        if value < minimum:
            raise self.error(key, f"must be at least {minimum}, got {value}")
        return value

    def optional(self, key: str, kind: type | tuple[type, ...], default: Any) -> Any:
        return self.get(key, kind) if key in self.data else default


# ---- the layer settings every family shares ---------------------------------------------------------

def _attention(cfg: Config, head_dim: int, *, rotary: bool, rotary_base: float | None = None,
               bias_key: str = "attention_bias") -> dict[str, Any]:
    heads = cfg.count("num_attention_heads")
    kv_heads = cfg.count("num_key_value_heads")
    if heads % kv_heads:
        raise cfg.error("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads={heads}",
                        "grouped-query attention shares each key/value head among heads / kv_heads query heads")
    params: dict[str, Any] = {"heads": heads, "head_dim": head_dim, "rotary": rotary,
                              "bias": cfg.optional(bias_key, bool, False)}
    if kv_heads != heads:
        params["kv_heads"] = kv_heads
    if rotary and rotary_base is not None:
        params["rotary_base"] = float(rotary_base)
    return params


def _mamba2(cfg: Config, dim: int, *, heads: str, head_dim: str, state: str, groups: str, conv: str,
            expand: str, bias: str, conv_bias: str) -> dict[str, Any]:
    n_heads, factor = cfg.count(heads), cfg.count(expand)
    width = cfg.data.get(head_dim)
    width = factor * dim // n_heads if width == "auto" else cfg.count(head_dim)
    if n_heads * width != factor * dim:
        raise cfg.error(heads, f"{n_heads} heads x {width} = {n_heads * width} channels, but madsl's Mamba-2 "
                               f"is {expand} x hidden_size = {factor * dim} wide",
                        "madsl's M2 derives its heads from expand * dim / head_dim")
    return {"d_state": cfg.count(state), "d_conv": cfg.count(conv), "expand": factor, "head_dim": width,
            "groups": cfg.count(groups), "bias": cfg.get(bias, bool), "conv_bias": cfg.get(conv_bias, bool)}


def _model(cfg: Config, name: str, family: "Family", dim: int, blocks: list[str],
           layers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The spec's data: only the symbols the stack uses get settings (madsl refuses the others)."""
    used = {part for block in blocks for part in block.split("-")}
    return {"name": name,
            "description": f"converted from a {family.title} config.json" + (
                f" ({Path(cfg.path).name})" if not cfg.path.startswith("<") else ""),
            "dim": dim, "vocab": cfg.count("vocab_size"),
            "tie_embeddings": cfg.optional("tie_word_embeddings", bool, family.tied_by_default),
            "norm": "rms", "channel_mixer": "none", "topology": compact(blocks),
            "layers": {symbol: params for symbol, params in layers.items() if symbol in used}}


def _head_dim(cfg: Config, dim: int, key: str | None = None) -> int:
    heads = cfg.count("num_attention_heads")
    if key is not None and key in cfg.data and cfg.data[key] is not None:
        return cfg.count(key)
    if dim % heads:
        raise cfg.error("num_attention_heads", f"{heads} does not divide hidden_size={dim}")
    return dim // heads


# ---- the other direction: a spec's stack, one setting per layer kind -----------------------------------

class Stack:
    """A spec as the families write it: per layer, the sequence mixer's and the channel mixer's
    primitives (None: no channel mixer), and one setting per primitive kind."""

    def __init__(self, spec: Any, family: "Family"):
        self.spec, self.family = spec, family
        if spec.norm != "rms":
            raise MadslError(f"{spec.name}: {family.title} uses RMSNorm; the spec has norm: {spec.norm}")
        if not spec.final_norm:
            raise MadslError(f"{spec.name}: {family.title} has a final norm; the spec has final_norm: false")
        if spec.vocab is None:
            raise MadslError(f"{spec.name}: a config.json states vocab_size", hint="set `vocab:` in the spec")
        _plain(spec, family)
        self.layers: list[tuple[Any, Any]] = []
        for block in topo.blocks(topo.expand(spec.topology)):
            channel = spec.channel_for(block)
            self.layers.append((spec.primitive_for(block.mixer),
                                None if channel is None else spec.primitive_for(channel)))
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


def _plain(spec: Any, family: "Family") -> None:
    """A stack of blocks: no parallel mixers, group connections or shared (tied) layers."""
    def walk(nodes: Any) -> None:
        for node in nodes:
            if isinstance(node, topo.Repeat):
                node = node.node
            if isinstance(node, topo.Group):
                if dict(node.attrs).get("residual", "none") != "none":
                    raise MadslError(f"{spec.name}: a group connection (residual=...) has no "
                                     f"{family.title} config.json")
                if topo.is_forked(node) or node.attrs:
                    raise MadslError(f"{spec.name}: a group of branches (X | Y) or a group's norm= / "
                                     f"linear_std= has no {family.title} config.json")
                walk(node.body)
    walk(spec.topology)
    for block in topo.blocks(topo.expand(spec.topology)):
        if isinstance(block.mixer, topo.Parallel):
            raise MadslError(f"{spec.name}: parallel mixers {topo.block_text(block)!r} have no "
                             f"{family.title} config.json")
        for layer in (block.mixer, spec.channel_for(block)):
            if layer is not None and layer.tag is not None:
                raise MadslError(f"{spec.name}: {topo.layer_text(layer)!r}: shared (tied) layers have no "
                                 f"{family.title} config.json")


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
        dim, n = cfg.count("hidden_size"), cfg.count("num_hidden_layers")
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
        dt_rank = cfg.get("mamba_dt_rank", (int, str))
        if dt_rank == "auto":
            dt_rank = math.ceil(dim / 16)
        elif not isinstance(dt_rank, int) or dt_rank < 1:
            raise cfg.error("mamba_dt_rank", f"expected a positive integer or \"auto\", got {dt_rank!r}")
        inner = cfg.count("intermediate_size")
        layers = {
            "Mb": {"d_state": cfg.count("mamba_d_state"), "d_conv": cfg.count("mamba_d_conv"),
                   "expand": cfg.count("mamba_expand"), "dt_rank": dt_rank,
                   "bias": cfg.get("mamba_proj_bias", bool), "conv_bias": cfg.get("mamba_conv_bias", bool)},
            # Jamba's attention has no position embedding: the Mamba layers carry positions
            "A": _attention(cfg, _head_dim(cfg, dim), rotary=False),
            "Sg": {"inner": inner},
            "MoE": {"experts": experts, "expert_width": inner, "active": active,
                    "aux_loss_weight": float(cfg.optional("router_aux_loss_coef", (int, float), 0.001))},
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
        dim, n = cfg.count("hidden_size"), cfg.count("num_hidden_layers")
        pattern = cfg.get("hybrid_override_pattern", str)
        if len(pattern) != n:
            raise cfg.error("hybrid_override_pattern", f"{len(pattern)} layers, but num_hidden_layers is {n}")
        if "E" in pattern:
            raise cfg.error("hybrid_override_pattern", f"layer {pattern.index('E') + 1} is a mixture of experts "
                            "(E): Nemotron-H's experts are squared-ReLU MLPs (two matrices each), madsl's "
                            "are SwiGLU (three); converting them would miscount every expert",
                            "convert the pattern alone with madsl convert --from-megatron and set MoE's sizes")
        try:
            blocks = megatron_blocks(pattern, self.SYMBOLS)
        except MadslError as err:
            at = cfg.where("hybrid_override_pattern")
            column = err.location.column
            raise MadslError(err.message, at if column is None or at.line is None else
                             Location(at.file, at.line, at.source_line.index(pattern) + column, at.source_line),
                             expected=err.expected, hint=err.hint) from None
        activation = cfg.optional("mlp_hidden_act", str, "relu2")
        if activation not in self.ACTIVATIONS:
            raise cfg.error("mlp_hidden_act", f"madsl's Mlp has no activation {activation!r}",
                            "relu2 (squared ReLU) or gelu_pytorch_tanh")
        layers = {
            "M2": _mamba2(cfg, dim, heads="mamba_num_heads", head_dim="mamba_head_dim", state="ssm_state_size",
                          groups="n_groups", conv="conv_kernel", expand="expand", bias="use_bias",
                          conv_bias="use_conv_bias"),
            # NoPE: Nemotron-H's attention has no position embedding
            "A": _attention(cfg, _head_dim(cfg, dim, "attention_head_dim" if "attention_head_dim" in cfg.data
                                           else "head_dim"), rotary=False),
            "Mlp": {"inner": cfg.count("intermediate_size"), "bias": cfg.optional("mlp_bias", bool, False),
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
        dim, n = cfg.count("hidden_size"), cfg.count("num_hidden_layers")
        kinds = cfg.get("layer_types", list)
        if len(kinds) != n:
            raise cfg.error("layer_types", f"{len(kinds)} layers, but num_hidden_layers is {n}")
        for i, kind in enumerate(kinds):
            if kind not in self.KINDS:
                raise cfg.error("layer_types", f"layer {i + 1} is {kind!r}", "each layer is \"mamba\" or \"attention\"")
        experts = cfg.count("num_local_experts", 0)
        shared = cfg.count("shared_intermediate_size")
        channel = "MoE" if experts else "Sg"
        blocks = [f"{self.KINDS[kind]}-{channel}" for kind in kinds]
        position = cfg.optional("position_embedding_type", str, "nope")
        if position not in ("nope", "rope"):
            raise cfg.error("position_embedding_type", f"{position!r} is neither \"nope\" nor \"rope\"")
        layers: dict[str, dict[str, Any]] = {
            "A": _attention(cfg, _head_dim(cfg, dim), rotary=position == "rope",
                            rotary_base=cfg.optional("rope_theta", (int, float), 10000.0)),
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
                             "aux_loss_weight": float(cfg.optional("router_aux_loss_coef", (int, float), 0.0))}
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


def family(model_type: str, cfg: Config | None = None) -> Family:
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    message = f"madsl converts no {model_type!r} configs"
    expected = "model_type " + ", ".join(FAMILIES)
    if cfg is not None:
        raise MadslError(f"model_type: {message}", cfg.where("model_type"), expected=expected)
    raise MadslError(message, expected=expected)


def from_hf_config(source: str | Path | dict[str, Any], name: str = "converted") -> dict[str, Any]:
    """The spec data (for spec_from_data, or YAML) of a Hugging Face config.json (a path, or the
    parsed JSON object) of a hybrid family this module knows (FAMILIES)."""
    cfg = (Config(source, json.dumps(source, indent=2), "<config.json>") if isinstance(source, dict)
           else Config.load(source))
    return family(cfg.get("model_type", str), cfg).read(cfg, name)


def to_hf_config(spec: Any, model_type: str) -> dict[str, Any]:
    """The config.json fields of the family `model_type` that describe a spec's stack (a Spec or a path)."""
    from madsl.spec import Spec, load_spec

    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    return family(model_type).write(spec)

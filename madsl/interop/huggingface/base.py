"""What every Hugging Face hybrid family (families.py) shares: the base class of a family, the
readers of the layer settings several families write alike (attention, Mamba-2, rotary, the spec's
data), and `Stack`, a spec read back from its plan for writing a config.json.

A family's `read(cfg, name)` turns a config.json (`config.Config`) into a spec's
data; its `write(spec)` gives the config.json fields that describe the spec's stack, or refuses
with the reason where the family cannot express it. Every size madsl accounts is read from the
config, taken at transformers' default where its config class has one (and listed with the spec:
`Config.defaulted`), or refused by name; none is guessed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from madsl.errors import MadslError
from madsl.graph import build_graph
from madsl.interop.huggingface.config import Config
from madsl.interop.huggingface.shown import shown_value
from madsl.interop.megatron import compact
from madsl.structure import PARALLEL, SETTINGS, plan_blocks, refuse_beyond_stack


class Family:
    """One model family: its model_type, its title in messages, the architecture it writes, whether
    its embeddings are tied where the config does not say, and the keys it takes at transformers'
    default where a config leaves them out (`defaults`, from `config_class`; any other key it reads
    is refused when absent: the sizes that say which model it is)."""

    model_type: str
    title: str
    architecture: str
    tied_by_default: bool
    config_class: str
    config_owner = "transformers'"  # whose class config_class is (RWKV-7's: flash-linear-attention's)
    defaults: dict[str, Any]
    mlp_activation = "silu"  # what its gated MLPs gate with (madsl's Sg activation; RecurrentGemma: gelu)

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        raise NotImplementedError

    def write(self, spec: Any) -> dict[str, Any]:
        raise NotImplementedError


# ---- the layer settings several families write alike --------------------------------------------------


def attention(
    cfg: Config,
    head_dim: int,
    *,
    rotary: bool,
    rotary_base: float | None = None,
    rotary_fraction: float = 1.0,
    bias_key: str | None = "attention_bias",
    qk_norm: bool = False,
) -> dict[str, Any]:
    """Attention's settings: heads, key/value heads (grouped-query attention), head width, rotary."""
    heads = cfg.count("num_attention_heads")
    if cfg.data.get("num_key_value_heads", cfg.defaults.get("num_key_value_heads")) is None:
        why = f"null: num_attention_heads, as {cfg.config_owner} {cfg.config_class} reads it"
        kv_heads = cfg.take_default("num_key_value_heads", heads, why)
    else:
        kv_heads = cfg.count("num_key_value_heads")
    if heads % kv_heads:
        raise cfg.error(
            "num_key_value_heads",
            f"{kv_heads} does not divide num_attention_heads={heads}",
            "grouped-query attention shares each key/value head among heads / kv_heads query heads",
        )
    params: dict[str, Any] = {
        "heads": heads,
        "head_dim": head_dim,
        "rotary": rotary,
        "bias": cfg.flag(bias_key) if bias_key else False,
    }
    if kv_heads != heads:
        params["kv_heads"] = kv_heads
    if rotary and rotary_base is not None:
        params["rotary_base"] = rotary_base
    if rotary and rotary_fraction != 1.0:
        params["rotary_fraction"] = rotary_fraction
    if qk_norm:
        params["qk_norm"] = True
    return params


def head_dim(cfg: Config, dim: int, *keys: str) -> int:
    """The attention head width: the first of `keys` the config states, else the class's default
    (Nemotron-H's 128, listed), else hidden_size / heads, as the family's attention derives it."""
    for key in keys:
        if cfg.data.get(key) is not None:
            return cfg.count(key)
    for key in keys:
        if key in cfg.defaults and key not in cfg.data:
            return cfg.count(key)
    heads = cfg.count("num_attention_heads")
    if dim % heads:
        raise cfg.error(
            "num_attention_heads",
            f"{heads} does not divide hidden_size={dim}",
            f"state the head width ({' or '.join(keys) or 'head_dim'})",
        )
    return dim // heads  # as the family's attention derives it: not a default of its config class


def rope(cfg: Config, theta: float, fraction: float = 1.0) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor) at the top level or in `rope_parameters` (transformers 5),
    with the family's defaults; scaled rotary (rope_scaling, a rope_type other than default) is
    refused: madsl's rotary has no scaling."""
    section = cfg.section("rope_parameters")
    source = section if section is not None else cfg
    if section is not None:
        kind = section.data.get("rope_type", "default")
        if kind != "default":
            raise section.error(
                "rope_type",
                f'"{kind}" rotary scaling: madsl\'s rotary has none',
                "convert a config with rope_type default",
            )
    scaling = cfg.section("rope_scaling")
    if scaling is not None and scaling.data.get("rope_type", scaling.data.get("type")) != "default":
        raise cfg.error("rope_scaling", "scaled rotary embeddings: madsl's rotary has no scaling", "rope_scaling: null")
    theta = source.number("rope_theta", theta, positive=True)
    if "partial_rotary_factor" in source.data:  # absent: the whole head, as every class reads it
        fraction = source.number("partial_rotary_factor", fraction, positive=True)
    if fraction > 1:
        raise source.error("partial_rotary_factor", f"{fraction} is more than the whole head (1.0)")
    return theta, fraction


MAMBA2_KEYS = ("heads", "head_dim", "state", "groups", "conv", "expand", "bias", "conv_bias")


def mamba2(cfg: Config, dim: int, keys: dict[str, str], *, width: int | None, of: str = "") -> dict[str, Any]:
    """Mamba-2's settings from the family's keys (MAMBA2_KEYS -> its config keys). `width` None: the
    layer is heads x head_dim wide (Nemotron-H's mixer, whatever expand says); else the config's
    width (expand x hidden_size, Falcon-H1's mamba_d_ssm), which heads x head_dim must equal, as
    the family's own config check requires (`of`: where that width comes from, for the message).
    head_dim "auto" is width / heads."""
    # expand sizes nothing where the heads or the family's width do: kept for writing back
    n_heads = cfg.count(keys["heads"])
    factor = cfg.count(keys["expand"])
    if keys["head_dim"] not in cfg.data and cfg.defaults.get(keys["head_dim"]) == "auto":
        cfg.take_default(keys["head_dim"], "auto")
    if cfg.data.get(keys["head_dim"], cfg.defaults.get(keys["head_dim"])) == "auto" and width is not None:
        if width % n_heads:
            raise cfg.error(keys["heads"], f"{n_heads} heads do not divide the Mamba width {width}")
        per_head = width // n_heads
    else:
        per_head = cfg.count(
            keys["head_dim"], hint='a positive integer, or "auto" (the width / heads)' if width is not None else None
        )
    if width is not None and n_heads * per_head != width:
        raise cfg.error(
            keys["heads"],
            f"{n_heads} heads x {per_head} = {n_heads * per_head} channels, but the Mamba layers are {width} wide{of}",
            "heads x head width is the Mamba width",
        )
    return {
        "d_state": cfg.count(keys["state"]),
        "d_conv": cfg.count(keys["conv"]),
        "expand": factor,
        "head_dim": per_head,
        "heads": n_heads,
        "groups": cfg.count(keys["groups"]),
        "bias": cfg.flag(keys["bias"]),
        "conv_bias": cfg.flag(keys["conv_bias"]),
    }


def spec_data(
    cfg: Config,
    name: str,
    family: Family,
    dim: int,
    blocks: list[str],
    layers: dict[str, dict[str, Any]],
    *,
    tied: bool | None = None,
    note: str = "",
) -> dict[str, Any]:
    """The spec's data: only the symbols the stack uses get settings (madsl refuses the others)."""
    bare = [re.sub(r"\{[^}]*\}", "", block) for block in blocks]  # a layer's own settings (MiniMax's decay)
    used = {
        re.sub(r"#\w+", "", part).strip("[] ")  # a tag, Zs#s0, is no part of the symbol
        for block in bare
        for group in re.split("[->]", block)  # an injector, Zs#s0>M2, is a layer of its own
        for part in group.split("|")
    }
    source = f" ({Path(cfg.path).name})" if not cfg.path.startswith("<") else ""
    return {
        "name": name,
        "description": f"converted from {_article(family.title)} {family.title} config.json{source}{note}",
        "dim": dim,
        "vocab": cfg.count("vocab_size"),
        "tie_embeddings": tied if tied is not None else cfg.flag("tie_word_embeddings"),
        "norm": "rms",
        "channel_mixer": "none",
        "topology": compact(blocks),
        "layers": {symbol: params for symbol, params in layers.items() if symbol in used},
    }


def spelled(cfg: Config, key: str, *aliases: str) -> str:
    """The key a config states a value under, where transformers' class reads it under other names
    too (Nemotron-H's mamba_n_groups for n_groups): the first alias written, which the class reads
    over `key` (said where both are written and differ), else `key`."""
    alias = next((a for a in aliases if a in cfg.data), None)
    if alias is None:
        return key
    if key in cfg.data and cfg.data[key] != cfg.data[alias]:
        cfg.notes.append(f"{key} is not read: {cfg.config_owner} {cfg.config_class} reads {alias} over it")
    return alias


def ignored(cfg: Config, key: str, built: Any, what: str) -> None:
    """Where transformers' class ignores `key` (it builds `built`, whatever the config says), madsl
    follows the class: a note where the config says otherwise."""
    if key in cfg.data and cfg.data[key] != built:
        whose = f"{cfg.config_owner} {cfg.config_class}"
        cfg.notes.append(f"{key} = {shown_value(cfg.data[key])} is not read: {whose} {what}")


def _article(title: str) -> str:
    """ "an" before a vowel sound: a vowel, or an acronym's letter named with one (an LFM2, an xLSTM)."""
    spelled_out = title[:2].isupper() or title[0] == "x" and title[1:2].isupper()  # letters read one by one
    return "an" if title[0] in "AEIOU" or spelled_out and title[0] in "FHLMNRSXx" else "a"


# ---- the other direction: a spec's stack, one setting per layer kind -----------------------------------


class Stack:
    """A spec as the families write it, read from its plan: per block, the sequence mixers'
    primitives (several only where `parallel`, Falcon-H1's attention beside Mamba-2) and the
    channel mixer's (None: no channel mixer), and one setting per primitive kind. The plan must be
    a plain stack (`madsl.structure`); a layer's own settings are allowed where every layer of its
    kind has them, and settings named in `varying` may differ from layer to layer (MiniMax's
    per-layer decay: the family checks them in `layers`); `structures` names the structures beyond a
    plain stack that the family reads itself from `plan` (Zamba2's tags and injectors)."""

    def __init__(
        self,
        spec: Any,
        family: Family,
        *,
        parallel: bool = False,
        varying: frozenset[str] = frozenset(),
        norm: str = "rms",
        residual: bool = False,
        structures: frozenset[str] = frozenset(),
    ):
        self.spec, self.family, self.varying = spec, family, varying
        if not residual and (spec.postnorm or spec.factors_used()):  # `residual`: the family states both
            raise MadslError(
                f"{spec.name}: {family.title}'s layers add each part's output to the stream before its norm, "
                "unscaled; the spec has postnorm or residual_factors",
                hint="postnorm: false and no residual_factors",
            )
        if spec.norm != norm:
            kind = {"rms": "RMSNorm", "layer": "LayerNorm"}[norm]
            raise MadslError(f"{spec.name}: {family.title} uses {kind}; the spec has norm: {spec.norm}")
        if not spec.final_norm:
            raise MadslError(f"{spec.name}: {family.title} has a final norm; the spec has final_norm: false")
        if spec.vocab is None:
            raise MadslError(f"{spec.name}: a config.json states vocab_size", hint="set `vocab:` in the spec")
        allow = frozenset({SETTINGS, PARALLEL} if parallel else {SETTINGS}) | structures
        self.plan = plan = build_graph(spec)
        refuse_beyond_stack(plan, f"{family.title} config.json", allow=allow)
        self.blocks: list[tuple[tuple[Any, ...], Any]] = [
            (
                tuple(node["primitive"] for node in block.mixers),
                None if block.channel is None else block.channel["primitive"],
            )
            for block in plan_blocks(plan)
        ]
        self.layers = [(mixers[0], channel) for mixers, channel in self.blocks]
        self.kinds: dict[str, Any] = {}
        for mixers, channel in self.blocks:
            for prim in (*mixers, channel):
                if prim is not None:
                    self._one_setting(prim)

    def _one_setting(self, prim: Any) -> None:
        seen = self.kinds.setdefault(prim.name, prim)
        if seen != prim:
            changed = [k for k, v in prim.config().items() if seen.config()[k] != v and k not in self.varying]
            if not changed:  # only the settings the family gives each layer (`varying`) differ
                return
            raise MadslError(
                f"{self.spec.name}: two {prim.name} layers differ in {', '.join(changed)}; "
                f"a {self.family.title} config.json has one setting per layer kind"
            )

    def refuse_kinds(self, allowed: set[str], what: str) -> None:
        for name in self.kinds:
            if name not in allowed:
                raise MadslError(f"{self.spec.name}: {self.family.title} has no {name} layer", expected=what)
        mlp, family = self.kinds.get("swiglu"), self.family
        if mlp is not None and mlp.activation != family.mlp_activation:
            self.refuse(
                f"{family.title}'s gated MLPs gate with {family.mlp_activation}; the spec's Sg with {mlp.activation}",
                f"Sg activation: {family.mlp_activation}",
            )

    def refuse(self, reason: str, hint: str | None = None) -> None:
        raise MadslError(f"{self.spec.name}: {reason}", hint=hint)

    def refuse_moe_options(self, moe: Any, *allowed: str) -> None:
        """Refuse by name the MoE options (latent_width, shared_gate) the family's config.json cannot
        state, but those in `allowed`: never written without them."""
        for option, value in (("latent_width", moe.latent_width), ("shared_gate", moe.shared_gate)):
            if value and option not in allowed:
                self.refuse(
                    f"{self.family.title}'s config.json has no MoE {option} (the spec's MoE has {option}: "
                    f"{str(value).lower()})",
                    f"{option}: {0 if option == 'latent_width' else 'false'}",
                )

    def positions(self, role: int, name: str) -> list[int]:
        return [i for i, prims in enumerate(self.layers) if prims[role] is not None and prims[role].name == name]

    def common(self, model_type: str) -> dict[str, Any]:
        return {
            "model_type": model_type,
            "architectures": [self.family.architecture],
            "hidden_size": self.spec.dim,
            "num_hidden_layers": len(self.blocks),
            "vocab_size": self.spec.vocab,
            "tie_word_embeddings": self.spec.tie_embeddings,
        }

    def attention(self, *, rotary: bool | None, scaled: bool = False) -> dict[str, Any]:
        """The attention's heads, refused where the family cannot state it; `scaled`: the family
        states the softmax scale (Granite's attention_multiplier), so any scale is written."""
        a = self.kinds.get("attention")
        if a is None:
            return {}
        if a.window is not None:
            raise MadslError(
                f"{self.spec.name}: sliding-window attention (window={a.window}) is not written "
                f"to a {self.family.title} config.json",
                hint="window: null",
            )
        if rotary is not None and a.rotary != rotary:
            raise MadslError(
                f"{self.spec.name}: {self.family.title}'s attention "
                f"{'uses' if rotary else 'has no'} rotary position embeddings",
                hint=f"set rotary: {str(rotary).lower()} on the attention layers",
            )
        if (a.scale is not None and not scaled) or a.out_bias and not a.bias:
            self.refuse(
                f"{self.family.title}'s attention scales by 1 / sqrt(head_dim) and has a bias on every "
                "projection or none",
                "scale: null, out_bias: false",
            )
        return {"num_attention_heads": a.heads, "num_key_value_heads": a.key_value_heads}

    def mamba2(self, *, norm: bool = True) -> Any:
        """The spec's Mamba-2 (or None), refused where its norm is not the family's."""
        m = self.kinds.get("mamba2")
        if m is not None and m.norm != norm:
            self.refuse(
                f"{self.family.title}'s Mamba-2 layers {'have' if norm else 'have no'} the gated RMSNorm",
                f"set norm: {str(norm).lower()} on the M2 layers",
            )
        return m


def period(positions: list[int], n: int) -> tuple[int, int] | None:
    """(period, offset) with positions == [i < n: i % period == offset], the smallest period."""
    if not positions:
        return n + 1, n  # no such layer: a period longer than the stack
    for step in range(1, n + 1):
        offset = positions[0] % step
        if offset == positions[0] and [i for i in range(n) if i % step == offset] == positions:
            return step, offset
    return None

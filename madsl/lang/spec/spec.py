"""The Spec: a checked, resolved spec, and the questions asked of it.

`Spec.channel_for` and `Spec.primitive_for` say what a block's channel mixer and a layer
occurrence are; `Spec.canonical()` prints the one form of its model; `Spec.identity()` is what
determines that model, as plain data, `Spec.identity_text` that data as canonical JSON and
`Spec.hash` its SHA-256 (the spec's part of every run id). Specs are made by build.py.
"""

from __future__ import annotations

import hashlib
import json
import typing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from madsl.errors import Collector, MadslError, did_you_mean
from madsl.lang import budget as budgets
from madsl.lang import stdlib
from madsl.lang import topology as topo
from madsl.lang.spec.files import SourceMap
from madsl.lang.spec.init import InitFrom
from madsl.lang.spec.symbols import SymbolDef
from madsl.primitives.base import ConfigError, Primitive, WidthRelative

DEFAULT_SEQ_LEN = 128


@dataclass
class Spec:
    """A checked, resolved spec: the topology (parsed), the symbol table, the model-wide
    settings, budgets and eval settings. Made by `load_spec`, `spec_from_data` or
    `spec_from_topology`; `repr` is one line (name, topology, width, file)."""

    name: str
    dim: int
    topology_text: str
    topology: topo.Topology
    symbols: dict[str, SymbolDef]
    channel_mixer: str | None = "Sg"
    vocab: int | None = None
    seq_len: int = DEFAULT_SEQ_LEN
    norm: str = "rms"
    tie_embeddings: bool = True
    positions: str = "none"  # or "learned": absolute position embeddings (GPT-2, GPT-Neo)
    embedding_std: float = 0.02
    linear_std: float | None = None  # None: each layer's own init; a number: every Linear N(0, std)
    norm_eps: float = 1e-5  # the epsilon of every norm between layers and before the head
    # µP-style multipliers (Granite 4.0): the token embedding times embedding_scale, each block part's
    # output times residual_scale before its residual add, the logits divided by logit_divisor
    embedding_scale: float = 1.0
    residual_scale: float = 1.0
    # MiniMax's residual wiring: each block part's residual is its normed input (postnorm), and a part
    # whose layer is a symbol here joins as alpha * residual + beta * output ({symbol: (alpha, beta)})
    postnorm: bool = False
    residual_factors: dict[str, tuple[float, float]] = field(default_factory=dict)
    logit_divisor: float = 1.0
    logit_soft_cap: float | None = None  # the logits through cap * tanh(logits / cap) (xLSTM, Gemma)
    final_norm: bool = True  # false: the last block's output goes to the head unnormalised (seed 004's hybrids)
    embedding_norm: bool = False  # true: the token embedding normed before the first block (RWKV's ln0)
    meta_tokens: int = 0  # learned tokens prepended to every sequence, their outputs dropped (Hymba's)
    init: list[InitFrom] = field(default_factory=list)  # layers that start from saved weights (init.py)
    description: str = ""
    budget: dict[str, budgets.Bound] = field(default_factory=dict)
    budget_seq_len: int | None = None
    fit: list[str] = field(default_factory=list)  # free parameters `madsl fit` may set (budget.fit)
    eval: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    data: dict[str, Any] = field(default_factory=dict, repr=False)  # the merged YAML, to rebuild the spec
    source_map: SourceMap | None = field(default=None, repr=False)  # where things are written, for errors

    def __repr__(self) -> str:
        where = f", path={str(self.path)!r}" if self.path is not None else ""
        return f"Spec(name={self.name!r}, topology={self.topology_text!r}, dim={self.dim}{where})"

    def canonical(self) -> str:
        """The canonical topology (channel mixers equal to the default elided)."""
        return topo.canonical(resolve_channels(self))

    def symbols_used(self) -> list[str]:
        """The symbols the model is built from: every layer written in the topology plus
        the default channel mixer where a block falls back to it."""
        used = {layer.symbol for layer in topo.layers(self.topology)}
        used |= {
            channel.symbol for block in topo.blocks(self.topology) if (channel := self.channel_for(block)) is not None
        }
        return sorted(used & set(self.symbols))

    def identity(self) -> dict[str, Any]:
        """Everything that determines the model built from this spec, as plain data: the
        canonical topology, the model-wide settings and the resolved parameters of every
        symbol used. Name, description, budgets and eval section are not part of it, so a
        renamed or re-budgeted spec keeps its identity (and a results store its runs)."""
        return {
            "canonical": self.canonical(),
            "dim": self.dim,
            "vocab": self.vocab,
            "norm": self.norm,
            "tie_embeddings": self.tie_embeddings,
            "channel_mixer": self.channel_mixer,
            "layers": {
                s: {"primitive": self.symbols[s].primitive, "params": _identity_params(self.symbols[s], self.dim)}
                for s in self.symbols_used()
            },
            # model-wide options added later: named only off their defaults (existing identities hold)
            **{key: value for key, value, default in self.model_options() if value != default},
            # saved weights by their bytes, not their path
            **({"init": [entry.identity() for entry in self.init]} if self.init else {}),
        }

    @property
    def identity_text(self) -> str:
        """`identity()` as canonical JSON (keys sorted, no spaces): the text a results store
        records as the spec's identity, and hashes."""
        return json.dumps(self.identity(), sort_keys=True, separators=(",", ":"), default=_plain)

    @property
    def hash(self) -> str:
        """The SHA-256 (hex) of `identity_text`: the spec's part of every run id, equal for two
        specs that build the same model."""
        return hashlib.sha256(self.identity_text.encode()).hexdigest()

    def model_options(self) -> list[tuple[str, Any, Any]]:
        """(key, value, default) of the model-wide options that came after the first stored runs."""
        return [
            ("positions", self.positions, "none"),
            ("embedding_std", self.embedding_std, 0.02),
            ("linear_std", self.linear_std, None),
            ("final_norm", self.final_norm, True),
            ("embedding_norm", self.embedding_norm, False),
            ("meta_tokens", self.meta_tokens, 0),
            ("norm_eps", self.norm_eps, 1e-5),
            ("embedding_scale", self.embedding_scale, 1.0),
            ("residual_scale", self.residual_scale, 1.0),
            ("postnorm", self.postnorm, False),
            ("residual_factors", self.factors_used(), {}),
            ("logit_divisor", self.logit_divisor, 1.0),
            ("logit_soft_cap", self.logit_soft_cap, None),
        ]

    def factors_used(self) -> dict[str, dict[str, float]]:
        """residual_factors of the symbols the model uses, where not both 1 (those join as without)."""
        used = set(self.symbols_used())
        return {
            symbol: {"alpha": alpha, "beta": beta}
            for symbol, (alpha, beta) in sorted(self.residual_factors.items())
            if symbol in used and (alpha, beta) != (1.0, 1.0)
        }

    def topology_error(self, err: MadslError, span: topo.Span | None) -> MadslError:
        """`err`, which happened at `span` inside the topology string, located in the spec file."""
        if span is None or self.source_map is None:
            return topo.locate(err, span, self.topology_text)
        location = self.source_map.position(("topology",), span.line, span.column, span.length)
        return err.relocated(replace(location, topology_column=span.column))

    def channel_for(self, block: topo.Block) -> topo.Layer | None:
        """The channel mixer a block gets (the one answer to this question): the one written
        after '-', none for `-none`, else the spec's default channel mixer, unless every
        sequence mixer of the block mixes channels itself (Mamba)."""
        if block.channel is not None:
            return None if block.channel.symbol == topo.NO_CHANNEL else block.channel
        if self.channel_mixer is None or _mixes_both(self, block):
            return None
        return topo.Layer(self.channel_mixer)

    def free_parameter(self, item: str) -> tuple[str, str]:
        """`SYMBOL.param` -> (symbol, param), checked: a symbol the model uses and one of its
        integer hyperparameters (what `madsl fit` can search over)."""
        symbol, _, param = item.partition(".")
        if not param:
            raise MadslError(
                f"a free parameter is written SYMBOL.param, got {item!r}",
                hint="for example H.filter_states or Sg.inner",
            )
        used = self.symbols_used()
        if symbol not in used:
            raise MadslError(
                f"{item}: the topology does not use {symbol!r}",
                expected="a symbol of the topology: " + ", ".join(used),
                hint=did_you_mean(symbol, used),
            )
        fields = stdlib.primitives()[self.symbols[symbol].primitive].cls.fields()
        integers = [k for k, t in fields.items() if t is int or int in typing.get_args(t)]
        if param not in fields:
            raise MadslError(
                f"{item}: {symbol} ({self.symbols[symbol].primitive}) has no parameter {param!r}",
                expected="one of " + ", ".join(integers),
                hint=did_you_mean(param, integers),
            )
        if param not in integers:
            raise MadslError(
                f"{item}: only integer parameters can be solved for, and {param} is not one",
                expected="one of " + ", ".join(integers),
            )
        return symbol, param

    def definition_for(self, layer: topo.Layer) -> SymbolDef:
        """What the symbol of a layer occurrence means; an unknown symbol is an error at it."""
        definition = self.symbols.get(layer.symbol)
        if definition is None:
            raise self.topology_error(
                MadslError(
                    f"unknown layer {layer.symbol!r}",
                    expected="a layer symbol: " + ", ".join(sorted(self.symbols)),
                    hint=did_you_mean(layer.symbol, self.symbols)
                    or "define it under `layers:` with `primitive:` or `base:`",
                ),
                layer.span,
            )
        return definition

    def check_override_keys(self, layer: topo.Layer) -> None:
        """Every parameter written in `{...}` after a layer is one of its primitive's (all
        unknown ones raised at once). The symbol must be known."""
        definition = self.symbols[layer.symbol]
        defaults = stdlib.primitives()[definition.primitive].defaults
        key_spans = {k: ks for k, ks, _ in layer.override_spans}
        unknown = Collector()
        for key, _ in layer.overrides:
            if key not in defaults:
                err = MadslError(
                    f"{layer.symbol} ({definition.primitive}) has no parameter {key!r}",
                    expected="one of " + ", ".join(defaults),
                    hint=did_you_mean(key, defaults),
                )
                unknown.add(self.topology_error(err, key_spans.get(key, layer.span)))
        unknown.raise_any()

    def primitive_for(self, layer: topo.Layer) -> Primitive:
        """The primitive a layer occurrence stands for: symbol defaults + overrides, validated."""
        definition = self.definition_for(layer)
        self.check_override_keys(layer)
        config = {**definition.params, **dict(layer.overrides)}
        value_spans = {k: vs for k, _, vs in layer.override_spans}
        entry = stdlib.primitives()[definition.primitive]
        try:
            return create_primitive(entry, self.dim, config)
        except ConfigError as err:
            message = f"{layer.symbol}: {err.message}"
            if err.key in dict(layer.overrides):
                raise self.topology_error(
                    MadslError(message, hint=err.hint), value_spans.get(err.key, layer.span)
                ) from None
            if err.key in definition.where:
                raise MadslError(message, definition.where[err.key], hint=err.hint) from None
            raise self.topology_error(MadslError(message, hint=err.hint), layer.span) from None


def resolve_channels(spec: Spec) -> topo.Topology:
    """The expanded topology as one model has one form: overrides that restate a symbol's
    value dropped (`A{heads=1}` is `A` where A has one head) and every block's channel
    mixer elided when it is the one the block gets anyway (`H` and `H-Sg` under Sg)."""
    restated: dict[topo.Layer, topo.Layer] = {}

    def bare(layer: topo.Layer) -> topo.Layer:
        if layer not in restated:
            restated[layer] = _without_restated(spec, layer)
        return restated[layer]

    def fix(block: topo.Block) -> topo.Block:
        mixer = block.mixer
        mixer = (
            topo.Parallel(tuple(map(bare, mixer.branches)), mixer.span)
            if isinstance(mixer, topo.Parallel)
            else bare(mixer)
        )
        channel = bare(block.channel) if block.channel is not None else None
        if channel is not None and not channel.overrides and not channel.tag:
            # written as what the block would get anyway (`H-Sg` under Sg, `Mb-none`): elide it
            implied = spec.channel_for(topo.Block(mixer, None))
            if (implied.symbol if implied else topo.NO_CHANNEL) == channel.symbol:
                channel = None
        return topo.Block(mixer, channel, bare(block.inject) if block.inject is not None else None)

    return topo.map_blocks(topo.expand(spec.topology), fix)


def _without_restated(spec: Spec, layer: topo.Layer) -> topo.Layer:
    """The layer without the overrides whose value (as the primitive reads it: 10000 for a
    float is 10000.0) is the symbol's own."""
    definition = spec.symbols.get(layer.symbol)
    if not layer.overrides or definition is None:
        return layer
    entry = stdlib.primitives()[definition.primitive]
    resolved = spec.primitive_for(layer).config()
    try:
        own = create_primitive(entry, spec.dim, dict(definition.params)).config()
    except ConfigError:  # the symbol alone is invalid here (only its overrides make it valid)
        own = definition.params
    kept = tuple(
        (k, _as_read(v, resolved[k]))
        for k, v in layer.overrides
        if not (type(resolved[k]) is type(own.get(k)) and resolved[k] == own.get(k))
    )
    if len(kept) == len(layer.overrides) and all(type(k[1]) is type(o[1]) for k, o in zip(kept, layer.overrides)):
        return layer  # (== alone would take 2 for 2.0)
    return topo.Layer(layer.symbol, kept, layer.tag, layer.span)


def _as_read(written: Any, read: Any) -> Any:
    """A number as the primitive reads it (`heads=2.0` is the int 2, `rotary_base=20000` the float
    20000.0), so that two spellings of one value are one model, one identity; anything else as written."""
    numbers = (int, float)
    if type(written) in numbers and type(read) in numbers and type(written) is not type(read) and written == read:
        return read
    return written


def _identity_params(definition: "SymbolDef", dim: int) -> dict[str, Any]:
    """A symbol's parameters as its spec's identity holds them: width-relative defaults as their
    value at `dim` (what they were before they scaled), and without the parameters its
    primitive added later (`Primitive.identity_omits`) while they are at their stdlib default."""
    entry = stdlib.primitives()[definition.primitive]
    params = {
        k: v.resolve(k, dim) if isinstance(v, WidthRelative) else v
        for k, v in definition.params.items()
        if not (k in entry.cls.identity_omits and v == entry.defaults.get(k))
    }
    try:
        read = create_primitive(entry, dim, dict(definition.params)).config()
    except ConfigError:  # only the topology's overrides make the symbol valid: as written
        return params
    return {k: _as_read(v, read.get(k)) for k, v in params.items()}


def create_primitive(entry: Any, dim: int, config: dict[str, Any]) -> Primitive:
    """`entry.cls.create(dim, config)`, with an integer parameter written in float notation
    (`inner=1e3`, `inner: 1.0e3`) held to the integer limit of topologies and YAML: an exact
    integral value is read as that integer (1e3 is 1000, and prints so), and one past
    2^63 - 1 in size (`1e99`) is refused as an integer written out would be, not read as a
    100-digit integer that no canonical form could parse back."""
    fields = entry.cls.fields()
    for key, value in config.items():
        if (
            isinstance(value, float)
            and value.is_integer()
            and abs(value) > topo.MAX_INTEGER
            and _integer_only(fields.get(key))
        ):
            raise ConfigError(
                key,
                f"{entry.cls.name}: {key} must be an integer of at most {topo.MAX_INTEGER:,} in size, got {value!r}",
                hint="integers are 64-bit, as written out in full",
            )
    return entry.cls.create(dim, config)


def _integer_only(annotation: Any) -> bool:
    """Whether a primitive's field takes integers and no other numbers (int, int | None)."""
    options = typing.get_args(annotation) or (annotation,)
    return int in options and float not in options


def _mixes_both(spec: Spec, block: topo.Block) -> bool:
    mixers = block.mixer.branches if isinstance(block.mixer, topo.Parallel) else (block.mixer,)
    return all(m.symbol in spec.symbols and spec.symbols[m.symbol].role() == "both" for m in mixers)


def _plain(value: Any) -> Any:
    """A value of an identity that JSON has no type for: a number type's scalar as its number, a
    set in sorted order (the same reading as the results store's canonical JSON)."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"not JSON serializable: {value!r}")

"""Spec files (`.mad`, YAML) -> validated `Spec` objects.

Schema (every key is checked; unknown keys are errors, never ignored):

    name: str                       required
    description: str
    extends: path                   another spec, relative to this file; this one's keys win
    dim: int                        model width, required
    vocab: int                      vocabulary size (embedding and head); optional
    seq_len: int                    length used for KV cache and FLOP accounting (default 128)
    topology: str                   the topology string, required
    channel_mixer: SYMBOL | none    the channel mixer of blocks that name none (default Sg)
    norm: rms | layer               pre-norm kind (default rms)
    tie_embeddings: bool            output head shares the embedding (default true)
    layers: {SYMBOL: {...}}         override a symbol's parameters, or define a new symbol
                                    with `primitive: NAME` or `base: SYMBOL`
    budget: {QUANTITY: BOUND, seq_len: int}   see budget.py
    eval: {...}                     settings for `madsl eval` (checked by the runner)
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import budget as budgets
from . import stdlib
from . import topology as topo
from .errors import Location, MadslError, did_you_mean
from .primitives.base import ConfigError, Primitive
from .yamlsource import Located, load

SYMBOL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
DEFAULT_SEQ_LEN = 128

_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,), "description": (str,), "extends": (str,), "dim": (int,), "vocab": (int,),
    "seq_len": (int,), "topology": (str,), "channel_mixer": (str, type(None)), "norm": (str,),
    "tie_embeddings": (bool,), "layers": (dict,), "budget": (dict,), "eval": (dict,),
}
_REQUIRED = ("name", "dim", "topology")
_CHOICES = {"norm": ("rms", "layer")}
_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", dict: "a mapping",
               type(None): "none"}


@dataclass(frozen=True)
class SymbolDef:
    """What a symbol means in one spec: a primitive and its parameters (defaults applied)."""

    symbol: str
    primitive: str
    params: dict[str, Any]
    source: str  # provenance of the defaults, or "spec" for spec-defined symbols
    # where each parameter was last set in a spec file (for errors), by key
    where: dict[str, Location] = field(default_factory=dict, compare=False)

    def role(self) -> str:
        return stdlib.primitives()[self.primitive].cls.role


@dataclass
class Spec:
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
    description: str = ""
    budget: dict[str, budgets.Bound] = field(default_factory=dict)
    budget_seq_len: int | None = None
    eval: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    data: dict[str, Any] = field(default_factory=dict, repr=False)  # the merged YAML, to rebuild the spec
    # where things are written, for located errors
    topology_base: Location | None = None
    topology_style: str | None = None  # YAML scalar style of the topology: None, "'", '"', "|", ">"
    source_map: "SourceMap | None" = field(default=None, repr=False)

    def canonical(self) -> str:
        """The canonical topology (channel mixers equal to the default elided)."""
        return topo.canonical(resolve_channels(self))

    def symbols_used(self) -> list[str]:
        """The symbols the model is built from: every layer written in the topology plus
        the default channel mixer where a block falls back to it."""
        used = {layer.symbol for layer in topo.layers(self.topology)}
        used |= {channel.symbol for block in topo.blocks(self.topology)
                 if (channel := self.channel_for(block)) is not None}
        return sorted(used & set(self.symbols))

    def identity(self) -> dict[str, Any]:
        """Everything that determines the model built from this spec, as plain data: the
        canonical topology, the model-wide settings and the resolved parameters of every
        symbol used. Name, description, budgets and eval section are not part of it, so a
        renamed or re-budgeted spec keeps its identity (and a results store its runs)."""
        return {"canonical": self.canonical(), "dim": self.dim, "vocab": self.vocab, "norm": self.norm,
                "tie_embeddings": self.tie_embeddings, "channel_mixer": self.channel_mixer,
                "layers": {s: {"primitive": self.symbols[s].primitive, "params": _identity_params(self.symbols[s])}
                           for s in self.symbols_used()}}

    def topology_error(self, err: MadslError, span: topo.Span | None) -> MadslError:
        base = self.topology_base
        if base is None or base.line is None:
            return topo.locate(err, span, self.topology_text)
        if base.column is None and span is not None and self.source_map is not None:
            # a block scalar (`topology: |` or `>`): map the position back to the indented file lines
            line, column = base.line + span.line - 1, span.column
            if self.topology_style == ">":  # folded: the file's lines were joined by single spaces
                line = base.line
                while True:
                    content = self.source_map.line(base.file, line).strip()
                    if column <= len(content) + 1 or not content:
                        break
                    column -= len(content) + 1
                    line += 1
            text = self.source_map.line(base.file, line)
            indent = len(text) - len(text.lstrip(" "))
            return err.relocated(Location(base.file, line, indent + column, text, span.length, span.column))
        located = topo.locate(err, span, self.topology_text, base)
        loc = located.location
        if self.source_map is not None and loc.file is not None and loc.line is not None:
            located = located.relocated(Location(loc.file, loc.line, loc.column,
                                                 self.source_map.line(loc.file, loc.line), loc.length,
                                                 span.column if span is not None else None))
        return located

    def channel_for(self, block: topo.Block) -> topo.Layer | None:
        """The channel mixer a block gets (the one answer to this question): the one written
        after '-', none for `-none`, else the spec's default channel mixer, unless every
        sequence mixer of the block mixes channels itself (Mamba)."""
        if block.channel is not None:
            return None if block.channel.symbol == topo.NO_CHANNEL else block.channel
        if self.channel_mixer is None or _mixes_both(self, block):
            return None
        return topo.Layer(self.channel_mixer)

    def primitive_for(self, layer: topo.Layer) -> Primitive:
        """The primitive a layer occurrence stands for: symbol defaults + overrides, validated."""
        definition = self.symbols.get(layer.symbol)
        if definition is None:
            raise self.topology_error(MadslError(
                f"unknown layer {layer.symbol!r}", expected="a layer symbol: " + ", ".join(sorted(self.symbols)),
                hint=did_you_mean(layer.symbol, self.symbols) or
                "define it under `layers:` with `primitive:` or `base:`"), layer.span)
        config = dict(definition.params)
        key_spans = {k: ks for k, ks, _ in layer.override_spans}
        value_spans = {k: vs for k, _, vs in layer.override_spans}
        entry = stdlib.primitives()[definition.primitive]
        for key, value in layer.overrides:
            if key not in entry.defaults:
                err = MadslError(f"{layer.symbol} ({definition.primitive}) has no parameter {key!r}",
                                 expected="one of " + ", ".join(entry.defaults),
                                 hint=did_you_mean(key, entry.defaults))
                raise self.topology_error(err, key_spans.get(key, layer.span))
            config[key] = value
        try:
            return entry.cls.create(self.dim, config)
        except ConfigError as err:
            message = f"{layer.symbol}: {err.message}"
            if err.key in dict(layer.overrides):
                raise self.topology_error(MadslError(message, hint=err.hint),
                                          value_spans.get(err.key, layer.span)) from None
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
        mixer = topo.Parallel(tuple(map(bare, mixer.branches)), mixer.span) if isinstance(mixer, topo.Parallel) \
            else bare(mixer)
        channel = bare(block.channel) if block.channel is not None else None
        if channel is not None and not channel.overrides and not channel.tag:
            # written as what the block would get anyway (`H-Sg` under Sg, `Mb-none`): elide it
            implied = spec.channel_for(topo.Block(mixer, None))
            if (implied.symbol if implied else topo.NO_CHANNEL) == channel.symbol:
                channel = None
        return topo.Block(mixer, channel)

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
        own = entry.cls.create(spec.dim, dict(definition.params)).config()
    except ConfigError:  # the symbol alone is invalid here (only its overrides make it valid)
        own = definition.params
    kept = tuple((k, v) for k, v in layer.overrides
                 if not (type(resolved[k]) is type(own.get(k)) and resolved[k] == own.get(k)))
    return layer if len(kept) == len(layer.overrides) else topo.Layer(layer.symbol, kept, layer.tag, layer.span)


def _identity_params(definition: "SymbolDef") -> dict[str, Any]:
    """A symbol's parameters as its spec's identity holds them: without the parameters its
    primitive added later (`Primitive.identity_omits`) while they are at their stdlib default."""
    entry = stdlib.primitives()[definition.primitive]
    return {k: v for k, v in definition.params.items()
            if not (k in entry.cls.identity_omits and v == entry.defaults.get(k))}


def _mixes_both(spec: Spec, block: topo.Block) -> bool:
    mixers = block.mixer.branches if isinstance(block.mixer, topo.Parallel) else (block.mixer,)
    return all(m.symbol in spec.symbols and spec.symbols[m.symbol].role() == "both" for m in mixers)


# --- loading ---------------------------------------------------------------------------

def load_spec(path: str | Path, *, overrides: dict[str, Any] | None = None) -> Spec:
    """Load, merge (`extends:`), validate and resolve a spec file. Raises MadslError."""
    path = Path(path)
    data, source_map = _load_merged(path, chain=())
    if overrides:
        data.update(overrides)
    return _build(data, source_map, path)


def spec_from_data(data: dict[str, Any]) -> Spec:
    """A spec from already-merged data (e.g. stored with a saved model)."""
    return _build(dict(data), None, None)


def spec_from_topology(text: str, *, dim: int = 128, vocab: int | None = None,
                       seq_len: int = DEFAULT_SEQ_LEN, name: str = "topology",
                       channel_mixer: str | None = "Sg", layers: dict | None = None) -> Spec:
    """A spec made of a topology string and the stdlib defaults (`madsl compile -t`)."""
    data = {"name": name, "dim": dim, "topology": text, "seq_len": seq_len, "channel_mixer": channel_mixer}
    if vocab is not None:
        data["vocab"] = vocab
    if layers:
        data["layers"] = layers
    return _build(data, None, None)


class SourceMap:
    """Where each key and value of a (possibly `extends`-merged) spec is written:
    in this file if it sets the key, else in the spec it extends."""

    def __init__(self, located: Located, parent: "SourceMap | None"):
        self.located, self.parent = located, parent
        self.mine = set(_paths(located.data))

    def _owner(self, key_path: tuple) -> "SourceMap":
        if key_path in self.mine or self.parent is None:
            return self
        return self.parent._owner(key_path)

    def key(self, key_path: tuple) -> Location:
        return self._owner(key_path).located.key(key_path)

    def value(self, key_path: tuple) -> Location:
        return self._owner(key_path).located.value(key_path)

    def style(self, key_path: tuple) -> str | None:
        return self._owner(key_path).located.value_styles.get(key_path)

    def line(self, file: str, number: int) -> str:
        if self.located.file == file or self.parent is None:
            return self.located.line(number)
        return self.parent.line(file, number)


def _load_merged(path: Path, chain: tuple[Path, ...]) -> tuple[dict, SourceMap]:
    located = load(path)
    file_data = located.data
    if file_data is None:
        raise MadslError("the spec file is empty", Location(str(path), 1, 1, ""),
                         expected="a mapping with at least name, dim and topology")
    if not isinstance(file_data, dict):
        raise MadslError("a spec must be a YAML mapping", located.value(()),
                         expected="keys such as name, dim, topology")
    parent_data: dict = {}
    parent_map: SourceMap | None = None
    if "extends" in file_data:
        ref = file_data["extends"]
        if not isinstance(ref, str):
            raise MadslError("extends must be a path to another spec", located.value(("extends",)))
        parent = (path.parent / ref).resolve()
        if parent in chain or parent == path.resolve():
            raise MadslError(f"extends makes a cycle: {' -> '.join(str(p) for p in chain + (parent,))}",
                             located.value(("extends",)), hint="a spec cannot extend itself")
        if not parent.is_file():
            raise MadslError(f"extends names a spec that does not exist: {ref}", located.value(("extends",)),
                             hint=f"paths are relative to {path.parent}/")
        parent_data, parent_map = _load_merged(parent, chain + (path.resolve(),))
    merged = _merge(parent_data, {k: v for k, v in file_data.items() if k != "extends"})
    return merged, SourceMap(located, parent_map)


def _paths(data: Any, prefix: tuple = ()):
    if isinstance(data, dict):
        for key, value in data.items():
            yield prefix + (key,)
            yield from _paths(value, prefix + (key,))


def _merge(base: dict, over: dict) -> dict:
    """`extends` semantics: mappings merge key by key (layers per symbol), other values replace."""
    out = dict(base)
    for key, value in over.items():
        if key in ("layers", "budget", "eval") and isinstance(value, dict) and isinstance(out.get(key), dict):
            merged = dict(out[key])
            for sub, sub_value in value.items():
                if key == "layers" and isinstance(sub_value, dict) and isinstance(merged.get(sub), dict):
                    merged[sub] = {**merged[sub], **sub_value}
                else:
                    merged[sub] = sub_value
            out[key] = merged
        else:
            out[key] = value
    return out


def _build(data: dict, where: SourceMap | None, path: Path | None) -> Spec:
    def key_loc(*key_path) -> Location | None:
        return where.key(tuple(key_path)) if where else None

    def value_loc(*key_path) -> Location | None:
        return where.value(tuple(key_path)) if where else None

    for key in data:
        if key not in _TYPES:
            raise MadslError(f"unknown key {key!r}", key_loc(key),
                             expected="one of " + ", ".join(_TYPES), hint=did_you_mean(str(key), _TYPES))
    for key in _REQUIRED:
        if key not in data:
            raise MadslError(f"missing required key {key!r}", key_loc(),
                             hint=f"add `{key}: ...` to the spec" + (" (or to the spec it extends)" if path else ""))
    for key, value in data.items():
        allowed = _TYPES[key]
        if isinstance(value, bool) and bool not in allowed:
            ok = False
        else:
            ok = isinstance(value, allowed)
        if not ok:
            hint = None
            if key == "topology" and isinstance(value, (list, dict)):
                hint = "YAML reads [...] and {...} as lists and mappings: quote the topology, e.g. topology: '[H | mA]'"
            raise MadslError(f"{key} must be {' or '.join(_TYPE_NAMES[t] for t in allowed)}, got {value!r}",
                             value_loc(key), hint=hint)
        if key in _CHOICES and value not in _CHOICES[key]:
            raise MadslError(f"{key} must be one of {', '.join(_CHOICES[key])}, got {value!r}", value_loc(key),
                             hint=did_you_mean(str(value), _CHOICES[key]))
    for key in ("dim", "vocab", "seq_len"):
        if key in data and data[key] <= 0:
            raise MadslError(f"{key} must be a positive integer, got {data[key]}", value_loc(key))
    if not data["name"].strip():
        raise MadslError("name must not be empty", value_loc("name"))

    symbols = _symbol_table(data.get("layers") or {}, key_loc, value_loc)

    topology_base, style = None, None
    if where is not None:
        start = value_loc("topology")
        style = where.style(("topology",))
        if style in ("'", '"'):  # the string starts after its opening quote
            start = Location(start.file, start.line, start.column + 1, start.source_line)
        if style in ("|", ">"):  # block scalar: the text starts on the next line, indented
            start = Location(start.file, start.line + 1, None, None)
        topology_base = start

    text = data["topology"]
    spec = Spec(name=data["name"], dim=data["dim"], topology_text=text, topology=(), symbols=symbols,
                channel_mixer=data.get("channel_mixer", "Sg"), vocab=data.get("vocab"),
                seq_len=data.get("seq_len", DEFAULT_SEQ_LEN), norm=data.get("norm", "rms"),
                tie_embeddings=data.get("tie_embeddings", True), description=data.get("description", ""),
                eval=dict(data.get("eval") or {}), path=path, data=dict(data),
                topology_base=topology_base, topology_style=style, source_map=where)
    if spec.channel_mixer == topo.NO_CHANNEL:
        spec.channel_mixer = None
    try:
        spec.topology = topo.parse(text)
    except topo.TopologySyntaxError as err:
        raise spec.topology_error(err, err.span) from None

    if spec.channel_mixer is not None:
        if spec.channel_mixer not in symbols:
            raise MadslError(f"unknown channel mixer {spec.channel_mixer!r}", value_loc("channel_mixer"),
                             hint=did_you_mean(spec.channel_mixer, symbols) or "use a channel mixer symbol or none")
        if symbols[spec.channel_mixer].role() != "channel":
            raise MadslError(f"channel_mixer {spec.channel_mixer!r} is a {symbols[spec.channel_mixer].role()} "
                             f"mixer, not a channel mixer", value_loc("channel_mixer"),
                             hint="channel mixers: " + ", ".join(s for s, d in symbols.items()
                                                                if d.role() == "channel"))
    spec.budget, spec.budget_seq_len = _budget(data.get("budget") or {}, key_loc, value_loc)
    # every layer written in the topology must resolve (unknown symbols, bad overrides) at load time
    for layer in dict.fromkeys(topo.layers(spec.topology)):
        if layer.symbol != topo.NO_CHANNEL:
            spec.primitive_for(layer)
    return spec


def _symbol_table(layers: dict, key_loc, value_loc) -> dict[str, SymbolDef]:
    prims = stdlib.primitives()
    table: dict[str, SymbolDef] = {}
    for sym, entry in stdlib.symbols().items():
        params = {**prims[entry.primitive].defaults, **entry.params}
        table[sym] = SymbolDef(sym, entry.primitive, params, entry.source or prims[entry.primitive].source)

    pending = dict(layers)
    # symbols may be based on each other in any order; resolve until nothing changes
    while pending:
        progressed = False
        for sym in list(pending):
            body = pending[sym]
            sym_text = str(sym)
            if not isinstance(sym, str) or not SYMBOL_RE.match(sym) or sym == topo.NO_CHANNEL:
                raise MadslError(f"{sym_text!r} is not a valid layer symbol", key_loc("layers", sym),
                                 expected="a letter followed by letters, digits or '_' (and not 'none')")
            if body is None:
                body = {}
            if not isinstance(body, dict):
                raise MadslError(f"layers.{sym} must be a mapping of parameters, got {body!r}",
                                 value_loc("layers", sym), hint=f"e.g. `{sym}: {{heads: 4}}`")
            base_sym = body.get("base")
            if base_sym is not None and base_sym in pending and base_sym != sym:
                continue  # resolve the base first
            table[sym] = _symbol_def(sym, body, table, prims, key_loc, value_loc)
            del pending[sym]
            progressed = True
        if not progressed:
            sym = next(iter(pending))
            raise MadslError(f"layers.{sym}: `base:` symbols form a cycle ({', '.join(pending)})",
                             value_loc("layers", sym, "base"))
    return table


def _symbol_def(sym: str, body: dict, table: dict[str, SymbolDef], prims, key_loc, value_loc) -> SymbolDef:
    primitive = body.get("primitive")
    base_sym = body.get("base")
    if primitive is not None and base_sym is not None:
        raise MadslError(f"layers.{sym}: give either `primitive:` or `base:`, not both",
                         key_loc("layers", sym, "base"))
    where: dict[str, Location] = {}
    if base_sym is not None:
        if not isinstance(base_sym, str) or base_sym not in table:
            raise MadslError(f"layers.{sym}: unknown base symbol {base_sym!r}", value_loc("layers", sym, "base"),
                             hint=did_you_mean(str(base_sym), table))
        base = table[base_sym]
        primitive, params, source = base.primitive, dict(base.params), f"spec (based on {base_sym})"
        where.update(base.where)
    elif primitive is not None:
        if not isinstance(primitive, str) or primitive not in prims:
            raise MadslError(f"layers.{sym}: unknown primitive {primitive!r}",
                             value_loc("layers", sym, "primitive"),
                             expected="one of " + ", ".join(prims), hint=did_you_mean(str(primitive), prims))
        params, source = dict(prims[primitive].defaults), "spec"
        if sym in table and table[sym].primitive == primitive:
            params, source = dict(table[sym].params), table[sym].source
    elif sym in table:
        primitive, params, source = table[sym].primitive, dict(table[sym].params), table[sym].source
        where.update(table[sym].where)
    else:
        raise MadslError(f"layers.{sym}: a new symbol needs `primitive:` or `base:`", key_loc("layers", sym),
                         hint="e.g. `primitive: attention` or `base: mA`; primitives: " + ", ".join(prims)
                         + (f"; or did you mean the symbol {did_you_mean(sym, table)[14:-1]}?"
                            if did_you_mean(sym, table) else ""))
    defaults = prims[primitive].defaults
    for key, value in body.items():
        if key in ("primitive", "base"):
            continue
        if key == "source":
            source = str(value)
            continue
        if key not in defaults:
            raise MadslError(f"layers.{sym}: {primitive} has no parameter {key!r}", key_loc("layers", sym, key),
                             expected="one of " + ", ".join(defaults), hint=did_you_mean(str(key), defaults))
        params[key] = value
        where[key] = value_loc("layers", sym, key)
    return SymbolDef(sym, primitive, params, source, where)


def _budget(data: dict, key_loc, value_loc) -> tuple[dict[str, budgets.Bound], int | None]:
    bounds: dict[str, budgets.Bound] = {}
    seq_len = None
    for key, value in data.items():
        if key == "seq_len":
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise MadslError(f"budget.seq_len must be a positive integer, got {value!r}",
                                 value_loc("budget", key))
            seq_len = value
            continue
        if key not in budgets.QUANTITIES:
            raise MadslError(f"unknown budget {key!r}", key_loc("budget", key),
                             expected="one of " + ", ".join(budgets.QUANTITIES + ("seq_len",)),
                             hint=did_you_mean(str(key), budgets.QUANTITIES))
        try:
            bounds[key] = budgets.parse_bound(value)
        except budgets.BudgetError as err:
            raise MadslError(f"budget.{key}: {err}", value_loc("budget", key)) from None
    return bounds, seq_len

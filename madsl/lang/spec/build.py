"""Building a Spec: spec files or data -> a checked, resolved `Spec` (madsl.lang.spec.spec).

    load_spec(path)            a spec file, with what it `extends:` merged in
    spec_with(base, changes)   a loaded spec with top-level keys replaced (a sweep's variant)
    spec_from_data(data)       already-merged data (e.g. stored with a saved model)
    spec_from_topology(text)   a topology string and the stdlib defaults (`madsl compile -t`)

Every independent error is collected and raised together (`_build`): the top-level keys
(keys.py), the symbol table (symbols.py), the channel mixer, the topology and every layer it
uses, the unused `layers:` entries and the free parameters of `budget.fit`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from madsl.errors import Collector, MadslError, did_you_mean
from madsl.lang import stdlib
from madsl.lang import topology as topo
from madsl.lang.spec.files import Locator, SourceMap, load_merged
from madsl.lang.spec.init import parse_init
from madsl.lang.spec.keys import check_top_level, parse_budget
from madsl.lang.spec.spec import DEFAULT_SEQ_LEN, Spec, create_primitive
from madsl.lang.spec.symbols import SymbolDef, symbol_table
from madsl.primitives.base import ConfigError


def load_spec(path: str | Path, *, overrides: dict[str, Any] | None = None, named: bool = False) -> Spec:
    """Load, merge (`extends:`), validate and resolve a spec file. Raises MadslError.

    `named`: another file named this one (a sweep file's `specs:`), and it is held to the read
    policy of files.py: where it does not read as a spec, `files.NotASpec` is raised
    before any of its lines could be shown, for the namer to report at its own entry."""
    path = Path(path)
    data, source_map = load_merged(path, named=named)
    if overrides:
        data.update(overrides)
    return _build(data, source_map, path)


def spec_with(base: Spec, overrides: dict[str, Any]) -> Spec:
    """`base` (a spec loaded from its file) with top-level keys replaced, checked as a spec
    of its own (a sweep's variant): no file is read again."""
    return _build({**base.data, **overrides}, base.source_map, base.path)


def spec_from_data(data: dict[str, Any]) -> Spec:
    """A spec from already-merged data (e.g. stored with a saved model)."""
    return _build(dict(data), None, None)


def spec_from_topology(
    text: str,
    *,
    dim: int = 128,
    vocab: int | None = None,
    seq_len: int = DEFAULT_SEQ_LEN,
    name: str = "topology",
    channel_mixer: str | None = "Sg",
    layers: dict | None = None,
) -> Spec:
    """A spec made of a topology string and the stdlib defaults (`madsl compile -t`)."""
    data = {"name": name, "dim": dim, "topology": text, "seq_len": seq_len, "channel_mixer": channel_mixer}
    if vocab is not None:
        data["vocab"] = vocab
    if layers:
        data["layers"] = layers
    return _build(data, None, None)


def _build(data: dict, source_map: SourceMap | None, path: Path | None) -> Spec:
    """Check and resolve merged spec data. Independent problems are all collected and raised
    together (one MadslError, in file order); checks that an earlier error would make
    meaningless are skipped: nothing is resolved against a topology that does not parse, a
    width that is not a positive integer, or a symbol whose `layers:` entry is broken."""
    at = Locator(source_map)
    errors = Collector(str(path) if path is not None else None)
    unusable = check_top_level(data, at, errors, from_file=path is not None)
    layers = data.get("layers") if "layers" not in unusable else None
    symbols, broken = symbol_table(layers or {}, at, errors)
    spec = _spec_before_topology(data, unusable, symbols, path, source_map)
    if data.get("residual_factors") and "residual_factors" not in unusable:
        spec.residual_factors = _residual_factors(data["residual_factors"], symbols, at, errors)
    if "budget" not in unusable:
        spec.budget, spec.budget_seq_len, spec.fit = parse_budget(data.get("budget") or {}, at, errors)
    if "channel_mixer" not in unusable:
        with errors.check():
            _check_channel_mixer(spec, broken, at)
    _parse_topology(spec, errors)
    values_checkable = "dim" not in unusable  # without a valid width only names can be checked
    _check_topology_layers(spec, broken, values_checkable, errors)
    if values_checkable:
        _check_unused_symbols(spec, layers or {}, broken, at, errors)
    _check_fit(spec, broken, at, errors)
    if data.get("init") and "init" not in unusable:
        names = set(spec.symbols_used()) | {f"#{layer.tag}" for layer in topo.layers(spec.topology) if layer.tag}
        spec.init = parse_init(data["init"], names, at, errors, path)
    errors.raise_any()
    return spec


def _spec_before_topology(
    data: dict, unusable: set[str], symbols: dict[str, SymbolDef], path: Path | None, source_map: SourceMap | None
) -> Spec:
    """The spec's model-wide settings; its topology is not parsed yet (topology_text None: unusable)."""

    def usable(key: str, default: Any) -> Any:
        """The value of `key` where it is of its type and range, else its default: a wrong value is
        reported once (by check_top_level), and the checks after it run on something they can read."""
        return data.get(key, default) if key not in unusable else default

    text = data.get("topology") if "topology" not in unusable else None
    spec = Spec(
        name=str(data.get("name")),
        dim=data.get("dim"),
        topology_text=text,
        topology=(),
        symbols=symbols,
        channel_mixer=usable("channel_mixer", "Sg"),
        vocab=usable("vocab", None),
        seq_len=usable("seq_len", DEFAULT_SEQ_LEN),
        norm=usable("norm", "rms"),
        tie_embeddings=usable("tie_embeddings", True),
        description=usable("description", ""),
        eval=dict(usable("eval", None) or {}),
        path=path,
        data=dict(data),
        source_map=source_map,
    )
    # the model-wide options added later, where their values are usable (else their defaults)
    if "positions" not in unusable:
        spec.positions = data.get("positions", "none")
    if "embedding_std" not in unusable:
        spec.embedding_std = float(data.get("embedding_std", 0.02))
    if "linear_std" not in unusable and data.get("linear_std") is not None:
        spec.linear_std = float(data["linear_std"])
    if "final_norm" not in unusable:
        spec.final_norm = data.get("final_norm", True)
    if "embedding_norm" not in unusable:
        spec.embedding_norm = data.get("embedding_norm", False)
    if "meta_tokens" not in unusable:
        spec.meta_tokens = data.get("meta_tokens", 0)
    for key in ("norm_eps", "embedding_scale", "residual_scale", "logit_divisor", "logit_soft_cap"):
        if key not in unusable and data.get(key) is not None:
            setattr(spec, key, float(data[key]))
    if "postnorm" not in unusable:
        spec.postnorm = data.get("postnorm", False)
    if spec.channel_mixer == topo.NO_CHANNEL:
        spec.channel_mixer = None
    return spec


FACTORS = ("alpha", "beta")  # residual_factors: the residual's factor and the output's


def _residual_factors(
    data: dict, symbols: dict[str, SymbolDef], at: Locator, errors: Collector
) -> dict[str, tuple[float, float]]:
    """residual_factors: each symbol -> (alpha, beta), 1 where not written; every unknown symbol or
    key and every value that is not a finite number is an error at it (and that symbol left out)."""
    out = {}
    for symbol, factors in data.items():
        with errors.check():
            if symbol not in symbols:
                raise MadslError(
                    f"residual_factors: unknown layer {symbol!r}",
                    at.key("residual_factors", symbol),
                    hint=did_you_mean(str(symbol), symbols) or "a layer symbol of the spec",
                )
            if not isinstance(factors, dict) or not factors:
                raise MadslError(
                    f"residual_factors.{symbol} must be a mapping of alpha and beta, got {factors!r}",
                    at.value("residual_factors", symbol),
                    expected="{alpha: NUMBER, beta: NUMBER} (either may be left out: 1)",
                )
            for key, value in factors.items():
                if key not in FACTORS:
                    raise MadslError(
                        f"residual_factors.{symbol}: unknown factor {key!r}",
                        at.key("residual_factors", symbol, key),
                        expected="alpha (the residual's factor) or beta (the output's)",
                        hint=did_you_mean(str(key), FACTORS),
                    )
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(value) < float("inf"):
                    raise MadslError(
                        f"residual_factors.{symbol}.{key} must be a finite number, got {value!r}",
                        at.value("residual_factors", symbol, key),
                    )
            out[symbol] = (float(factors.get("alpha", 1.0)), float(factors.get("beta", 1.0)))
    return out


def _parse_topology(spec: Spec, errors: Collector) -> None:
    """spec.topology from its text; where that is missing or does not parse, every error so far is raised."""
    if spec.topology_text is not None:
        try:
            spec.topology = topo.parse(spec.topology_text)
            return
        except topo.TopologySyntaxError as err:  # nothing after it can be read: stop here
            errors.add(spec.topology_error(err, err.span))
    errors.raise_any()
    raise AssertionError("unreachable: a missing topology is an error")


def _check_topology_layers(spec: Spec, broken: set[str], values_checkable: bool, errors: Collector) -> None:
    """Every layer written in the topology must resolve (unknown symbols, bad overrides) at load time;
    without a valid width (not `values_checkable`), or for a symbol whose entry is broken, only names."""
    for layer in dict.fromkeys(topo.layers(spec.topology)):
        with errors.check():
            if layer.symbol == topo.NO_CHANNEL:
                _check_no_channel(spec, layer)
            elif layer.symbol in broken:
                if layer.symbol in spec.symbols:
                    spec.check_override_keys(layer)
            elif values_checkable:
                spec.primitive_for(layer)
            else:
                spec.definition_for(layer)
                spec.check_override_keys(layer)


def _check_fit(spec: Spec, broken: set[str], at: Locator, errors: Collector) -> None:
    """Every free parameter of budget.fit must name a parameter `madsl fit` can set."""
    for index, item in enumerate(spec.fit):
        if item.partition(".")[0] in broken:
            continue
        try:
            spec.free_parameter(item)
        except MadslError as err:
            errors.add(err.relocated(at.value("budget", "fit", index) or at.value("budget", "fit")))


def _check_channel_mixer(spec: Spec, broken: set[str], at: Locator) -> None:
    mixer, symbols = spec.channel_mixer, spec.symbols
    if mixer is None or mixer in broken:
        return
    if mixer not in symbols:
        raise MadslError(
            f"unknown channel mixer {mixer!r}",
            at.value("channel_mixer"),
            hint=did_you_mean(mixer, symbols) or "use a channel mixer symbol or none",
        )
    if symbols[mixer].role() != "channel":
        raise MadslError(
            f"channel_mixer {mixer!r} is a {symbols[mixer].role()} mixer, not a channel mixer",
            at.value("channel_mixer"),
            hint="channel mixers: " + ", ".join(s for s, d in symbols.items() if d.role() == "channel"),
        )


def _check_no_channel(spec: Spec, layer: topo.Layer) -> None:
    """`-none` is the absence of a channel mixer: nothing to parametrise or tag."""
    if layer.override_spans:
        key, key_span, _ = layer.override_spans[0]
        raise spec.topology_error(
            MadslError(f"none (no channel mixer) takes no parameters, got {key!r}", hint="remove the {...} after none"),
            key_span,
        )
    if layer.overrides:
        raise spec.topology_error(
            MadslError("none (no channel mixer) takes no parameters", hint="remove the {...} after none"), layer.span
        )
    if layer.tag:
        raise spec.topology_error(
            MadslError(
                f"none (no channel mixer) takes no tag, got #{layer.tag}",
                hint="tags name layers with weights to share; none has none",
            ),
            layer.span,
        )


def _check_unused_symbols(spec: Spec, layers: dict, broken: set[str], at: Locator, errors: Collector) -> None:
    """A `layers:` entry the topology does not use is still checked at the spec's width, so a
    typo in it is found now and not when the topology starts to use it. (A used symbol is checked
    with its topology overrides applied, which may be what makes it valid.)"""
    used = set(spec.symbols_used())
    for symbol in layers:
        if symbol in used or str(symbol) in broken:
            continue
        definition = spec.symbols[symbol]
        try:
            create_primitive(stdlib.primitives()[definition.primitive], spec.dim, dict(definition.params))
        except ConfigError as err:
            where = definition.where.get(err.key) or at.key("layers", symbol)
            errors.add(
                MadslError(
                    f"layers.{symbol}: {err.message}",
                    where,
                    hint=err.hint
                    or f"{symbol} is not used by the topology, but every symbol "
                    f"under layers: must be valid at dim {spec.dim}",
                )
            )

"""A spec's `init:` carried out: layers of a compiled model take a saved model's weights, and
frozen ones stop training (madsl/lang/spec/init.py reads the entries; docs/weights.md).

The saved model (madsl's model file format, madsl.compiler.load) is read as untrusted input and
built on its own; then each named part is copied tensor by tensor: the k-th use of a symbol or tag
from the saved model's k-th use (a spec with fewer uses takes the first ones), with the use's
pre-norm where both models give the use a norm of its own; `embedding` the token embedding,
`positions` the learned position table, `embedding_norm` and `final_norm` the norms after the
embedding and before the output layer. Every mismatch
(a use count, a tensor's name or shape) is a MadslError naming the entry, the layer and the tensor,
raised before the model is changed: nothing is initialised at random in place of what was asked.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from madsl.errors import MadslError
from madsl.paths import require_inside


def apply_init(model: Any, spec: Any, load: Callable[[Path], Any]) -> None:
    """Copy every `spec.init` entry's weights into `model` (compiled from `spec`) and freeze what
    the entries freeze; `load` reads a saved model folder (madsl.compiler.load)."""
    for index, entry in enumerate(spec.init):
        entry.require_files()
        for name in ("config.json", "model.safetensors"):
            require_inside(entry.folder / name, entry.folder, f"init[{index}].from")
        try:
            saved = load(entry.folder)
        except MadslError as err:
            raise MadslError(f"init[{index}]: {err.one_line()}", entry.where) from None
        pairs = [pair for name in entry.layers for pair in _pairs(model, saved, name, index, entry.where)]
        for target, source, what in pairs:  # every shape checked before anything is copied
            if source is not None:
                _check(target, source, what, index, entry.where)
        with torch.no_grad():
            for target, source, _ in pairs:
                if source is not None:
                    target.load_state_dict(source.state_dict())
        if entry.freeze:
            for target, _, _ in pairs:
                target.requires_grad_(False)


def frozen_parameters(model: nn.Module) -> int:
    """How many of `model`'s parameters do not train (each shared tensor once)."""
    return sum(p.numel() for p in model.parameters() if not p.requires_grad)


def _part(model: Any, name: str) -> nn.Module | None:
    """A model-level part, None where the model has none (no learned positions, no final norm)."""
    part = getattr(model, name)
    return None if isinstance(part, nn.Identity) else part


def _pairs(model: Any, saved: Any, name: str, index: int, where: Any) -> list[tuple[nn.Module, Any, str]]:
    """(the model's module, the saved model's or None where nothing is copied into it but it freezes
    with the rest, what it is) for one name of an entry."""
    if name in ("embedding", "positions", "embedding_norm", "final_norm"):
        target, source = (_part(m, name) for m in (model, saved))
        if target is None or source is None:
            whose = "the spec" if target is None else "the saved model"
            raise MadslError(f"init[{index}]: {whose} has no learned {name} to initialise from", where)
        return [(target, source, name)]
    uses, saved_uses = model.named_layers.get(name, []), saved.named_layers.get(name, [])
    if len(uses) > len(saved_uses):  # fewer take the saved model's first ones (seed 004's first layers)
        raise MadslError(
            f"init[{index}]: the spec uses {name} {len(uses)} time(s), the saved model only {len(saved_uses)}",
            where,
            hint="the k-th use takes the saved k-th use's weights: the spec may use it as often or less often",
        )
    target_units, source_units = _units(model), _units(saved)
    pairs = []
    for k, (layer, saved_layer) in enumerate(zip(uses, saved_uses)):
        unit, saved_unit = target_units.get(id(layer)), source_units.get(id(saved_layer))
        if unit is not None and saved_unit is not None:  # the use's own pre-norm comes with it
            pairs.append((unit, saved_unit, f"{name} (use {k + 1}, with its norm)"))
        else:
            pairs.append((layer, saved_layer, f"{name} (use {k + 1})"))
            if unit is not None:  # a norm the saved use lacks keeps its init, and is the use's to freeze
                pairs.append((unit.norm, None, f"{name} (use {k + 1})'s norm"))
    return pairs


def _units(model: nn.Module) -> dict[int, nn.Module]:
    """id(layer) -> the PreNorm holding it, for layers with a norm of their own."""
    from madsl.model_parts import PreNorm

    return {id(m.layer): m for m in model.modules() if isinstance(m, PreNorm)}


def _check(target: nn.Module, source: nn.Module, what: str, index: int, where: Any) -> None:
    mine, theirs = target.state_dict(), source.state_dict()
    for key in sorted(set(mine) | set(theirs)):
        if key not in theirs or key not in mine:
            whose = "the saved model's" if key not in theirs else "the spec's"
            raise MadslError(
                f"init[{index}]: {what}: {whose} layer has no tensor {key!r}",
                where,
                hint="the two layers are of different kinds or options: init copies a layer into one built alike",
            )
        if mine[key].shape != theirs[key].shape:
            raise MadslError(
                f"init[{index}]: {what}: tensor {key!r} is {list(theirs[key].shape)} in the saved model, "
                f"{list(mine[key].shape)} in the spec's",
                where,
                hint="build the spec's layer with the saved model's width and options",
            )

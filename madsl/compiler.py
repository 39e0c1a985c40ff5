"""Spec -> torch.nn.Module, by walking the same expanded topology the accounting walks.

Each layer is built by its primitive (`Primitive.build()`), so the module of a
layer and its accounting come from the same resolved hyperparameters. Weight
sharing: the first use of a tag builds the unit, later uses reuse the object.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import topology as topo
from .errors import MadslError
from .graph import account
from .model import Block, GroupConnection, Model, Parallel, PreNorm, make_norm
from .spec import Spec, load_spec, spec_from_data


class _Compiler:
    def __init__(self, spec: Spec):
        self.spec = spec
        self.tagged: dict[str, nn.Module] = {}
        # every built layer module under the names `freeze` accepts: its symbol and "#tag"
        self.named: dict[str, list[nn.Module]] = {}

    def unit(self, layer: topo.Layer) -> nn.Module:
        if layer.tag is not None and layer.tag in self.tagged:
            return self.tagged[layer.tag]
        unit = PreNorm(make_norm(self.spec.norm, self.spec.dim), self.layer(layer))
        if layer.tag is not None:
            self.tagged[layer.tag] = unit
        return unit

    def layer(self, layer: topo.Layer) -> nn.Module:
        prim = self.spec.primitive_for(layer)
        try:
            module = prim.build()
        except (ValueError, RuntimeError) as err:  # a combination the module cannot realise
            raise self.spec.topology_error(MadslError(f"{layer.symbol} cannot be compiled: {err}"),
                                           layer.span) from None
        self.named.setdefault(layer.symbol, []).append(module)
        if layer.tag is not None:
            self.named.setdefault(f"#{layer.tag}", []).append(module)
        return module

    def bare_layer(self, layer: topo.Layer) -> nn.Module:
        if layer.tag is not None:
            if layer.tag not in self.tagged:
                self.tagged[layer.tag] = self.layer(layer)
            return self.tagged[layer.tag]
        return self.layer(layer)

    def block(self, block: topo.Block) -> Block:
        spec = self.spec
        mixers = block.mixer.branches if isinstance(block.mixer, topo.Parallel) else (block.mixer,)
        if len(mixers) == 1:
            mixer: nn.Module = self.unit(mixers[0])
        else:
            mixer = Parallel(make_norm(spec.norm, spec.dim), [self.bare_layer(m) for m in mixers])
        channel_layer = spec.channel_for(block)
        return Block(mixer, self.unit(channel_layer) if channel_layer is not None else None)

    def nodes(self, nodes: topo.Topology) -> list[nn.Module]:
        out: list[nn.Module] = []
        for node in nodes:
            if isinstance(node, topo.Group):
                body = self.nodes(node.body)
                residual = dict(node.attrs).get("residual", "none")
                out.append(GroupConnection(body, residual, self.spec.dim) if residual != "none" else
                           nn.Sequential(*body))
            else:
                out.append(self.block(node))
        return out


def compile_spec(spec: Spec | str | Path, *, vocab_size: int | None = None, max_seq_len: int | None = None,
                 num_classes: int | None = None, device: str | torch.device | None = None,
                 seed: int = 0) -> Model:
    """Build the torch model of a spec. Initialisation is deterministic in `seed`."""
    if not isinstance(spec, Spec):
        spec = load_spec(spec)
    vocab_size = vocab_size or spec.vocab
    if vocab_size is None:
        raise MadslError(f"{spec.name}: compiling needs a vocabulary size",
                         hint="pass vocab_size=..., or set `vocab:` in the spec")
    account(spec)  # validates the whole topology (roles, tags) with located errors before building
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        compiler = _Compiler(spec)
        body = compiler.nodes(topo.expand(spec.topology))
        model = Model(body, spec.dim, vocab_size, num_classes or vocab_size, spec.norm, spec.tie_embeddings,
                      max_seq_len or spec.seq_len)
    model.spec = spec
    model.named_layers = compiler.named
    if device is not None:
        model = model.to(device)
    return model


def save(model: Model, path: str | Path) -> None:
    """Write spec + state_dict atomically; `load` rebuilds the model from it."""
    payload: dict[str, Any] = {
        "format": "madsl-model/1",
        "spec": model.spec.data,
        "canonical": model.spec.canonical(),
        "vocab_size": model.vocab_size,
        "num_classes": model.num_classes,
        "max_seq_len": model.max_seq_len,
        "state_dict": model.state_dict(),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load(path: str | Path, *, device: str | torch.device | None = None) -> Model:
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if payload.get("format") != "madsl-model/1":
        raise MadslError(f"{path} is not a saved madsl model")
    spec = spec_from_data(payload["spec"])
    model = compile_spec(spec, vocab_size=payload["vocab_size"], num_classes=payload["num_classes"],
                         max_seq_len=payload["max_seq_len"], device=device)
    model.load_state_dict(payload["state_dict"])
    return model

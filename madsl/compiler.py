"""Spec -> torch.nn.Module, by walking the plan the accounting reads (`madsl.graph.build_graph`).

Each layer is built by the resolved primitive its plan node holds (`Primitive.build()`),
so a layer's module and its accounting come from the same object. Weight sharing: the
first use of a tag builds the unit, later uses reuse the object.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import networkx as nx
import torch
from torch import nn

from .errors import MadslError
from .graph import build_graph, layer_nodes
from .model import Block, Fork, GroupConnection, Model, Parallel, PreNorm, Stack, make_norm, reinit_linears
from .outputs import temp_beside
from .spec import Spec, load_spec, spec_from_data


class _Compiler:
    """Builds the modules of a plan (`madsl.graph.build_graph`), node by node: each layer from
    the primitive its node holds, blocks in stack order, nested into the groups that enclose
    them. Weight sharing: the first use of a tag builds the unit, later uses reuse the object."""

    def __init__(self, spec: Spec, plan: nx.DiGraph):
        self.spec, self.plan = spec, plan
        self.tagged: dict[str, nn.Module] = {}
        # every built layer module under the names `freeze` accepts: its symbol and "#tag"
        self.named: dict[str, list[nn.Module]] = {}
        # (depth, module, std) of each group with a `linear_std`, applied after the model-wide init, outer first
        self.group_inits: list[tuple[int, nn.Module, float]] = []

    def layer(self, node: dict) -> nn.Module:
        layer = node["layer"]
        try:
            module = node["primitive"].build()
        except (ValueError, RuntimeError) as err:  # a combination the module cannot realise
            raise self.spec.topology_error(MadslError(f"{layer.symbol} cannot be compiled: {err}"),
                                           layer.span) from None
        self.named.setdefault(layer.symbol, []).append(module)
        if layer.tag is not None:
            self.named.setdefault(f"#{layer.tag}", []).append(module)
        return module

    def unit(self, node: dict) -> nn.Module:
        """The layer with its pre-norm."""
        tag = node["layer"].tag
        if tag is not None and tag in self.tagged:
            return self.tagged[tag]
        unit = PreNorm(make_norm(node["norm"], self.spec.dim), self.layer(node))
        if tag is not None:
            self.tagged[tag] = unit
        return unit

    def bare_layer(self, node: dict) -> nn.Module:
        """A parallel branch: the layer alone (the block owns the norm)."""
        tag = node["layer"].tag
        if tag is None:
            return self.layer(node)
        if tag not in self.tagged:
            self.tagged[tag] = self.layer(node)
        return self.tagged[tag]

    def block(self, nodes: list[dict]) -> Block:
        mixers = [n for n in nodes if n["slot"] == "sequence"]
        channels = [n for n in nodes if n["slot"] == "channel"]
        if len(mixers) == 1:
            mixer: nn.Module = self.unit(mixers[0])
        else:
            mixer = Parallel(make_norm(mixers[0]["norm"], self.spec.dim), [self.bare_layer(m) for m in mixers])
        return Block(mixer, self.unit(channels[0]) if channels else None)

    def body(self) -> list[nn.Module]:
        """The blocks in stack order, each group's blocks wrapped in its connection (a group of
        branches: each branch's blocks in a Stack, the branches in a Fork)."""
        groups: dict[int, dict] = self.plan.graph["groups"]
        by_block: dict[int, list[dict]] = {}
        for node in layer_nodes(self.plan):
            by_block.setdefault(node["row"].block, []).append(node)
        top: list[nn.Module] = []
        open_groups: list[tuple[int, list[nn.Module]]] = []  # outermost first

        def close() -> None:
            gid, members = open_groups.pop()
            attrs, dim = groups[gid], self.spec.dim
            if "branch" in attrs:  # one branch of a group of branches
                module: nn.Module = Stack(*members)
            else:
                if "branches" in attrs:
                    members = [Fork(members, attrs["split"], attrs["combine"], dim)]
                residual = attrs["residual"]
                if residual != "none":
                    module = GroupConnection(members, residual, dim)
                else:
                    module = members[0] if "branches" in attrs else Stack(*members)
                if "linear_std" in attrs:
                    self.group_inits.append((len(open_groups), module, float(attrs["linear_std"])))
            (open_groups[-1][1] if open_groups else top).append(module)

        for block in sorted(by_block):
            nodes = by_block[block]
            path = nodes[0]["row"].group_path
            while open_groups and [g for g, _ in open_groups] != list(path[:len(open_groups)]):
                close()
            for gid in path[len(open_groups):]:
                open_groups.append((gid, []))
            (open_groups[-1][1] if open_groups else top).append(self.block(nodes))
        while open_groups:
            close()
        return top


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
    # the plan: every layer resolved and validated (roles, tags: located errors) before anything is built
    plan = build_graph(spec, seq_len=max_seq_len or spec.seq_len, vocab=vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        compiler = _Compiler(spec, plan)
        body = compiler.body()
        model = Model(body, spec.dim, vocab_size, num_classes or vocab_size, spec.norm, spec.tie_embeddings,
                      max_seq_len or spec.seq_len, positions=spec.seq_len if spec.positions == "learned" else 0,
                      embedding_std=spec.embedding_std,
                      linear_std=spec.linear_std, final_norm=spec.final_norm)
        for _, module, std in sorted(compiler.group_inits, key=lambda entry: entry[0]):
            reinit_linears(module, std)
    model.spec = spec
    model.plan = plan  # the graph the model was built from (`madsl compile --emit dot` draws it)
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
    fd, tmp = temp_beside(path)
    os.close(fd)
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    except BaseException:  # a failed write leaves no partial file
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: str | Path, *, device: str | torch.device | None = None) -> Model:
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if payload.get("format") != "madsl-model/1":
        raise MadslError(f"{path} is not a saved madsl model")
    spec = spec_from_data(payload["spec"])
    model = compile_spec(spec, vocab_size=payload["vocab_size"], num_classes=payload["num_classes"],
                         max_seq_len=payload["max_seq_len"], device=device)
    model.load_state_dict(payload["state_dict"])
    return model

"""Reading a plan's structure (`madsl.graph`): the edges into and out of a node, its blocks, and
what it holds beyond a plain stack, with the one refusal of that which converters share.

A converter's target (a Megatron layer pattern, a Hugging Face config.json) writes a model as a
plain stack: one block after another, each a sequence mixer and its channel mixer, every layer
of a kind alike. `beyond_stack(plan)` walks a plan in stack order and yields each structure such
a stack lacks; `refuse_beyond_stack` raises a MadslError for the first one a target cannot
express. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import networkx as nx

from .errors import MadslError
from .lang import topology as topo


def sources(plan: nx.DiGraph, node: str, kind: str) -> list[str]:
    """The nodes that feed `node` along edges of `kind`, in branch order."""
    edges = [(u, data.get("branch", 0)) for u, _, data in plan.in_edges(node, data=True) if data["kind"] == kind]
    return [u for u, _ in sorted(edges, key=lambda edge: edge[1])]


def targets(plan: nx.DiGraph, node: str, kind: str) -> list[str]:
    """The nodes that `node` feeds along edges of `kind`, in branch order."""
    edges = [(v, data.get("branch", 0)) for _, v, data in plan.out_edges(node, data=True) if data["kind"] == kind]
    return [v for v, _ in sorted(edges, key=lambda edge: edge[1])]


@dataclass(frozen=True)
class PlanBlock:
    """One block of a plan, as its layer nodes' data: its sequence mixers (several: parallel
    mixers, in branch order) and its channel mixer (None: none)."""

    index: int
    mixers: tuple[dict[str, Any], ...]
    channel: dict[str, Any] | None
    inject: dict[str, Any] | None = None  # the injector written before `>` (Zs#a>M2); None: none


def plan_blocks(plan: nx.DiGraph) -> list[PlanBlock]:
    """The blocks of a plan (resolved, or a `plan_structure`) in stack order."""
    mixers: dict[int, list[dict[str, Any]]] = {}
    channels: dict[int, dict[str, Any]] = {}
    injects: dict[int, dict[str, Any]] = {}
    for _, node in plan.nodes(data=True):  # added in stack order
        if node["kind"] == "layer":
            if node.get("injects"):
                injects[node["block"]] = node
            elif node["slot"] == "channel":
                channels[node["block"]] = node
            else:
                mixers.setdefault(node["block"], []).append(node)
    return [PlanBlock(b, tuple(nodes), channels.get(b), injects.get(b)) for b, nodes in mixers.items()]


# the kinds of structure beyond a plain stack
GROUP = "group"  # a group with a connection, branches, a norm= or a linear_std=
PARALLEL = "parallel"  # parallel mixers, [A | Mb]
TAG = "tag"  # a tagged layer: one module for every use of the tag
SETTINGS = "settings"  # a layer's own settings, A{heads=2}
INJECT = "inject"  # an injector, Zs#a>M2: a layer whose output enters the next mixer's norm
KINDS = (GROUP, PARALLEL, TAG, SETTINGS, INJECT)


@dataclass(frozen=True)
class Structure:
    """One structure of a plan beyond a plain stack: its kind (KINDS), what it is as an error
    names it (`text`, plural when `plural`) and a hint where one helps."""

    kind: str
    text: str
    plural: bool = False
    hint: str | None = None


def _group(attrs: dict[str, Any]) -> Structure:
    if attrs["residual"] != "none":
        return Structure(GROUP, f"a group connection (residual={attrs['residual']})")
    if "branches" in attrs:
        return Structure(GROUP, "a group of branches (X | Y)")
    written = ", ".join(f"{key}={attrs[key]}" for key in ("norm", "linear_std") if key in attrs)
    return Structure(GROUP, f"a group's {written}")


def _layer(layer: topo.Layer) -> Iterator[Structure]:
    text = topo.layer_text(layer)
    if layer.tag is not None:
        yield Structure(TAG, f"{text!r}: shared tags (tied layers)", plural=True)
    if layer.overrides:
        yield Structure(
            SETTINGS, f"{text!r}: per-layer settings", plural=True, hint="write the values under `layers:` instead"
        )


def beyond_stack(plan: nx.DiGraph) -> Iterator[Structure]:
    """Every structure of a plan beyond a plain stack of blocks, in stack order: its groups
    (each at its entry), parallel mixers, injectors, tagged layers and layers with settings of their own."""
    for node_id, node in plan.nodes(data=True):  # added in stack order
        if node["kind"] == "group":
            yield _group(node["attrs"])
        elif node["kind"] == "sum":
            branches = [topo.layer_text(plan.nodes[u]["layer"]) for u in sources(plan, node_id, "branch")]
            yield Structure(PARALLEL, f"parallel mixers '[{' | '.join(branches)}]'", plural=True)
        elif node["kind"] == "layer":
            if node.get("injects"):
                yield Structure(INJECT, f"{topo.layer_text(node['layer'])!r}: injectors ('>')", plural=True)
            yield from _layer(node["layer"])


def refuse_beyond_stack(plan: nx.DiGraph, target: str, *, allow: frozenset[str] = frozenset()) -> None:
    """Raise a MadslError, "<spec>: <structure> has no <target>", for the plan's first structure
    beyond a plain stack whose kind is not in `allow` (what the target can express)."""
    for structure in beyond_stack(plan):
        if structure.kind not in allow:
            verb = "have" if structure.plural else "has"
            raise MadslError(f"{plan.graph['name']}: {structure.text} {verb} no {target}", hint=structure.hint)

"""The plan: a resolved spec as a networkx graph, and the accounting that reads it.

`build_graph(spec)` builds it in two steps. `plan_structure` (madsl/plan_layout.py) lays out the
expanded topology from its syntax alone: one node per layer occurrence and per point where the
residual stream forks or joins, and the edges between them. Then every layer node is resolved once (its primitive,
validated, with located errors for roles and tags; its cost; its `LayerRow`). Nodes are added in
stack order. What each node holds (`kind` and the keys beside it):

    "embedding", "head"      the model's ends; "final_norm" (kind "norm") before the head if the
                             spec has one
    layer   b{i}.mixer, b{i}.mixer{j} (parallel mixer j), b{i}.channel, b{i}.inject: a layer occurrence of
            block i: `slot` ("sequence" or "channel"), `layer` (the topology's Layer), `block`,
            `branch` (its index among parallel mixers, else None), `norm` (the kind of the
            pre-norm in front of it; an injector, `injects` True, has none); once resolved,
            `primitive` (resolved at the plan's length) and `row` (its LayerRow)
    sum     b{i}.sum: parallel mixers' outputs summed: `block`, `norm` (the one pre-norm the
            block owns and feeds to every branch)
    add     b{i}.add0, b{i}.add1: a block's residual add after its `part` ("mixer", "channel"):
            the part's output (a "data" edge) plus the part's input (a "residual" edge); `block`
    group   g{k}: where group k begins: `group`, `attrs` (its attributes, the defaults filled in:
            residual, split, combine; norm and linear_std where written; branches where it is a
            group of branches)
    split_*, combine_*   g{k}.split, g{k}.combine: a group of branches' splitter (feeding each
            branch) and combiner (joining them), the kind naming the projector: `group`, `entry`
    group_* g{k}.add, g{k}.gated, g{k}.none: where group k ends, its connection: the group's
            output (a "data" edge) joined to its input (a "group" edge from g{k}) as `residual`
            says (none: no join); `group`, `entry` (g{k})

Edges carry a `kind`: "data" (the residual stream), "residual" (a block's skip path), "branch"
(into and out of parallel mixers, and from each branch of a group of branches into its combiner;
with `branch`, the index), "group" (a group's connection), "inject" (into a block's injector from the
block's input, and from it into the mixer, or the sum of parallel mixers, whose pre-norm input it is
added to) and "shares" (a tagged layer's later uses to its first). Group ids number groups, and each
branch of a group of branches, in the order they open. The graph's own attributes: name, dim, seq_len,
vocab, blocks (their number) and parts (the model-level PartRows).

Both halves of madsl read this one graph: `account(spec)` sums it into an `Account` (one
row per layer, the model-level parts, totals), and the compiler (`madsl/compiler.py`)
builds the torch modules by walking it, so what is counted is what is built; the converters
and `madsl expand` read its structure too (`madsl/structure.py`: its blocks, its edges, and
what it holds beyond a plain stack). Shared
layers (`H#a`) count their parameters, and their active parameters, once (and each later use its
per-use parts, `Primitive.per_use_params`: Zamba2's adapters); state and FLOPs are per use. A plan is built at
one sequence length (the accounting's seq_len, `madsl.compile`'s max_seq_len), and a layer
hyperparameter written `seq_len` takes that length there; a spec's meta tokens lengthen what every
layer reads by their number. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from os import PathLike
from typing import Any

import networkx as nx

from .errors import MadslError
from .lang import topology as topo
from .lang.spec import Spec, load_spec
from .plan_layout import plan_structure
from .primitives.base import ConfigError, Cost, Primitive


@dataclass(frozen=True)
class LayerRow:
    index: int  # position in the expanded stack, 0-based
    block: int  # which block it belongs to
    node: str  # graph node id
    symbol: str
    primitive: str
    role: str  # "sequence", "channel", "both"
    config: dict[str, Any]
    params: int  # the layer's own parameters plus its pre-norm (0 for a repeated use of a shared tag)
    active_params: int  # of those, what one token's output reads (less than params for a routed layer)
    norm_params: int
    fixed_state: int
    conv_state: int
    kv_cache: int
    flops: int
    tag: str | None = None
    shared: bool = False  # True for the second and later uses of a tag
    branch: int | None = None  # index inside a parallel mixer
    derived: dict[str, Any] = field(default_factory=dict)  # sizes the primitive derives (e.g. inner_head_dim)

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "block": self.block,
            "symbol": self.symbol,
            "primitive": self.primitive,
            "role": self.role,
            "params": self.params,
            "active_params": self.active_params,
            "norm_params": self.norm_params,
            "fixed_state": self.fixed_state,
            "conv_state": self.conv_state,
            "kv_cache": self.kv_cache,
            "flops": self.flops,
            "tag": self.tag,
            "shared": self.shared,
            "branch": self.branch,
            "config": self.config,
            "derived": self.derived,
        }


@dataclass(frozen=True)
class PartRow:
    """A model-level part that is not a layer of the topology."""

    # "embedding", "positions", "embedding_norm", "meta_tokens", "final_norm", "head", "group_gate[g]",
    # "group_split[g]", "group_combine[g]"
    name: str
    params: int
    flops: int = 0

    @property
    def active_params(self) -> int:
        """Every token reads a model-level part (embedding and head count in both totals)."""
        return self.params

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "params": self.params, "active_params": self.active_params, "flops": self.flops}


@dataclass
class Account:
    spec: Spec
    seq_len: int
    vocab: int | None
    layers: list[LayerRow]
    parts: list[PartRow]
    graph: nx.DiGraph = field(repr=False)

    def __repr__(self) -> str:
        totals = ", ".join(f"{k}={v:,}" for k, v in self.totals.items())
        return f"Account({self.spec.name!r}, seq_len={self.seq_len}, {len(self.layers)} layers, {totals})"

    @property
    def totals(self) -> dict[str, int]:
        params = sum(r.params for r in self.layers) + sum(p.params for p in self.parts)
        return {
            "params": params,
            "active_params": sum(r.active_params for r in self.layers) + sum(p.active_params for p in self.parts),
            "fixed_state": sum(r.fixed_state for r in self.layers),
            "conv_state": sum(r.conv_state for r in self.layers),
            "kv_cache": sum(r.kv_cache for r in self.layers),
            # what inference keeps per sequence: the recurrent state and the KV cache at seq_len (the
            # MAD paper's "total state", STAR's cache objective); conv_state is stated apart
            "total_state": sum(r.fixed_state + r.kv_cache for r in self.layers),
            "flops": sum(r.flops for r in self.layers) + sum(p.flops for p in self.parts),
            # where the spec's init: freezes layers, the parameters that train and those that do not
            **(
                {"trainable_params": params - frozen, "frozen_params": frozen}
                if (frozen := self.frozen_params())
                else {}
            ),
        }

    def init_names(self, frozen: bool = False) -> set[str]:
        """The names (symbols, #tags, embedding, positions, embedding_norm, final_norm) the spec's
        `init:` initialises (only the frozen ones with `frozen`)."""
        return {name for entry in self.spec.init if entry.freeze or not frozen for name in entry.layers}

    def initialised(self, row: LayerRow | PartRow, frozen: bool = False) -> bool:
        """Whether `row` takes saved weights by the spec's `init:` (and stays frozen, with `frozen`)."""
        names = self.init_names(frozen)
        if isinstance(row, PartRow):
            return row.name in names
        return row.symbol in names or (row.tag is not None and f"#{row.tag}" in names)

    def frozen_params(self) -> int:
        """The parameters the spec's `init:` freezes: each frozen use with its own pre-norm (a
        shared tag's once), and the frozen model-level parts."""
        frozen = sum(part.params for part in self.parts if self.initialised(part, frozen=True))
        for row in self.layers:
            if self.initialised(row, frozen=True):  # a parallel branch's norm is its block's, and trains
                frozen += row.params - (row.norm_params if row.branch is not None and row.params else 0)
        return frozen

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.spec.name,
            "topology": self.spec.canonical(),
            "dim": self.spec.dim,
            "vocab": self.vocab,
            "seq_len": self.seq_len,
            "layers": [r.as_dict() for r in self.layers],
            "parts": [p.as_dict() for p in self.parts],
            "totals": self.totals,
        }


def norm_params(spec: Spec, kind: str | None = None) -> int:
    """A norm's parameters: RMSNorm a weight, LayerNorm a weight and a bias (kind: the spec's norm by default)."""
    return spec.dim * (2 if (kind or spec.norm) == "layer" else 1)


def projector_cost(kind: str, branches: int, dim: int, seq_len: int) -> tuple[int, int]:
    """(params, FLOPs) of a group's splitter or combiner: `res`, `gated` and `gated_soft` give each
    branch a Linear(dim, dim) with bias; `gated` adds a scalar gate per branch, `gated_soft` one
    for the pair; `copy` and `mean` have none."""
    if kind not in ("res", "gated", "gated_soft"):
        return 0, 0
    gates = {"gated": branches, "gated_soft": 1}.get(kind, 0)
    return branches * (dim * dim + dim) + gates, branches * 2 * seq_len * dim * dim


class _Resolver:
    """Resolves a laid-out plan's layer nodes in stack order: each layer's primitive (at the
    plan's length), its role against its slot, its tag against the tag's first use, its cost
    and its LayerRow, set on its node."""

    def __init__(self, spec: Spec, seq_len: int, plan: nx.DiGraph):
        self.spec, self.seq_len, self.plan = spec, seq_len, plan
        self.rows: list[LayerRow] = []
        self.tags: dict[str, tuple[topo.Layer, str]] = {}  # tag -> (first layer, its node)
        self.normed_tags: set[str] = set()  # tags whose pre-norm is counted (a use as a block's part)
        self.resolved: dict[topo.Layer, Primitive] = {}

    def primitive(self, layer: topo.Layer) -> Primitive:
        """The layer's primitive, built for this plan's sequence length: a hyperparameter written
        `seq_len` (the Hyena filters' filter_length) takes it (`Primitive.at_length`)."""
        if layer not in self.resolved:
            prim = self.spec.primitive_for(layer)
            try:
                prim = prim.at_length(self.seq_len)
            except ConfigError as err:
                written = ", ".join(prim.length_relative())
                raise self.spec.topology_error(
                    MadslError(
                        f"{layer.symbol}: {err.message} "
                        f"(built for sequence length {self.seq_len}: {written} = seq_len)",
                        hint=err.hint,
                    ),
                    layer.span,
                ) from None
            self.resolved[layer] = prim
        return self.resolved[layer]

    def check_tag(self, layer: topo.Layer) -> bool:
        """True when this use of a tag repeats an earlier one (its parameters are shared)."""
        if layer.tag is None:
            return False
        if layer.tag not in self.tags:
            return False
        first, _ = self.tags[layer.tag]
        if (first.symbol, first.overrides) != (layer.symbol, layer.overrides):
            raise self.spec.topology_error(
                MadslError(
                    f"tag #{layer.tag} is used for different layers: {topo.layer_text(first)} and "
                    f"{topo.layer_text(layer)}",
                    hint="a tag names one shared module; use another tag for a different layer",
                ),
                layer.span,
            )
        return True

    def check_role(self, layer: topo.Layer, prim: Primitive, slot: str) -> None:
        role = prim.role
        if slot == "sequence" and role == "channel":
            raise self.spec.topology_error(
                MadslError(
                    f"{layer.symbol} is a channel mixer ({prim.name}); it cannot stand in a sequence-mixer slot",
                    hint=f"pair it with a sequence mixer, e.g. H-{layer.symbol}",
                ),
                layer.span,
            )
        if slot == "channel" and role != "channel":
            raise self.spec.topology_error(
                MadslError(
                    f"{layer.symbol} is a {role} mixer ({prim.name}); after '-' comes a channel mixer",
                    hint="channel mixers: "
                    + ", ".join(s for s, d in self.spec.symbols.items() if d.role() == "channel"),
                ),
                layer.span,
            )

    def resolve(self, node_id: str) -> None:
        """Resolve one layer node (the next in stack order): set its `primitive` and `row`, and
        draw its "shares" edge from the tag's first use where it repeats a tag."""
        node = self.plan.nodes[node_id]
        layer, branch = node["layer"], node["branch"]
        prim = self.primitive(layer)
        self.check_role(layer, prim, node["slot"])
        shared = self.check_tag(layer)
        cost: Cost = prim.cost(self.seq_len)
        # a layer's pre-norm belongs to it (and is shared with its tag's later uses as a block's
        # part), except in a parallel block, where one norm owned by the block feeds every branch
        # (counted with the first): a tag first used as a branch gets its norm where it first stands alone
        if node.get("injects"):  # an injector reads the stream as it is (Zs normalizes its own input)
            owns_norm = False
        elif branch is None:
            owns_norm = layer.tag is None or layer.tag not in self.normed_tags
            if layer.tag is not None:
                self.normed_tags.add(layer.tag)
        else:
            owns_norm = branch == 0
        norm = norm_params(self.spec, node["norm"]) if owns_norm else 0
        row = LayerRow(
            index=len(self.rows),
            block=node["block"],
            node=node_id,
            symbol=layer.symbol,
            primitive=prim.name,
            role=prim.role,
            config=prim.config(),
            derived=prim.derived(),
            params=(prim.per_use_params() if shared else cost.params) + norm,
            active_params=(prim.per_use_params() if shared else cost.active_params) + norm,
            norm_params=norm,
            fixed_state=cost.fixed_state,
            conv_state=cost.conv_state,
            kv_cache=cost.kv_cache,
            flops=cost.flops,
            tag=layer.tag,
            shared=shared,
            branch=branch,
        )
        if shared:
            self.plan.add_edge(self.tags[layer.tag][1], node_id, kind="shares")
        elif layer.tag is not None:
            self.tags[layer.tag] = (layer, node_id)
        self.rows.append(row)
        node.update(primitive=prim, row=row)


def _group_parts(plan: nx.DiGraph, spec: Spec, seq_len: int) -> list[PartRow]:
    """The groups' own parameters, each group's at its exit (inner groups first): a group of
    branches' splitter and combiner, a gated connection's gate = sigmoid(Linear(dim, dim))."""
    d, parts = spec.dim, []
    for _, node in plan.nodes(data=True):
        if not node["kind"].startswith("group_"):
            continue
        gid, attrs = node["group"], plan.nodes[node["entry"]]["attrs"]
        if "branches" in attrs:
            for role in ("split", "combine"):
                params, flops = projector_cost(attrs[role], attrs["branches"], d, seq_len)
                if params:
                    parts.append(PartRow(f"group_{role}[{gid}]", params, flops))
        if attrs["residual"] == "gated":
            parts.append(PartRow(f"group_gate[{gid}]", d * d + d, 2 * seq_len * d * d))
    return parts


def _as_spec(spec: Spec | str | PathLike) -> Spec:
    return spec if isinstance(spec, Spec) else load_spec(spec)


def build_graph(spec: Spec | str | PathLike, *, seq_len: int | None = None, vocab: int | None = None) -> nx.DiGraph:
    """The plan of a spec (a Spec or the path of a .mad file) at `seq_len` (default: the spec's)
    and `vocab` (default: the spec's; without one, embedding and head are not counted).
    Raises located MadslErrors."""
    spec = _as_spec(spec)
    seq_len = seq_len or spec.seq_len
    vocab = vocab if vocab is not None else spec.vocab
    plan = plan_structure(spec.topology, channel_for=spec.channel_for, norm=spec.norm, final_norm=spec.final_norm)
    plan.graph.update(name=spec.name, dim=spec.dim, seq_len=seq_len, vocab=vocab)
    # the layers read the meta tokens ahead of the sequence: their state, cache and FLOPs are at that length
    resolver = _Resolver(spec, seq_len + spec.meta_tokens, plan)
    for node_id in [n for n, kind in plan.nodes(data="kind") if kind == "layer"]:
        resolver.resolve(node_id)
    d = spec.dim
    parts = []
    if vocab is not None:
        # MAD paper App. C.4.1 counts 4LDV FLOPs for the embedding layers (input and output)
        parts.append(PartRow("embedding", vocab * d, 4 * seq_len * d * vocab))
    if spec.positions == "learned":  # one per position up to the spec's seq_len, whatever the accounting length
        parts.append(PartRow("positions", spec.seq_len * d))
    if spec.embedding_norm:
        parts.append(PartRow("embedding_norm", norm_params(spec)))
    if spec.meta_tokens:
        parts.append(PartRow("meta_tokens", spec.meta_tokens * d))
    if spec.final_norm:
        parts.append(PartRow("final_norm", norm_params(spec)))
    if vocab is not None and not spec.tie_embeddings:
        parts.append(PartRow("head", vocab * d))
    plan.graph["parts"] = parts + _group_parts(plan, spec, seq_len + spec.meta_tokens)
    return plan


def layer_nodes(plan: nx.DiGraph) -> list[dict[str, Any]]:
    """The layer nodes' data in stack order (row.index)."""
    layers = [data for _, data in plan.nodes(data=True) if data.get("kind") == "layer"]
    return sorted(layers, key=lambda data: data["row"].index)


def account(spec: Spec | str | PathLike, *, seq_len: int | None = None, vocab: int | None = None) -> Account:
    """Analytic accounting of a spec (a Spec or the path of a .mad file): its plan
    (`build_graph`), summed."""
    spec = _as_spec(spec)
    plan = build_graph(spec, seq_len=seq_len, vocab=vocab)
    return account_plan(spec, plan)


def account_plan(spec: Spec, plan: nx.DiGraph) -> Account:
    """The accounting read from a plan built by `build_graph`."""
    return Account(
        spec,
        plan.graph["seq_len"],
        plan.graph["vocab"],
        [d["row"] for d in layer_nodes(plan)],
        list(plan.graph["parts"]),
        plan,
    )

"""The plan: a resolved spec as a networkx graph, and the accounting that reads it.

`build_graph(spec)` resolves every layer occurrence once (its primitive, validated,
with located errors for roles and tags) into a `networkx.DiGraph`: one node per layer
instance (its symbol, resolved primitive, cost, block, branch, enclosing groups), plus
nodes for the embedding, the parallel-branch sums, the residual adds, group connections,
the final norm and the head. Edges carry a `kind`: "data" (the main path), "residual" (a
block's skip path), "branch" (into/out of parallel mixers), "group" (a group's
connection) and "shares" (a tagged layer's later uses to its first).

Both halves of madsl read this one graph: `account(spec)` sums it into an `Account` (one
row per layer, the model-level parts, totals), and the compiler (`madsl/compiler.py`)
builds the torch modules by walking it, so what is counted is what is built. Shared
layers (`H#a`) count their parameters once; state and FLOPs are per use. A plan is built at
one sequence length (the accounting's seq_len, `madsl.compile`'s max_seq_len), and a layer
hyperparameter written `seq_len` takes that length there. No torch here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from os import PathLike
from typing import Any

import networkx as nx

from . import topology as topo
from .errors import MadslError
from .primitives.base import ConfigError, Cost, Primitive
from .spec import Spec, load_spec


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
    norm_params: int
    fixed_state: int
    conv_state: int
    kv_cache: int
    flops: int
    tag: str | None = None
    shared: bool = False  # True for the second and later uses of a tag
    branch: int | None = None  # index inside a parallel mixer
    group_path: tuple[int, ...] = ()  # ids of the attribute groups that enclose it
    derived: dict[str, Any] = field(default_factory=dict)  # sizes the primitive derives (e.g. inner_head_dim)

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "block": self.block, "symbol": self.symbol, "primitive": self.primitive,
                "role": self.role, "params": self.params, "norm_params": self.norm_params,
                "fixed_state": self.fixed_state, "conv_state": self.conv_state, "kv_cache": self.kv_cache,
                "flops": self.flops, "tag": self.tag, "shared": self.shared, "branch": self.branch,
                "config": self.config, "derived": self.derived}


@dataclass(frozen=True)
class PartRow:
    """A model-level part that is not a layer of the topology."""

    name: str  # "embedding", "positions", "final_norm", "head", "group_gate[g]", "group_split[g]", "group_combine[g]"
    params: int
    flops: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "params": self.params, "flops": self.flops}


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
        return {
            "params": sum(r.params for r in self.layers) + sum(p.params for p in self.parts),
            "fixed_state": sum(r.fixed_state for r in self.layers),
            "conv_state": sum(r.conv_state for r in self.layers),
            "kv_cache": sum(r.kv_cache for r in self.layers),
            "flops": sum(r.flops for r in self.layers) + sum(p.flops for p in self.parts),
        }

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


def _mixers(block: topo.Block) -> tuple[topo.Layer, ...]:
    return block.mixer.branches if isinstance(block.mixer, topo.Parallel) else (block.mixer,)


class _Builder:
    def __init__(self, spec: Spec, seq_len: int, vocab: int | None):
        self.spec, self.seq_len, self.vocab = spec, seq_len, vocab
        self.graph = nx.DiGraph(name=spec.name, dim=spec.dim, seq_len=seq_len, vocab=vocab)
        self.rows: list[LayerRow] = []
        self.parts: list[PartRow] = []
        self.tags: dict[str, tuple[topo.Layer, str]] = {}  # tag -> (first layer, its node)
        self.resolved: dict[topo.Layer, Primitive] = {}
        self.block_index = 0
        self.group_count = 0
        # group id -> its attributes (residual, split, combine, linear_std, the number of branches);
        # each branch of a group of branches is a group of its own: {"branch": index}
        self.groups: dict[int, dict[str, Any]] = {}

    def primitive(self, layer: topo.Layer) -> Primitive:
        """The layer's primitive, built for this plan's sequence length: a hyperparameter written
        `seq_len` (the Hyena filters' filter_length) takes it (`Primitive.at_length`)."""
        if layer not in self.resolved:
            prim = self.spec.primitive_for(layer)
            try:
                prim = prim.at_length(self.seq_len)
            except ConfigError as err:
                written = ", ".join(prim.length_relative())
                raise self.spec.topology_error(MadslError(
                    f"{layer.symbol}: {err.message} (built for sequence length {self.seq_len}: {written} = seq_len)",
                    hint=err.hint), layer.span) from None
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
            raise self.spec.topology_error(MadslError(
                f"tag #{layer.tag} is used for different layers: {topo.layer_text(first)} and "
                f"{topo.layer_text(layer)}", hint="a tag names one shared module; use another tag "
                                                  "for a different layer"), layer.span)
        return True

    def add_layer(self, layer: topo.Layer, role_slot: str, block: int, node_id: str,
                  group_path: tuple[int, ...], branch: int | None, with_norm: bool, norm_kind: str) -> LayerRow:
        prim = self.primitive(layer)
        role = prim.role
        if role_slot == "sequence" and role == "channel":
            raise self.spec.topology_error(MadslError(
                f"{layer.symbol} is a channel mixer ({prim.name}); it cannot stand in a sequence-mixer slot",
                hint=f"pair it with a sequence mixer, e.g. H-{layer.symbol}"), layer.span)
        if role_slot == "channel" and role != "channel":
            raise self.spec.topology_error(MadslError(
                f"{layer.symbol} is a {role} mixer ({prim.name}); after '-' comes a channel mixer",
                hint="channel mixers: " + ", ".join(s for s, d in self.spec.symbols.items()
                                                    if d.role() == "channel")), layer.span)
        shared = self.check_tag(layer)
        cost: Cost = prim.cost(self.seq_len)
        # a layer's pre-norm belongs to it (and is shared with it), except in a parallel
        # block, where one norm owned by the block feeds every branch
        norm_shared = shared and branch is None
        norm = 0 if norm_shared or not with_norm else norm_params(self.spec, norm_kind)
        row = LayerRow(index=len(self.rows), block=block, node=node_id, symbol=layer.symbol,
                       primitive=prim.name, role=role, config=prim.config(), derived=prim.derived(),
                       params=(0 if shared else cost.params) + norm, norm_params=norm,
                       fixed_state=cost.fixed_state, conv_state=cost.conv_state,
                       kv_cache=cost.kv_cache, flops=cost.flops, tag=layer.tag, shared=shared,
                       branch=branch, group_path=group_path)
        if layer.tag is not None and not shared:
            self.tags[layer.tag] = (layer, node_id)
        self.rows.append(row)
        self.graph.add_node(node_id, kind="layer", slot=role_slot, row=row, primitive=prim, layer=layer,
                            norm=norm_kind)
        if shared:
            self.graph.add_edge(self.tags[layer.tag][1], node_id, kind="shares")
        return row

    def add_block(self, block: topo.Block, prev: str, group_path: tuple[int, ...], norm_kind: str) -> str:
        b = self.block_index
        self.block_index += 1
        mixers = _mixers(block)
        channel = self.spec.channel_for(block)

        if len(mixers) == 1:
            mixer_out = f"b{b}.mixer"
            self.add_layer(mixers[0], "sequence", b, mixer_out, group_path, None, with_norm=True, norm_kind=norm_kind)
            self.graph.add_edge(prev, mixer_out, kind="data")
        else:
            # one pre-norm feeds every branch; their outputs are summed
            fan_in = f"b{b}.sum"
            self.graph.add_node(fan_in, kind="sum")
            for i, m in enumerate(mixers):
                node_id = f"b{b}.mixer{i}"
                self.add_layer(m, "sequence", b, node_id, group_path, i, with_norm=(i == 0), norm_kind=norm_kind)
                self.graph.add_edge(prev, node_id, kind="branch")
                self.graph.add_edge(node_id, fan_in, kind="branch")
            mixer_out = fan_in
        after_mixer = f"b{b}.add0"
        self.graph.add_node(after_mixer, kind="add")
        self.graph.add_edge(mixer_out, after_mixer, kind="data")
        self.graph.add_edge(prev, after_mixer, kind="residual")
        if channel is None:
            return after_mixer
        channel_node = f"b{b}.channel"
        self.add_layer(channel, "channel", b, channel_node, group_path, None, with_norm=True, norm_kind=norm_kind)
        self.graph.add_edge(after_mixer, channel_node, kind="data")
        out = f"b{b}.add1"
        self.graph.add_node(out, kind="add")
        self.graph.add_edge(channel_node, out, kind="data")
        self.graph.add_edge(after_mixer, out, kind="residual")
        return out

    def new_group(self, attrs: dict[str, Any]) -> int:
        gid = self.group_count
        self.group_count += 1
        self.groups[gid] = attrs
        return gid

    def add_fork(self, gid: int, fork: topo.Fork, prev: str, group_path: tuple[int, ...], norm_kind: str) -> str:
        """A group of branches: its splitter feeds each branch, its combiner joins their outputs."""
        attrs, d, n = self.groups[gid], self.spec.dim, len(fork.branches)
        split, combine = f"g{gid}.split", f"g{gid}.combine"
        self.graph.add_node(split, kind=f"split_{attrs['split']}", group=gid)
        self.graph.add_node(combine, kind=f"combine_{attrs['combine']}", group=gid)
        self.graph.add_edge(prev, split, kind="data")
        for i, branch in enumerate(fork.branches):
            bid = self.new_group({"branch": i})
            out = self.add_nodes(branch, split, group_path + (bid,), norm_kind)
            self.graph.add_edge(out, combine, kind="branch")
        for role in ("split", "combine"):
            params, flops = projector_cost(attrs[role], n, d, self.seq_len)
            if params:
                self.parts.append(PartRow(f"group_{role}[{gid}]", params, flops))
        return combine

    def add_nodes(self, nodes: topo.Topology, prev: str, group_path: tuple[int, ...], norm_kind: str) -> str:
        for node in nodes:
            if isinstance(node, topo.Group):
                attrs = {**topo.GROUP_DEFAULTS, **dict(node.attrs)}
                residual = attrs["residual"]
                inner_norm = attrs.get("norm", norm_kind)
                gid = self.new_group(attrs)
                if topo.is_forked(node):
                    attrs["branches"] = len(node.body[0].branches)
                    inner = self.add_fork(gid, node.body[0], prev, group_path + (gid,), inner_norm)
                else:
                    inner = self.add_nodes(node.body, prev, group_path + (gid,), inner_norm)
                if residual == "none":
                    prev = inner
                    continue
                joint = f"g{gid}.{residual}"
                self.graph.add_node(joint, kind=f"group_{residual}", group=gid)
                self.graph.add_edge(inner, joint, kind="data")
                self.graph.add_edge(prev, joint, kind="group")
                if residual == "gated":  # gate = sigmoid(Linear(dim, dim)) of the group's input
                    d = self.spec.dim
                    self.parts.append(PartRow(f"group_gate[{gid}]", d * d + d, 2 * self.seq_len * d * d))
                prev = joint
            else:
                prev = self.add_block(node, prev, group_path, norm_kind)
        return prev


def _as_spec(spec: Spec | str | PathLike) -> Spec:
    return spec if isinstance(spec, Spec) else load_spec(spec)


def build_graph(spec: Spec | str | PathLike, *, seq_len: int | None = None, vocab: int | None = None) -> nx.DiGraph:
    """The plan of a spec (a Spec or the path of a .mad file) at `seq_len` (default: the spec's)
    and `vocab` (default: the spec's; without one, embedding and head are not counted).
    Raises located MadslErrors."""
    spec = _as_spec(spec)
    seq_len = seq_len or spec.seq_len
    vocab = vocab if vocab is not None else spec.vocab
    b = _Builder(spec, seq_len, vocab)
    b.graph.add_node("embedding", kind="embedding")
    last = b.add_nodes(topo.expand(spec.topology), "embedding", (), spec.norm)
    if spec.final_norm:
        b.graph.add_node("final_norm", kind="norm")
        b.graph.add_edge(last, "final_norm", kind="data")
        last = "final_norm"
    b.graph.add_node("head", kind="head")
    b.graph.add_edge(last, "head", kind="data")
    d = spec.dim
    parts = []
    if vocab is not None:
        # MAD paper App. C.4.1 counts 4LDV FLOPs for the embedding layers (input and output)
        parts.append(PartRow("embedding", vocab * d, 4 * seq_len * d * vocab))
    if spec.positions == "learned":  # one per position up to the spec's seq_len, whatever the accounting length
        parts.append(PartRow("positions", spec.seq_len * d))
    if spec.final_norm:
        parts.append(PartRow("final_norm", norm_params(spec)))
    if vocab is not None and not spec.tie_embeddings:
        parts.append(PartRow("head", vocab * d))
    b.graph.graph.update(parts=parts + b.parts, groups=b.groups, blocks=b.block_index)
    return b.graph


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
    return Account(spec, plan.graph["seq_len"], plan.graph["vocab"], [d["row"] for d in layer_nodes(plan)],
                   list(plan.graph["parts"]), plan)

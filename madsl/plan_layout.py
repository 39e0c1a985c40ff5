"""A topology's structure as a plan graph, from its syntax alone (`plan_structure`): the first of
`madsl.graph.build_graph`'s two steps. One node per layer occurrence and per point where the
residual stream forks or joins, and the edges between them (the node and edge kinds are
madsl/graph.py's docstring); symbols are not looked up and nothing is resolved. No torch here.
"""

from __future__ import annotations

from typing import Callable

import networkx as nx

from .lang import topology as topo


def _mixers(block: topo.Block) -> tuple[topo.Layer, ...]:
    return block.mixer.branches if isinstance(block.mixer, topo.Parallel) else (block.mixer,)


def written_channel(block: topo.Block) -> topo.Layer | None:
    """A block's channel mixer as the topology writes it, without a spec's default: None where it
    writes none after the mixer, the layer `none` where it writes `-none`."""
    return block.channel


class _Layout:
    """Lays out an expanded topology's structure in a plan graph (the node and edge kinds of
    madsl/graph.py's docstring), from its syntax alone: which channel mixer a block gets is asked of
    `channel_for`. Every method takes the pre-norm kind of where it lays out (`norm`)."""

    def __init__(self, graph: nx.DiGraph, channel_for: Callable[[topo.Block], topo.Layer | None]):
        self.graph, self.channel_for = graph, channel_for
        self.block_count = 0
        self.group_count = 0

    def layer(self, node: str, layer: topo.Layer, slot: str, block: int, branch: int | None, norm: str) -> None:
        """A layer occurrence, unresolved (`_Resolver` adds its primitive and row)."""
        self.graph.add_node(node, kind="layer", slot=slot, layer=layer, block=block, branch=branch, norm=norm)

    def join(self, block: int, part: str, part_out: str, part_in: str) -> str:
        """The residual add after a block's part: the part's output plus its input."""
        node = f"b{block}.add{0 if part == 'mixer' else 1}"
        self.graph.add_node(node, kind="add", block=block, part=part)
        self.graph.add_edge(part_out, node, kind="data")
        self.graph.add_edge(part_in, node, kind="residual")
        return node

    def block(self, block: topo.Block, prev: str, norm: str) -> str:
        """A block after `prev`: its mixer (or parallel mixers, summed) and its channel mixer,
        each a pre-norm residual part, and its injector if it has one. Returns its output node."""
        b = self.block_count
        self.block_count += 1
        if block.inject is not None:  # laid out first: it runs before the mixer
            self.layer(f"b{b}.inject", block.inject, "sequence", b, None, norm)
            self.graph.nodes[f"b{b}.inject"]["injects"] = True
            self.graph.add_edge(prev, f"b{b}.inject", kind="inject")
        mixers = _mixers(block)
        if len(mixers) == 1:
            mixer_out = f"b{b}.mixer"
            self.layer(mixer_out, mixers[0], "sequence", b, None, norm)
            self.graph.add_edge(prev, mixer_out, kind="data")
        else:  # one pre-norm, owned by the block, feeds every branch; their outputs are summed
            mixer_out = f"b{b}.sum"
            self.graph.add_node(mixer_out, kind="sum", block=b, norm=norm)
            for i, mixer in enumerate(mixers):
                node = f"b{b}.mixer{i}"
                self.layer(node, mixer, "sequence", b, i, norm)
                self.graph.add_edge(prev, node, kind="branch", branch=i)
                self.graph.add_edge(node, mixer_out, kind="branch", branch=i)
        if block.inject is not None:  # read from the block's input, added to the input of the mixer's norm
            self.graph.add_edge(f"b{b}.inject", mixer_out, kind="inject")
        out = self.join(b, "mixer", mixer_out, prev)
        channel = self.channel_for(block)
        if channel is None:
            return out
        channel_node = f"b{b}.channel"
        self.layer(channel_node, channel, "channel", b, None, norm)
        self.graph.add_edge(out, channel_node, kind="data")
        return self.join(b, "channel", channel_node, out)

    def new_group(self) -> int:
        gid = self.group_count
        self.group_count += 1
        return gid

    def group(self, group: topo.Group, prev: str, norm: str) -> str:
        """A group after `prev`: its entry, its body (a sequence, or the branches of a fork) and
        its exit, the connection. Returns the exit."""
        gid = self.new_group()
        attrs = {**topo.GROUP_DEFAULTS, **dict(group.attrs)}
        entry = f"g{gid}"
        self.graph.add_node(entry, kind="group", group=gid, attrs=attrs)
        self.graph.add_edge(prev, entry, kind="data")
        inner_norm = attrs.get("norm", norm)
        if topo.is_forked(group):
            attrs["branches"] = len(group.body[0].branches)
            inner = self.fork(gid, group.body[0], entry, inner_norm)
        else:
            inner = self.sequence(group.body, entry, inner_norm)
        residual = attrs["residual"]
        exit_node = f"g{gid}.{residual}"
        self.graph.add_node(exit_node, kind=f"group_{residual}", group=gid, entry=entry)
        self.graph.add_edge(inner, exit_node, kind="data")
        if residual != "none":
            self.graph.add_edge(entry, exit_node, kind="group")
        return exit_node

    def fork(self, gid: int, fork: topo.Fork, entry: str, norm: str) -> str:
        """A group of branches: its splitter feeds each branch, its combiner joins their outputs."""
        attrs = self.graph.nodes[entry]["attrs"]
        split, combine = f"g{gid}.split", f"g{gid}.combine"
        self.graph.add_node(split, kind=f"split_{attrs['split']}", group=gid, entry=entry)
        self.graph.add_node(combine, kind=f"combine_{attrs['combine']}", group=gid, entry=entry)
        self.graph.add_edge(entry, split, kind="data")
        for i, branch in enumerate(fork.branches):
            self.new_group()  # each branch numbers as a group of its own
            out = self.sequence(branch, split, norm)
            self.graph.add_edge(out, combine, kind="branch", branch=i)
        return combine

    def sequence(self, nodes: topo.Topology, prev: str, norm: str) -> str:
        """Blocks and groups one after the other from `prev`; returns the last one's output."""
        for node in nodes:
            prev = self.group(node, prev, norm) if isinstance(node, topo.Group) else self.block(node, prev, norm)
        return prev


def plan_structure(
    topology: topo.Topology,
    *,
    channel_for: Callable[[topo.Block], topo.Layer | None] = written_channel,
    norm: str = "rms",
    final_norm: bool = False,
) -> nx.DiGraph:
    """The structure of a topology as a plan graph, from its syntax alone: embedding, the
    expanded topology's layer, join and group nodes (symbols not looked up, nothing resolved),
    the final norm if `final_norm`, and the head. `channel_for` gives each block's channel mixer
    (default: as written), `norm` the pre-norm kind outside groups that set one."""
    graph = nx.DiGraph()
    graph.add_node("embedding", kind="embedding")
    layout = _Layout(graph, channel_for)
    last = layout.sequence(topo.expand(topology), "embedding", norm)
    if final_norm:
        graph.add_node("final_norm", kind="norm")
        graph.add_edge(last, "final_norm", kind="data")
        last = "final_norm"
    graph.add_node("head", kind="head")
    graph.add_edge(last, "head", kind="data")
    graph.graph["blocks"] = layout.block_count
    return graph

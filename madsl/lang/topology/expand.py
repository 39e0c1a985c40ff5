"""Walking a topology: its size, its expansion (repeats unrolled, groups without attributes
flattened: the architecture's one true shape), its blocks and its layers.
"""

from __future__ import annotations

from typing import Iterator

from madsl.lang.topology.nodes import Block, Fork, Group, Layer, Node, Parallel, Repeat, Topology


def size(topology: Topology) -> int:
    """Number of blocks after expansion (a parallel block counts once per branch, an injector once),
    computed without expanding."""
    total = 0
    for node in topology:
        if isinstance(node, Repeat):
            total += node.count * size((node.node,))
        elif isinstance(node, Group):
            total += size(node.body)
        elif isinstance(node, Fork):
            total += sum(size(branch) for branch in node.branches)
        else:
            total += (len(node.mixer.branches) if isinstance(node.mixer, Parallel) else 1) + (node.inject is not None)
    return total


def expand(topology: Topology) -> Topology:
    """Unroll repeats and flatten groups without attributes (a group of branches stays)."""
    out: list[Node] = []
    for node in topology:
        out.extend(_expand_node(node))
    return tuple(out)


def _expand_node(node: Node) -> Iterator[Node]:
    if isinstance(node, Repeat):
        inner = list(_expand_node(node.node))
        for _ in range(node.count):
            yield from inner
    elif isinstance(node, Group):
        body = expand(node.body)
        if node.attrs or is_forked(node):
            yield Group(body, node.attrs, node.span)
        else:
            yield from body
    elif isinstance(node, Fork):
        yield Fork(tuple(expand(branch) for branch in node.branches))
    else:
        yield node


def is_forked(group: Group) -> bool:
    """Whether a group is a group of branches, `(X | Y)`."""
    return len(group.body) == 1 and isinstance(group.body[0], Fork)


def blocks(topology: Topology) -> Iterator[Block]:
    """Every block of the expanded topology, in order (descending into groups)."""
    for node in expand(topology):
        if isinstance(node, Group):
            yield from blocks(node.body)
        elif isinstance(node, Fork):
            for branch in node.branches:
                yield from blocks(branch)
        else:
            yield node


def layers(topology: Topology) -> Iterator[Layer]:
    """Every layer occurrence as written (not expanded), for error checking."""
    for node in topology:
        if isinstance(node, Repeat):
            yield from layers((node.node,))
        elif isinstance(node, Group):
            yield from layers(node.body)
        elif isinstance(node, Fork):
            for branch in node.branches:
                yield from layers(branch)
        else:
            if node.inject is not None:
                yield node.inject
            yield from (node.mixer.branches if isinstance(node.mixer, Parallel) else (node.mixer,))
            if node.channel is not None:
                yield node.channel


def map_blocks(topology: Topology, fn) -> Topology:
    """Apply fn to every block of an expanded topology, keeping groups."""
    out = []
    for node in topology:
        if isinstance(node, Group):
            out.append(Group(map_blocks(node.body, fn), node.attrs, node.span))
        elif isinstance(node, Fork):
            out.append(Fork(tuple(map_blocks(branch, fn) for branch in node.branches)))
        elif isinstance(node, Repeat):
            out.append(Repeat(map_blocks((node.node,), fn)[0], node.count))
        else:
            out.append(fn(node))
    return tuple(out)

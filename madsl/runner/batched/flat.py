"""A stack's trainable parameters as flat tensors, one set per optimizer group (`FlatParameters`): what
lets a stacked group's AdamW (`madsl.runner.batched.stacked`) be a few ops per group, and its
backward add into gradients that live as long as the stack, as a CUDA graph needs
(`madsl.runner.batched.replay`).

Apart from the stack, which updates these tensors, because this is only their layout: where
each parameter's (members, *shape) block lies, and which member each element belongs to.
"""

from __future__ import annotations

import math

import torch


class FlatParameters:
    """The stacked trainable parameters of one optimizer group (of one dtype) in one flat
    tensor each for the weights, their gradients and the two Adam moments: parameter after
    parameter, each a contiguous (members, *shape) block, which every parameter is a view of.
    AdamW is then a few ops for all the group's parameters instead of a few per parameter,
    and the backward adds into one gradient tensor that lives as long as the stack (as a CUDA
    graph needs). `member_of` gives each element's member, for the per-member lr and decay."""

    def __init__(self, group: int, names: list[str], shapes: list[tuple], blocks: dict[str, list[torch.Tensor]]):
        self.group, self.names, self.shapes = group, names, shapes
        self.sizes = [math.prod(shape) for shape in shapes]
        # blocks: "param", "exp_avg", "exp_avg_sq" -> per parameter, its (members, *shape) stack
        self.param, self.exp_avg, self.exp_avg_sq = (
            torch.cat([b.reshape(-1) for b in blocks[key]]) for key in ("param", "exp_avg", "exp_avg_sq")
        )
        self.members = blocks["param"][0].shape[0]
        self._derived()

    def _derived(self) -> None:
        self.grad = torch.zeros_like(self.param)
        self.member_of = torch.cat(
            [torch.arange(self.members, device=self.param.device).repeat_interleave(size) for size in self.sizes]
        )

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each parameter's (members, *shape) view of a flat tensor."""
        blocks = flat.split([self.members * size for size in self.sizes])
        return {name: block.view(self.members, *shape) for name, shape, block in zip(self.names, self.shapes, blocks)}

    def leaves(self) -> dict[str, torch.Tensor]:
        """The parameters as leaves of autograd sharing the weights' memory, each with its
        block of the gradient tensor as .grad."""
        grads = self.views(self.grad)
        leaves = {}
        for name, view in self.views(self.param).items():
            leaves[name] = view.detach().requires_grad_()
            leaves[name].grad = grads[name]
        return leaves

    def keep(self, index: torch.Tensor) -> None:
        """Only these members' blocks."""
        for key in ("param", "exp_avg", "exp_avg_sq"):
            blocks = self.views(getattr(self, key)).values()
            setattr(self, key, torch.cat([block.index_select(0, index).reshape(-1) for block in blocks]))
        self.members = len(index)
        self._derived()

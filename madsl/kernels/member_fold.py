"""One kernel call for all members of a stacked model (grid-batched training).

`madsl.runner.batched.stacked` trains the members of a grid group as one model: parameters
stacked along a member axis, every member's forward in one `torch.func.vmap`. An op
without a vmap batching rule (SDPA's fused kernels, madsl's fused CPU scan, mamba-ssm's,
causal-conv1d's and fla's kernels: autograd.Functions or ops with no rule) would make vmap
loop over the members, one launch each, or fail. Each such op here gets a *fold*: a rule
that moves the member axis into an axis the op already treats independently (the batch
for attention and fla's kernels, the channels for the scan and the depthwise convolution)
and runs the op once, on the folded tensors.

How: an op's public function calls `folded(Fold, *args)` when a torch.func transform is
active (else it runs the op directly: the unbatched path pays one cheap check). That
applies `_Folded`, an autograd.Function whose `vmap` staticmethod calls `Fold.fold` on the
unwrapped tensors. The fold runs ordinary, differentiable torch ops (the op itself, on the
folded tensors), which ordinary autograd records, so `loss.backward()` after the vmap (as
the stacked trainer does) runs the op's own backward once for all members. `_Folded`'s own
forward/backward run only where vmap passes none of the op's tensors batched (the op then
runs as it is, and is differentiated by recomputing it); under `torch.func.grad` / `vjp`
themselves (not used by madsl) they raise a clear error.

A fold is a class with two static methods:

    call(*args)                            the op's public function (dispatching on device)
    fold(members, in_dims, *args)          -> (outputs, out_dims), on unwrapped tensors; calls
                                           `call` on the folded tensors (so nested vmaps fold again)

An op whose every tensor argument and output leads with the batch axis needs no class of
its own: the decorator `folds_into_batch` folds the members into that axis. `active()`
reads torch's private `torch._C._are_functorch_transforms_active` (what torch's own
autograd.Function dispatch reads); tests/test_member_fold.py fails if it stops working.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Sequence

import torch
from torch import Tensor


def active() -> bool:
    """Whether a torch.func transform (vmap, grad, ...) is running."""
    return torch._C._are_functorch_transforms_active()


def folded(fold: type, *args: Any) -> Any:
    """`fold.call(*args)`, with the fold's vmap rule in place (call only where `active()`)."""
    return _Folded.apply(fold, *args)


def member_first(x: Tensor, in_dim: int | None, members: int) -> Tensor:
    """The member axis of an unwrapped tensor moved to the front (expanded where the tensor
    is the same for every member)."""
    return x.movedim(in_dim, 0) if in_dim is not None else x.expand(members, *x.shape)


def into_batch(x: Tensor | None, in_dim: int | None, members: int) -> Tensor | None:
    """(batch, ...) per member -> (members * batch, ...), member-major."""
    return None if x is None else member_first(x, in_dim, members).flatten(0, 1)


def out_of_batch(y: Tensor, members: int) -> Tensor:
    """The inverse of `into_batch` for an output: (members * batch, ...) -> (members, batch, ...)."""
    return y.unflatten(0, (members, -1))


def unbatched(name: str, in_dims: Sequence[int | None], positions: Sequence[int]) -> None:
    """Refuse a member axis on arguments the fold cannot move (the op takes them once for all)."""
    for i in positions:
        if in_dims[i] is not None:
            raise NotImplementedError(f"{name} under vmap: argument {i} differs per member, which this op cannot fold")


def folds_into_batch(fn: Callable) -> Callable:
    """Decorator for an op whose tensor arguments and outputs (a tensor or a tuple, None
    allowed) all lead with the batch axis, batch elements independent: under vmap it runs
    once, with the members folded into the batch, (members, batch, ...) -> (members * batch,
    ...). Keyword arguments are bound to positions (autograd.Function takes no keywords)."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        if not active():
            return fn(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return folded(fold, *bound.args)

    def fold_members(members: int, in_dims: tuple, *args: Any) -> tuple:
        args = [into_batch(a, d, members) if isinstance(a, Tensor) else a for a, d in zip(args, in_dims)]
        out = op(*args)
        if isinstance(out, tuple):
            return (
                tuple(None if o is None else out_of_batch(o, members) for o in out),
                tuple(None if o is None else 0 for o in out),
            )
        return out_of_batch(out, members), 0

    fold = type(f"{fn.__name__}_fold", (), {"call": staticmethod(op), "fold": staticmethod(fold_members)})
    return op


class _Folded(torch.autograd.Function):
    """See the module docstring. Inputs: (fold, *args) with the op's args as `fold.call` takes them."""

    @staticmethod
    def forward(fold: type, *args: Any) -> Any:
        return fold.call(*args)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        fold, *args = inputs
        ctx.fold = fold
        ctx.layout = [isinstance(a, Tensor) for a in args]
        ctx.constants = [None if is_tensor else a for a, is_tensor in zip(args, ctx.layout)]
        ctx.save_for_backward(*(a for a in args if isinstance(a, Tensor)))

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple:
        if active():
            raise NotImplementedError(
                "madsl's folded kernels support torch.func.vmap with ordinary autograd "
                "(as grid-batched training uses them), not torch.func.grad/vjp"
            )
        saved = iter(ctx.saved_tensors)
        args = [next(saved) if is_tensor else c for is_tensor, c in zip(ctx.layout, ctx.constants)]
        wanted = [i for i, a in enumerate(args) if isinstance(a, Tensor) and ctx.needs_input_grad[i + 1]]
        with torch.enable_grad():
            for i in wanted:
                args[i] = args[i].detach().requires_grad_(True)
            outputs = ctx.fold.call(*args)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            pairs = [(o, g) for o, g in zip(outputs, grads) if o is not None and g is not None and o.requires_grad]
            found = (
                torch.autograd.grad(
                    [o for o, _ in pairs], [args[i] for i in wanted], [g for _, g in pairs], allow_unused=True
                )
                if pairs
                else [None] * len(wanted)
            )
        result: list[Tensor | None] = [None] * len(args)
        for i, grad in zip(wanted, found):
            result[i] = grad
        return (None, *result)

    @staticmethod
    def vmap(info: Any, in_dims: tuple, fold: type, *args: Any) -> tuple:
        return fold.fold(info.batch_size, in_dims[1:], *args)

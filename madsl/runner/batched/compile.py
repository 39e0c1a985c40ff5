"""A stacked training step or evaluation batch compiled into fused kernels (opt-in:
`MADSL_COMPILE_STACKED=1`, or `StackedMembers(..., compiled=True)`).

Why: a width-128 model's stacked step on a GPU is bound by how many kernels it launches
(hundreds of small ones: benchmarks/step_ops.py), and a CUDA graph removes the host's cost of
launching them but not each kernel's own few microseconds and memory round trip. Fusing the
elementwise chains, norms, activations, the loss and AdamW removes kernels.

How: `torch.compile` of a function that calls `torch.func.vmap` fuses nothing (dynamo keeps
the vmap as one higher-order op and runs it eagerly). So the step is first traced by
`make_fx` into one flat graph of plain aten ops: vmap's batching rules and the member folds
(`madsl.kernels.member_fold`) run as they do eagerly and leave batched ops on the stacked
tensors; the backward (`torch.autograd.grad` inside the traced function), AdamW and the
metric sums are recorded too. Inductor (`torch._inductor.compile_fx`) then compiles that
graph: fused elementwise and reduction kernels, with matmuls, SDPA, convolutions and FFTs as
calls to torch's own kernels. The traced function updates its tensor arguments in place
(weights, Adam moments, metric sums), as the eager step does, so a compiled step can be
replayed as a CUDA graph like an eager one (`replay.ReplayedStep`).

A compiled function is specialised to its arguments' shapes, dtypes and strides: one is
compiled per batch shape (an epoch's smaller last batch has its own). Tracing runs the
function once on clones of its arguments (real tensors: nothing of the caller's changes).
Compiled and eager steps agree to rounding, not bit for bit: inductor reorders and fuses
floating-point work (tests/test_compiled_step.py, benchmarks/compiled_step.py).
"""

from __future__ import annotations

import os
import warnings
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

ENV = "MADSL_COMPILE_STACKED"
# madsl.kernels.cuda's getters of the cuda extra's kernels: pybind and Triton calls that make_fx
# cannot record (their outputs would be frozen into the graph as constants)
EXTENSION_GETTERS = ("selective_scan_fn", "mamba_inner_fn", "causal_conv1d_fn", "chunk_gla", "fla_op")
# A traced step larger than this is not compiled: attention-sg's is ~700 ops, hyena-sg's ~1,050;
# Mamba's CPU scan, unrolled over its steps, 15,000, which inductor did not finish in 16 minutes
MAX_TRACED_OPS = 5_000


def requested() -> bool:
    """Whether the environment asks for compiled stacked steps (`MADSL_COMPILE_STACKED=1`; unset,
    empty or 0: no). Any other value is a MadslError, never silently read as no: `madsl eval`
    checks it before it plans (exit 2)."""
    value = os.environ.get(ENV, "").strip()
    if value not in ("", "0", "1"):
        from madsl.errors import MadslError

        raise MadslError(
            f"{ENV}={value!r}: expected 1 (compile the stacked step) or 0",
            expected="1 or 0",
            hint=f"unset {ENV} to train eagerly (the default)",
        )
    return value == "1"


class NotCompiled(RuntimeError):
    """The function calls a kernel that tracing cannot record, or traces into too many ops."""


@contextmanager
def _extension_kernels_refused() -> Iterator[None]:
    """While tracing, a layer that would call a kernel of the cuda extra raises `NotCompiled`
    (where the library is missing, the layer's pure-PyTorch path runs and is traced)."""
    from madsl.kernels import cuda

    originals = {name: getattr(cuda, name) for name in EXTENSION_GETTERS}

    def refusing(name: str, getter: Callable) -> Callable:
        def get(*args, **kwargs):
            kernel = getter(*args, **kwargs)
            if kernel is not None:
                what = ".".join(str(a) for a in args[:2]) or name  # fla_op(module, name, ...)
                raise NotCompiled(f"{what}, a kernel of the cuda extra, cannot be traced by make_fx")
            return kernel

        return get

    for name, getter in originals.items():
        setattr(cuda, name, refusing(name, getter))
    try:
        yield
    finally:
        for name, getter in originals.items():
            setattr(cuda, name, getter)


def compile_inplace(function: Callable[..., None], tensors: tuple[torch.Tensor, ...]) -> Callable[..., None]:
    """`function(*tensors)` (which updates some of its arguments in place and returns
    nothing) traced into aten ops and compiled by inductor, for arguments like these."""
    from torch._guards import TracingContext, tracing
    from torch._inductor.compile_fx import compile_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with _extension_kernels_refused():
        graph = make_fx(function, tracing_mode="real")(*(t.clone() for t in tensors))
    ops = sum(node.op == "call_function" for node in graph.graph.nodes)
    if ops > MAX_TRACED_OPS:
        raise NotCompiled(
            f"it traces into {ops} ops (over {MAX_TRACED_OPS}: a recurrence unrolled step by step), "
            f"which inductor would take many minutes to compile"
        )
    # static shapes, but a shape environment as dynamo gives inductor: without one inductor
    # bypasses its on-disk graph cache ("No shape env") and lowers every group's step anew
    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    with tracing(TracingContext(fake_mode)):
        return compile_fx(graph, [fake_mode.from_tensor(t, static_shapes=True) for t in tensors])


class CompiledInPlace:
    """`function(*tensors)`, compiled once per shape, dtype, stride and device of its
    arguments. Where it cannot be traced or traces into too many ops (`NotCompiled`), one
    warning, and the caller runs its eager path from then on."""

    def __init__(self, function: Callable[..., None], what: str):
        self.function, self.what = function, what
        self.compiled: dict[tuple, Callable[..., None]] = {}
        self.usable = True

    def __call__(self, *tensors: torch.Tensor) -> bool:
        """Run the compiled function on `tensors`; False (having run nothing) where it cannot be."""
        if not self.usable:
            return False
        key = tuple((tuple(t.shape), t.dtype, t.stride(), t.device) for t in tensors)
        if key not in self.compiled:
            try:
                self.compiled[key] = compile_inplace(self.function, tensors)
            except NotCompiled as err:
                warnings.warn(f"{ENV}: this group's {self.what} runs eagerly: {err}", RuntimeWarning, stacklevel=3)
                self.usable = False
                return False
        self.compiled[key](*tensors)
        return True

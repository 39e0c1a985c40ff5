"""Triton's CPU interpreter (TRITON_INTERPRET=1, set by tests/conftest.py on a machine without
CUDA) made to run flash-linear-attention's kernels, so that madsl's fla paths are tested
on a CPU: the same kernels and wrappers that train on a GPU, executed block by block in numpy.

Two gaps of the interpreter (Triton 3.x) are bridged, in the tests only:
- a kernel's `for i in range(n)` loop variable is a tensor when compiled, a Python int when
  interpreted, so fla's `i_t.to(tl.int64)` fails: kernels run with a `range` that yields
  interpreter scalars (the shape and dtype `tl.program_id` gives);
- autotuning times each configuration through a GPU driver, which there is none of: the first
  configuration runs, untimed (any configuration computes the same thing, as in tests/test_cuda.py).
"""

from __future__ import annotations

import builtins
import os
from typing import Iterator

import numpy as np


def available() -> bool:
    """Whether Triton is installed and interprets (it reads TRITON_INTERPRET when a kernel is defined)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return os.environ.get("TRITON_INTERPRET") == "1"


def bridge(monkeypatch) -> None:
    """Apply both bridges for a test (undone by pytest's monkeypatch)."""
    import triton.language as tl
    from triton.runtime import interpreter
    from triton.runtime.autotuner import Autotuner

    def as_int(x) -> int:
        if isinstance(x, tl.core.tensor):
            return int(np.asarray(x.handle.data).reshape(-1)[0])
        return int(x.value if isinstance(x, tl.constexpr) else x)

    def scalar_range(*args) -> Iterator:
        for i in builtins.range(*(as_int(a) for a in args)):
            yield tl.core.tensor(interpreter.TensorHandle(np.array([i], dtype=np.int32), tl.int32), tl.int32)

    def compile_and_exec(self, transformed_ast):
        # as FunctionRewriter._compile_and_exec, in a copy of the kernel's globals whose `range` is scalar_range
        code = compile(transformed_ast, filename=self.filename, mode="exec")
        kernel_globals = {**vars(interpreter), **self.fn.__globals__, "range": scalar_range}
        scope = {**self.kwargs}
        exec(code, kernel_globals, scope)
        return scope[self.fn.__name__]

    monkeypatch.setattr(interpreter.FunctionRewriter, "_compile_and_exec", compile_and_exec)
    monkeypatch.setattr(interpreter.InterpretedFunction, "rewritten_fn", {})  # none rewritten without the bridge
    prune = Autotuner.prune_configs
    monkeypatch.setattr(Autotuner, "prune_configs", lambda self, kwargs: prune(self, kwargs)[:1])
    monkeypatch.setattr(Autotuner, "_bench", lambda self, *args, config=None, **kwargs: [0.0, 0.0, 0.0])

"""The CUDA libraries of the `cuda` extra, imported lazily: on first use, and only for
CUDA tensors. Nothing here is imported at module import time (they need CUDA and
Triton, and take seconds to import).

    mamba-ssm        selective_scan_fn, mamba_inner_fn (Mamba's scan; its whole inner block)
    causal-conv1d    causal_conv1d_fn (Mamba's short convolution)
    flash-linear-attention   fla.ops.gla.chunk_gla (GLA's parallel form);
                     fla.ops.simple_gla.chunk_simple_gla (a scalar decay per head and token:
                     Mamba-2's SSD, retention, linear attention); fla.ops.delta_rule.chunk_delta_rule
                     and fla.ops.gated_delta_rule.chunk_gated_delta_rule (DeltaNet, Gated DeltaNet)

Step mode (one token) stays in plain PyTorch on every device: a handful of small ops,
where a fused kernel would save little and cost a copy of the state (causal-conv1d's
update and fla's fused_recurrent_gla write the state in place; madsl's step does not).
None of these kernels takes float64; float64 tensors always take madsl's own paths.

Each getter returns the function, or None when the library does not import; on a
CUDA tensor the layers then fall back to madsl's pure-PyTorch GPU paths (chunked
scans), after one warning per library that names the extra.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable

EXTRA_HINT = "pip install 'madsl[cuda]'"


@functools.lru_cache(maxsize=None)
def warn_missing(library: str, fallback: str) -> None:
    """One warning per (library, fallback) per process."""
    warnings.warn(
        f"{library} is not installed or does not import; on CUDA, madsl uses {fallback} "
        f"instead (slower). Install the CUDA extra: {EXTRA_HINT}",
        RuntimeWarning,
        stacklevel=3,
    )


def _load(module: str, names: tuple[str, ...]) -> tuple[Callable, ...] | None:
    try:
        imported = __import__(module, fromlist=list(names))
        return tuple(getattr(imported, name) for name in names)
    except Exception:  # ImportError, or a build without CUDA / a broken Triton
        return None


@functools.lru_cache(maxsize=1)
def mamba_ssm_ops() -> tuple[Callable, Callable] | None:
    """(selective_scan_fn, mamba_inner_fn) from mamba-ssm, or None. The module imports
    causal-conv1d itself when present; mamba_inner_fn needs it (see `mamba_inner`)."""
    return _load("mamba_ssm.ops.selective_scan_interface", ("selective_scan_fn", "mamba_inner_fn"))


@functools.lru_cache(maxsize=1)
def causal_conv1d_ops() -> tuple[Callable] | None:
    """(causal_conv1d_fn,) from causal-conv1d, or None."""
    return _load("causal_conv1d", ("causal_conv1d_fn",))


@functools.lru_cache(maxsize=1)
def fla_gla_ops() -> tuple[Callable] | None:
    """(chunk_gla,) from flash-linear-attention, or None."""
    return _load("fla.ops.gla", ("chunk_gla",))


def selective_scan_fn() -> Callable | None:
    ops = mamba_ssm_ops()
    if ops is None:
        warn_missing("mamba-ssm", "a chunked pure-PyTorch selective scan")
        return None
    return ops[0]


def mamba_inner_fn() -> Callable | None:
    """mamba-ssm's fused Mamba block (conv, x_proj, dt_proj, scan, gate, out_proj in one
    autograd Function); needs both mamba-ssm and causal-conv1d. No warning: the parts
    have their own fallbacks, which warn."""
    ops = mamba_ssm_ops()
    if ops is None or causal_conv1d_ops() is None:
        return None
    return ops[1]


def causal_conv1d_fn() -> Callable | None:
    ops = causal_conv1d_ops()
    if ops is None:
        warn_missing("causal-conv1d", "torch's depthwise Conv1d")
        return None
    return ops[0]


def chunk_gla() -> Callable | None:
    ops = fla_gla_ops()
    if ops is None:
        warn_missing("flash-linear-attention", "madsl's chunked pure-PyTorch GLA")
        return None
    return ops[0]


@functools.lru_cache(maxsize=None)
def _fla_op(module: str, name: str) -> Callable | None:
    ops = _load(module, (name,))
    return None if ops is None else ops[0]


def fla_op(module: str, name: str, fallback: str) -> Callable | None:
    """An fla kernel (`fla.ops.<module>.<name>`), or None after a one-time warning naming the extra."""
    op = _fla_op(f"fla.ops.{module}", name)
    if op is None:
        warn_missing("flash-linear-attention", fallback)
    return op


def library_status() -> str:
    """Which libraries of the extra import here, a line each (the GPU check scripts print it)."""
    return "\n".join(
        f"{name:24s} {'imports' if ops else 'MISSING'}"
        for name, ops in (
            ("mamba-ssm", mamba_ssm_ops()),
            ("causal-conv1d", causal_conv1d_ops()),
            ("flash-linear-attention", fla_gla_ops()),
        )
    )


if __name__ == "__main__":  # python -m madsl.kernels.cuda
    print(library_status())

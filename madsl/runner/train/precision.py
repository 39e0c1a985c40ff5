"""Training precision: `fp32`, `bf16` or `auto` (`--precision`, spec `eval.precision`).

`bf16` is mixed precision: master weights and optimizer state stay float32; the
forward pass (and so its backward) runs under `torch.autocast(dtype=bfloat16)`. The
numerically delicate parts switch autocast off and compute in float32 themselves:
the long convolutions and filter generation (`madsl.kernels.fftconv.full_precision`),
the selective scans, the GLA recurrences, MoE routing, the loss; SDPA's kernels keep
the softmax statistics in float32. `auto` is bf16 on a CUDA device that supports it,
fp32 elsewhere; it is resolved when the runs are planned, so a run's identity names
the precision it really trains in (and fp32, the default, is left out of it: run ids
from before precision existed stay valid).

On CUDA every precision allows TF32 matmuls and convolutions (fp32 master weights,
10-bit-mantissa products): the speed of tensor cores at the accuracy MAD needs.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from madsl.errors import MadslError, option
from madsl.runner.common.choices import PRECISIONS
from madsl.runner.train.options import train_config_identity  # noqa: F401 (its home before the other options)

if TYPE_CHECKING:
    import torch


def check_precision(name: str) -> str:
    if name not in PRECISIONS:
        raise MadslError(
            f"unknown precision {name!r}",
            expected=", ".join(PRECISIONS),
            hint="bf16 trains in bfloat16 autocast with float32 master weights",
        )
    return name


def device_supports_bf16(device: "torch.device") -> bool:
    import torch

    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return device.type == "cpu"  # CPU autocast runs bf16 on any x86/ARM CPU torch supports


def resolve_precision(name: str, device: "torch.device | str") -> str:
    """`fp32` or `bf16` for training on `device`; bf16 on a device without it is an error."""
    import torch

    device = torch.device(device)
    check_precision(name)
    if name == "auto":
        return "bf16" if device.type == "cuda" and device_supports_bf16(device) else "fp32"
    if name == "bf16" and not device_supports_bf16(device):  # a CUDA GPU before Ampere
        raise MadslError(
            f"{option('precision')} bf16: device {device} does not support bfloat16",
            hint=f"use {option('precision')} fp32, or auto (bf16 only where the device has it)",
        )
    return name


def autocast(precision: str, device: "torch.device", cache: bool = True) -> contextlib.AbstractContextManager:
    """The forward pass's context: bf16 autocast, or nothing for fp32. `cache=False` for a
    step captured as a CUDA graph (autocast's cache of cast weights must not outlive it)."""
    import torch

    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=cache)
    return contextlib.nullcontext()


def configure_device(device: "torch.device") -> None:
    """TF32 matmuls and cuDNN convolutions on CUDA (no effect elsewhere); a run placed on
    cuda:N makes N the current device (Triton kernels launch on the current device)."""
    import torch

    if device.type == "cuda":
        if device.index is not None:
            torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

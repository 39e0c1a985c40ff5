"""The dtype the CPU kernels compute in: float64 stays float64; every other float type (half types
included) is computed in float32, as mamba-ssm's selective_scan_ref and the FFT convolution do."""

from __future__ import annotations

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 inputs, float32 for the rest."""
    return torch.float64 if dtype == torch.float64 else torch.float32

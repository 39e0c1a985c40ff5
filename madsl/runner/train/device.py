"""The device a run trains on: which one `--device` names, and what to do when it runs out
of memory (recognise it, give the cached memory back).

Apart from the loop because the plan's step measurements (`madsl.runner.plan.cost`) and a
grid group that halves its stack when it runs out of memory (`madsl.runner.batched.grid`)
need the same answers.
"""

from __future__ import annotations

import gc

import torch


def resolve_device(device: str) -> torch.device:
    """The torch device `--device` names ("auto": CUDA where there is one, else the CPU)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: no CUDA device is available")
    return torch.device(device)


def release_device_memory() -> None:
    """What freed tensors left cached in this process (a stack that ran out of memory, a plan's
    step measurements), back to the GPU, for what trains next or in the other processes."""
    gc.collect()  # (a failed stack's tensors can sit in reference cycles)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def is_out_of_memory(err: BaseException) -> bool:
    """Whether `err` is the device (or the host) running out of memory."""
    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and (
        "out of memory" in text or "can't allocate" in text or "not enough memory" in text
    )

"""Device work replayed: a fixed sequence of device work run on per-shape input buffers,
captured once warm as a CUDA graph and replayed from then on (`ReplayedStep`), and the small
host-to-device upload it reads its per-step numbers from without making the host wait
(`HostUpload`).

A stacked step and an evaluation batch (`madsl.runner.batched.stacked`) are each such a
sequence: the batch is copied into buffers, the members' learning rates and Adam's bias
corrections are uploaded into one small tensor, and the rest (forward, backward, AdamW, the
metric sums) reads nothing on the host. So with CUDA graphs on (`--cuda-graphs`), each is
captured once warm and replayed: one launch instead of hundreds, which is where a
width-128 model's time goes on a GPU. Apart from the stack because none of this knows what
the work computes.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch


class HostUpload:
    """Sets a small device tensor from host values every step without making the host wait
    for the device (a copy from ordinary host memory to a GPU does): on CUDA through pinned
    staging buffers taken in turn, each reused once the device has read it."""

    SLOTS = 8  # how many steps the host may run ahead of the device

    def __init__(self, target: torch.Tensor):
        self.target = target
        self.turn = 0
        if target.device.type == "cuda":
            self.staging = [torch.empty(target.shape, dtype=target.dtype, pin_memory=True) for _ in range(self.SLOTS)]
            self.read: list[Any] = [None] * self.SLOTS  # per slot: the event after the device's read

    def __call__(self, values: Sequence[float]) -> None:
        host = torch.tensor(values, dtype=self.target.dtype)
        if self.target.device.type != "cuda":
            self.target.copy_(host)
            return
        slot = self.turn % self.SLOTS
        self.turn += 1
        if self.read[slot] is not None:
            self.read[slot].synchronize()  # its last upload has been read (SLOTS steps ago)
        self.staging[slot].copy_(host)
        self.target.copy_(self.staging[slot], non_blocking=True)
        self.read[slot] = torch.cuda.Event()
        self.read[slot].record()


@dataclass
class _Buffers:
    """One batch shape's inputs and targets, where the computation reads them; its CUDA graph once captured."""

    inputs: torch.Tensor
    targets: torch.Tensor
    graph: Any = None
    eager_runs: int = 0


GRAPH_WARMUP = 3  # eager runs of a batch shape before its CUDA graph is captured


class ReplayedStep:
    """Runs `compute(inputs, targets, cache)` on per-shape input buffers: eagerly or, with
    `graphs` on a CUDA device, captured as a CUDA graph after `WARMUP` eager runs of that
    shape (kernel autotuning, cuBLAS and cuFFT plans, lazily filled caches such as rotary
    tables) and replayed from then on. `compute` must do the same device work on every call
    and read no value on the host (tests/test_grid.py checks the stacked step for it); where
    a capture fails anyway, one warning and eager runs from then on."""

    WARMUP = GRAPH_WARMUP

    def __init__(
        self, compute: Callable[[torch.Tensor, torch.Tensor, bool], None], device: torch.device, graphs: bool, what: str
    ):
        self.compute, self.device, self.what = compute, device, what
        self.graphs = graphs and device.type == "cuda"
        self.shapes: dict[tuple, _Buffers] = {}  # an epoch's smaller last batch has its own

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        key = (tuple(x.shape), x.dtype, tuple(y.shape), y.dtype)
        if key not in self.shapes:
            self.shapes[key] = _Buffers(
                torch.empty(x.shape, dtype=x.dtype, device=x.device),
                torch.empty(y.shape, dtype=y.dtype, device=y.device),
            )
        buffers = self.shapes[key]
        buffers.inputs.copy_(x)
        buffers.targets.copy_(y)
        if buffers.graph is None and self.graphs and buffers.eager_runs >= self.WARMUP:
            self._capture(buffers)
        if buffers.graph is not None:
            buffers.graph.replay()
            return
        if self.graphs:  # warm-up before a capture, on a side stream (torch's CUDA-graph recipe)
            side = torch.cuda.Stream(device=self.device)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.compute(buffers.inputs, buffers.targets, False)
            torch.cuda.current_stream().wait_stream(side)
        else:
            self.compute(buffers.inputs, buffers.targets, True)
        buffers.eager_runs += 1

    def _capture(self, buffers: _Buffers) -> None:
        """Record `compute` on these buffers (nothing runs while it records)."""
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.compute(buffers.inputs, buffers.targets, False)  # autocast's cast cache must not outlive it
        except Exception as err:  # noqa: BLE001 - any capture failure: run on without graphs
            first_line = str(err).splitlines()[0] if str(err) else ""
            warnings.warn(
                f"CUDA graphs off for this group's {self.what}: it cannot be captured "
                f"({type(err).__name__}: {first_line}); it runs on without them",
                RuntimeWarning,
                stacklevel=3,
            )
            self.graphs = False
            torch.cuda.synchronize()
            return
        buffers.graph = graph

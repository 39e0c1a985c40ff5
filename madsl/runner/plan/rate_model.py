"""This machine's training rate per layer family: what the plan's time estimate
(madsl.runner.plan.cost) turns the accounting's FLOPs into seconds with. Measured once per device
and thread count, cached (madsl.runner.plan.rate_cache), measured again on request.

    a layer family  one layer of a primitive (attention, hyena, mamba, ...) at its stdlib
                    defaults, width 128, length 128: forward + backward on random input at two
                    batch sizes (CPU 8 and 32 sequences, CUDA 32 and 128), the fastest of
                    TIMED_STEPS after a warm-up; the two points make a line,
                        seconds = overhead + training FLOPs / rate
                    (training FLOPs: 3 x the accounting's forward FLOPs of the layer)
    the rest        a training step (AdamW) of a reference model (REFERENCE_TOPOLOGY, width 128,
                    vocabulary 16) less the sum of its layers' lines, a layer and a token: what
                    the rest of a model adds (norms, residuals, embedding, head, loss, optimizer)
    threads (CPU)   a run on T threads: the reference model's step on T threads (wall clock,
                    the fastest of a few) against one thread, between 1 and T

On the CPU the steps are timed in the CPU time of one thread (torch on one thread), which other
work on the machine does not stretch, unlike a wall clock: rates measured under different loads
agree within about 10 % (benchmarks/RESULTS.md). The threads' speedup cannot be read so (busy cores
make it read low): it is measured only where the load average leaves T cores free, else taken as
1, and the estimate errs long (`--measure-rate` on a quiet machine measures it). On CUDA, in
wall-clock time with the device synchronized. What a run does beyond its steps (data generation,
building the model) is not in the rate.
"""

from __future__ import annotations

import os
import platform
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

from madsl.runner.common.choices import TRAIN_FORWARDS

RATE_WIDTH = 128
RATE_LENGTH = 128
BATCHES = {"cpu": (8, 32), "cuda": (32, 128)}  # the two points of a family's line, in sequences
TIMED_STEPS = 3  # timed steps a point after the warm-up; the fastest counts
SPEEDUP_STEPS = 3  # wall-clock steps on T threads: the fastest counts
REFERENCE_TOPOLOGY = "A-Sg:A-Sg"
REFERENCE_VOCAB = 16
HOW = (
    f"forward + backward of each layer family at width {RATE_WIDTH}, length {RATE_LENGTH}, two batch sizes; "
    f"an AdamW step of a {REFERENCE_TOPOLOGY} model for the rest of a model, a layer and a token"
)

Progress = Callable[[str, int, int], None]  # (what, done, total)


@dataclass(frozen=True)
class Line:
    """A measured family: seconds of one layer's training step = overhead_s + training FLOPs / flops_per_s."""

    overhead_s: float
    flops_per_s: float
    measured: str  # ISO date and time (UTC)
    load: float | None  # the machine's 1-minute load average then (None: the system has none)

    def seconds(self, train_flops: float) -> float:
        return self.overhead_s + train_flops / self.flops_per_s


@dataclass(frozen=True)
class Measured:
    """One measured number (the rest of a model, the threads' speedup), when and under what load."""

    value: float
    measured: str
    load: float | None


@dataclass
class DeviceRates:
    """The rates of one device at one thread count: a line per layer family, the rest of a model
    (seconds a layer and a token: norms, residuals and its share of embedding, head, loss and
    optimizer), the threads' speedup (CPU); `measured_now`: what this plan measured (the others
    came from the cache)."""

    device: str  # e.g. "cpu: Intel(R) Xeon(R) Processor, 2 CPUs" or "cuda: NVIDIA H100 80GB HBM3"
    threads: int
    families: dict[str, Line] = field(default_factory=dict)
    rest: Measured | None = None
    threads_speedup: Measured | None = None
    measured_now: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)  # family -> why it has no rate

    def step_seconds(
        self, layers: Sequence[tuple[str, float]], rows: int, length: int, members: int = 1
    ) -> float | None:
        """Seconds of a training step of `members` models trained stacked, each on `rows`
        sequences of `length` tokens, whose layers are (family, forward FLOPs of one sequence);
        None where a family has no rate. Stacked members share each layer's overhead (one
        launch for all)."""
        if any(family not in self.families for family, _ in layers):
            return None
        seconds = sum(
            self.families[family].seconds(TRAIN_FORWARDS * flops * rows * members) for family, flops in layers
        )
        if self.rest is not None:
            seconds += self.rest.value * len(layers) * rows * length * members
        return seconds / (self.threads_speedup.value if self.threads_speedup is not None else 1.0)

    def describe(self, families: Sequence[str]) -> dict[str, Any]:
        """Where the rates of `families` come from, for the plan (JSON) and its text."""
        used = [self.families[f] for f in families if f in self.families]
        used += [m for m in (self.rest, self.threads_speedup) if m is not None]
        oldest = min(used, key=lambda m: m.measured, default=None)
        return {
            "device": self.device,
            "threads": self.threads,
            "how": HOW,
            "measured_now": sorted(self.measured_now & {*families, "rest", "threads_speedup"}),
            "measured": oldest.measured if oldest else None,
            "load": oldest.load if oldest else None,
            "threads_speedup": self.threads_speedup.value if self.threads_speedup else None,
            # taken as 1, not measured: the cores were busy then
            "threads_speedup_assumed": self.threads_speedup is not None
            and not cores_free(self.threads_speedup.load, self.threads),
            "rest_s_per_layer_token": self.rest.value if self.rest else None,
            "families": {
                f: {"flops_per_s": self.families[f].flops_per_s, "overhead_s": self.families[f].overhead_s}
                for f in families
                if f in self.families
            },
            "failed": {f: why for f, why in self.failed.items() if f in families},
        }


def device_name(device: Any) -> str:
    """What a rate is the rate of: the CPU's model and count, or the GPU's name (printable text)."""
    if device.type == "cuda":
        import torch

        text = f"cuda: {torch.cuda.get_device_name(device)}"
    else:
        text = f"cpu: {cpu_model()}, {os.cpu_count() or 1} CPUs"
    return re.sub(r"[^ -~]", "?", text)[:200]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip() or platform.machine()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # no load average on this system
        return None


def cores_free(load: float | None, threads: int) -> bool:
    """Whether `threads` cores were free when the load average was `load` (None: unknown, taken as free)."""
    return load is None or load <= (os.cpu_count() or 1) - threads + 0.75


def clock() -> tuple[float, float]:
    """(wall seconds, this thread's CPU seconds)."""
    return time.perf_counter(), time.thread_time()

"""This machine's training rate per layer family: what the plan's time estimate
(madsl.runner.plan.cost) turns the accounting's FLOPs into seconds with. Measured once per device
and thread count, cached (madsl.runner.plan.rate_cache), measured again on request.

    a layer family  one layer of a primitive (attention, hyena, mamba, ...) at its stdlib
                    defaults, length 128, at each width of RATE_WIDTHS: forward + backward on
                    random input at two batch sizes (CPU 8 and 32 sequences, CUDA 32 and 128),
                    the fastest of TIMED_STEPS after a warm-up; the two points make a line,
                        seconds = overhead + training FLOPs / rate
                    (training FLOPs: 3 x the accounting's forward FLOPs of the layer); a layer of
                    another width takes the overhead and the rate interpolated between the two
                    nearest widths (in log width; the ends held beyond the ladder). Multi-head
                    attention is a family of its own per head width ("attention_hd8"): its
                    softmax costs heads x L^2 a sequence, which its FLOPs do not count
    the rest        a training step (AdamW, the gradient clipped) of a reference model
                    (REFERENCE_TOPOLOGY) at REST_WIDTHS x two batch sizes x REST_VOCABS less the
                    sum of its layers' lines, fitted (least squares, no term negative) by
                        seconds = fixed + per logit x rows x length x vocabulary
                                  + per layer token x rows x length x layers + per parameter x parameters
                    what a model adds outside its layers: the Python and dispatch of a step, the
                    head and the loss over the vocabulary, norms and residuals, the optimizer
                    (`Outside`); the fit's spread over those points is the estimate's interval
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

import math
import os
import platform
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

from madsl.runner.common.choices import TRAIN_FORWARDS

RATE_WIDTH = 128  # the width a family's single line (a format-1 cache's) was measured at
# the widths a family's line is measured at: the widths of the CPU studies (8-48) and of the MAD
# protocol (128); a step at width 8 costs 6-10x what a width-128 rate predicts (benchmarks/RESULTS.md)
RATE_WIDTHS = (8, 16, 32, 64, 128)
REST_WIDTHS = (8, 16, 32, 128)  # the rest matters most where layers are cheap; 128 pins the per-parameter term
REST_VOCABS = (16, 256)  # the MAD tasks' vocabularies and byte-level text
RATE_LENGTH = 128
BATCHES = {"cpu": (8, 32), "cuda": (32, 128)}  # the two points of a family's line, in sequences
TIMED_STEPS = 3  # timed steps a point after the warm-up; the fastest counts
SPEEDUP_STEPS = 3  # wall-clock steps on T threads: the fastest counts
REFERENCE_TOPOLOGY = "A-Sg:A-Sg"
REFERENCE_VOCAB = 16
HOW = (
    f"forward + backward of each layer family at widths {', '.join(map(str, RATE_WIDTHS))}, length "
    f"{RATE_LENGTH}, two batch sizes; AdamW steps of a {REFERENCE_TOPOLOGY} model at widths "
    f"{', '.join(map(str, REST_WIDTHS))} and vocabularies {' and '.join(map(str, REST_VOCABS))} for the rest"
)
# The estimate's interval around the fitted step time, beyond the fit's own spread: actual / planned
# CPU time over `benchmarks/plan_time.py --workloads` (a reduced CPU study at widths 8-32, a quick
# protocol, a small search; whole processes, start-up included) was 1.00-1.29 (benchmarks/RESULTS.md,
# 2026-11-28), widened by the +-20 % that measurements on these machines vary run to run
PLANNED_LOW, PLANNED_HIGH = 0.8, 1.55

Progress = Callable[[str, int, int], None]  # (what, done, total)


@dataclass(frozen=True)
class Line:
    """A measured family: seconds of one layer's training step = overhead_s + training FLOPs /
    flops_per_s, at width RATE_WIDTH; `points`: (width, overhead_s, flops_per_s) at each width of
    the ladder where measured there (none: the one line at every width)."""

    overhead_s: float
    flops_per_s: float
    measured: str  # ISO date and time (UTC)
    load: float | None  # the machine's 1-minute load average then (None: the system has none)
    points: tuple[tuple[int, float, float], ...] = ()

    def seconds(self, train_flops: float, width: int | None = None) -> float:
        overhead, rate = self.at(width)
        return overhead + train_flops / rate

    def at(self, width: int | None) -> tuple[float, float]:
        """(overhead_s, flops_per_s) at `width`: interpolated in log width between the two
        nearest measured widths, held at the ends of the ladder."""
        points = sorted(self.points)
        if width is None or not points:
            return self.overhead_s, self.flops_per_s
        if width <= points[0][0] or len(points) == 1:
            return points[0][1], points[0][2]
        for (w0, o0, r0), (w1, o1, r1) in zip(points, points[1:]):
            if width <= w1:
                t = (math.log(width) - math.log(w0)) / (math.log(w1) - math.log(w0))
                return o0 + (o1 - o0) * t, math.exp(math.log(r0) + (math.log(r1) - math.log(r0)) * t)
        return points[-1][1], points[-1][2]


@dataclass(frozen=True)
class Outside:
    """What a model's training step costs outside its layers (the module's docstring: the rest),
    and the interval of the fit: a step's actual seconds lay between `low` and `high` times the
    fitted ones at the measured points."""

    fixed_s: float
    per_logit_s: float
    per_param_s: float
    low: float
    high: float
    measured: str
    load: float | None

    def seconds(self, rows: int, length: int, vocab: int, params: int) -> float:
        return self.fixed_s + self.per_logit_s * rows * length * vocab + self.per_param_s * params


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
    outside: Outside | None = None  # the rest's other terms (none: a format-1 measurement)
    startup: Measured | None = None  # CPU seconds a new madsl process takes to reach its first step
    measured_now: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)  # family -> why it has no rate

    def step_seconds(
        self,
        layers: Sequence[tuple],
        rows: int,
        length: int,
        members: int = 1,
        model: tuple[int, int] | None = None,
    ) -> float | None:
        """Seconds of a training step of `members` models trained stacked, each on `rows`
        sequences of `length` tokens, whose layers are (family, forward FLOPs of one sequence
        [, width]); `model`: (vocabulary, parameters) of one, for what it costs outside its layers
        (None: that is left out). None where a family has no rate. Stacked members share each
        layer's overhead and the step's fixed cost (one launch for all)."""
        if any(layer[0] not in self.families for layer in layers):
            return None
        seconds = sum(
            self.families[layer[0]].seconds(TRAIN_FORWARDS * layer[1] * rows * members, _width(layer))
            for layer in layers
        )
        if self.rest is not None:
            seconds += self.rest.value * len(layers) * rows * length * members
        if self.outside is not None and model is not None:
            vocab, params = model
            seconds += self.outside.seconds(rows * members, length, vocab, params * members)
        return seconds / (self.threads_speedup.value if self.threads_speedup is not None else 1.0)

    def interval(self) -> tuple[float, float]:
        """The factors around an estimate between which the actual time is expected: the
        rest's fit spread, widened to the benchmarked PLANNED_LOW..PLANNED_HIGH."""
        low, high = (self.outside.low, self.outside.high) if self.outside is not None else (1.0, 1.0)
        return min(low, PLANNED_LOW), max(high, PLANNED_HIGH)

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
            "startup_s": self.startup.value if self.startup else None,
            "outside": None
            if self.outside is None
            else {key: getattr(self.outside, key) for key in ("fixed_s", "per_logit_s", "per_param_s", "low", "high")},
            "interval": list(self.interval()),
            "families": {
                f: {"flops_per_s": self.families[f].flops_per_s, "overhead_s": self.families[f].overhead_s}
                for f in families
                if f in self.families
            },
            "failed": {f: why for f, why in self.failed.items() if f in families},
        }


def startup_cost(rates: Sequence[dict], at_once: int | None, executor: str) -> tuple[float | None, int]:
    """(the CPU seconds a process takes to start, as the rates measured it (None: not measured),
    the processes of this machine that pay it): the command's own and, where several runs train
    at once on the local executor, each worker's (a pool of spawned processes). A Ray cluster's
    workers start elsewhere: only the command's own."""
    measured = [rate["startup_s"] for rate in rates if rate.get("startup_s") is not None]
    workers = at_once if executor == "local" and at_once and at_once > 1 else 0
    return (max(measured) if measured else None), 1 + workers


def _width(layer: tuple) -> int | None:
    return layer[2] if len(layer) > 2 else None


def rate_family(primitive: str, config: dict[str, Any]) -> str:
    """The family whose rate times a layer: its primitive's, or for multi-head attention the
    head width's (`attention_hd8`: 16 heads of 8 cost another rate than one head of 128)."""
    if primitive == "attention" and int(config.get("heads") or 1) > 1 and config.get("head_dim"):
        return f"attention_hd{int(config['head_dim'])}"
    return primitive


def family_primitive(family: str, width: int) -> Any:
    """The primitive a family's rate is measured on at `width` (rate_family's inverse): stdlib
    defaults, or attention with heads of the family's head width."""
    from madsl.lang.stdlib import primitive

    name, _, head_dim = family.partition("_hd")
    if name == "attention" and head_dim.isdigit():
        head = int(head_dim)
        return primitive("attention", width, heads=max(1, width // head), head_dim=head)
    return primitive(family, width)


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

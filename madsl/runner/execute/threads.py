"""How many torch threads a run trains on, on the CPU: the one rule the executors set and the
plans cost at.

    run_threads      the threads of each run: the ones asked for (`--threads`), else the cores
                     shared out among the workers (at least 1), at most DEFAULT_MAX_THREADS
    oversubscribed   a warning where the runs' threads ask for more cores than are free

Why a cap: the models madsl trains on a CPU are small (widths 8 to 128), and their operations
are too small to split well across threads. On this project's 2-core machines a second thread
buys little wall time on an idle machine and costs many times its CPU on a busy one
(benchmarks/RESULTS.md, "Threads"; the measurement is benchmarks/threads.py), so one worker on
2 cores trains on 1 thread unless asked for more. The thread count is recorded with each run
(CPU sums are split by thread count, so a run resumes on the threads it started on).
"""

from __future__ import annotations

import os

DEFAULT_MAX_THREADS = 1  # measured: benchmarks/threads.py (module docstring)


def cores() -> int:
    """The cores this process may run on (its affinity where the system tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def run_threads(workers: int, requested: int | None = None, available: int | None = None) -> int:
    """The torch threads each of `workers` runs trains on: `requested` where given, else the
    `available` cores (default: this machine's) shared out among them, between 1 and
    DEFAULT_MAX_THREADS."""
    if requested is not None:
        return requested
    share = (available or cores()) // max(1, workers)
    return max(1, min(share, DEFAULT_MAX_THREADS))


def oversubscribed(workers: int, threads: int, available: int | None = None, load: float | None = None) -> str | None:
    """A warning where `workers` runs of `threads` threads each ask for more than the `available`
    cores, or more than are free at `load` (the 1-minute load average; None: not considered),
    else None: on a busy CPU a run's threads wait on each other and its step costs many times
    its CPU."""
    available = available or cores()
    wanted = workers * threads
    if wanted > available:
        return (
            f"{workers} worker(s) x {threads} torch thread(s) = {wanted} threads on {available} core(s): runs "
            "oversubscribe the cores and each step costs several times its CPU (fewer --workers or --threads)"
        )
    if load is not None and load + wanted > available + 0.5:
        return (
            f"the machine is busy (load {load:.1f} on {available} core(s)) and the runs add {wanted} thread(s): "
            "expect them to take longer than planned"
        )
    return None

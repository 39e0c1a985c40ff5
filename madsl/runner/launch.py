"""Running jobs, the one way: `run(jobs, execution)` checks the results database, places the runs
(local workers and devices, or Ray), creates the store only when work starts, registers what the
planner files the jobs under, runs them through the coordinator (madsl.runner.execute.coordinator)
and tells the reporter; a database that cannot be written is a MadslError. `evaluate` (MAD runs and
grid groups, and a search's candidates through it) and `madsl.scaling.scale` (pretraining runs)
plan their jobs, then run them here.

    where = place(execution)                      # the execution options checked, before planning
    precision = run_precision("auto", where)      # what the runs train in, by the one rule
    outcome = run(jobs, execution, placement=where, reporter=reporter, stop=stop, register=plan.register)

Prints nothing.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from madsl.errors import MadslError, option
from madsl.runner.execute.coordinator import Outcome, Reporter, run_jobs
from madsl.runner.execute.devices import (
    check_workers_and_device,
    default_batch_grid,
    executor_for,
    place_devices,
    planned_device,
    ray_device,
    ray_options,
    resolve_cuda_graphs,
)
from madsl.runner.execute.jobs import Job
from madsl.runner.execute.local import Executor
from madsl.runner.execute.options import check_execution
from madsl.runner.execute.threads import oversubscribed, run_threads
from madsl.runner.plan.rate_model import load_average
from madsl.runner.store.database import check_database

__all__ = ["Job", "Outcome", "Placement", "Reporter", "check_store", "place", "run", "run_precision"]


@dataclass(frozen=True)
class Placement:
    """Where and how the runs execute, resolved from the execution options."""

    ray: Any  # Ray's options (madsl.runner.execute.ray.RayOptions), or None: this machine's executors
    devices: list[str] | None  # where this machine places the runs, round-robin (None: one device, or on Ray)
    batch_grid: bool  # runs that differ only in lr, wd or seed train together (grid groups)
    cuda_graphs: bool  # stacked steps replayed as CUDA graphs
    device: str = "auto"  # the --device the runs were given

    @property
    def runs_on(self) -> str:
        """The device kind the runs train on: a Ray task's share (cuda or cpu), else this machine's."""
        return ray_device(self.ray) if self.ray is not None else planned_device(self.device)


def check_store(execution: Any) -> None:
    """A results database madsl cannot use (not a madsl database, a folder, a link) refused before
    anything is planned or written."""
    check_database(execution.db)


def place(execution: Any, *, stacked: bool = True) -> Placement:
    """The execution options checked (bad input before anything is planned) and resolved: the
    executor, workers and devices, kept weights, checkpoints; with `stacked` (runs that may train
    together in grid groups: MAD runs) grid batching and CUDA graphs too. Pretraining runs
    (`stacked` False) train one at a time on the device named."""
    if stacked:
        from madsl.runner.batched import compile as stacked_compile

        stacked_compile.requested()  # a bad MADSL_COMPILE_STACKED is bad input before anything is planned
    ray = ray_options(execution.executor, execution.address, execution.cpus_per_run, execution.gpus_per_run)
    check_workers_and_device(execution.workers, execution.device, on_this_machine=ray is None)
    if ray is not None and execution.device == "cuda" and not ray.gpus_per_run:
        raise MadslError(
            f"{option('device')} cuda on Ray: the runs hold no GPU",
            hint=f"give them one: {option('gpus_per_run')} 1 (or a fraction, e.g. 0.25)",
        )
    batch_grid = cuda_graphs = False
    if stacked:
        if ray is not None and execution.batch_grid:
            raise MadslError(
                f"{option('batch_grid')} runs with the local executors only: Ray runs each run as its own task",
                hint=f"drop {option('batch_grid')}, or use {option('executor')} local",
            )
        batch_grid = ray is None and (
            default_batch_grid(execution.device) if execution.batch_grid is None else execution.batch_grid
        )
        cuda_graphs = resolve_cuda_graphs(
            execution.cuda_graphs, ray is not None, planned_device(execution.device), batch_grid
        )
    _check_options(execution)
    # on Ray, Ray places runs; a pretraining run trains on the device named
    devices = place_devices(execution.device, execution.devices) if ray is None and stacked else None
    return Placement(ray, devices, batch_grid, cuda_graphs, execution.device)


def _check_options(execution: Any) -> None:
    check_execution(execution)  # each option as declared (madsl.runner.execute.options)
    if execution.keep == "best":  # refused here, not once the first run has trained and is to be kept
        from madsl.runner.store.kept import safetensors_torch

        safetensors_torch(f"{option('keep')} best")


def run_precision(name: str, where: Placement) -> str:
    """The precision runs asked to train in `name` (fp32, bf16 or auto) train in where they are
    placed, by the one rule (madsl.runner.train.precision.resolve_precision): auto is bf16 on a
    CUDA device with bf16, else fp32; bf16 where the device has none is an error."""
    from madsl.runner.train.precision import check_precision, resolve_precision

    if check_precision(name) == "fp32":  # fp32 anywhere: no device to ask (and no torch to import)
        return name
    return resolve_precision(name, where.runs_on)


def run_threads_placed(execution: Any, where: Placement) -> int:
    """The torch threads each run trains on where it is placed: the CPUs a run holds on Ray, else
    madsl.runner.execute.threads.run_threads of the workers and `--threads`."""
    if where.ray is not None:
        return max(1, int(where.ray.cpus_per_run))
    return run_threads(execution.workers, getattr(execution, "threads", None))


def run(
    jobs: Sequence[Job],
    execution: Any,
    *,
    reporter: Reporter | None = None,
    stop: Callable[[], bool] | None = None,
    register: Callable[[Any], None] | None = None,
    placement: Placement | None = None,
    skip_solved_at: float | None = None,
) -> Outcome:
    """Run `jobs` (Jobs, or grid groups of them) under `execution` (an Execution of
    madsl.runner.execute.options): the results database is checked, the runs placed (`placement`,
    or `place(execution)`), the store created (only now: bad input leaves none behind), `register(store)`
    called to file the runs (their identities, specs and labels), and every job not done yet run
    by the executor (execution.executor: "local", "ray" or an Executor object). Runs finished
    before are never repeated; `stop` is polled (once true, runs checkpoint and stop); progress
    goes to `reporter`. `skip_solved_at`: a run is skipped once a sibling of its setting reached
    this accuracy. A database that cannot be written is a MadslError; what was recorded stays."""
    check_store(execution)
    where = placement if placement is not None else place(execution)
    threads = getattr(execution, "threads", None)
    runner = (
        execution.executor
        if isinstance(execution.executor, Executor)
        else executor_for(execution.workers, where.ray, threads)
    )
    if reporter is not None and where.ray is None and not isinstance(execution.executor, Executor):
        warning = oversubscribed(execution.workers, run_threads_placed(execution, where), load=load_average())
        if warning is not None:
            reporter.message(f"warning: {warning}")
    from madsl.runner.store.results import Store

    store = Store(execution.db)
    try:
        if register is not None:
            register(store)
        return run_jobs(
            store, list(jobs), runner, reporter, skip_solved_at=skip_solved_at, stop_requested=stop or (lambda: False)
        )
    except sqlite3.OperationalError as err:
        # every write is a transaction: what was recorded stays, and the runs in flight stay
        # claimed by this (now ended) process, so the same command resumes them from their checkpoints
        raise MadslError(
            f"the results database {execution.db} could not be written: {err}",
            hint="free disk space (or fix the file system) and rerun the same command: finished "
            "runs are kept and the others resume",
        ) from None
    finally:
        store.close()

"""Where runs train: the devices of this machine runs are placed on, grid batching and CUDA
graphs by device, and the executor that runs them (local processes or Ray).
"""

from __future__ import annotations

from typing import Any, Sequence

from madsl.errors import MadslError, option
from madsl.runner.execute.local import Executor, make_executor


def planned_device(device: str) -> str:
    """The device kind the runs will train on (what `auto` precision resolves against)."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_cuda_graphs(cuda_graphs: bool | None, on_ray: bool, device: str, batch_grid: bool) -> bool:
    """Whether steps replay as CUDA graphs. By default (None) wherever they can: grid-batched
    training on a CUDA device of this machine (on an H100, faster than stacked without them
    for attention, Hyena and Mamba on every task but memorization's one-epoch measurement,
    with results equal to eager's to rounding: docs/gpu.md); asked for (True) where they
    cannot: bad input."""
    if cuda_graphs is None:
        return not on_ray and batch_grid and device.startswith("cuda")
    if cuda_graphs:
        _check_cuda_graphs(on_ray, device, batch_grid)
    return cuda_graphs


def _check_cuda_graphs(on_ray: bool, device: str, batch_grid: bool) -> None:
    """CUDA graphs replay grid-batched (stacked) training on a CUDA device of this machine."""
    if on_ray:
        raise MadslError(
            f"{option('cuda_graphs')} runs with the local executors only: Ray runs each run as its own task",
            hint=f"drop {option('cuda_graphs')}, or use {option('executor')} local",
        )
    if not device.startswith("cuda"):
        raise MadslError(
            f"{option('cuda_graphs')} needs a CUDA device; the runs are planned on {device}",
            hint=f"run on a GPU ({option('device')} cuda), or drop {option('cuda_graphs')}",
        )
    if not batch_grid:
        raise MadslError(
            f"{option('cuda_graphs')} replays grid-batched training: it needs grid batching",
            hint=f"turn grid batching ({option('batch_grid')}) back on (the default on CUDA), or drop "
            f"{option('cuda_graphs')}",
        )


def default_batch_grid(device: str) -> bool:
    """Grid batching by default: on CUDA, where one small run leaves most of the device idle;
    off on the CPU, where members run one after another anyway (docs/gpu.md, measured)."""
    return planned_device(device).startswith("cuda")


def place_devices(device: str, devices: Sequence[str] | None) -> list[str] | None:
    """The devices runs are placed on, round-robin in plan order (`--devices cuda:0,cuda:1`):
    None for one device. Default on CUDA: every visible GPU. Each must exist (exit 2 otherwise)."""
    import torch

    if devices is None:
        on_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
        count = torch.cuda.device_count() if on_cuda else 0
        return [f"cuda:{i}" for i in range(count)] if count > 1 else None
    if not devices:
        raise MadslError(f"{option('devices')}: the list is empty", hint="e.g. cuda:0,cuda:1")
    for name in devices:
        kind, _, index = name.partition(":")
        if name == "cpu":
            continue
        if kind != "cuda" or not index.isdigit():
            raise MadslError(f"{option('devices')}: unknown device {name!r}", expected="cpu or cuda:N, comma-separated")
        if int(index) >= torch.cuda.device_count():
            raise MadslError(
                f"{option('devices')}: {name} does not exist on this machine "
                f"({torch.cuda.device_count()} CUDA device(s) visible)",
                hint="see nvidia-smi, or CUDA_VISIBLE_DEVICES",
            )
    return list(devices)


EXECUTORS = ("local", "ray")


def ray_device(options: Any) -> str:
    """Runs on Ray train on their GPU share, else on the CPU (the driver's devices do not count)."""
    return "cuda" if options.gpus_per_run else "cpu"


def ray_options(executor: Executor | str | None, address: str | None, cpus_per_run: float, gpus_per_run: float) -> Any:
    """RayOptions when the runs go to Ray (checked now, before anything is planned), else None."""
    if executor is None or isinstance(executor, Executor) or executor == "local":
        return None
    if executor != "ray":
        from madsl.errors import did_you_mean

        raise MadslError(
            f"unknown executor {executor!r}",
            expected=" or ".join(EXECUTORS),
            hint=did_you_mean(str(executor), EXECUTORS),
        )
    from madsl.runner.execute.ray import RayOptions, import_ray

    options = RayOptions(address=address, cpus_per_run=float(cpus_per_run), gpus_per_run=float(gpus_per_run))
    options.check()
    import_ray()
    return options


def executor_for(workers: int, ray: Any, threads: int | None = None) -> Executor:
    """The executor of the runs: `workers` local ones on `threads` torch threads each (None: the
    default of madsl.runner.execute.threads), or Ray's (`ray`: its RayOptions, None: local)."""
    if ray is None:
        return make_executor(workers, threads)
    from madsl.runner.execute.ray import RayExecutor

    return RayExecutor(ray)


def check_workers_and_device(workers: int, device: str, on_this_machine: bool = True) -> None:
    """--workers at least 1, --device one of auto, cpu, cuda (cuda: one this machine has, unless on Ray)."""
    if workers < 1:
        raise MadslError(f"{option('workers')} must be at least 1, got {workers}")
    if device not in ("auto", "cpu", "cuda"):
        raise MadslError(f"unknown device {device!r}", expected="auto, cpu or cuda")
    if device == "cuda" and on_this_machine:  # on Ray, the workers' GPUs count
        import torch

        if not torch.cuda.is_available():
            raise MadslError(
                f"{option('device')} cuda: no CUDA device is available", hint=f"use {option('device')} auto or cpu"
            )

"""How runs execute: the options of an evaluation that change no result, each declared once.

An `Option` is one knob of `madsl eval` and `madsl.evaluate` that decides where and how the runs
execute, not what they compute (so none enters a run's identity): the results database, the
workers and devices, the executor, grid batching and CUDA graphs, checkpoints, kept weights, a dry
run. Its declaration carries its default, its help text and how the command line reads it; from
this table come the `eval` command's options (madsl/cli/evaluate.py) and `Execution`, the frozen
record of them that `madsl.evaluate` takes (madsl.runner.config). What the runs train is the other
table, madsl.runner.plan.settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from madsl.errors import option as named
from madsl.lang.declare import Choice, Flag, Kind, Number, Where
from madsl.runner.common.words import non_negative_text, positive_int_text, positive_text
from madsl.runner.store.results import DEFAULT_DB


def device_list_text(text: str) -> list[str]:
    """Devices, comma-separated (cuda:0,cuda:1); each is checked when runs are placed."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):  # "cuda:0,,cuda:1" or a trailing comma: a device left out, not to be guessed
        raise ValueError(f"an empty item in {text!r}: expected a device between every two commas")
    return names


@dataclass(frozen=True)
class Option:
    name: str  # its keyword of madsl.evaluate and its field of Execution
    default: Any
    help: str
    flag: str
    cli: Mapping[str, Any] = field(default_factory=dict)  # argparse: choices, metavar, action
    text: Callable[[str], Any] | None = None  # one command-line word -> its value (ValueError if bad)
    group: str = ""  # the --help section it is listed in ("" or "cluster")
    kind: Kind | None = None  # what a value given to madsl.evaluate may be (None: checked where it is used)


OPTIONS: tuple[Option, ...] = (
    Option("db", DEFAULT_DB, f"results database (default: {DEFAULT_DB})", "--db"),
    Option(
        "workers",
        1,
        "runs in parallel (local processes; default 1)",
        "--workers",
        text=positive_int_text,
        kind=Number(integer=True, minimum=1),
    ),
    Option(
        "threads",
        None,
        "torch threads of each run on the CPU (default: the cores shared out among the workers, at most "
        "1: a second thread slows the small models of a CPU study, madsl.runner.execute.threads)",
        "--threads",
        {"metavar": "N"},
        text=positive_int_text,
        kind=Number(integer=True, minimum=1),
    ),
    Option(
        "device",
        "auto",
        "where runs train (default: auto, CUDA when available)",
        "--device",
        {"choices": ("auto", "cpu", "cuda")},
        kind=Choice(("auto", "cpu", "cuda"), "device"),
    ),
    Option(
        "devices",
        None,
        "place runs on these devices round-robin, e.g. cuda:0,cuda:1 (default on CUDA: every visible GPU)",
        "--devices",
        {"metavar": "DEV,DEV"},
        text=device_list_text,
    ),
    Option(
        "executor",
        "local",
        "local: --workers processes of this machine (default); ray: a Ray cluster (needs madsl[ray])",
        "--executor",
        {"metavar": "local|ray"},
        group="cluster",
    ),
    Option(
        "address",
        None,
        "the Ray cluster to use (default: start a local Ray instance sized to this machine)",
        "--address",
        {"metavar": "auto|HOST:PORT"},
        group="cluster",
    ),
    Option(
        "cpus_per_run",
        1.0,
        "CPUs each run holds on Ray (default: 1)",
        "--cpus-per-run",
        {"metavar": "N"},
        text=positive_text,
        group="cluster",
        kind=Number(minimum=0, inclusive=False),
    ),
    Option(
        "gpus_per_run",
        0.0,
        "GPUs each run holds on Ray; fractions share a GPU, e.g. 0.25 (default: 0)",
        "--gpus-per-run",
        {"metavar": "F"},
        text=non_negative_text,
        group="cluster",
        kind=Number(minimum=0),
    ),
    Option(
        "batch_grid",
        None,
        "train the runs of a setting that differ only in lr, weight decay or seed together, "
        "in one job (each stored as its own run, results as unbatched; default: on for CUDA, off on the CPU)",
        "--batch-grid",
        {"action": "boolean"},
        kind=Flag(),
    ),
    Option(
        "cuda_graphs",
        None,
        "train every run stacked (grid groups; a run alone as a stack of one) and replay "
        "each training step and evaluation batch as a CUDA graph: one launch each (CUDA with grid batching only; "
        "a step that cannot be captured runs on without; default: on where grid batching is on a CUDA device)",
        "--cuda-graphs",
        {"action": "boolean"},
        kind=Flag(),
    ),
    Option(
        "keep",
        "none",
        "best: keep each run's best weights in the results folder, for `madsl export RUN_ID`",
        "--keep",
        {"choices": ("none", "best")},
        kind=Choice(("none", "best"), "keep"),
    ),
    Option(
        "checkpoint_every",
        None,
        "how often a run writes its checkpoint, at an epoch's end or inside a long one "
        "(default 60: a crash loses at most a minute of training; 0: after every epoch)",
        "--checkpoint-every",
        {"metavar": "SECONDS"},
        text=non_negative_text,
        kind=Number(
            minimum=0, unit=" of seconds", hint="how often a run writes its checkpoint, e.g. 60; 0: after every epoch"
        ),
    ),
    Option(
        "dry_run",
        False,
        "print the plan and exit: runs (in all, done, pending), training tokens, FLOPs, "
        "estimated time (the FLOPs at this machine's measured training rate); with --format json",
        "--dry-run",
        {"action": "store_true"},
        kind=Flag(),
    ),
    Option(
        "measure_rate",
        False,
        "measure this machine's training rate again for the plan's time estimate (it is "
        "measured once per device and thread count, and cached)",
        "--measure-rate",
        {"action": "store_true"},
        kind=Flag(),
    ),
)
BY_NAME: Mapping[str, Option] = {option.name: option for option in OPTIONS}

# The options as one frozen record; `executor` may also hold an Executor object (Python only).
Execution = dataclasses.make_dataclass(
    "Execution",
    [(option.name, Any, field(default=option.default)) for option in OPTIONS],
    frozen=True,
    namespace={
        "__module__": __name__,
        "__doc__": "How an evaluation's runs execute (madsl.runner.execute.options); changes no result.",
    },
)


def check_execution(execution: Any) -> None:
    """Every option given (not None) checked against its declaration, named as its caller wrote
    it (a keyword of madsl.evaluate, a flag of the command line)."""
    for option in OPTIONS:
        value = getattr(execution, option.name)
        if option.kind is not None and value is not None:
            option.kind.check(value, Where(), named(option.name))

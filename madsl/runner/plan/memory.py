"""Whether a planned run can fit where it trains, decided before anything runs.

A setting such as `--set vocab_size=1000000000` plans like any other, then fails every run
(or the plan's timed steps) on an allocation of half a terabyte. `check_fits` refuses such a
plan up front, with what the run needs and what the device has. It compares a *lower bound*
of a run's memory, so that it never refuses a run that would fit:

    weights            4 bytes a parameter (float32 master weights, frozen or not)
    training state     12 bytes a trained parameter (its gradient and AdamW's two moments)
    data               4 bytes a token of the training and test splits (int64 ids take 8)
    activations        2 bytes a number of the residual stream each layer keeps for the
                       backward (bf16 at the least), batch x length x width x layers
    logits             2 bytes a class of one position of each sequence in a batch

or, where `eval_lengths` asks for longer sequences and that needs more, the weights, the test
split at the longest length and one layer's activations of a batch of it (a forward),

summed over the members of a group trained in one process (stacked or in lockstep: each
member holds its weights and state, members of one seed share their data, activations count
once), against the device's total memory (a CPU's: the machine's, or its container's limit).
Parameters come from the accounting (`madsl.graph.account`), so a spec
costs nothing to check: no model is built. Runs on Ray go to machines this one cannot see
and are not checked. The runs that pass may still run out of memory (the bound leaves out
most activations); those fail as runs, with the error recorded (exit 3).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

from madsl.errors import MadslError, option
from madsl.tasks.base import data_shape

if TYPE_CHECKING:
    from madsl.runner.plan.cost import Shapes

WEIGHT_BYTES = 4
TRAINING_STATE_BYTES = 12
TOKEN_BYTES = 4
ACTIVATION_BYTES = 2


def size_text(num_bytes: float) -> str:
    """Bytes in binary units: 1.5 GiB, 2.0 TiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if num_bytes < 1024 or unit == "TiB":
            return f"{num_bytes:,.0f} {unit}" if unit == "B" else f"{num_bytes:,.1f} {unit}"
        num_bytes /= 1024
    raise AssertionError("unreachable")


def device_memory(device: str) -> tuple[str, int | None]:
    """(the device's name, its total memory in bytes; None where unknown)."""
    if device in ("auto", "cuda") or device.startswith("cuda:"):
        import torch

        if torch.cuda.is_available():
            index = int(device.partition(":")[2] or torch.cuda.current_device())
            properties = torch.cuda.get_device_properties(index)
            return f"cuda:{index} ({properties.name})", int(properties.total_memory)
        if device != "auto":
            return device, None  # no such device: refused elsewhere (--device / --devices)
    return "this machine", cpu_memory()


def cpu_memory() -> int | None:
    """The machine's physical memory, or its cgroup's limit where that is lower."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    try:
        with open("/sys/fs/cgroup/memory.max") as limit_file:
            limit = limit_file.read().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


def needs(members: Sequence[Any], params: int, layers: int) -> dict[str, int]:
    """The lower bound of the memory of runs trained together in one process (a run alone: one
    member), by part (bytes): training, or the evaluation at the longest `eval_lengths` where
    that needs more (a forward keeps one layer's activations). Each member holds its weights and
    training state; members of one seed share their data splits; activations are counted once
    (members in lockstep take their steps one after another)."""
    first = members[0]
    settings = dict(first.setting)
    seq_len, train_examples, test_examples = data_shape(first.task, settings)
    batch, dim = int(first.train.batch_size), int(first.model_factory.spec.dim)
    meta = int(getattr(first.model_factory.spec, "meta_tokens", 0))  # the stack reads them ahead of every sequence
    trained = 0 if first.train.freeze else params  # which parameters a freeze leaves is known to the model only
    runs, seeds = len(members), len({member.train.seed for member in members})
    training = {
        "weights": WEIGHT_BYTES * params * runs,
        "training state": TRAINING_STATE_BYTES * trained * runs,
        "data": TOKEN_BYTES * (train_examples + test_examples) * seq_len * seeds,
        "activations": ACTIVATION_BYTES * min(batch, max(train_examples, 1)) * (seq_len + meta) * dim * max(layers, 1),
        "logits": ACTIVATION_BYTES * min(batch, max(train_examples, 1)) * int(first.task.num_classes(settings)),
    }
    longest = max(first.train.eval_lengths, default=0)
    evaluation = {
        "weights": WEIGHT_BYTES * params * runs,
        "data": TOKEN_BYTES * test_examples * longest,
        "activations": ACTIVATION_BYTES * min(batch, max(test_examples, 1)) * (longest + meta) * dim,
    }
    return max(training, evaluation, key=lambda parts: sum(parts.values()))


def check_fits(work: Sequence[Any], shapes: "Shapes | None" = None) -> None:
    """Refuse (MadslError, exit 2) a plan with a run or group whose lower bound exceeds its
    device's memory. `work`: the units an executor runs (RunJobs and GroupJobs); `shapes`: the
    plan's accounting (madsl.runner.plan.cost.Shapes), which its cost reads after (each shape
    accounted once)."""
    from madsl.runner.plan.cost import Shapes

    shapes = shapes if shapes is not None else Shapes()
    for unit in work:
        members = list(getattr(unit, "members", [unit]))
        first = members[0]
        spec = getattr(first.model_factory, "spec", None)
        if spec is None:  # a stand-in model: nothing to account
            continue
        settings = dict(first.setting)
        seq_len, vocab = int(settings.get("seq_len", 1)), int(first.task.vocab_size(settings))
        accounting = shapes.accounting(spec, seq_len, vocab)
        params, layers = accounting.totals["params"], len(accounting.layers)
        parts = needs(members, params, layers)
        needed = sum(parts.values())
        where, available = device_memory(getattr(unit, "device", first.device))
        if available is None or needed <= available:
            continue
        knobs = ", ".join(
            f"{k}={v}"
            for k, v in settings.items()
            if k in ("seq_len", "vocab_size", "num_train_examples", "num_test_examples")
        )
        runs = f"{len(members)} runs trained together need" if len(members) > 1 else "a run needs"
        detail = ", ".join(f"{name} {size_text(size)}" for name, size in parts.items() if size)
        raise MadslError(
            f"{spec.name} on {first.task.name} ({knobs}, batch {first.train.batch_size}) does not fit: "
            f"{runs} at least {size_text(needed)} ({params:,} parameters a run; {detail}), "
            f"and {where} has {size_text(available)}",
            hint=f"lower the settings that size it ({option('settings_overrides')} vocab_size, seq_len, "
            f"num_train_examples; {option('batch_size')}), or train where there is more memory",
        )

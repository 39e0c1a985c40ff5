"""Ops dispatched per training step: a device-independent proxy for GPU kernel launches.

A width-128 MAD model's step on a GPU costs its kernel launches, not its arithmetic
(docs/gpu.md). This counts the aten ops that reach the dispatcher in one training step,
and in one epoch's evaluation, on the CPU, for the paper grid's 6 (lr, wd) runs of one
spec: unbatched (each run's own step, `train.train_step`, and evaluation, `train.evaluate`)
against the 6 members stacked (`madsl.runner.batched.stacked`: one step, one evaluation), measured
in the same run; and the ops that read a value on the host (each would make a GPU wait).
With `--cuda-graphs` on a device, a stacked step or evaluation batch is one graph replay
whatever its count.

    python benchmarks/step_ops.py                        # attention-sg, hyena-sg, mamba
    python benchmarks/step_ops.py --specs specs/paper/*.mad --seq-len 128 --batch-size 32
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import madsl.runner.batched.stacked as stacked  # noqa: E402
import madsl.runner.train.loop as train  # noqa: E402
from madsl.runner.execute.jobs import execute_job  # noqa: E402
from madsl.runner.plan.evaluation import cli_overrides, plan_evaluation  # noqa: E402
from madsl.runner.store.files import StoreFiles  # noqa: E402
from madsl.spec import load_spec  # noqa: E402

DEFAULT_SPECS = ["specs/paper/attention-sg.mad", "specs/paper/hyena-sg.mad", "specs/paper/mamba.mad"]
TEST_BATCHES = 4
METADATA_ONLY = {torch.ops.aten.detach, torch.ops.aten.lift_fresh, torch.ops.aten._unsafe_view}  # (not marked views)
HOST_READS = ("_local_scalar_dense", "nonzero", "is_nonzero", "masked_select", "unique")


class OpCount(TorchDispatchMode):
    """Counts the ops dispatched while active, those that compute (a view or a reshape of
    metadata launches no kernel on a GPU), and those that read a value on the host."""

    def __init__(self):
        super().__init__()
        self.ops = self.computing = self.host_reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        self.computing += not func.is_view and func.overloadpacket not in METADATA_ONLY
        self.host_reads += any(name in str(func) for name in HOST_READS)
        return func(*args, **(kwargs or {}))


def counted(owner, name: str, count: OpCount, steps: list) -> Callable[[], None]:
    """Count the ops of every call of owner.name (a step function); returns the undo."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        steps.append(1)
        with count:
            return original(*args, **kwargs)

    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, original)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", nargs="+", default=DEFAULT_SPECS)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="bf16: count under CPU bf16 autocast, as the GPU trains (default fp32)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"ops dispatched, paper grid of 6 runs, in-context recall, length {args.seq_len}, batch {args.batch_size}, "
        f"{TEST_BATCHES} test batches, {args.precision} (CPU)"
    )
    for path in args.specs:
        spec = load_spec(path)
        cli = cli_overrides(
            protocol="baseline",
            tasks=["in-context-recall"],
            lr=[1e-4, 5e-4, 1e-3],
            wd=[0.0, 0.1],
            epochs=1,
            batch_size=args.batch_size,
            eval_lengths=[],
            precision=args.precision,
            settings={
                "seq_len": args.seq_len,
                "num_train_examples": 2 * args.batch_size,
                "num_test_examples": TEST_BATCHES * args.batch_size,
            },
        )
        counts = {}
        for mode in ("unbatched", "stacked"):
            # a training step: train.train_step, StackedMembers.step; an epoch's evaluation (of every
            # member): train.evaluate (once per run), StackedMembers.evaluate (once)
            step, steps, evaluation, evaluations = OpCount(), [], OpCount(), []
            owner = stacked.StackedMembers if mode == "stacked" else train
            undo = [
                counted(owner, "step" if mode == "stacked" else "train_step", step, steps),
                counted(owner, "evaluate", evaluation, evaluations),
            ]
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    plan = plan_evaluation(StoreFiles(Path(tmp) / "a.db"), [(spec, path)], cli, device="cpu")
                    for job in plan.work(batch_grid=mode == "stacked"):
                        if mode == "stacked":
                            job.stack = True
                        execute_job(job, lambda event: None, lambda: False)
            finally:
                for restore in undo:
                    restore()
            runs_per_step = 6 if mode == "unbatched" else 1  # unbatched, six runs take a step each
            counts[mode] = {
                "step": step.ops / len(steps) * runs_per_step,
                "step kernels": step.computing / len(steps) * runs_per_step,
                "evaluation": evaluation.ops,  # one epoch: six runs' evaluations, or the stack's one
                "step reads": step.host_reads / len(steps) * runs_per_step,
                "evaluation reads": evaluation.host_reads,
            }  # the epoch's metrics, to the host
        unbatched, stacked_counts = counts["unbatched"], counts["stacked"]
        print(
            f"  {spec.name:14s} a step of the 6: unbatched {unbatched['step']:6.0f}, stacked "
            f"{stacked_counts['step']:6.0f} ({stacked_counts['step'] / unbatched['step']:.2f}x); computing ops "
            f"{unbatched['step kernels']:6.0f}, {stacked_counts['step kernels']:6.0f}   "
            f"an epoch's evaluation: unbatched {unbatched['evaluation']:6.0f}, stacked "
            f"{stacked_counts['evaluation']:6.0f} ({stacked_counts['evaluation'] / unbatched['evaluation']:.2f}x)   "
            f"host reads: a step {unbatched['step reads']:.0f}, {stacked_counts['step reads']:.0f}; an evaluation "
            f"{unbatched['evaluation reads']:.0f}, {stacked_counts['evaluation reads']:.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

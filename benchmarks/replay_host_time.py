"""What the host spends on a graph-replayed stacked step: is the CPU side fast enough that, on
a GPU, a replayed step costs only the graph's device time?

Runs on the CPU. torch.cuda's stream and graph calls are replaced by stand-ins: a capture
records nothing and a replay costs nothing, so the steady epochs of a stacked group (the
paper grid of 6, one task's baseline, `--examples` training examples) measure everything the
host does per step around the replay: the batch gathered and copied into the graph's
buffers, the members' learning rates and Adam's bias corrections uploaded, the schedulers
stepped, progress, and the same per evaluation batch. The baseline, measured in the same
run: the same group's eager stacked epoch on this CPU (the work a replay stands for, at CPU
speed, not a GPU's).

    python benchmarks/replay_host_time.py                      # attention-sg, hyena-sg, mamba
    python benchmarks/replay_host_time.py --specs specs/paper/hyena-sg.mad --examples 1280
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from madsl.runner.batched import replay  # noqa: E402
from madsl.runner.execute.jobs import execute_job  # noqa: E402
from madsl.runner.plan.evaluation import cli_overrides, plan_evaluation  # noqa: E402
from madsl.runner.plan.protocols import PAPER_GRID_LR, PAPER_GRID_WD  # noqa: E402
from madsl.runner.store.files import StoreFiles  # noqa: E402
from madsl.spec import load_spec  # noqa: E402

DEFAULT_SPECS = ["specs/paper/attention-sg.mad", "specs/paper/hyena-sg.mad", "specs/paper/mamba.mad"]
# Two full evaluation batches (the batch size is 128): every batch shape, training's and
# evaluation's, has had its 3 warm-up runs and its capture by the end of epoch 2, so epoch 3
# only replays. (A smaller last batch would be a shape of its own, warming up one epoch at a time.)
TEST_EXAMPLES = 256


class _FreeReplays:
    """torch.cuda's graph calls as `replay._Replayed` makes them, on the CPU: warm-up runs
    compute, a capture records nothing, a replay returns at once."""

    def __init__(self) -> None:
        self.capturing = False

    def install(self, patch: Callable[[object, str, object], None]) -> None:
        """`patch(owner, name, value)`: a setattr that main undoes afterwards."""
        free = self

        class Graph:
            def replay(self) -> None:
                pass

        class Capture:
            def __init__(self, graph, capture_error_mode: str = "global"):
                pass

            def __enter__(self) -> None:
                free.capturing = True

            def __exit__(self, *exc) -> bool:
                free.capturing = False
                return False

        class Stream:
            def __init__(self, device=None):
                pass

            def wait_stream(self, other) -> None:
                pass

        patch(torch.cuda, "CUDAGraph", Graph)
        patch(torch.cuda, "graph", Capture)
        patch(torch.cuda, "Stream", Stream)
        patch(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
        patch(torch.cuda, "current_stream", lambda: Stream())
        patch(torch.cuda, "synchronize", lambda: None)
        init = replay._Replayed.__init__

        def replayed_init(replayed, compute, device, graphs: bool, what: str) -> None:
            init(replayed, compute, device, graphs, what)
            replayed.graphs = graphs  # as on a CUDA device
            replayed.compute = lambda *args: None if free.capturing else compute(*args)

        patch(replay._Replayed, "__init__", replayed_init)


def epoch_seconds(path: str, task: str, examples: int, epochs: int, graphs: bool, workdir: Path) -> list[float]:
    """The recorded seconds of each epoch of the paper grid's 6 runs trained as one stack."""
    cli = cli_overrides(
        protocol="baseline",
        tasks=[task],
        lr=list(PAPER_GRID_LR),
        wd=list(PAPER_GRID_WD),
        epochs=epochs,
        eval_lengths=[],
        precision="fp32",
        settings={"num_train_examples": examples, "num_test_examples": TEST_EXAMPLES},
    )
    plan = plan_evaluation(
        StoreFiles(workdir / f"{Path(path).stem}-{graphs}.db"), [(load_spec(path), path)], cli, device="cpu"
    )
    events: list = []
    for job in plan.work(batch_grid=True, cuda_graphs=graphs):
        job.stack = True
        execute_job(job, events.append, lambda: False)
    done = [e for e in events if e.kind == "finished"]
    if len(done) != len(plan.jobs):
        raise RuntimeError(f"{path}: runs did not finish: {[e.data for e in events if e.kind == 'failed']}")
    return [epoch["seconds"] for epoch in done[0].data["result"]["history"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", nargs="+", default=DEFAULT_SPECS)
    parser.add_argument("--task", default="in-context-recall")
    parser.add_argument(
        "--examples", type=int, default=640, help="training examples, a multiple of 128 (steps = examples / 128)"
    )
    args = parser.parse_args()
    if args.examples <= 0 or args.examples % 128:
        parser.error(f"--examples must be a positive multiple of the batch size 128, got {args.examples}")
    torch.set_num_threads(1)
    steps = args.examples // 128
    print(
        f"CPU, 1 thread; {args.task}, {args.examples} training examples ({steps} steps an epoch), "
        f"{TEST_EXAMPLES} test examples; the paper grid of 6 as one stack"
    )
    restore: list = []

    def patch(owner, name, value) -> None:
        restore.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    with tempfile.TemporaryDirectory() as tmp:
        for path in args.specs:
            eager = epoch_seconds(path, args.task, args.examples, 1, False, Path(tmp))[0]
            _FreeReplays().install(patch)
            try:  # epoch 1 warms up (3 steps and evaluation batches each) and captures; 2 and 3 replay
                replayed = epoch_seconds(path, args.task, args.examples, 3, True, Path(tmp))[-1]
            finally:
                for owner, name, value in reversed(restore):
                    setattr(owner, name, value)
                restore.clear()
            print(
                f"  {Path(path).stem:14s} host per replayed step {replayed / steps * 1e3:6.2f} ms (its evaluation "
                f"included); eager stacked step on this CPU {eager / steps:7.2f} s; ratio {replayed / eager:.1e}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the full `paper` protocol costs per architecture on this device.

For each spec and each MAD task: one run at the task's baseline setting, trained by the
runner itself (`execute_job`: data, model, AdamW, evaluation) for two epochs, its second
epoch timed (the steady state: the first pays one-time costs); then the projection

    hours = sum over the paper protocol's runs of  epoch seconds(task) x scale(setting) x epochs x stop

with scale(setting) = (train examples x sequence length) of the setting over the
baseline's (linear: attention's quadratic term is ignored, a lower bound for long
settings), epochs = 200 and stop = the fraction of epochs early stopping leaves
(`--stop-fraction`, default 1: no early stop, an upper bound; measure it on a sample of
settings with `--measure-stop K`, which trains K settings of each task as the paper
protocol does, or elsewhere with `madsl eval --protocol paper --task ...`, and pass it in).

Grid batching: for each task, the paper grid's 6 (lr, wd) runs of one epoch on
`--grid-examples` training examples, run one after another (`execute_job` each), as one
grid group in lockstep and as one stacked model (`madsl.runner.batched.grid`, `stacked`; where the
layers stack), in the same process and run; the columns are time over the unbatched time
(below 1: faster; CPU time of this process on the CPU, wall time on a GPU), or with
`--grid-examples baseline` the runs' own second epochs at the baseline setting; and the
projection is also given with each task's hours scaled by the ratio of grid-batched training
as this device runs it: on the CPU lockstep; on CUDA stacked, without CUDA graphs and with
them (the default there).

With `--shapes`, nothing is scaled from the baseline: every sequence length in each task's
sweep is trained as `madsl eval` trains it by default on this device (the paper grid as one
group, stacked and graph-replayed on CUDA; run by run on the CPU) for `--shape-steps` steps
an epoch, and its steady epoch (the wall time from the first epoch's end to the second's) is
split into the training steps, the evaluation (timed, the device synchronized) and the
checkpoints; each setting then costs its steps x the step + its test examples x the
evaluation per example + the checkpoints, per epoch. This is the projection to read on a
GPU: a launch-bound short setting and a compute-bound long one are each measured.

Each spec ends with its arithmetic floor: the protocol's FLOPs (the accounting; 200 epochs, no
early stop) at the rate this device multiplies the model's own matrices, measured in the same
process, and the sustained rate that 2 device-hours would need.

    python benchmarks/protocol_cost.py                       # paper specs mamba, hyena-sg, attention-sg; on a
                                                             # GPU: baseline grids and the per-shape projection
    python benchmarks/protocol_cost.py --quick               # a few minutes on 2 CPU cores
    python benchmarks/protocol_cost.py --grid-only           # only batched vs unbatched, every task
    python benchmarks/protocol_cost.py --grid-only --grid-examples 16   # per-step overhead regime
    python benchmarks/protocol_cost.py --specs specs/paper/*.mad --precision bf16 --device cuda
    python benchmarks/protocol_cost.py --device cuda --measure-stop 2     # early stopping measured
    python benchmarks/protocol_cost.py --device cuda --workers-per-device 3   # runs sharing one GPU
    python benchmarks/protocol_cost.py --device cuda --precision bf16 --grid-examples baseline --grid-modes graphs \
        --shapes                                             # the GPU projection, measured per shape
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from madsl.runner.batched.grouping import stacks_on  # noqa: E402
from madsl.runner.execute.devices import default_batch_grid, resolve_cuda_graphs  # noqa: E402
from madsl.runner.execute.jobs import RunJob, execute_job  # noqa: E402
from madsl.runner.plan.evaluation import CompiledSpecFactory, cli_overrides, plan_evaluation, plan_spec, tasks_by_name  # noqa: E402
from madsl.runner.plan.overrides import Overrides  # noqa: E402
from madsl.runner.plan.protocols import PAPER_GRID_LR, PAPER_GRID_WD  # noqa: E402
from madsl.runner.store.files import StoreFiles  # noqa: E402
from madsl.runner.store.results import canonical_json  # noqa: E402
from madsl.runner.train.precision import resolve_precision  # noqa: E402
from madsl.spec import load_spec  # noqa: E402

# The epoch timed: the first pays one-time costs that 200 epochs amortize (cuBLAS and cuDNN
# heuristics, Triton autotuning, CUDA graph capture, the allocator's growth); the second is the
# steady state (or the last, where early stopping ends a run sooner).
TIMED_EPOCH = 2
SHAPE_STEPS = 20  # training steps of a per-shape measurement (--shapes): steady steps cost alike
DEFAULT_SPECS = ["specs/paper/mamba.mad", "specs/paper/hyena-sg.mad", "specs/paper/attention-sg.mad"]


def _size(setting: dict) -> float:
    return float(setting.get("num_train_examples", 1)) * float(setting.get("seq_len", 1))


def epoch_seconds(
    spec, path: str, task_name: str, device: str, precision: str, examples: int | None, workdir: Path
) -> tuple[float, dict]:
    """Seconds of a runner epoch (train + eval; the TIMED_EPOCH-th) at the task's baseline setting,
    scaled to its full number of training examples when `examples` trims it; and the baseline setting."""
    registry, all_tasks = tasks_by_name(None)
    overrides = Overrides(
        protocol="baseline",
        tasks=(task_name,),
        lrs=(1e-3,),
        wds=(0.0,),
        epochs=TIMED_EPOCH,
        eval_lengths=(),
        precision=resolve_precision(precision, "cuda" if device.startswith("cuda") else "cpu"),
    )
    if examples is not None:
        overrides.settings = {"num_train_examples": examples, "num_test_examples": min(examples, 256)}
    run = plan_spec(spec, path, overrides, registry, all_tasks).runs[0]
    full = (
        plan_spec(spec, path, Overrides(protocol="baseline", tasks=(task_name,)), registry, all_tasks).runs[0].settings
    )
    events = []
    job = RunJob(
        run_id=f"bench-{spec.name}-{task_name}",
        task=registry[task_name],
        setting=dict(run.settings),
        train=run.train,
        model_factory=CompiledSpecFactory(spec, path),
        checkpoint_path=str(workdir / f"{spec.name}-{task_name}.pt"),
        data_dir=str(workdir / "data"),
        device=device,
        label=task_name,
    )
    execute_job(job, events.append, lambda: False)
    finished = [e for e in events if e.kind == "finished"]
    if not finished:
        raise RuntimeError(f"{task_name}: the run did not finish: {events[-1]}")
    seconds = finished[0].data["result"]["history"][-1]["seconds"]
    return seconds * _size(full) / _size(run.settings), dict(full)


def grid_seconds(
    spec,
    path: str,
    task_name: str,
    device: str,
    precision: str,
    examples: int | None,
    workdir: Path,
    repeats: int = 1,
    modes: Sequence[str] | None = None,
) -> dict[str, float | None]:
    """Seconds of the paper grid's 6 (lr, wd) runs (one epoch on `examples` training
    examples): one after another ("unbatched"), as one grid group in lockstep, as one stacked
    model ("stacked"; None where the layers do not stack) and, on CUDA, stacked with its step
    replayed as a CUDA graph ("graphs"); each with its own data cache. With `repeats` > 1 the
    modes run that many rounds, interleaved, and each keeps its fastest: the first round pays
    the one-time costs (kernel autotuning, FFT plans, allocator growth) of its shapes.

    `examples` None: the task's baseline setting, for TIMED_EPOCH epochs, the last timed as the
    runner times an epoch (training and evaluation; data generation, model building and the
    first epoch's one-time costs excluded: the members' recorded seconds of it, summed where
    they train one after another, unbatched or in lockstep). `modes`: only these (default all
    of this device's)."""
    import torch

    from madsl.runner.batched.stacked import batchable
    from madsl.runner.execute.jobs import job_inputs

    settings = None if examples is None else {"num_train_examples": examples, "num_test_examples": min(examples, 256)}
    cli = cli_overrides(
        protocol="baseline",
        tasks=[task_name],
        lr=list(PAPER_GRID_LR),
        wd=list(PAPER_GRID_WD),
        epochs=TIMED_EPOCH if examples is None else 1,
        eval_lengths=[],
        precision=precision,
        settings=settings,
    )
    # CPU time on the CPU (robust to other jobs on a shared machine), wall time on a GPU
    clock = time.monotonic if device.startswith("cuda") else time.process_time
    all_modes = ("unbatched", "lockstep", "stacked") + (("graphs",) if device.startswith("cuda") else ())
    modes = [mode for mode in all_modes if modes is None or mode in modes]
    times: dict[str, float | None] = {}
    for round_ in range(repeats):
        for mode in modes:
            plan = plan_evaluation(
                StoreFiles(workdir / f"grid-{spec.name}-{task_name}-{mode}-{round_}.db"),
                [(spec, path)],
                cli,
                device=device,
            )
            if mode in ("stacked", "graphs"):
                model = job_inputs(plan.jobs[0]).build_model()
                if not batchable([model, model]):
                    times[mode] = None
                    continue
            work = plan.work(batch_grid=mode != "unbatched", cuda_graphs=mode == "graphs")
            for job in work:
                if mode != "unbatched":
                    job.stack = mode in ("stacked", "graphs")
            events: list = []
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            started = clock()
            for job in work:
                execute_job(job, events.append, lambda: False)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            seconds = clock() - started
            done = [e for e in events if e.kind == "finished"]
            if len(done) != len(plan.jobs):
                raise RuntimeError(
                    f"{task_name}: grid runs did not finish: {[e for e in events if e.kind == 'failed']}"
                )
            if examples is None:  # the runs' own epoch seconds: a stack's members each record the stack's,
                recorded = [e.data["result"]["history"][-1]["seconds"] for e in done]  # lockstep's its own
                seconds = sum(recorded) if mode in ("unbatched", "lockstep") else max(recorded)
            times[mode] = min(seconds, times.get(mode) or seconds)
    return times


@dataclass
class ShapeCost:
    """One epoch of a setting's paper grid, as `madsl eval` trains it by default on this device,
    at one sequence length: per training step, per evaluated test example, and per epoch the
    members' checkpoints (where one fell due: by default once a minute)."""

    seq_len: int
    step_seconds: float
    eval_seconds_per_example: float
    checkpoint_seconds: float

    def epoch(self, setting: dict, batch_size: int) -> float:
        steps = math.ceil(int(setting["num_train_examples"]) / batch_size)
        return (
            steps * self.step_seconds
            + int(setting["num_test_examples"]) * self.eval_seconds_per_example
            + self.checkpoint_seconds
        )


@contextlib.contextmanager
def timed_calls(targets: Sequence[tuple[object, str, str]], device: str) -> Iterator[list]:
    """Log (label, start, end) of every call of owner.name for (owner, name, label) in `targets`,
    the device synchronized at both ends (a GPU's queued steps land before the call, not in it)."""
    import torch

    spans: list[tuple[str, float, float]] = []
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]

    def timed(original, label):
        def wrapper(*args, **kwargs):
            sync()
            start = time.monotonic()
            try:
                return original(*args, **kwargs)
            finally:
                sync()
                spans.append((label, start, time.monotonic()))

        return wrapper

    for (owner, name, original), (_, _, label) in zip(originals, targets):
        setattr(owner, name, timed(original, label))
    try:
        yield spans
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def shape_costs(
    spec, path: str, task_name: str, runs: Sequence, device: str, precision: str, steps: int, workdir: Path
) -> dict[int, ShapeCost]:
    """The paper grid of each sequence length in the task's sweep, trained as `madsl eval` trains it
    by default on this device (grid-batched and graph-replayed on CUDA, run by run on the CPU),
    measured, not scaled: `steps` training steps of that length's first sweep setting for
    TIMED_EPOCH epochs; the wall time between the first and the last epoch's end (checkpoints
    included, setup and one-time costs excluded), split into its evaluation, its checkpoints and
    the rest, the training steps. Other vocabularies are costed at this one's (the LM head is a
    small part at MAD's vocabularies)."""
    import madsl.runner.batched.stacked as stacked
    import madsl.runner.train.loop as train
    from madsl.runner.train.state import Checkpointer

    costs: dict[int, ShapeCost] = {}
    for seq_len in sorted({int(r.settings["seq_len"]) for r in runs}):
        first = next(r for r in runs if int(r.settings["seq_len"]) == seq_len)
        batch_size = first.train.batch_size
        setting = {**dict(first.settings), "num_train_examples": steps * batch_size}
        cli = cli_overrides(
            protocol="baseline",
            tasks=[task_name],
            lr=list(PAPER_GRID_LR),
            wd=list(PAPER_GRID_WD),
            epochs=TIMED_EPOCH,
            eval_lengths=[],
            precision=precision,
            settings=setting,
        )
        plan = plan_evaluation(
            StoreFiles(workdir / f"shape-{spec.name}-{task_name}-{seq_len}.db"), [(spec, path)], cli, device=device
        )
        batch_grid = default_batch_grid(device)
        epoch_ends: dict[tuple[int, str], list[float]] = collections.defaultdict(list)  # (job, epoch): times
        events: list = []
        targets = [
            (stacked.StackedMembers, "evaluate", "evaluation"),
            (train, "evaluate", "evaluation"),
            (Checkpointer, "save", "checkpoint"),
        ]
        step = evaluation = per_epoch = 0.0
        with timed_calls(targets, device) as spans:
            for index, job in enumerate(
                plan.work(batch_grid, cuda_graphs=resolve_cuda_graphs(None, False, device, batch_grid))
            ):

                def emit(event, index=index):
                    events.append(event)
                    if event.kind == "epoch":
                        epoch_ends[index, event.data["metrics"]["epoch"]].append(time.monotonic())

                execute_job(job, emit, lambda: False)
                # the job's steady epoch: from its first member's end of epoch 1 to that of the last
                start, end = epoch_ends[index, 1][0], epoch_ends[index, TIMED_EPOCH][0]
                inside = [(label, b - a) for label, a, b in spans if start <= a and b <= end]
                job_evaluation = sum(t for label, t in inside if label == "evaluation")
                job_checkpoints = sum(t for label, t in inside if label == "checkpoint")
                evaluation += job_evaluation
                per_epoch += job_checkpoints
                step += (end - start - job_evaluation - job_checkpoints) / (TIMED_EPOCH - 1) / steps
        done = [e for e in events if e.kind == "finished"]
        if len(done) != len(plan.jobs):
            raise RuntimeError(f"{task_name}: grid runs did not finish: {[e for e in events if e.kind == 'failed']}")
        epochs = TIMED_EPOCH - 1
        costs[seq_len] = ShapeCost(
            seq_len, step, evaluation / epochs / int(setting["num_test_examples"]), per_epoch / epochs
        )
    return costs


def shapes_hours(
    spec,
    path: str,
    task_name: str,
    runs: Sequence,
    device: str,
    precision: str,
    steps: int,
    fraction: float,
    workdir: Path,
) -> float:
    """The task's share of the paper protocol from its measured shapes (`shape_costs`): each
    setting's grid epoch x its epochs x the stop fraction; the shapes printed as measured."""
    started = time.monotonic()
    costs = shape_costs(spec, path, task_name, runs, device, precision, steps, workdir)
    settings = {canonical_json(dict(r.settings)): r for r in runs}  # one grid per setting
    hours = (
        sum(
            costs[int(r.settings["seq_len"])].epoch(dict(r.settings), r.train.batch_size) * r.train.epochs * fraction
            for r in settings.values()
        )
        / 3600
    )
    print(
        f"  {task_name:26s} per shape   {len(settings):3d} grids  {hours:8.2f} h   "
        f"(measured in {time.monotonic() - started:.0f} s)",
        flush=True,
    )
    for c in costs.values():
        print(
            f"      length {c.seq_len:5d}: a step of the grid {c.step_seconds * 1e3:8.2f} ms, evaluation "
            f"{c.eval_seconds_per_example * 1e6:7.1f} us an example, checkpoints {c.checkpoint_seconds:.3f} s an epoch"
        )
    return hours


def stop_fraction(
    spec,
    path: str,
    task_name: str,
    settings: list[dict],
    device: str,
    precision: str,
    sample: int,
    workdir: Path,
    graphs: bool | None,
) -> float:
    """Early stopping, measured: `sample` settings of the task (spread over its sweep, the
    baseline first), each trained as the paper protocol trains it (its lr x wd grid of runs,
    all epochs unless early stopping ends them; grid-batched, with CUDA graphs or not, as this
    device does by default unless `graphs` says),
    and the fraction of the epochs the runs took; each setting's line printed as it ends."""
    chosen = [settings[round(i * (len(settings) - 1) / max(sample - 1, 1))] for i in range(min(sample, len(settings)))]
    done = planned = 0
    for index, setting in enumerate(chosen):
        cli = cli_overrides(protocol="baseline", tasks=[task_name], settings=setting, precision=precision)
        plan = plan_evaluation(
            StoreFiles(workdir / f"stop-{spec.name}-{task_name}-{index}.db"), [(spec, path)], cli, device=device
        )
        events: list = []
        started = time.monotonic()
        batch_grid = default_batch_grid(device)
        for job in plan.work(batch_grid, cuda_graphs=resolve_cuda_graphs(graphs, False, device, batch_grid)):
            execute_job(job, events.append, lambda: False)
        results = [e.data["result"] for e in events if e.kind == "finished"]
        if len(results) != len(plan.jobs):
            raise RuntimeError(f"{task_name}: runs did not finish: {[e for e in events if e.kind == 'failed']}")
        epochs = [result["epochs_done"] for result in results]
        done += sum(epochs)
        planned += len(results) * plan.jobs[0].train.epochs
        print(
            f"  {task_name:26s} stop: {canonical_json(setting)}: epochs {sorted(epochs)} of "
            f"{plan.jobs[0].train.epochs}, {time.monotonic() - started:.0f} s",
            flush=True,
        )
    return done / planned


def shared_device_ratio(
    path: str, tasks: Sequence[str], device: str, precision: str, workers: int, workdir: Path
) -> tuple[float, dict[int, float]]:
    """Several runs at once on one device: the paper grid of each task's baseline (one group
    each, trained as `madsl eval` trains it by default) by 1 worker process and by `workers`
    sharing the device, each for 1 and for 3 epochs. The difference of those two wall times
    is two steady epochs of every group: the setup (processes, CUDA contexts, data, models,
    warm-up and graph capture) cancels. Returns the `workers` steady time over the 1-worker
    one (below 1: sharing the device pays) and the steady seconds by worker count."""
    from madsl.runner.api import evaluate

    walls: dict[tuple[int, int], float] = {}
    for count in (1, workers):
        for epochs in (1, 3):
            started = time.monotonic()
            summary = evaluate(
                [path],
                tasks=list(tasks),
                protocol="baseline",
                lr=list(PAPER_GRID_LR),
                wd=list(PAPER_GRID_WD),
                epochs=epochs,
                eval_lengths=[],
                precision=precision,
                device=device,
                workers=count,
                db=workdir / f"shared-{Path(path).stem}-{count}-{epochs}.db",
            )
            walls[count, epochs] = time.monotonic() - started
            if summary["failed"]:
                raise RuntimeError(f"{path}: {summary['failed']} runs failed with {count} worker(s)")
    steady = {count: walls[count, 3] - walls[count, 1] for count in (1, workers)}
    return steady[workers] / steady[1], steady


def protocol_flops(spec, runs: Sequence, registry) -> dict[str, float]:
    """The paper protocol's arithmetic by task, from the accounting (`madsl.graph.account`): each
    run's epochs x (forward + backward of its training examples, ~3 forwards, + a forward of its
    test examples), with no early stop."""
    from madsl.graph import account
    from madsl.runner.plan.evaluation import _task_for_run

    forward: dict[tuple[int, int], float] = {}  # (seq_len, vocab) -> FLOPs of one sequence's forward
    by_task: dict[str, float] = collections.defaultdict(float)
    for run in runs:
        settings = dict(run.settings)
        seq_len, vocab = int(settings.get("seq_len", 1)), int(_task_for_run(registry, run).vocab_size(settings))
        if (seq_len, vocab) not in forward:
            forward[seq_len, vocab] = account(spec, seq_len=seq_len, vocab=vocab).totals["flops"]
        sequences = 3 * int(settings.get("num_train_examples", 0)) + int(settings.get("num_test_examples", 0))
        by_task[run.task] += forward[seq_len, vocab] * sequences * run.train.epochs
    return dict(by_task)


def matmul_rate(device: str, precision: str, dim: int, repeats: int = 20) -> float:
    """FLOP/s of this device on the model's own matrix products: a batch of 128 sequences of 128
    tokens through [dim, dim], [dim, 4 dim] and [4 dim, dim] weights, in the run's precision (bf16
    under autocast), the fastest of `repeats` after a warm-up. The best a width-`dim` model's
    arithmetic can run at here; a step's norms, activations and small kernels run slower."""
    import torch

    dtype = (
        torch.bfloat16
        if resolve_precision(precision, "cuda" if device.startswith("cuda") else "cpu") == "bf16"
        else torch.float32
    )
    generator = torch.Generator().manual_seed(0)
    shapes = [(dim, dim), (dim, 4 * dim), (4 * dim, dim)]
    tokens = 128 * 128
    operands = [
        (
            torch.randn(tokens, k, generator=generator).to(device, dtype),
            torch.randn(k, n, generator=generator).to(device, dtype),
        )
        for k, n in shapes
    ]
    flops = sum(2 * tokens * k * n for k, n in shapes)

    def products() -> None:
        for x, w in operands:
            x @ w
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)

    products()
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        products()
        best = min(best, time.perf_counter() - started)
    return flops / best


def floor_line(spec, runs: Sequence, registry, device: str, precision: str, target_hours: float = 2.0) -> str:
    """What the protocol's arithmetic alone costs at this device's matmul rate: the floor under
    any projection, and the sustained rate the `target_hours` needs."""
    by_task = protocol_flops(spec, runs, registry)
    total = sum(by_task.values())
    rate = matmul_rate(device, precision, spec.dim)
    shares = ", ".join(f"{task} {flops / total:.0%}" for task, flops in sorted(by_task.items(), key=lambda kv: -kv[1]))

    def figure(value: float) -> str:  # three significant digits, thousands separated
        return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"

    return (
        f"  {'arithmetic floor':26s} {total / rate / 3600:8.2f} device-hours: {figure(total / 1e15)} PFLOP "
        f"({shares}) at {figure(rate / 1e12)} TFLOP/s, this device's width-{spec.dim} matmuls; "
        f"{target_hours:g} h needs {figure(total / (target_hours * 3600) / 1e12)} TFLOP/s sustained"
    )


def _grid_examples(text: str) -> int | str:
    if text == "baseline":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of examples or 'baseline', got {text!r}") from None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", nargs="+", default=DEFAULT_SPECS)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--precision", default="auto", choices=("fp32", "bf16", "auto"))
    parser.add_argument(
        "--stop-fraction",
        type=float,
        default=1.0,
        help="fraction of the 200 epochs early stopping leaves (measured elsewhere)",
    )
    parser.add_argument(
        "--measure-stop",
        type=int,
        default=0,
        metavar="K",
        help="measure the stop fraction per task instead: train K of its settings as the paper "
        "protocol does (full grids, early stopping; minutes to hours per setting)",
    )
    parser.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether the --measure-stop runs replay their steps as CUDA graphs (default: as "
        "`madsl eval` does, on CUDA)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="one spec (mamba) on 256 training examples per task, scaled up"
    )
    parser.add_argument(
        "--grid-examples",
        type=_grid_examples,
        default=None,
        help="training examples of the batched-vs-unbatched grid comparison (0: skip it; "
        "'baseline': the task's baseline setting, epoch seconds as the runner records them; "
        "default: 'baseline' on CUDA, 64 on the CPU)",
    )
    parser.add_argument(
        "--grid-modes",
        nargs="+",
        default=None,
        choices=("unbatched", "lockstep", "stacked", "graphs"),
        help="only these modes of the grid comparison; without 'unbatched' (and with "
        "--grid-examples baseline) the unbatched grid is taken as 6 x the measured epoch",
    )
    parser.add_argument("--tasks", nargs="+", default=None, help="only these tasks (default: all six)")
    parser.add_argument(
        "--grid-repeats",
        type=int,
        default=1,
        help="rounds of the grid comparison, each mode keeping its fastest (2: warm kernels)",
    )
    parser.add_argument(
        "--workers-per-device",
        type=int,
        default=0,
        metavar="W",
        help="also measure W worker processes sharing the device against one (the baseline "
        "grids of the tasks, steady epochs) and project with that throughput",
    )
    parser.add_argument(
        "--shapes",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also project from each sequence length of every task's sweep measured as `madsl eval` "
        "trains it by default on this device (grid-batched, with CUDA graphs on CUDA), no "
        "scaling from the baseline (default: on for CUDA; on the CPU it takes hours)",
    )
    parser.add_argument(
        "--shape-steps",
        type=int,
        default=SHAPE_STEPS,
        metavar="N",
        help=f"training steps an epoch of a --shapes measurement (default {SHAPE_STEPS})",
    )
    parser.add_argument(
        "--grid-only",
        action="store_true",
        help="only the batched-vs-unbatched comparison, for every spec and task (no projection)",
    )
    args = parser.parse_args()
    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    on_cuda = device.startswith("cuda")
    # the defaults answer the question on each device: on a GPU the projection as madsl eval trains
    if args.grid_examples is None:
        args.grid_examples = "baseline" if on_cuda else 64
    if args.shapes is None:
        args.shapes = on_cuda and not args.grid_only
    if args.workers_per_device and args.workers_per_device < 2:
        parser.error(
            f"--workers-per-device compares W workers with one: W must be at least 2, got {args.workers_per_device}"
        )
    if (
        args.grid_modes is not None
        and "unbatched" not in args.grid_modes
        and (args.grid_only or args.grid_examples != "baseline")
    ):
        parser.error(
            "--grid-modes without 'unbatched' takes the unbatched grid from the measured epoch: "
            "it needs --grid-examples baseline and the projection (not --grid-only)"
        )
    if args.shape_steps < 1:
        parser.error(f"--shape-steps must be at least 1, got {args.shape_steps}")
    if args.shapes and args.grid_only:
        parser.error("--shapes is a projection: it cannot go with --grid-only")
    specs = args.specs[:1] if args.quick and not args.grid_only else args.specs
    examples = 256 if args.quick else None
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else "CPU"
    print(f"device: {device} ({name}), precision {args.precision}, torch threads {torch.get_num_threads()}")
    registry, all_tasks = tasks_by_name(None)
    with tempfile.TemporaryDirectory() as tmp:
        for path in specs:
            spec = load_spec(path)
            paper = plan_spec(spec, path, Overrides(protocol="paper", tasks=("all",)), registry, all_tasks)
            runs_by_task = collections.defaultdict(list)
            for run in paper.runs:
                runs_by_task[run.task].append(run)
            total = batched_total = graphs_total = shapes_total = 0.0
            batched_measured = graphs_measured = False
            stop_fractions: dict[str, float] = {}
            print(f"\n{spec.name}: {len(paper.runs)} runs in the paper protocol")
            unknown = set(args.tasks or ()) - set(runs_by_task)
            if unknown:
                parser.error(f"unknown task(s) {sorted(unknown)}; the tasks are {sorted(runs_by_task)}")
            for task_name, runs in runs_by_task.items():
                if args.tasks and task_name not in args.tasks:
                    continue
                started = time.monotonic()
                if not args.grid_only:
                    seconds, baseline = epoch_seconds(
                        spec, path, task_name, device, args.precision, examples, Path(tmp)
                    )
                    fraction = args.stop_fraction
                    if args.measure_stop:
                        settings = list({canonical_json(dict(r.settings)): dict(r.settings) for r in runs}.values())
                        fraction = stop_fraction(
                            spec,
                            path,
                            task_name,
                            settings,
                            device,
                            args.precision,
                            args.measure_stop,
                            Path(tmp),
                            args.cuda_graphs,
                        )
                        stop_fractions[task_name] = fraction
                        print(f"  {task_name:26s} stop fraction {fraction:.3f}")
                    task_hours = (
                        sum(
                            seconds * _size(dict(r.settings)) / _size(baseline) * r.train.epochs * fraction
                            for r in runs
                        )
                        / 3600
                    )
                    total += task_hours
                grid = ""
                ratio = graphs_ratio = 1.0
                if args.grid_examples:
                    grid_examples = None if args.grid_examples == "baseline" else args.grid_examples
                    times = grid_seconds(
                        spec,
                        path,
                        task_name,
                        device,
                        args.precision,
                        grid_examples,
                        Path(tmp),
                        args.grid_repeats,
                        args.grid_modes,
                    )
                    if "unbatched" not in times:  # (checked in main: baseline grid, projection on)
                        times = {"unbatched": len(PAPER_GRID_LR) * len(PAPER_GRID_WD) * seconds, **times}
                    unbatched = times["unbatched"]
                    stacked = times.get("stacked") is not None and stacks_on(device)
                    default = times["stacked"] if stacked else times.get("lockstep")
                    default = default if default is not None else unbatched  # neither measured
                    ratio = default / unbatched
                    graphs_ratio = (times.get("graphs") or default) / unbatched
                    batched_measured |= times.get("stacked") is not None or times.get("lockstep") is not None
                    graphs_measured |= times.get("graphs") is not None
                    grid = f"   grid of 6: unbatched {unbatched:6.2f} s" + "".join(
                        f", {mode} " + (f"{times[mode] / unbatched:.2f}x" if times[mode] is not None else "n/a")
                        for mode in times
                        if mode != "unbatched"
                    )
                if args.grid_only:
                    print(f"  {task_name:26s}{grid}")
                    continue
                batched_total += task_hours * ratio
                graphs_total += task_hours * graphs_ratio
                print(
                    f"  {task_name:26s} epoch {seconds:8.2f} s at baseline   {len(runs):3d} runs   "
                    f"{task_hours:8.2f} h{grid}   (measured in {time.monotonic() - started:.0f} s)"
                )
                if args.shapes:
                    shapes_total += shapes_hours(
                        spec, path, task_name, runs, device, args.precision, args.shape_steps, fraction, Path(tmp)
                    )
            if args.grid_only:
                continue
            stops = (
                ", ".join(f"{task} {f:.2f}" for task, f in stop_fractions.items())
                if stop_fractions
                else f"{args.stop_fraction:g}"
            )
            print(
                floor_line(
                    spec,
                    [r for r in paper.runs if not args.tasks or r.task in args.tasks],
                    registry,
                    device,
                    args.precision,
                )
            )
            print(f"  {'total':26s} {total:8.2f} device-hours for {spec.name} (unbatched, stop fraction {stops})")
            shared = 1.0
            if args.workers_per_device > 1:
                shared, steady = shared_device_ratio(
                    path,
                    [t for t in runs_by_task if not args.tasks or t in args.tasks],
                    device,
                    args.precision,
                    args.workers_per_device,
                    Path(tmp),
                )
                print(
                    f"  {args.workers_per_device} workers sharing the device: two steady epochs of the baseline "
                    f"grids in {steady[args.workers_per_device]:.1f} s against {steady[1]:.1f} s by one "
                    f"({shared:.2f}x)"
                )
            if args.grid_examples and batched_measured:
                print(
                    f"  {'total, grid-batched':26s} {batched_total:8.2f} device-hours ({batched_total / total:.2f}x"
                    f"{'; --no-cuda-graphs' if device.startswith('cuda') else ''})"
                )
            if args.grid_examples and graphs_measured:  # (CUDA only)
                print(
                    f"  {'total, + CUDA graphs':26s} {graphs_total:8.2f} device-hours "
                    f"({graphs_total / total:.2f}x; the default on CUDA)"
                )
            # on top of what `madsl eval` does by default, as measured: unbatched on the CPU, graphs on CUDA
            if args.workers_per_device > 1 and (args.grid_examples or not device.startswith("cuda")):
                best = graphs_total if device.startswith("cuda") else total
                print(
                    f"  {f'total, {args.workers_per_device} workers a device':26s} {best * shared:8.2f} "
                    f"device-hours ({best * shared / total:.2f}x; --workers {args.workers_per_device} on one device)"
                )
            if args.shapes:
                print(
                    f"  {'total, measured per shape':26s} {shapes_total:8.2f} device-hours (as `madsl eval` trains "
                    f"by default here, stop fraction {stops})"
                )
                if args.workers_per_device > 1:
                    print(
                        f"  {f'  + {args.workers_per_device} workers a device':26s} {shapes_total * shared:8.2f} "
                        f"device-hours"
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

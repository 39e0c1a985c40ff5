"""The stacked training step and evaluation compiled into fused kernels against the eager ones.

A width-128 MAD model's stacked step on a GPU costs its kernels, hundreds of small ones
(benchmarks/step_ops.py, docs/gpu.md). `MADSL_COMPILE_STACKED=1` (`StackedMembers(...,
compiled=True)`, `madsl.runner.batched.compile`) traces the vmapped step with its backward,
AdamW and metric sums into plain aten ops and compiles them with inductor. For the paper
grid's 6 (lr, wd) members of one spec, in the same run: the kernels a step launches (eager:
the ops dispatched that compute; compiled: the kernels inductor generated plus the ops it
still dispatches to torch, such as matmuls and SDPA), the seconds the first compiled step took
(tracing and compiling; then again for a second stack of the same shapes, with inductor's
on-disk cache warm: what the next group of a protocol pays), a step's time eager and
compiled (fastest of `--repeats`, interleaved; on CUDA both replayed as CUDA graphs, as
`madsl eval` trains there, unless `--no-graphs`), and how far apart the two stacks are after
`--steps` steps on the same batches and an evaluation (the largest absolute difference of
the weights, Adam's moments, the training losses and the evaluation loss, each also
relative to the largest eager value). On the CPU the kernels are inductor's C++ ones; on
CUDA Triton's (fewer fusions, so more kernels than the CPU count).

    python benchmarks/compiled_step.py                          # attention-sg, hyena-sg; fp32 and bf16
    python benchmarks/compiled_step.py --device cuda --precision bf16 --seq-len 128 --batch-size 128
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from madsl.runner.batched.replay import GRAPH_WARMUP  # noqa: E402
from madsl.runner.batched.stacked import StackedMembers  # noqa: E402
from madsl.runner.execute.jobs import job_inputs  # noqa: E402
from madsl.runner.plan.evaluation import cli_overrides, plan_evaluation  # noqa: E402
from madsl.runner.store.files import StoreFiles  # noqa: E402
from madsl.runner.train.device import resolve_device  # noqa: E402
from madsl.runner.train.state import RunData, RunState  # noqa: E402
from madsl.spec import load_spec  # noqa: E402

DEFAULT_SPECS = ["specs/paper/attention-sg.mad", "specs/paper/hyena-sg.mad"]
METADATA_ONLY = {
    torch.ops.aten.detach,
    torch.ops.aten.lift_fresh,
    torch.ops.aten._unsafe_view,
    torch.ops.aten.empty,
    torch.ops.aten.empty_strided,
}  # no kernel (an allocation is none either)
GENERATED_KERNEL = re.compile(r"^\s+(cpp_fused_\w+\(|triton_\w+\.run\()", re.M)  # a call in inductor's wrapper


class KernelCount(TorchDispatchMode):
    """The ops dispatched while active that compute (a view, a reshape of metadata or an
    allocation launches no kernel on a GPU)."""

    def __init__(self):
        super().__init__()
        self.computing = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.computing += not func.is_view and func.overloadpacket not in METADATA_ONLY
        return func(*args, **(kwargs or {}))


def build_stack(path: str, precision: str, seq_len: int, batch: int, device: torch.device, compiled: bool):
    """The paper grid's 6 fresh members of `path` on in-context recall, stacked, and their data."""
    spec = load_spec(path)
    cli = cli_overrides(
        protocol="baseline",
        tasks=["in-context-recall"],
        lr=[1e-4, 5e-4, 1e-3],
        wd=[0.0, 0.1],
        epochs=1,
        batch_size=batch,
        eval_lengths=[],
        precision=precision,
        settings={"seq_len": seq_len, "num_train_examples": 4 * batch, "num_test_examples": 2 * batch},
    )
    with tempfile.TemporaryDirectory() as tmp:
        plan = plan_evaluation(StoreFiles(Path(tmp) / "a.db"), [(spec, path)], cli, device=str(device))
        [group] = plan.work(batch_grid=True)
    states, datas = [], []
    for job in group.members:
        inputs = job_inputs(job, lambda task, setting, split, seed, data_dir: task.generate(dict(setting), split, seed))
        states.append(RunState.start(job.train, inputs.build_model, device, 4 * batch, inputs.num_classes))
        datas.append(RunData.from_tasks(inputs.train_data, inputs.test_data, device))
    stack = StackedMembers(states, graphs=False, compiled=compiled)
    stack.load_metrics()
    return stack, datas


def batches(datas, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The training batches of an epoch, in order, member axis first."""
    return [
        (
            torch.stack([d.train_x[start : start + batch] for d in datas]),
            torch.stack([d.train_y[start : start + batch] for d in datas]),
        )
        for start in range(0, datas[0].train_x.shape[0], batch)
    ]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def compare(eager: StackedMembers, compiled: StackedMembers, eager_eval, compiled_eval) -> dict[str, tuple]:
    """(max abs difference, relative to the eager values' max abs) per quantity."""

    def diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[float, float]:
        biggest = max(x.double().abs().max().item() for x in a)
        apart = max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))
        return apart, apart / max(biggest, 1e-30)

    return {
        "weights": diff([f.param for f in eager.flats], [f.param for f in compiled.flats]),
        "exp_avg": diff([f.exp_avg for f in eager.flats], [f.exp_avg for f in compiled.flats]),
        "exp_avg_sq": diff([f.exp_avg_sq for f in eager.flats], [f.exp_avg_sq for f in compiled.flats]),
        "train loss sum": diff([eager.train_sums["loss_sum"]], [compiled.train_sums["loss_sum"]]),
        "eval loss": diff(
            [torch.tensor([r["loss"] for r in eager_eval])], [torch.tensor([r["loss"] for r in compiled_eval])]
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", nargs="+", default=DEFAULT_SPECS)
    parser.add_argument("--precision", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"])
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4, help="steps of both stacks before comparing (default 4)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps of each, interleaved (default 5)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="on CUDA, time both stacks replayed as CUDA graphs (default)",
    )
    parser.add_argument(
        "--warm-cache",
        action="store_true",
        help="use inductor's on-disk cache as it is (default: a fresh one, so compile times are cold)",
    )
    args = parser.parse_args()
    if not args.warm_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="madsl-inductor-")
    from torch._inductor.utils import run_and_get_code

    device = resolve_device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"stacked step, eager vs compiled (inductor), paper grid of 6 runs, in-context recall, length "
        f"{args.seq_len}, batch {args.batch_size}, {device} ({torch.get_num_threads()} thread(s) on the CPU), "
        f"torch {torch.__version__}, load {load:.2f}"
    )
    for path in args.specs:
        for precision in args.precision:
            eager, datas = build_stack(path, precision, args.seq_len, args.batch_size, device, compiled=False)
            compiled, _ = build_stack(path, precision, args.seq_len, args.batch_size, device, compiled=True)
            epoch = batches(datas, args.batch_size)
            x, y = epoch[0]
            started = time.perf_counter()
            _, code = run_and_get_code(lambda: (compiled.step(x, y), synchronize(device)))
            compile_seconds = time.perf_counter() - started
            # a second stack of the same members: its step from inductor's on-disk cache, the same kernels
            again, _ = build_stack(path, precision, args.seq_len, args.batch_size, device, compiled=True)
            started = time.perf_counter()
            again.step(x, y)
            synchronize(device)
            warm_compile_seconds = time.perf_counter() - started
            warm_apart = max((a.param - b.param).abs().max().item() for a, b in zip(again.flats, compiled.flats))
            del again
            eager.step(x, y)
            for step in range(1, args.steps):
                x, y = epoch[step % len(epoch)]
                eager.step(x, y)
                compiled.step(x, y)
            eager_eval = eager.evaluate(datas)
            started = time.perf_counter()
            _, eval_code = run_and_get_code(lambda: compiled.evaluate(datas))
            eval_compile_seconds = time.perf_counter() - started
            apart = compare(eager, compiled, eager_eval, compiled.evaluate(datas))
            counts = {}
            for name, stack in (("eager", eager), ("compiled", compiled)):
                with KernelCount() as count:
                    stack.step(x, y)
                counts[name] = count.computing
            generated = len(GENERATED_KERNEL.findall("\n".join(code)))
            eval_generated = len(GENERATED_KERNEL.findall("\n".join(eval_code)))
            graphs = args.graphs and device.type == "cuda"
            for stack in (eager, compiled):  # the rest of the warm-up (steps run: args.steps + 1), a capture, a replay
                stack._train_step.graphs = graphs
                for _ in range(max(0, GRAPH_WARMUP - args.steps - 1) + 2 if graphs else 0):
                    stack.step(x, y)
            times = {"eager": [], "compiled": []}
            for _ in range(args.repeats):
                for name, stack in (("eager", eager), ("compiled", compiled)):
                    synchronize(device)
                    started = time.perf_counter()
                    stack.step(x, y)
                    synchronize(device)
                    times[name].append(time.perf_counter() - started)
            eager_s, compiled_s = min(times["eager"]), min(times["compiled"])
            print(
                f"  {load_spec(path).name:14s} {precision}: kernels a step: eager {counts['eager']}, compiled "
                f"{generated + counts['compiled']} ({generated} generated + {counts['compiled']} torch ops; "
                f"{(generated + counts['compiled']) / counts['eager']:.2f}x); evaluation batch: {eval_generated} "
                f"generated kernels; compile: step {compile_seconds:.1f} s (cache warm {warm_compile_seconds:.1f} s, "
                f"weights {warm_apart:.0e} apart), "
                f"evaluation {eval_compile_seconds:.1f} s; a step{' (CUDA graphs)' if graphs else ''} eager "
                f"{eager_s * 1e3:.2f} ms, compiled {compiled_s * 1e3:.2f} ms "
                f"({compiled_s / eager_s:.2f}x)"
            )
            print(
                "      after "
                f"{args.steps} steps and an evaluation, max abs (relative) difference: "
                + ", ".join(f"{key} {a:.1e} ({r:.1e})" for key, (a, r) in apart.items())
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

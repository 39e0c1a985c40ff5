"""What the full `paper` protocol costs per architecture on this device.

For each spec and each MAD task: one epoch of one run at the task's baseline setting,
trained by the runner itself (`execute_job`: data, model, AdamW, evaluation), timed;
then the projection

    hours = sum over the paper protocol's runs of  epoch seconds(task) x scale(setting) x epochs x stop

with scale(setting) = (train examples x sequence length) of the setting over the
baseline's (linear: attention's quadratic term is ignored, a lower bound for long
settings), epochs = 200 and stop = the fraction of epochs early stopping leaves
(`--stop-fraction`, default 1: no early stop, an upper bound; measure it on a sample of
settings with `madsl eval --protocol paper --task ...` and pass it in).

Grid batching (the 6 (lr, wd) runs of a setting as one model) is not implemented yet,
so there is no batched-vs-unbatched column; docs/runner.md says why.

    python benchmarks/protocol_cost.py                       # paper specs mamba, hyena-sg, attention-sg
    python benchmarks/protocol_cost.py --quick               # a few minutes on 2 CPU cores
    python benchmarks/protocol_cost.py --specs specs/paper/*.mad --precision bf16 --device cuda
"""
from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from madsl.runner.api import CompiledSpecFactory, _task_registry, plan_spec  # noqa: E402
from madsl.runner.executor import RunJob, execute_job  # noqa: E402
from madsl.runner.precision import resolve_precision  # noqa: E402
from madsl.runner.protocols import Overrides  # noqa: E402
from madsl.spec import load_spec  # noqa: E402

DEFAULT_SPECS = ["specs/paper/mamba.mad", "specs/paper/hyena-sg.mad", "specs/paper/attention-sg.mad"]


def _size(setting: dict) -> float:
    return float(setting.get("num_train_examples", 1)) * float(setting.get("seq_len", 1))


def epoch_seconds(spec, path: str, task_name: str, device: str, precision: str, examples: int | None,
                  workdir: Path) -> tuple[float, dict]:
    """Seconds of one runner epoch (train + eval) at the task's baseline setting, scaled to its
    full number of training examples when `examples` trims it; and the baseline setting."""
    registry, all_tasks = _task_registry(None)
    overrides = Overrides(protocol="baseline", tasks=(task_name,), lrs=(1e-3,), wds=(0.0,), epochs=1, eval_lengths=(),
                          precision=resolve_precision(precision, "cuda" if device.startswith("cuda") else "cpu"))
    if examples is not None:
        overrides.settings = {"num_train_examples": examples, "num_test_examples": min(examples, 256)}
    run = plan_spec(spec, path, overrides, registry, all_tasks).runs[0]
    full = plan_spec(spec, path, Overrides(protocol="baseline", tasks=(task_name,)), registry,
                     all_tasks).runs[0].settings
    events = []
    job = RunJob(run_id=f"bench-{task_name}", task=registry[task_name], setting=dict(run.settings), train=run.train,
                 model_factory=CompiledSpecFactory(spec, path), checkpoint_path=str(workdir / f"{task_name}.pt"),
                 data_dir=str(workdir / "data"), device=device, label=task_name)
    execute_job(job, events.append, lambda: False)
    finished = [e for e in events if e.kind == "finished"]
    if not finished:
        raise RuntimeError(f"{task_name}: the run did not finish: {events[-1]}")
    seconds = finished[0].data["result"]["history"][0]["seconds"]
    return seconds * _size(full) / _size(run.settings), dict(full)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", nargs="+", default=DEFAULT_SPECS)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--precision", default="auto", choices=("fp32", "bf16", "auto"))
    parser.add_argument("--stop-fraction", type=float, default=1.0,
                        help="fraction of the 200 epochs early stopping leaves (measured elsewhere)")
    parser.add_argument("--quick", action="store_true",
                        help="one spec (mamba) on 256 training examples per task, scaled up")
    args = parser.parse_args()
    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    specs = args.specs[:1] if args.quick else args.specs
    examples = 256 if args.quick else None
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else "CPU"
    print(f"device: {device} ({name}), precision {args.precision}, torch threads {torch.get_num_threads()}")
    registry, all_tasks = _task_registry(None)
    with tempfile.TemporaryDirectory() as tmp:
        for path in specs:
            spec = load_spec(path)
            paper = plan_spec(spec, path, Overrides(protocol="paper", tasks=("all",)), registry, all_tasks)
            runs_by_task = collections.defaultdict(list)
            for run in paper.runs:
                runs_by_task[run.task].append(run)
            total = 0.0
            print(f"\n{spec.name}: {len(paper.runs)} runs in the paper protocol")
            for task_name, runs in runs_by_task.items():
                started = time.monotonic()
                seconds, baseline = epoch_seconds(spec, path, task_name, device, args.precision, examples, Path(tmp))
                task_hours = sum(seconds * _size(dict(r.settings)) / _size(baseline) * r.train.epochs
                                 * args.stop_fraction for r in runs) / 3600
                total += task_hours
                print(f"  {task_name:26s} epoch {seconds:8.2f} s at baseline   {len(runs):3d} runs   "
                      f"{task_hours:8.2f} h   (measured in {time.monotonic() - started:.0f} s)")
            print(f"  {'total':26s} {total:8.2f} device-hours for {spec.name} (unbatched, "
                  f"stop fraction {args.stop_fraction:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

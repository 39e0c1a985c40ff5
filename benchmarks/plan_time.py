"""How fast and how steady the plan's time estimate is (madsl/runner/plan/cost.py, rate.py).

    python benchmarks/plan_time.py                      # the paper protocol's plan for all paper specs:
                                                        # wall time, load, estimate; cached and fresh rates
    python benchmarks/plan_time.py --check-steps hyena-sg mamba
                                                        # one thread's CPU time of real training steps
                                                        # against what the cached rates predict
    python benchmarks/plan_time.py --workloads          # plan vs actual CPU time (one thread) of a
                                                        # reduced CPU study (one study a width), a quick
                                                        # protocol of one spec and a small search
    python benchmarks/plan_time.py --workloads --cached-rates
                                                        # the same, planned from the rates cached earlier
                                                        # (a loaded machine's plan reads them as they are)

--workloads measures the rates first in a fresh cache (a temporary MADSL_CACHE_DIR), then plans
(`--dry-run --format json`) and runs each workload as its own process with OMP_NUM_THREADS=1,
the actual cost being the process's CPU time (user + system, its children included: start-up,
data, building, training, evaluation). Ratios are actual / planned; the plan's interval is shown.

Each plan runs as its own `madsl eval ... --dry-run --format json` process (what a user waits for);
a fresh cache is a new temporary MADSL_CACHE_DIR (the rates measured in that plan).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def plan_once(cache_dir: str | None) -> tuple[float, dict]:
    """(wall seconds, the plan's JSON) of one dry run of the paper protocol for every paper spec."""
    env = dict(os.environ, **({"MADSL_CACHE_DIR": cache_dir} if cache_dir else {}))
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            "-m",
            "madsl",
            "eval",
            *sorted(glob.glob(str(REPO / "specs/paper/*.mad"))),
            "--protocol",
            "paper",
            "--dry-run",
            "--format",
            "json",
            "--db",
            str(Path(tmp) / "r.db"),
        ]
        started = time.perf_counter()
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
        return time.perf_counter() - started, json.loads(out)


def report_plans(fresh: int) -> None:
    rows = [("cached", None)] + [
        (f"fresh cache {i + 1}", tempfile.mkdtemp(prefix="madsl-rates-")) for i in range(fresh)
    ]
    for label, cache_dir in rows + [(f"{label}, again", d) for label, d in rows if d]:
        seconds, plan = plan_once(cache_dir)
        rate = plan["rates"][0]
        print(
            f"{label}: {seconds:.1f} s; load {os.getloadavg()[0]:.2f}; {plan['runs']:,} runs; estimate "
            f"{plan['wall_seconds'] / 3600:,.0f} h; {len(rate['measured_now'])} rates measured now "
            f"(cached ones from load {rate['load']})",
            flush=True,
        )


def check_steps(specs: list[str]) -> None:
    """Measured / predicted seconds of a training step, one thread, CPU time (the machine's load
    does not stretch it)."""
    import torch
    import torch.nn.functional as F

    from madsl.compiler import compile_spec
    from madsl.runner.plan.cost import Shapes
    from madsl.runner.plan.rate import RateBook
    from madsl.runner.train.optim import build_optimizer
    from madsl.spec import load_spec

    torch.set_num_threads(1)
    book = RateBook.default()
    for name in specs:
        spec = load_spec(REPO / "specs" / "paper" / f"{name}.mad")
        for rows, length in ((128, 128), (32, 128), (128, 32)):
            model = compile_spec(spec, vocab_size=16, max_seq_len=length, seed=0)
            optimizer = build_optimizer(model, 1e-3, 0.0, torch.device("cpu"))
            x = torch.randint(0, 16, (rows, length), generator=torch.Generator().manual_seed(0))

            def step() -> None:
                logits = model(x)
                loss = F.cross_entropy(logits.reshape(-1, 16).float(), x.reshape(-1)) + model.aux_loss()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()

            step()
            measured = min(_cpu_seconds(step) for _ in range(2))
            shape = Shapes().of(spec, length, 16)
            rates = book.rates(torch.device("cpu"), 1, {layer[0] for layer in shape.layers})
            predicted = rates.step_seconds(shape.layers, rows, length, model=(16, shape.params))
            print(
                f"{name} batch {rows} length {length}: {measured * 1000:.0f} ms, predicted "
                f"{predicted * 1000:.0f} ms: {measured / predicted:.2f}",
                flush=True,
            )
    book.save()


def _cpu_seconds(step) -> float:
    started = time.thread_time()
    step()
    return time.thread_time() - started


STUDY = """name: plan-time-{dim}
data: bundled:tinyshakespeare
seq_len: 128
architectures:
  transformer: bundled:paper/mh-attention-sg
  hyena: bundled:paper/hyena-sg
budgets: [8e10, 2.5e11]
sizes: [{{dim: {dim}}}]
recipe:
  batch_size: 16
  lr: 3e-3
  eval_tokens: 32768
"""
STUDY_WIDTHS = (8, 16, 32)
SEARCH = """name: plan-time-search
dim: 32
budget:
  fixed_state: <= 4096
space:
  sequence_mixers: [H, mA, Mb]
  channel_mixers: [Sg]
  blocks: {min: 2, max: 2}
  shapes: [sequence]
objectives:
  score:
    protocol: quick
    tasks: [in-context-recall]
    set: {num_train_examples: 512}
    epochs: 2
  minimize: [fixed_state]
algorithm:
  name: nsga2
  population: 4
  generations: 1
  offspring: 2
  seed: 0
"""
QUICK = ["specs/paper/hyena-sg.mad", "--protocol", "quick", "--task", "in-context-recall", "--task", "compression"]


def _madsl(args: list[str], env: dict) -> tuple[float, str]:
    """(CPU seconds of the process and its children, its standard output) of one madsl command."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-m", "madsl", *args], env=env, capture_output=True, text=True, cwd=REPO)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"madsl {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), out.stdout


def _row(label: str, planned: float, interval: list | None, actual: float) -> dict:
    low, high = interval or (planned, planned)
    print(
        f"{label}: planned {planned:.1f} s (interval {low:.1f}-{high:.1f} s), actual {actual:.1f} s of CPU: "
        f"actual/plan {actual / planned:.2f}, {'inside' if low <= actual <= high else 'OUTSIDE'} the interval; "
        f"load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    return {"workload": label, "planned_s": planned, "interval_s": [low, high], "actual_s": actual}


def workloads(cached_rates: bool = False) -> list[dict]:
    """Plan vs actual CPU time of the three workloads (the module's docstring). With `cached_rates`
    the plans read the user's rate cache as it is (measured earlier, e.g. on idle cores), the way a
    plan made on a loaded machine reads it, instead of rates measured now."""
    tmp = Path(tempfile.mkdtemp(prefix="madsl-plan-time-"))
    env = dict(os.environ, OMP_NUM_THREADS="1", **({} if cached_rates else {"MADSL_CACHE_DIR": str(tmp / "cache")}))
    seconds, _ = _madsl(["eval", "specs/paper/hyena-sg.mad", "--dry-run", "--db", str(tmp / "m.db")], env)
    where = "the cached rates read" if cached_rates else "rates measured in a fresh cache"
    print(f"{where}: {seconds:.1f} s of CPU (with the dry run)", flush=True)
    rows = []
    for dim in STUDY_WIDTHS:
        study = tmp / f"study-{dim}.yaml"
        study.write_text(STUDY.format(dim=dim))
        db = str(tmp / f"study-{dim}.db")
        plan = json.loads(_madsl(["scale", str(study), "--dry-run", "--format", "json", "--db", db], env)[1])
        cost = plan.get("plan", plan)
        actual, _ = _madsl(["scale", str(study), "--workers", "1", "--db", db, "-q"], env)
        # the command's CPU: its runs and its process's start-up (what `actual` measures)
        interval = [h * 3600 for h in cost["cpu_hours_interval"]] if cost.get("cpu_hours_interval") else None
        rows.append(_row(f"study width {dim} ({len(cost['runs'])} runs)", cost["cpu_hours"] * 3600, interval, actual))
    plan = json.loads(_madsl(["eval", *QUICK, "--dry-run", "--format", "json", "--db", str(tmp / "q.db")], env)[1])
    actual, _ = _madsl(["eval", *QUICK, "--db", str(tmp / "q.db"), "-q"], env)
    rows.append(
        _row("quick protocol hyena-sg width 128", plan["cpu_seconds"], plan.get("cpu_seconds_interval"), actual)
    )
    search = tmp / "search.yaml"
    search.write_text(SEARCH)
    db = str(tmp / "s.db")
    plan = json.loads(_madsl(["search", str(search), "--dry-run", "--format", "json", "--db", db], env)[1])
    actual, _ = _madsl(["search", str(search), "--db", db, "--out", str(tmp / "front"), "-q"], env)
    label = f"search width 32 ({plan['evaluations']} candidates)"  # estimated from its first batch's mean
    rows.append(_row(label, plan["estimated_cpu_seconds"], plan.get("estimated_cpu_seconds_interval"), actual))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fresh", type=int, default=1, help="plans with a fresh rate cache (default 1)")
    parser.add_argument("--check-steps", nargs="+", metavar="SPEC", help="paper spec names to check step by step")
    parser.add_argument("--workloads", action="store_true", help="plan vs actual CPU time of three workloads")
    parser.add_argument(
        "--cached-rates", action="store_true", help="--workloads plans from the rate cache as it is (not measured now)"
    )
    args = parser.parse_args()
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    if args.workloads:
        print(json.dumps(workloads(args.cached_rates)))
    elif args.check_steps:
        check_steps(args.check_steps)
    else:
        report_plans(args.fresh)


if __name__ == "__main__":
    main()

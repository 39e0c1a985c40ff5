"""How fast and how steady the plan's time estimate is (madsl/runner/plan/cost.py, rate.py).

    python benchmarks/plan_time.py                      # the paper protocol's plan for all paper specs:
                                                        # wall time, load, estimate; cached and fresh rates
    python benchmarks/plan_time.py --check-steps hyena-sg mamba
                                                        # one thread's CPU time of real training steps
                                                        # against what the cached rates predict

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
            layers = list(Shapes().of(spec, length, 16).layers)
            rates = book.rates(torch.device("cpu"), 1, {family for family, _ in layers})
            predicted = rates.step_seconds(layers, rows, length)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fresh", type=int, default=1, help="plans with a fresh rate cache (default 1)")
    parser.add_argument("--check-steps", nargs="+", metavar="SPEC", help="paper spec names to check step by step")
    args = parser.parse_args()
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    if args.check_steps:
        check_steps(args.check_steps)
    else:
        report_plans(args.fresh)


if __name__ == "__main__":
    main()

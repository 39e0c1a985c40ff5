"""One torch thread or several: the wall and CPU time of a pretraining step of the paper's MAD
specs at the widths madsl trains on a CPU, on 1 and on T threads, measured in the same run.

    python benchmarks/threads.py                       # hyena-sg, mh-attention-sg, mamba at widths 16 64 128
    python benchmarks/threads.py --widths 32 --threads 2 4

Each (spec, width, threads) is timed in a fresh process (torch's thread pool is set once per
process), on the bundled tiny Shakespeare bytes with the paper's recipe, batch 16 x 128: a few
warm-up steps, then `--steps` steps; the fastest of `--repeats` runs counts. Wall time says
which is faster now; CPU time says what the threads cost the machine (on a busy machine a
thread that waits for a core spins, and its step costs many times its CPU). The load average
before each measurement is printed: run it on an idle and on a busy machine. This measurement
sets madsl.runner.execute.threads.DEFAULT_MAX_THREADS.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

SPECS = ("specs/paper/hyena-sg.mad", "specs/paper/mh-attention-sg.mad", "specs/paper/mamba.mad")


def measure(spec_path: str, width: int, threads: int, steps: int, data: str) -> dict:
    """(In a child process.) Wall and CPU seconds a step of `spec_path` at `width` on `threads` threads."""
    import torch

    from madsl.compiler import compile_spec
    from madsl.corpus import resolve_tokens
    from madsl.lang.spec import load_spec
    from madsl.runner.pretrain.job import TokenBatches
    from madsl.runner.pretrain.loop import as_tokens, open_pretrain, train_step
    from madsl.runner.pretrain.recipe import PretrainSettings
    from madsl.scaling.grid import sized_spec

    torch.set_num_threads(threads)
    spec = sized_spec(load_spec(spec_path), width, 1, 256, 128, "bench")
    settings = PretrainSettings(seq_len=128, batch_size=16, steps=steps + 3, lr=1e-3)
    state = open_pretrain(
        settings, lambda: compile_spec(spec, vocab_size=256, max_seq_len=128, seed=0), "cpu", None, None
    )
    batches = TokenBatches(resolve_tokens("bundled:tinyshakespeare", data), settings)

    def step(i: int) -> None:
        x, y = batches.train_batch(i)
        train_step(state, as_tokens(x, "cpu"), as_tokens(y, "cpu"))
        state.step += 1

    for i in range(3):
        step(i)
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(3, 3 + steps):
        step(i)
    return {"wall_ms": (time.perf_counter() - wall) / steps * 1e3, "cpu_ms": (time.process_time() - cpu) / steps * 1e3}


def _child(spec: str, width: int, threads: int, steps: int, data: str) -> dict:
    command = [sys.executable, __file__, "--child", json.dumps([spec, width, threads, steps, data])]
    out = subprocess.run(
        command, check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", nargs="+", default=list(SPECS))
    parser.add_argument("--widths", type=int, nargs="+", default=[16, 64, 128])
    parser.add_argument("--threads", type=int, nargs="+", default=[2], help="thread counts compared with 1")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*json.loads(args.child))))
        return
    import torch

    data = tempfile.mkdtemp(prefix="madsl-bench-")
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"
    )
    print("| spec | width | threads | load | wall ms/step | CPU ms/step | wall vs 1 thread | CPU vs 1 thread |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for spec in args.specs:
        for width in args.widths:
            one = None
            for threads in (1, *args.threads):
                load = os.getloadavg()[0]
                best = min(
                    (_child(spec, width, threads, args.steps, data) for _ in range(args.repeats)),
                    key=lambda m: m["wall_ms"],
                )
                one = one or best
                print(
                    f"| {os.path.basename(spec)} | {width} | {threads} | {load:.1f} | {best['wall_ms']:.1f} | "
                    f"{best['cpu_ms']:.1f} | {one['wall_ms'] / best['wall_ms']:.2f}x | "
                    f"{best['cpu_ms'] / one['cpu_ms']:.2f}x |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

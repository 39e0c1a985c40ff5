"""Forward + backward throughput and peak memory of the Hyena-family layers on the CPU.

    python benchmarks/hyena.py                 # the MAD shape and the long-sequence sweep
    python benchmarks/hyena.py --threads 1 --lengths 128 1024

One layer at width 128 with the stdlib defaults, input (batch, length, 128), a step is
y = layer(x); y.backward(g). The MAD shape is batch 128 x length 128; the sweep keeps
batch x length = 16384 tokens per step (1k x 16, 4k x 4, 16k x 1), so tokens/s falls only
by the log L of the FFT (plus the filter materialisation, O(L) per channel). Each
configuration runs in a fresh process so that its peak memory (peak RSS minus the RSS
before the first step, i.e. activations, gradients and workspace) is its own.

Reported: ms/step and tokens/s of the fastest step (wall clock), tokens per CPU-second
of the process (all threads; less sensitive to other processes competing for the cores
of a shared machine, but not to their memory traffic), and peak memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

LAYERS = ("hyena", "multihead_hyena", "hyena_experts")
TOKENS_PER_STEP = 16384


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def run_one(layer: str, length: int, batch: int, threads: int, steps: int, dim: int, method: str) -> dict:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from madsl.lang.stdlib import primitives

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    entry = primitives()[layer]
    module = entry.cls.create(dim, dict(entry.defaults)).build()
    module.conv_method = method
    x = torch.randn(batch, length, dim, requires_grad=True)
    grad = torch.randn(batch, length, dim)

    def step() -> None:
        module(x).backward(grad)

    step()  # warm-up: allocator, FFT plans
    before = _rss_mib()
    times, cpu_times = [], []
    for _ in range(steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    best = min(times)
    return {
        "layer": layer,
        "length": length,
        "batch": batch,
        "method": method,
        "threads": threads,
        "seconds_best": best,
        "seconds_median": sorted(times)[len(times) // 2],
        "tokens_per_s": batch * length / best,
        "cpu_seconds_best": min(cpu_times),
        "tokens_per_cpu_s": batch * length / min(cpu_times),
        "peak_mib": max(peak - before, 0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", nargs="+", default=list(LAYERS))
    parser.add_argument("--lengths", nargs="+", type=int, default=[128, 1024, 4096, 16384])
    parser.add_argument(
        "--method",
        default="auto",
        choices=["auto", "fft", "toeplitz"],
        help="long-convolution method (auto: Toeplitz matmul up to L=128, FFT beyond)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--one", nargs=3, metavar=("LAYER", "LENGTH", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.one:
        layer, length, batch = args.one[0], int(args.one[1]), int(args.one[2])
        print(json.dumps(run_one(layer, length, batch, args.threads, args.steps, args.dim, args.method)))
        return

    results = []
    print(
        f"{'layer':<16} {'L':>6} {'B':>4} {'method':>8} {'ms/step':>9} {'tokens/s':>10} {'tok/cpu-s':>10} "
        f"{'peak MiB':>9}"
    )
    for layer in args.layers:
        for length in args.lengths:
            batch = 128 if length == 128 else max(TOKENS_PER_STEP // length, 1)
            cmd = [
                sys.executable,
                __file__,
                "--one",
                layer,
                str(length),
                str(batch),
                "--threads",
                str(args.threads),
                "--steps",
                str(args.steps),
                "--dim",
                str(args.dim),
                "--method",
                args.method,
            ]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode:
                print(f"{layer:<16} {length:>6} {batch:>4} failed: {out.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results.append(r)
            method = r["method"] if r["method"] != "auto" else ("toeplitz" if length <= 128 else "fft")
            print(
                f"{layer:<16} {length:>6} {batch:>4} {method:>8} {1e3 * r['seconds_best']:>9.1f} "
                f"{r['tokens_per_s']:>10.0f} {r['tokens_per_cpu_s']:>10.0f} {r['peak_mib']:>9.0f}",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

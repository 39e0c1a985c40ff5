"""Forward + backward throughput of every layer primitive on the CPU.

    python benchmarks/throughput.py            # every case, 2 threads
    python benchmarks/throughput.py --only mAlg Mb --repeats 5

One layer at width 128, input requiring grad (as inside a model), a random upstream
gradient (a `.sum()` loss would hand matmul backward stride-0 gradients, which sends
CPU bmm down a per-matrix slow path and measures the wrong thing). Each case runs in
its own process so that its peak memory can be read: peak RSS over the RSS after
setup, i.e. activations, gradients and workspace of one step.

Cases: the MAD setting (batch 128 x length 128) for every primitive, with Mamba's
fused CPU scan and GLA's chunked kernel each next to the plain sequential
recurrence measured in the same run, and the newer layers (Mamba-2, Gated DeltaNet,
DeltaNet, retention, mLSTM, linear attention, RWKV-5/6, sliding-window attention) next
to attention and Mamba; then the subquadratic primitives at 1k / 4k / 16k tokens per
sequence with 16k tokens per batch (a linear kernel keeps tokens/s flat, an n log n one
declines slowly; mLSTM's parallel form is quadratic, like attention).

Times are the best of `--repeats` steps after one warm-up (the machine is shared;
the median is printed too).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

WIDTH = 128

# name: (symbol, hyperparameter overrides, module attributes to set, batch, length)
CASES: dict[str, tuple[str, dict, dict, int, int]] = {
    "H": ("H", {}, {}, 128, 128),
    "mH": ("mH", {}, {}, 128, 128),
    "He": ("He", {}, {}, 128, 128),
    "Mb scan": ("Mb", {}, {}, 128, 128),
    "Mb recurrent": ("Mb", {}, {"scan": "reference"}, 128, 128),
    "mA": ("mA", {}, {}, 128, 128),
    "A": ("A", {}, {}, 128, 128),
    "mAlg chunked": ("mAlg", {}, {"kernel": "chunked"}, 128, 128),
    "mAlg recurrent": ("mAlg", {}, {"kernel": "recurrent"}, 128, 128),
    "Alg chunked": ("Alg", {}, {"kernel": "chunked"}, 128, 128),
    "mA window=32": ("mA", {"window": 32}, {}, 128, 128),
    "M2": ("M2", {}, {}, 128, 128),
    "GDN": ("GDN", {}, {}, 128, 128),
    "DN": ("DN", {}, {}, 128, 128),
    "Ret": ("Ret", {}, {}, 128, 128),
    "mL": ("mL", {}, {}, 128, 128),
    "Lin": ("Lin", {}, {}, 128, 128),
    "mLin": ("mLin", {}, {}, 128, 128),
    "R5": ("R5", {}, {}, 128, 128),
    "R6": ("R6", {}, {}, 128, 128),
    "Sg": ("Sg", {}, {}, 128, 128),
    "Mlp": ("Mlp", {}, {}, 128, 128),
    "R6c": ("R6c", {}, {}, 128, 128),
    "MoE dense": ("MoE", {}, {"dense_dispatch": True}, 128, 128),
    "MoE gather": ("MoE", {}, {"dense_dispatch": False}, 128, 128),
    "mAlg L=1k": ("mAlg", {}, {"kernel": "chunked"}, 16, 1024),
    "mAlg L=4k": ("mAlg", {}, {"kernel": "chunked"}, 4, 4096),
    "mAlg L=16k": ("mAlg", {}, {"kernel": "chunked"}, 1, 16384),
    "Alg L=1k": ("Alg", {}, {"kernel": "chunked"}, 16, 1024),
    "Alg L=4k": ("Alg", {}, {"kernel": "chunked"}, 4, 4096),
    "Alg L=16k": ("Alg", {}, {"kernel": "chunked"}, 1, 16384),
    "H L=1k": ("H", {}, {}, 16, 1024),
    "H L=4k": ("H", {}, {}, 4, 4096),
    "H L=16k": ("H", {}, {}, 1, 16384),
    "mH L=1k": ("mH", {}, {}, 16, 1024),
    "mH L=4k": ("mH", {}, {}, 4, 4096),
    "mH L=16k": ("mH", {}, {}, 1, 16384),
    "He L=1k": ("He", {}, {}, 16, 1024),
    "He L=16k": ("He", {}, {}, 1, 16384),
    "Mb L=1k": ("Mb", {}, {}, 16, 1024),
    "Mb L=4k": ("Mb", {}, {}, 4, 4096),
    "Mb L=16k": ("Mb", {}, {}, 1, 16384),
    "M2 L=1k": ("M2", {}, {}, 16, 1024),
    "M2 L=4k": ("M2", {}, {}, 4, 4096),
    "GDN L=1k": ("GDN", {}, {}, 16, 1024),
    "GDN L=4k": ("GDN", {}, {}, 4, 4096),
    "Ret L=1k": ("Ret", {}, {}, 16, 1024),
    "Ret L=4k": ("Ret", {}, {}, 4, 4096),
    "R6 L=1k": ("R6", {}, {}, 16, 1024),
    "mL L=1k": ("mL", {}, {}, 16, 1024),  # quadratic parallel form: compare with mA
    "mA L=1k": ("mA", {}, {}, 16, 1024),
}


# The layers of issue 15, compared with attention and Mamba at the MAD setting.
NEWER_LAYERS = ("mA window=32", "M2", "GDN", "DN", "Ret", "mL", "Lin", "mLin", "R5", "R6")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(name: str, repeats: int, threads: int) -> dict:
    import torch

    from madsl.lang import stdlib

    torch.set_num_threads(threads)
    symbol, overrides, attributes, batch, length = CASES[name]
    sym = stdlib.symbols()[symbol]
    entry = stdlib.primitives()[sym.primitive]
    torch.manual_seed(0)
    layer = entry.cls.create(WIDTH, {**entry.defaults, **sym.params, **overrides}).build()
    for key, value in attributes.items():
        if key == "scan":  # Mamba's baseline: the plain autograd recurrence instead of the fused scan
            import madsl.layers.mamba as mamba
            from madsl.kernels.selective_scan_reference import selective_scan_reference

            mamba.selective_scan = selective_scan_reference
        else:
            setattr(layer, key, value)
    x = torch.randn(batch, length, WIDTH, requires_grad=True)
    upstream = torch.randn(batch, length, WIDTH)
    baseline = _rss_bytes()

    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        layer.zero_grad(set_to_none=True)
        x.grad = None
        start = time.perf_counter()
        y = layer(x)
        aux = getattr(layer, "aux_loss", None)
        if aux is not None:
            torch.autograd.backward([y, aux], [upstream, torch.ones_like(aux)])
        else:
            y.backward(upstream)
        times.append(time.perf_counter() - start)
        del y
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    best, median = min(times[1:]), statistics.median(times[1:])
    tokens = batch * length
    return {
        "name": name,
        "batch": batch,
        "length": length,
        "best_s": best,
        "median_s": median,
        "tokens_per_s": tokens / best,
        "median_tokens_per_s": tokens / median,
        "peak_mib": max(0, peak - baseline) / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help="case names (or prefixes) to run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child process: run one case, print JSON
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.repeats, args.threads)))
        return

    names = [n for n in CASES if not args.only or any(n.startswith(p) for p in args.only)]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    print(f"forward + backward, width {WIDTH}, {args.threads} threads, best of {args.repeats}")
    print(f"{'case':<16} {'batch x len':>12} {'tokens/s':>10} {'(median)':>10} {'ms/step':>9} {'peak MiB':>9}")
    results = {}
    for name in names:
        out = subprocess.run(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--one",
                name,
                "--repeats",
                str(args.repeats),
                "--threads",
                str(args.threads),
            ],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        results[name] = r
        print(
            f"{name:<16} {r['batch']:>5} x {r['length']:<5} {r['tokens_per_s']:>10,.0f} "
            f"{r['median_tokens_per_s']:>10,.0f} {1e3 * r['best_s']:>9.1f} {r['peak_mib']:>9.0f}"
        )
    for fast, slow, what in (
        ("mAlg chunked", "mAlg recurrent", "mAlg: chunked kernel"),
        ("Mb scan", "Mb recurrent", "Mb: fused CPU scan"),
    ):
        if fast in results and slow in results:
            ratio = results[slow]["best_s"] / results[fast]["best_s"]
            print(f"{what} is {ratio:.1f}x faster than the plain sequential recurrence (same run)")
    baselines = [b for b in ("mA", "Mb scan") if b in results]
    for name in NEWER_LAYERS:
        if name in results and baselines:
            ratios = ", ".join(
                f"{results[name]['tokens_per_s'] / results[b]['tokens_per_s']:.2f}x {b}" for b in baselines
            )
            print(f"{name:<16} tokens/s {ratios} (same run)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()

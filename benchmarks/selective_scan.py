"""Training throughput of Mamba on the CPU: madsl's fused selective scan vs the plain
sequential autograd recurrence (`selective_scan_reference`), measured in one run.

Model: token embedding -> 4 x [x + Mamba(LayerNorm(x))] -> LayerNorm -> vocabulary head,
cross-entropy, AdamW(fused=True); one step = forward + backward + optimizer step.
tokens/s = batch * length / (median wall time of a step; "cpu user/sys" is the
process's CPU time for it, all threads; sys is mostly page faults of fresh large
tensors, which glibc's tuning below removes). Every configuration runs in its own subprocess, so that its
peak resident memory (ru_maxrss) is its own; "mem" is that peak minus the same
process's peak just before the first step (torch, model, data). On a shared machine,
compare rows of one run only, and look at the load average printed with them.

    python benchmarks/selective_scan.py            # the full table (a few minutes)
    python benchmarks/selective_scan.py --quick    # batch 128 x length 128 only
    python benchmarks/selective_scan.py --glibc-tuning   # subprocesses run with
        MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 (see shared/FACTS.md)
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

WIDTH, LAYERS, VOCAB, THREADS = 128, 4, 128, 2


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_one(scan: str, batch: int, length: int, steps: int, what: str, threads: int) -> dict:
    """One configuration, in this process. scan: "fused" or "plain"; what: "model"
    (4 layers, full training step) or "scan" (the scan of one layer alone, fwd+bwd)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import madsl.layers.mamba as mamba_layer
    from madsl.kernels.selective_scan_cpu import selective_scan_cpu
    from madsl.kernels.selective_scan_reference import selective_scan_reference

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    scan_fn = selective_scan_cpu if scan == "fused" else selective_scan_reference
    mamba_layer.selective_scan = scan_fn  # the layer looks it up at call time

    if what == "model":

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(WIDTH)
                self.mixer = mamba_layer.Mamba(dim=WIDTH, d_state=4, d_conv=4, expand=2)

            def forward(self, x):
                return x + self.mixer(self.norm(x))

        model = nn.Sequential(
            nn.Embedding(VOCAB, WIDTH), *[Block() for _ in range(LAYERS)], nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        tokens = torch.randint(0, VOCAB, (batch, length + 1))

        def one_step():
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    else:
        d_inner, d_state = 2 * WIDTH, 4

        def bld(channels, scale=1.0, shift=0.0):  # (batch, channels, L) views, as the layer passes
            x = torch.randn(batch, length, channels) * scale + shift
            return x.transpose(1, 2).requires_grad_()

        inputs = [
            bld(d_inner),
            bld(d_inner, 0.5, -1.0),
            (-torch.rand(d_inner, d_state) - 0.5).requires_grad_(),
            bld(d_state),
            bld(d_state),
            torch.ones(d_inner, requires_grad=True),
            bld(d_inner),
            torch.zeros(d_inner, requires_grad=True),
        ]

        def one_step():
            out = scan_fn(*inputs, delta_softplus=True)
            out.backward(torch.ones_like(out))
            for x in inputs:
                x.grad = None

    base_mib = _maxrss_mib()
    one_step()  # warm-up
    times, user_times, sys_times = [], [], []
    for _ in range(steps):
        start, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        one_step()
        times.append(time.perf_counter() - start)
        end_usage = resource.getrusage(resource.RUSAGE_SELF)
        user_times.append(end_usage.ru_utime - usage.ru_utime)
        sys_times.append(end_usage.ru_stime - usage.ru_stime)
    step_s = statistics.median(times)
    return {
        "scan": scan,
        "what": what,
        "batch": batch,
        "length": length,
        "step_s": step_s,
        "min_s": min(times),
        "user_s": statistics.median(user_times),
        "sys_s": statistics.median(sys_times),
        "tokens_per_s": batch * length / step_s,
        "mem_mib": _maxrss_mib() - base_mib,
    }


GLIBC_TUNING = False


def measure(scan: str, batch: int, length: int, steps: int, what: str = "model") -> dict:
    cmd = [sys.executable, __file__, "--one", scan, str(batch), str(length), str(steps), what, str(THREADS)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env.get("PYTHONPATH")])
    )
    if GLIBC_TUNING:
        env.update(MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_="68719476736")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def show(r: dict) -> None:
    print(
        f"  {r['what']:5s} {r['scan']:5s} batch {r['batch']:3d} x length {r['length']:5d}: "
        f"{r['step_s']:7.3f} s/step (min {r['min_s']:.3f}; cpu user {r['user_s']:.3f} "
        f"sys {r['sys_s']:.3f})  "
        f"{r['tokens_per_s']:7.0f} tokens/s  mem +{r['mem_mib']:5.0f} MiB",
        flush=True,
    )


def main() -> None:
    global THREADS, GLIBC_TUNING
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only batch 128 x length 128")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=THREADS, help="torch threads (default 2)")
    parser.add_argument(
        "--glibc-tuning", action="store_true", help="run the measurements without glibc's mmap of large blocks"
    )
    parser.add_argument("--one", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        scan, batch, length, steps, what, threads = args.one
        print(json.dumps(run_one(scan, int(batch), int(length), int(steps), what, int(threads))))
        return
    THREADS, GLIBC_TUNING = args.threads, args.glibc_tuning

    print(
        f"{LAYERS} x Mamba, width {WIDTH}, d_state 4, expand 2; {THREADS} threads; "
        f"fwd+bwd+AdamW; glibc tuning {'on' if GLIBC_TUNING else 'off'}; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    fused = measure("fused", 128, 128, args.steps)
    plain = measure("plain", 128, 128, args.steps)
    show(fused)
    show(plain)
    print(f"  fused / plain: {fused['tokens_per_s'] / plain['tokens_per_s']:.2f}x")
    if args.quick:
        return

    print("The scan alone (one layer: batch x d_inner 256 x d_state 4), forward + backward:")
    for scan in ("fused", "plain"):
        show(measure(scan, 128, 128, args.steps, "scan"))

    print("Length scaling, batch 4 (time per step should grow linearly with length):")
    rows = [measure("fused", 4, length, args.steps) for length in (1024, 4096, 16384)]
    for r in rows:
        show(r)
    first = rows[0]
    for r in rows[1:]:
        print(
            f"  length x{r['length'] // first['length']}: time x{r['step_s'] / first['step_s']:.2f}, "
            f"memory x{r['mem_mib'] / max(first['mem_mib'], 1):.2f}"
        )
    show(measure("plain", 4, 1024, 1))  # one step: the plain loop is slow at this length
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

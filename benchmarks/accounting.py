"""How fast is the analytic accounting? (run on demand: python benchmarks/accounting.py)

Prints the time to parse + account a 48-layer topology at the 7B setting of Table C.2,
the cold start of `madsl check` on the bundled specs, and, as a baseline measured in
the same run, the cold start of `python -c 'import torch'` (what the CI gate avoids).
"""

from __future__ import annotations

import subprocess
import sys
import time

import madsl


def best_of(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    layers = {"Sg": {"inner": 9904}, "A": {"heads": 29, "head_dim": 128}}
    t48 = best_of(
        lambda: madsl.account(madsl.spec_from_topology("(2H:4A:4H:2A)x4", dim=3712, vocab=50257, layers=layers))
    )
    t12k = best_of(lambda: madsl.account(madsl.spec_from_topology("(H:A)x3000", dim=128)), repeat=2)
    spec = madsl.spec_from_topology("(2H:4A:4H:2A)x4", dim=3712, vocab=50257, layers=layers)
    print(
        f"48 blocks (96 layers), {madsl.account(spec).totals['params'] / 1e9:.2f}B params: "
        f"{t48 * 1e3:.1f} ms to parse and account"
    )
    print(f"6000 blocks (12000 layers): {t12k * 1e3:.0f} ms")

    def run(args):
        return best_of(lambda: subprocess.run(args, check=False, capture_output=True), repeat=3)

    check = run([sys.executable, "-m", "madsl", "check", "specs/paper/mamba.mad", "specs/paper/hyena-sg.mad"])
    torch_import = run([sys.executable, "-c", "import torch"])
    print(
        f"cold `madsl check` on 2 specs: {check:.2f} s; cold `import torch` (baseline): {torch_import:.2f} s; "
        f"ratio {check / torch_import:.2f}"
    )


if __name__ == "__main__":
    main()

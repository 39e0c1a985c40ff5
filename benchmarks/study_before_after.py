"""A study's CPU time under two versions of madsl, side by side: the same `madsl scale` command run
at the same time from two checkouts, so that both see the same load, each with a rate cache of its
own (warmed first, outside the timing), one torch thread each.

    git worktree add /tmp/before 416892f     # issue 38's starting point
    python benchmarks/study_before_after.py /tmp/before . --budgets 8e9 2.5e10 8e10
    python benchmarks/study_before_after.py /tmp/before . --budgets 8e9 2.5e10 8e10 --after-flags --no-batch

The study is specs/scaling/shakespeare-bytes.yaml with its budgets replaced (`--budgets`; the same
runs, shapes and stacks, fewer steps), written to a temporary folder. Prints each side's process CPU
seconds (user + system of the child, from os.wait4) and the ratio after / before, with the
load average around the pair; benchmarks/RESULTS.md records what it measured.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STUDY = Path(__file__).resolve().parents[1] / "specs" / "scaling" / "shakespeare-bytes.yaml"


def _study(folder: Path, budgets: list[str]) -> Path:
    text = STUDY.read_text()
    text = re.sub(r"(?m)^budgets: .*$", f"budgets: [{', '.join(budgets)}]", text)
    path = folder / "study.yaml"
    path.write_text(text)
    return path


def _start(checkout: Path, study: Path, work: Path, name: str, flags: list[str], dry_run: bool) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(checkout),
        "OMP_NUM_THREADS": "1",
        "XDG_CACHE_HOME": str(work / f"cache-{name}"),
    }
    command = [sys.executable, "-m", "madsl", "scale", str(study), "--workers", "1", "--db", str(work / f"{name}.db")]
    command += ["--dry-run"] if dry_run else flags
    return subprocess.Popen(command, cwd=checkout, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _pair(before: Path, after: Path, study: Path, work: Path, flags: list[str], dry_run: bool) -> dict:
    """Both sides at once; each side's CPU seconds (the children's rusage, read per child)."""
    started = {
        name: _start(co, study, work, name, flags if name == "after" else [], dry_run)
        for name, co in (("before", before), ("after", after))
    }
    seconds = {}
    for name, proc in started.items():
        _, status, usage = os.wait4(proc.pid, 0)
        if status != 0:
            raise SystemExit(f"{name}: madsl scale failed:\n{proc.stderr.read().decode()[-2000:]}")
        seconds[name] = usage.ru_utime + usage.ru_stime
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path, help="a checkout of the version to compare against")
    parser.add_argument("after", type=Path, help="a checkout of the version to measure")
    parser.add_argument("--budgets", nargs="+", default=["8e9", "2.5e10", "8e10"], help="the study's FLOP budgets")
    parser.add_argument("--after-flags", nargs=argparse.REMAINDER, default=[], help="flags for the after side's scale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="madsl-study-") as name:
        work = Path(name)
        study = _study(work, args.budgets)
        _pair(args.before.resolve(), args.after.resolve(), study, work, [], dry_run=True)  # warm both rate caches
        load = os.getloadavg()[0]
        wall = time.perf_counter()
        seconds = _pair(args.before.resolve(), args.after.resolve(), study, work, args.after_flags, dry_run=False)
        wall = time.perf_counter() - wall
    print(f"budgets {' '.join(args.budgets)}; after's flags: {' '.join(args.after_flags) or '(none)'}")
    print(f"load {load:.2f} -> {os.getloadavg()[0]:.2f}, {wall:.0f} s of wall time for the pair")
    ratio = seconds["after"] / seconds["before"]
    print(f"before {seconds['before']:.1f} s CPU, after {seconds['after']:.1f} s CPU: {ratio:.3f}x")


if __name__ == "__main__":
    main()

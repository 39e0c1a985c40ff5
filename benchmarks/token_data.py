"""What token data costs: `madsl data prepare`'s peak memory on a large text, and the check every
open of a token folder makes (each file's sha256 and every id against the vocabulary), first and
remembered.

    python benchmarks/token_data.py --mb 100          # prints a table; ~1-2 minutes on 2 cores

Each figure comes with its baseline from the same run: the peak memory of the bare command
(`madsl data prepare --help`), and hashlib.sha256 over the same bytes for the check.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PEAK = """
import resource, runpy, sys
sys.argv = ["madsl", *sys.argv[1:]]
try:
    runpy.run_module("madsl", run_name="__main__")
except SystemExit:
    pass
print("VmHWM", open("/proc/self/status").read().split("VmHWM:")[1].split()[0])
"""


def peak_kib(argv: list[str], cwd: Path) -> int:
    """The peak resident memory (kB) of `madsl ARGV` in a fresh process."""
    proc = subprocess.run(
        [sys.executable, "-c", PEAK, *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return int(proc.stdout.split("VmHWM")[-1].split()[0])


def write_text(path: Path, mb: int) -> None:
    line = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer\n"
    block = line * ((1 << 20) // len(line) + 1)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(mb):
            f.write(block[: 1 << 20])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="megabytes of text to prepare (default 100)")
    args = parser.parse_args()
    if args.mb < 1:
        print("error: --mb must be at least 1", file=sys.stderr)
        return 2
    from madsl.corpus import open_tokens

    work = Path(tempfile.mkdtemp(prefix="madsl-token-bench-"))
    try:
        os.environ["MADSL_CACHE_DIR"] = str(work / "cache")
        text = work / "big.txt"
        write_text(text, args.mb)
        bare = peak_kib(["data", "prepare", "--help"], work)
        prepared = peak_kib(["data", "prepare", str(text), "--tokenizer", "bytes", "-o", str(work / "out")], work)
        files = [work / "out" / name for name in ("train.bin", "val.bin")]
        size = sum(f.stat().st_size for f in files)
        start = time.process_time()
        for f in files:
            hashlib.sha256(f.read_bytes()).hexdigest()
        sha = time.process_time() - start
        (work / "cache").mkdir(exist_ok=True)
        shutil.rmtree(work / "cache")  # prepare remembered its files: forget them, to time the check
        start = time.process_time()
        open_tokens(work / "out")
        checked = time.process_time() - start
        start = time.process_time()
        for _ in range(100):
            open_tokens(work / "out")
        again = (time.process_time() - start) / 100
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gb = size / 1e9
    print(f"text: {args.mb} MB; token files: {size / 1e6:.0f} MB (bytes tokenizer, uint16)")
    print(
        f"peak memory, madsl data prepare: {prepared / 1024:.0f} MB "
        f"(bare command {bare / 1024:.0f} MB; {prepared / bare:.2f}x)"
    )
    print(
        f"first open (sha256 + vocabulary check): {checked / gb:.2f} s CPU per GB "
        f"(hashlib.sha256 alone {sha / gb:.2f} s per GB; {checked / sha:.2f}x)"
    )
    print(f"reopen, remembered: {again * 1e3:.2f} ms CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())

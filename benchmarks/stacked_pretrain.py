"""Stacked pretraining against the same runs one by one: the training throughput (tokens per
second of process CPU time, one torch thread) of M same-shape members at widths 8, 32 and 64.

    python benchmarks/stacked_pretrain.py                 # widths 8 32 64, 4 members; ~1-2 minutes
    python benchmarks/stacked_pretrain.py --members 8 --steps 60

Both arms train the same members (seeds 0..M-1, the bundled tiny Shakespeare bytes, the paper's
recipe) for the same steps with no evaluation in between, measured in the same run, one after
the other, in the CPU time of this process (other work on the machine does not stretch it, as it
does a wall clock); the stack's time includes its restacking and write-back. Each arm is timed
`--repeats` times and the fastest counts.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import tempfile
import time

import torch

from madsl.compiler import compile_spec
from madsl.corpus import resolve_tokens
from madsl.runner.pretrain.job import TokenBatches
from madsl.runner.pretrain.loop import as_tokens, open_pretrain, train_step
from madsl.runner.pretrain.recipe import PretrainSettings
from madsl.runner.pretrain.stacked import PretrainStack
from madsl.spec import spec_from_topology


def _states(topology: str, width: int, members: list[PretrainSettings]) -> list:
    spec = spec_from_topology(topology, dim=width, vocab=256, seq_len=members[0].seq_len)
    return [
        open_pretrain(
            s, lambda s=s: compile_spec(spec, vocab_size=256, max_seq_len=s.seq_len, seed=s.seed), "cpu", None, None
        )
        for s in members
    ]


def one_by_one(tokens, topology: str, width: int, members: list[PretrainSettings], steps: int) -> float:
    """CPU seconds of `steps` steps of each member, trained alone."""
    states = _states(topology, width, members)
    started = time.process_time()
    for state in states:
        data = TokenBatches(tokens, state.settings)
        for step in range(steps):
            x, y = data.train_batch(step)
            train_step(state, as_tokens(x, "cpu"), as_tokens(y, "cpu"))
            state.step += 1
    return time.process_time() - started


def stacked(tokens, topology: str, width: int, members: list[PretrainSettings], steps: int) -> float:
    """CPU seconds of `steps` steps of the members as one stack (stacking and write-back included)."""
    states = _states(topology, width, members)
    started = time.process_time()
    stack = PretrainStack(states)
    datas = [TokenBatches(tokens, s.settings) for s in states]
    for step in range(steps):
        batches = [d.train_batch(step) for d in datas]
        stack.step(
            torch.stack([as_tokens(b[0], "cpu") for b in batches]),
            torch.stack([as_tokens(b[1], "cpu") for b in batches]),
        )
        for state in states:
            state.step += 1
    stack.sync()
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--topology", default="mA-Sg:mA-Sg", help="the members' architecture (a transformer)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokens = resolve_tokens("bundled:tinyshakespeare", tempfile.mkdtemp(prefix="madsl-bench-"))
    base = PretrainSettings(seq_len=args.seq_len, batch_size=args.batch_size, steps=args.steps, lr=1e-3)
    members = [dataclasses.replace(base, seed=i) for i in range(args.members)]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, torch {torch.__version__}, 1 thread, "
        f"load {load:.2f}"
    )
    print(f"# {args.topology}, {args.members} members, {args.steps} steps, batch {args.batch_size} x {args.seq_len}")
    print("| width | one by one (CPU s) | stacked (CPU s) | stacked / one-by-one throughput |")
    print("|---:|---:|---:|---:|")
    for width in args.widths:
        alone = min(one_by_one(tokens, args.topology, width, members, args.steps) for _ in range(args.repeats))
        together = min(stacked(tokens, args.topology, width, members, args.steps) for _ in range(args.repeats))
        print(f"| {width} | {alone:.2f} | {together:.2f} | {alone / together:.2f}x |", flush=True)


if __name__ == "__main__":
    main()

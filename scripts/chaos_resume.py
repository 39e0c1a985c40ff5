"""Interrupt `madsl eval` at random moments until it finishes, then check that nothing was lost.

The runner promises that a run interrupted anywhere (kill -9, a lost machine, Ctrl-C) resumes
to exactly the result of an uninterrupted one (docs/runner.md, "Resuming"). The unit tests
stop a run at chosen points; this stops a real evaluation wherever chance puts it: during
data generation, a checkpoint write, a database transaction, a length evaluation, between a
group's members. It runs the evaluation once uninterrupted (the reference), then again in
a fresh results database, launching it over and over and stopping it after a random delay
(a new process group each time, so its workers go too) until an attempt ends by itself;
then it compares the two databases: every run's status, epochs, best epoch and metrics,
and every epoch's metrics, which must be equal (bit for bit on the same device and threads).

    python scripts/chaos_resume.py                             # kill -9, two paper specs, grid-batched
    python scripts/chaos_resume.py --signal INT                # Ctrl-C: each attempt must exit 130 by itself
    python scripts/chaos_resume.py --signal TERM               # SLURM's scancel, Kubernetes: the same
    python scripts/chaos_resume.py --delay 1.5 9 --seed 3 -- --executor ray   # extra `madsl eval` options after --

Exit status 0 when the results are equal, 1 when they differ or an attempt misbehaved (a
Ctrl-C'd or SIGTERM'd eval that did not stop within --grace seconds or exited other than with
130 or 0, or one that failed), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_EVAL = [
    "specs/paper/hyena-sg.mad",
    "specs/paper/attention-sg.mad",
    "--protocol",
    "baseline",
    "--task",
    "in-context-recall",
    "--task",
    "memorization",
    "--set",
    "num_train_examples=192",
    "--set",
    "num_test_examples=64",
    "--set",
    "in-context-recall.seq_len=64",
    "--epochs",
    "6",
    "--lr",
    "1e-3",
    "--lr",
    "5e-4",
    "--wd",
    "0",
    "--wd",
    "0.1",
    "--batch-grid",
    "--checkpoint-every",
    "0",
    "--workers",
    "2",
]
RUN_COLUMNS = (
    "status",
    "epochs_done",
    "best_epoch",
    "best_eval_loss",
    "best_eval_acc",
    "max_eval_acc",
    "early_stopped",
    "diverged_epoch",
)
EPOCH_COLUMNS = ("train_loss", "train_acc", "train_macro_acc", "eval_loss", "eval_acc", "eval_macro_acc")


def madsl_eval(args: list[str], db: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with open(log, "w") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "madsl", "eval", *args, "--db", str(db), "-q"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def results(db: Path) -> tuple[dict, dict]:
    with sqlite3.connect(db) as connection:
        runs = {row[0]: row[1:] for row in connection.execute(f"select run_id, {', '.join(RUN_COLUMNS)} from runs")}
        epochs = {
            (row[0], row[1]): row[2:]
            for row in connection.execute(f"select run_id, epoch, {', '.join(EPOCH_COLUMNS)} from epochs")
        }
    return runs, epochs


def differences(reference: Path, interrupted: Path) -> list[str]:
    (ref_runs, ref_epochs), (runs, epochs) = results(reference), results(interrupted)
    found = [f"runs only in one database: {sorted(set(ref_runs) ^ set(runs))}"] if set(ref_runs) != set(runs) else []
    found += (
        [f"epochs only in one database: {sorted(set(ref_epochs) ^ set(epochs))[:5]}"]
        if set(ref_epochs) != set(epochs)
        else []
    )
    for run_id in sorted(set(ref_runs) & set(runs)):
        for column, a, b in zip(RUN_COLUMNS, ref_runs[run_id], runs[run_id]):
            if a != b:
                found.append(f"run {run_id}: {column} {a!r} uninterrupted, {b!r} interrupted")
    for key in sorted(set(ref_epochs) & set(epochs)):
        for column, a, b in zip(EPOCH_COLUMNS, ref_epochs[key], epochs[key]):
            if a != b:
                found.append(f"run {key[0]} epoch {key[1]}: {column} {a!r} uninterrupted, {b!r} interrupted")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--signal",
        choices=("KILL", "INT", "TERM"),
        default="KILL",
        help="how each attempt's process group is stopped: KILL (kill -9, a lost machine), INT "
        "(Ctrl-C), TERM (a batch system's stop); INT and TERM must end it with exit 130",
    )
    parser.add_argument(
        "--delay",
        nargs=2,
        type=float,
        default=(2.0, 15.0),
        metavar=("LOW", "HIGH"),
        help="seconds after its start an attempt is stopped, uniform in [LOW, HIGH]",
    )
    parser.add_argument("--attempts", type=int, default=60, help="stop trying after this many (then finish it)")
    parser.add_argument("--grace", type=float, default=180.0, help="seconds a Ctrl-C'd attempt has to exit")
    parser.add_argument("--seed", type=int, default=0, help="seed of the delays")
    parser.add_argument("--keep", type=Path, default=None, help="keep the databases and logs in this folder")
    parser.add_argument("eval_args", nargs="*", help="`madsl eval` arguments after --, replacing the default study")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # each attempt's line as it ends
    low, high = args.delay
    if not 0 < low <= high or args.attempts < 1 or args.grace <= 0:
        parser.error("--delay needs 0 < LOW <= HIGH; --attempts and --grace must be positive")
    eval_args = args.eval_args or DEFAULT_EVAL
    chance = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as scratch:
        work = args.keep or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        reference, interrupted = work / "reference.db", work / "interrupted.db"
        for stale in work.glob("*.db*"):
            stale.unlink()
        started = time.monotonic()
        code = madsl_eval(eval_args, reference, work / "reference.log").wait()
        print(f"reference: exit {code} in {time.monotonic() - started:.0f} s")
        if code != 0:
            print((work / "reference.log").read_text()[-2000:])
            return 1
        misbehaved, stops, attempt, code = [], 0, 0, None
        stop_seconds: list[float] = []  # from each signal to the attempt's exit
        while code != 0:
            attempt += 1
            log = work / f"attempt-{attempt}.log"
            process = madsl_eval(eval_args, interrupted, log)
            delay = chance.uniform(low, high) if attempt <= args.attempts else None  # the last one finishes
            try:
                code = process.wait(timeout=delay)
                print(f"attempt {attempt}: ended by itself, exit {code}")
                if code != 0:
                    misbehaved.append(f"attempt {attempt} exited {code}: {log.read_text()[-500:]}")
                    break
                continue
            except subprocess.TimeoutExpired:
                pass
            os.killpg(process.pid, getattr(signal, f"SIG{args.signal}"))
            signalled = time.monotonic()
            stops += 1
            try:
                code = process.wait(timeout=args.grace)
                stop_seconds.append(time.monotonic() - signalled)
            except subprocess.TimeoutExpired:
                misbehaved.append(
                    f"attempt {attempt}: SIG{args.signal} after {delay:.1f} s, still running after {args.grace:.0f} s"
                )
                os.killpg(process.pid, signal.SIGKILL)
                code = process.wait()
            print(
                f"attempt {attempt}: SIG{args.signal} after {delay:.1f} s, exit {code} "
                f"{time.monotonic() - signalled:.1f} s later"
            )
            if args.signal != "KILL" and code not in (0, 130):  # stopped gracefully (or had just finished)
                misbehaved.append(f"attempt {attempt}: exit {code} after SIG{args.signal}: {log.read_text()[-500:]}")
            code = None if code != 0 else 0  # interrupted: go on; a run that finished as the signal came: done
        found = differences(reference, interrupted)
        if stop_seconds:
            print(f"from signal to exit: {min(stop_seconds):.1f}-{max(stop_seconds):.1f} s")
        print(
            f"{stops} stops (SIG{args.signal}) in {attempt} attempts, {time.monotonic() - started:.0f} s; "
            f"{len(results(reference)[0])} runs, {len(results(reference)[1])} epochs compared: "
            + ("equal" if not found else f"{len(found)} differences")
        )
        for line in [*misbehaved, *found][:40]:
            print("  " + line)
        return 1 if misbehaved or found else 0


if __name__ == "__main__":
    sys.exit(main())

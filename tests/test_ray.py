"""The Ray executor: same metrics as the local executor, checkpoints that come back to the
driver, a worker node lost mid-run, and the command line's errors.

Every test that starts Ray processes ends them, by their process ids, even when it fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from madsl.cli import main
from madsl.runner.execute.coordinator import Reporter
from madsl.runner.store.results import Store

TESTS_DIR = Path(__file__).resolve().parent
REPO = TESTS_DIR.parent
sys.path.insert(0, str(TESTS_DIR))
import runner_helpers as toy  # noqa: E402 - the stand-in model and toy tasks

try:
    import ray
except ImportError:  # the tests of the error for a missing Ray still run
    ray = None

# Ray runs hold one CPU, so one torch thread; the local runs they are compared with use one too
# (float sums over a different number of threads can differ in the last bits).
torch.set_num_threads(1)

needs_ray = pytest.mark.skipif(ray is None, reason="Ray is not installed (pip install 'madsl[ray]')")
SPEC = str(REPO / "specs" / "paper" / "hyena-sg.mad")


@pytest.fixture(scope="class")
def local_ray():
    """One local Ray instance (2 CPUs) for the tests of this module that need one."""
    # Workers unpickle the toy tasks and stand-in model by value: tests/ is not on their path.
    ray.cloudpickle.register_pickle_by_value(toy)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def run_rows(db):
    return {r["run_id"]: r for r in toy.run_rows(db)}


# --- same results as the local executor ------------------------------------------------------


@needs_ray
@pytest.mark.usefixtures("local_ray")
class TestOnALocalRayInstance:
    """One Ray instance for these tests, shut down before the tests that connect elsewhere."""

    def test_a_smoke_sweep_on_ray_records_the_same_metrics_as_the_local_executor(self, tmp_path, capsys):
        args = [SPEC, "--protocol", "smoke", "--task", "in-context-recall", "--quiet"]
        assert main(["eval", *args, "--db", str(tmp_path / "local.db")]) == 0
        assert main(["eval", *args, "--db", str(tmp_path / "ray.db"), "--executor", "ray", "--cpus-per-run", "1"]) == 0
        local, on_ray = toy.epoch_rows(tmp_path / "local.db"), toy.epoch_rows(tmp_path / "ray.db")
        assert local and local == on_ray  # bit-identical, epoch by epoch
        keys = ("run_id", "status", "epochs_done", "best_epoch", "best_eval_acc", "best_eval_loss", "max_eval_acc")
        assert [{k: r[k] for k in keys} for r in toy.run_rows(tmp_path / "local.db")] == [
            {k: r[k] for k in keys} for r in toy.run_rows(tmp_path / "ray.db")
        ]

    def test_a_scaling_study_on_ray_records_the_losses_of_the_local_executor(self, tmp_path, capsys):
        study = tmp_path / "study.yaml"
        study.write_text(
            "name: tiny\ndata: bundled:tinyshakespeare\nseq_len: 32\narchitectures:\n"
            "  hyena: bundled:paper/hyena-sg\nbudgets: [6e8]\nsizes: [{dim: 8}, {dim: 16}]\n"
            "recipe: {batch_size: 4, eval_tokens: 256}\n"
        )
        losses = {}
        for name, more in (("local", []), ("ray", ["--executor", "ray", "--cpus-per-run", "1"])):
            db = tmp_path / f"{name}.db"
            assert main(["scale", str(study), "--db", str(db), "-q", *more]) == 0
            with sqlite3.connect(db) as c:
                losses[name] = dict(c.execute("SELECT run_id, best_eval_loss FROM runs WHERE status='done'"))
        assert len(losses["local"]) == 2 and losses["local"] == losses["ray"]

    def test_keep_best_on_ray_keeps_the_weights_a_local_run_keeps(self, tmp_path, capsys):
        from safetensors.torch import load_file

        from madsl.runner.store.kept import WEIGHTS, models_dir

        # --checkpoint-every 3600: the only checkpoint with the best weights is the run's final one
        args = [
            SPEC,
            "--protocol",
            "smoke",
            "--task",
            "in-context-recall",
            "--epochs",
            "2",
            "--keep",
            "best",
            "--set",
            "seq_len=32",
            "--set",
            "num_train_examples=32",
            "--set",
            "num_test_examples=16",
            "--checkpoint-every",
            "3600",
            "--quiet",
        ]
        kept = {}
        for name, more in (("local", []), ("ray", ["--executor", "ray", "--cpus-per-run", "1"])):
            db = tmp_path / f"{name}.db"
            assert main(["eval", *args, "--db", str(db), *more]) == 0
            [run_id] = [r["run_id"] for r in toy.run_rows(db)]
            kept[name] = load_file(str(models_dir(Store(db).files_dir) / run_id / WEIGHTS))
        assert kept["local"].keys() == kept["ray"].keys()
        assert all(torch.equal(kept["local"][k], kept["ray"][k]) for k in kept["local"])

    def test_a_stopped_ray_run_leaves_its_checkpoint_in_the_store_and_resumes_locally(self, tmp_path):
        epochs, extra = 12, {"settings_overrides": {"num_train_examples": 512}, "lr": 3e-4}
        toy.run_toy_eval(tmp_path / "reference.db", epochs=epochs, **extra)
        reference_run, reference_epochs = (
            toy.run_rows(tmp_path / "reference.db")[0],
            toy.epoch_rows(tmp_path / "reference.db"),
        )

        class StopAfterTwoEpochs(Reporter):
            stop = False

            def epoch(self, job, metrics):
                self.stop = metrics["epoch"] >= 2

        db = tmp_path / "r.db"
        reporter = StopAfterTwoEpochs()
        stopped = toy.run_toy_eval(
            db, epochs=epochs, executor="ray", reporter=reporter, stop=lambda: reporter.stop, **extra
        )
        assert stopped["interrupted"] == 1
        run = toy.run_rows(db)[0]
        assert run["status"] == "pending"
        # the worker's checkpoint travelled back: the driver's store holds it
        assert Store(db).checkpoint_path(run["run_id"]).exists()
        assert 2 <= len(toy.epoch_rows(db)) < reference_run["epochs_done"]
        resumed = toy.run_toy_eval(db, epochs=epochs, **extra)  # the local executor takes over
        assert resumed["done"] == 1
        assert toy.epoch_rows(db) == reference_epochs  # bit-identical to the run never stopped
        keys = ("run_id", "epochs_done", "best_epoch", "best_eval_acc", "best_eval_loss", "max_eval_acc")
        assert {k: toy.run_rows(db)[0][k] for k in keys} == {k: reference_run[k] for k in keys}


# --- a worker node lost mid-run ----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _process_tree(pid: int) -> list[int]:
    """pid and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    tree, stack = [], [pid]
    while stack:
        p = stack.pop()
        tree.append(p)
        stack += children.get(p, [])
    return tree


def _kill_tree(pid: int) -> None:
    for p in _process_tree(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


class RayNode:
    """`ray start --block` in the foreground: its process tree is this node's processes."""

    def __init__(self, args: list[str], log: Path, env: dict):
        ray_cli = Path(sys.executable).with_name("ray")
        self.proc = subprocess.Popen(
            [str(ray_cli), "start", "--block", "--disable-usage-stats", "--node-ip-address=127.0.0.1", *args],
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
            env=env,
        )

        self.log = log
        deadline = time.monotonic() + 60
        while "Ray runtime started" not in log.read_text():  # up, and its auth token written
            assert self.proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)

    def kill(self) -> None:
        _kill_tree(self.proc.pid)
        self.proc.wait()


DRIVER = """
import sys, time
sys.path.insert(0, {tests!r})
import ray, runner_helpers as toy
from madsl.runner.execute.coordinator import Coordinator, Reporter
ray.cloudpickle.register_pickle_by_value(toy)
ray.init(address={address!r}, log_to_driver=False)
while ray.cluster_resources().get("CPU", 0) < 2:  # the worker node has joined
    time.sleep(0.1)

class Say(Reporter):
    def message(self, text):
        print(text, flush=True)

handle = Coordinator.handle

def handle_and_say_where(self, event):  # which process (so which node) runs which run
    if event.kind == "started":
        print("started", event.run_id, event.data["pid"], flush=True)
    handle(self, event)

Coordinator.handle = handle_and_say_where

summary = toy.run_toy_eval({db!r}, executor="ray", address={address!r}, reporter=Say(), **{kwargs})
print("complete" if summary["complete"] else "incomplete", flush=True)
"""


@needs_ray
def test_a_worker_node_lost_mid_run_is_retried_from_its_checkpoint_and_nothing_is_lost(tmp_path):
    # a checkpoint after every epoch (by default one a minute: this run would have none to resume from)
    kwargs = dict(epochs=16, wd=[0.0, 0.1], lr=3e-4, settings_overrides={"num_train_examples": 512}, checkpoint_every=0)
    toy.run_toy_eval(tmp_path / "reference.db", **kwargs)
    reference = toy.epoch_rows(tmp_path / "reference.db")

    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS_DIR)]),
        "RAY_DEDUP_LOGS": "0",
        "RAY_AUTH_MODE": "disabled",
    }  # a private loopback cluster: no token to share between nodes
    temp_dir = tempfile.mkdtemp(prefix="mr")  # short: Ray's socket paths live under it
    db = tmp_path / "r.db"
    nodes: list[RayNode] = []
    driver = None
    try:
        nodes.append(
            RayNode(
                ["--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false", f"--temp-dir={temp_dir}"],
                tmp_path / "head.log",
                env,
            )
        )
        nodes.append(RayNode([f"--address=127.0.0.1:{port}", "--num-cpus=1"], tmp_path / "worker.log", env))
        script = DRIVER.format(tests=str(TESTS_DIR), db=str(db), address=f"127.0.0.1:{port}", kwargs=repr(kwargs))
        log = tmp_path / "driver.log"
        driver = subprocess.Popen(
            [sys.executable, "-c", script], cwd=REPO, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT
        )
        # the run on the worker node (its process is one of that node's) has a checkpoint, and is not done
        deadline = time.monotonic() + 300  # a wait, not a timing: long enough for a loaded machine
        on_worker = None
        while True:
            assert driver.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "no run got under way on the worker node:\n" + log.read_text()
            if on_worker is None:
                worker_pids = set(_process_tree(nodes[1].proc.pid))
                on_worker = next(
                    (
                        line.split()[1]
                        for line in log.read_text().splitlines()
                        if line.startswith("started ") and int(line.split()[2]) in worker_pids
                    ),
                    None,
                )
            if on_worker is not None:
                try:
                    done_epochs = [row for row in toy.epoch_rows(db) if row[0] == on_worker]
                except sqlite3.OperationalError:
                    done_epochs = []
                if done_epochs:
                    assert run_rows(db)[on_worker]["status"] == "running"
                    break
            time.sleep(0.05)
        nodes[1].kill()  # the worker node, every process of it, mid-run
        driver.wait(timeout=180)
        output = log.read_text()
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
            driver.wait()
        for node in reversed(nodes):
            node.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert driver.returncode == 0, output
    assert "complete" in output.splitlines()
    assert "attempt 2, its node was lost) from its last checkpoint" in output, output

    runs = run_rows(db)
    assert len(runs) == 2 and {r["status"] for r in runs.values()} == {"done"}
    assert all(r["attempts"] == 1 for r in runs.values())  # claimed once: the retry was Ray's, not a rerun
    assert toy.epoch_rows(db) == reference  # every epoch once, the resumed run bit-identical
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# --- bad input ---------------------------------------------------------------------------------


def _eval(tmp_path, *extra):
    return main(
        [
            "eval",
            SPEC,
            "--protocol",
            "smoke",
            "--task",
            "in-context-recall",
            "--db",
            str(tmp_path / "r.db"),
            "--quiet",
            *extra,
        ]
    )


def test_an_unknown_executor_is_a_clear_error(tmp_path, capsys):
    assert _eval(tmp_path, "--executor", "rya") == 2
    err = capsys.readouterr().err
    assert "unknown executor 'rya'" in err and "did you mean 'ray'?" in err and "Traceback" not in err
    assert not (tmp_path / "r.db").exists()  # nothing planned, nothing written


def test_a_negative_gpu_share_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        _eval(tmp_path, "--executor", "ray", "--gpus-per-run", "-1")
    assert exit_.value.code == 2
    assert "--gpus-per-run: expected a non-negative number, got -1" in capsys.readouterr().err


def test_without_ray_the_ray_executor_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    assert _eval(tmp_path, "--executor", "ray") == 2
    err = capsys.readouterr().err
    assert "needs Ray, which is not installed" in err and "pip install 'madsl[ray]'" in err
    assert "Traceback" not in err


@needs_ray
def test_an_unreachable_address_is_a_clear_error_within_seconds(tmp_path, capsys):
    started = time.monotonic()
    assert _eval(tmp_path, "--executor", "ray", "--address", f"127.0.0.1:{_free_port()}") == 2
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert "no Ray cluster answers at" in err and "Traceback" not in err

"""A small results database for the trackers' and the HTML page's tests (and, larger, for
benchmarks/report_page.py): MAD runs of a few specs on the six tasks with a difficulty sweep, a
scaling study's pretraining runs, and a search state beside it. Written through the store's own
API (as `madsl eval` and `madsl scale` write), with deterministic numbers and timestamps; no training."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from madsl.runner.store.results import RunIdentity, Store, canonical_json, sha256
from madsl.search.state import FORMAT, VERSION

BASELINES = {
    "in-context-recall": {"vocab_size": 16, "seq_len": 128, "num_train_examples": 12800, "num_test_examples": 1280},
    "fuzzy-in-context-recall": {"vocab_size": 16, "seq_len": 128, "max_key_len": 3, "max_value_len": 3},
    "noisy-in-context-recall": {"vocab_size": 16, "seq_len": 128, "noise_vocab_size": 16, "frac_noise": 0.2},
    "selective-copying": {"vocab_size": 16, "seq_len": 256, "num_tokens_to_copy": 16},
    "compression": {"vocab_size": 16, "seq_len": 32},
    "memorization": {"vocab_size": 256, "seq_len": 32, "num_train_examples": 256, "num_test_examples": 64},
}
SWEEPS = {"in-context-recall": ("seq_len", (64, 128, 256)), "compression": ("vocab_size", (16, 32))}
T0 = 1_790_000_000.0  # a fixed clock: the same database every time


def _history(rng: random.Random, level: float, epochs: int) -> list[dict]:
    out = []
    for e in range(1, epochs + 1):
        acc = min(1.0, level * (1 - math.exp(-e / 2)) + rng.uniform(0, 0.02))
        loss = max(0.01, 2.5 * (1 - acc) + rng.uniform(0, 0.05))
        out.append(
            {
                "epoch": e,
                "lr": 1e-3,
                "seconds": 1.5,
                "train_loss": loss * 1.05,
                "train_ppl": math.exp(loss * 1.05),
                "train_acc": acc * 0.9,
                "train_macro_acc": acc * 0.88,
                "eval_loss": loss,
                "eval_ppl": math.exp(loss),
                "eval_acc": acc * 0.97,
                "eval_macro_acc": acc,
            }
        )
    return out


def _finish(store: Store, run_id: str, history: list[dict]) -> None:
    best = min(history, key=lambda m: m["eval_ppl"])
    store.claim(run_id, owner="test:1")
    store.finish(
        run_id,
        {
            "history": history,
            "best": best,
            "train_seconds": sum(m["seconds"] for m in history),
            "epochs_done": len(history),
            "best_epoch": best["epoch"],
            "max_eval_macro_acc": max((m["eval_macro_acc"] or 0.0) for m in history)
            if history[0]["eval_macro_acc"]
            else None,
            "early_stopped": False,
        },
        device="cpu",
        owner="test:1",
        threads=1,
    )


def _settings(task: str) -> list[dict]:
    base = BASELINES[task]
    if task not in SWEEPS:
        return [base]
    knob, values = SWEEPS[task]
    return [{**base, knob: v} for v in values]


def add_mad_runs(store: Store, specs: list[str], epochs: int, lrs: tuple, rng: random.Random) -> list[str]:
    ids = []
    for s, name in enumerate(specs):
        spec_hash = sha256(name)
        store.add_spec(spec_hash, name, canonical_json({"name": name, "topology": "A-Sg"}), f"specs/paper/{name}.mad")
        runs = []
        for task in BASELINES:
            for setting in _settings(task):
                for lr in lrs:
                    train = {"lr": lr, "wd": 0.0, "epochs": epochs, "batch_size": 32, "seed": 0}
                    runs.append(RunIdentity(spec_hash, task, setting, train, "0.2.0"))
        store.add_runs([(r, name) for r in runs], "quick")
        for identity in runs:
            level = 0.4 + 0.5 * ((s * 37 + len(identity.task) * 11 + identity.setting["seq_len"]) % 17) / 16
            _finish(store, identity.run_id, _history(rng, level, epochs))
            ids.append(identity.run_id)
    return ids


def add_study(store: Store, name: str = "tiny") -> None:
    """A study's pretraining runs: 2 architectures x 2 budgets x 3 sizes, U-shaped in the size."""
    for a, arch in enumerate(("attention", "hyena")):
        runs = []
        for budget in (1e13, 1e14):
            for k, size in enumerate(("d32", "d64", "d96")):
                spec_hash = sha256(f"{arch}-{size}")
                store.add_spec(spec_hash, f"{arch}-{size}", canonical_json({"arch": arch, "size": size}), None)
                setting = {"data": "abc", "vocab": 256, "budget": budget, "arch": arch, "size": size}
                steps = int(budget / 1e11) * (k + 1)
                train = {"lr": 1e-3, "wd": 0.1, "epochs": 4, "batch_size": 8, "seed": 0, "steps": steps, "seq_len": 64}
                loss = 3.0 - 0.2 * math.log10(budget / 1e12) + 0.15 * (k - 1 - 0.3 * a) ** 2 + 0.05 * a
                runs.append((RunIdentity(spec_hash, "pretrain", setting, train, "0.2.0"), f"{arch}-{size}", loss))
        store.add_runs([(r, n) for r, n, _ in runs], f"scale:{name}")
        for identity, _, loss in runs:
            history = [
                {"epoch": e, "lr": 1e-3, "seconds": 2.0, "train_loss": loss + 1.2 / e, "eval_loss": loss + 1 / e}
                | {"eval_ppl": math.exp(loss + 1 / e), "eval_acc": 0.3, "train_ppl": None, "eval_macro_acc": None}
                for e in range(1, 5)
            ]
            _finish(store, identity.run_id, history)


def write_search(db: Path, specs: list[str], name: str = "demo") -> Path:
    """A finished search's state beside the database (madsl.search.state's format)."""
    candidates, history = {}, []
    for g in range(3):
        for i in range(4):
            key = sha256(specs[(g * 4 + i) % len(specs)]) if g == 0 and i < len(specs) else sha256(f"cand-{g}-{i}")
            candidates[key] = {
                "id": key,
                "name": f"g{g}-c{i}",
                "topology": "A-Sg:H-Sg" if i % 2 else "H-Sg",
                "generation": g,
                "parents": [] if g == 0 else [sha256(f"cand-{g - 1}-{i}")],
                "operator": "random" if g == 0 else "mutate",
                "totals": {"params": 10_000 * (i + 1), "fixed_state": 512 * (i + 1), "kv_cache": 0},
                "status": "scored",
                "score": round(0.3 + 0.1 * g + 0.05 * i, 3),
                "tasks": {},
            }
        scores = [c["score"] for c in candidates.values() if c["generation"] == g]
        history.append(
            {"generation": g, "proposed": 4, "new": 4, "duplicates": 0, "failed": 0}
            | {"best": max(scores), "median": sorted(scores)[2], "best_so_far": max(scores)}
        )
    state = {"format": FORMAT, "version": VERSION, "fingerprint": "f" * 64, "generation": 3, "rng": {},
             "population": [], "pending": None, "candidates": candidates, "history": history,
             "counts": {}, "complete": True}  # fmt: skip
    path = db.with_name(f"{db.stem}.search-{name}.json")
    path.write_text(json.dumps(state))
    return path


def make_database(
    path: Path,
    specs: tuple[str, ...] = ("mamba", "hyena", "attention-sg"),
    epochs: int = 3,
    lrs: tuple = (1e-3, 5e-4),
    study: bool = True,
    search: bool = True,
) -> Path:
    """The test database at `path` (and its search state beside it)."""
    rng = random.Random(0)
    store = Store(path)
    try:
        add_mad_runs(store, list(specs), epochs, lrs, rng)
        if study:
            add_study(store)
        with store.transaction() as c:  # the clock fixed: every build of it is the same database
            rows = c.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()
            for i, row in enumerate(rows):
                t = T0 + 60 * i
                c.execute(
                    "UPDATE runs SET created=?, started=?, finished=?, heartbeat=NULL WHERE run_id=?",
                    (t, t, t + 30, row[0]),
                )
            c.execute("UPDATE specs SET created=?", (T0,))
    finally:
        store.close()
    if search:
        write_search(path, list(specs))
    return path

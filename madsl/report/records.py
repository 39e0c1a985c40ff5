"""A tracker record: what a tracker is told of one run (or one search, or one architecture's scores).

    key      what identifies it across exports (a run id, `search:<name>`, `scores:<spec hash>...`)
    name     a readable path, `mad/<spec>/<task>/lr=0.001,wd=0,seed=0,<run id prefix>`: TensorBoard's
             run name (a folder), MLflow's run name; made only of safe file-name characters
    group    mad, study, search or leaderboard: an MLflow experiment, a top folder of TensorBoard's
    tags     what groups them: spec, spec_hash, task, protocol, conventions, study, search, status
    config   the run's settings as flat key -> value (lr, wd, the task setting's knobs, the training
             settings), and `text`: longer documents (the spec's identity) as name -> text
    curves   (step, wall time, {metric: value}) per epoch or evaluation, in order
    finals   the final scores (best epoch's accuracy and loss, length evaluations, ...)
    digest   SHA-256 of all of the above: a tracker that holds a record with this digest is current

Every field is built from the database row alone, so the live reporter (live.py) and the export
give one run the same record. Torch-free, tracker-free.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

GROUPS = ("mad", "study", "search", "leaderboard")
EPOCH_METRICS = {  # epochs table column -> the curve's metric name
    "train_loss": "train/loss",
    "train_ppl": "train/ppl",
    "train_acc": "train/token_acc",
    "train_macro_acc": "train/acc",
    "eval_loss": "eval/loss",
    "eval_ppl": "eval/ppl",
    "eval_acc": "eval/token_acc",
    "eval_macro_acc": "eval/acc",
    "lr": "lr",
    "seconds": "seconds",
}
FINAL_COLUMNS = {  # runs table column -> the final score's name
    "best_eval_acc": "final/acc",
    "best_eval_token_acc": "final/token_acc",
    "max_eval_acc": "final/max_acc",
    "best_eval_loss": "final/loss",
    "best_eval_ppl": "final/ppl",
    "best_epoch": "final/best_epoch",
    "epochs_done": "final/epochs_done",
    "train_seconds": "final/train_seconds",
}
_UNSAFE = re.compile(r"[^A-Za-z0-9._+=,-]+")


@dataclass
class Record:
    key: str
    name: str
    group: str
    tags: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)
    curves: list[tuple[int, float, dict[str, float]]] = field(default_factory=list)
    finals: dict[str, float] = field(default_factory=dict)
    start: float = 0.0  # wall time (seconds since the epoch) the run started

    @property
    def digest(self) -> str:
        data = [
            self.key,
            self.name,
            self.group,
            self.tags,
            self.config,
            self.text,
            self.curves,
            self.finals,
            self.start,
        ]
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()

    @property
    def end(self) -> float:
        return self.curves[-1][1] if self.curves else self.start


def component(text: object, limit: int = 80) -> str:
    """`text` as one safe path component: letters, digits and . _ + = , - (others become _), no
    leading dot or dash, at most `limit` characters; never empty."""
    out = _UNSAFE.sub("_", str(text)).lstrip(".-")[:limit]
    return out or "_"


def number(value: Any) -> float | None:
    """A finite number, or None (a NULL, text or NaN stored by hand is left out)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def shown(value: Any) -> str:
    """A setting's value as a name shows it: 0.001, 1e-05, 256, text."""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def json_object(text: Any) -> dict[str, Any]:
    """A JSON object column as a dict ({} where it is not one: the database is untrusted)."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def flat(prefix: str, mapping: Mapping[str, Any]) -> dict[str, Any]:
    """`mapping` as prefix.key -> value, nested objects flattened, lists as JSON text."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            out.update(flat(f"{prefix}{key}.", value))
        elif isinstance(value, (list, tuple)):
            out[f"{prefix}{key}"] = json.dumps(value)
        else:
            out[f"{prefix}{key}"] = value
    return out


def curves_of(epochs: Sequence[Mapping[str, Any]], start: float, steps: Sequence[int] | None = None) -> list:
    """(step, wall time, metrics) per epochs row: the step is the epoch (or `steps[i]`: a pretraining
    run's optimizer step), the wall time the start plus the seconds so far."""
    out, clock = [], start
    for i, row in enumerate(epochs):
        metrics = {name: v for column, name in EPOCH_METRICS.items() if (v := number(row[column])) is not None}
        clock += metrics.get("seconds", 0.0)
        step = steps[i] if steps is not None and i < len(steps) else int(row["epoch"])
        out.append((int(step), round(clock, 3), metrics))
    return out


def base_tags(row: Mapping[str, Any], protocols: Sequence[str]) -> dict[str, str]:
    config = json_object(row["train_config"])
    keys = row.keys() if hasattr(row, "keys") else row
    tags = {
        "madsl.run_id": row["run_id"],
        "spec": row["spec_name"],
        "spec_hash": row["spec_hash"],
        "task": row["task"],
        "status": row["status"],
        "madsl_version": row["madsl_version"],
        "conventions": str(config.get("conventions", "madsl")),
    }
    if protocols:
        tags["protocol"] = ",".join(sorted(protocols))
    if "device" in keys and row["device"]:
        tags["device"] = str(row["device"])
    return tags


def run_config(row: Mapping[str, Any]) -> dict[str, Any]:
    """The run's settings, flat: lr, wd, epochs, batch size, seed, the setting's knobs, the training settings."""
    config = {k: row[k] for k in ("lr", "wd", "epochs", "batch_size", "seed")}
    config.update(flat("setting.", json_object(row["setting"])))
    config.update(flat("train.", json_object(row["train_config"])))
    return config


def mad_record(row: Mapping[str, Any], epochs: Sequence, lengths: Sequence, protocols: Sequence[str]) -> Record:
    """A MAD run's record."""
    name = "/".join(
        (
            "mad",
            component(row["spec_name"]),
            component(row["task"]),
            component(f"lr={shown(row['lr'])},wd={shown(row['wd'])},seed={row['seed']},{row['run_id'][:8]}", 120),
        )
    )
    start = number(row["started"]) or number(row["created"]) or 0.0
    finals = {name: v for column, name in FINAL_COLUMNS.items() if (v := number(row[column])) is not None}
    for ev in lengths:
        if (acc := number(ev["acc"])) is not None:
            finals[f"length/acc@{int(ev['length'])}"] = acc
    return Record(
        key=row["run_id"],
        name=name,
        group="mad",
        tags=base_tags(row, protocols),
        config=run_config(row),
        curves=curves_of(epochs, start),
        finals=finals,
        start=start,
    )


def evaluation_steps(train: Mapping[str, Any], count: int) -> list[int]:
    """The optimizer steps a pretraining run's evaluations came after (madsl.runner.pretrain.recipe)."""
    steps = train.get("steps")
    if not isinstance(steps, int) or steps < 1:
        return list(range(1, count + 1))
    every = train.get("eval_every") or max(1, math.ceil(steps / 10))
    every = every if isinstance(every, int) and every > 0 else max(1, math.ceil(steps / 10))
    return [min(steps, every * (i + 1)) for i in range(count)]


def pretrain_record(row: Mapping[str, Any], epochs: Sequence, studies: Sequence[str]) -> Record:
    """A pretraining run's record (a scaling study's): its validation curve over optimizer steps."""
    setting = json_object(row["setting"])
    train = json_object(row["train_config"])
    study = ",".join(sorted(studies)) or "unlabelled"
    budget = number(setting.get("budget"))
    label = f"{setting.get('size', '?')},C={budget:.3g}" if budget is not None else str(setting.get("size", "?"))
    name = "/".join(
        (
            "study",
            component(study),
            component(setting.get("arch", row["spec_name"])),
            component(f"{label},seed={row['seed']},{row['run_id'][:8]}", 120),
        )
    )
    start = number(row["started"]) or number(row["created"]) or 0.0
    tags = base_tags(row, ())
    tags.update({"study": study, "arch": str(setting.get("arch", "")), "size": str(setting.get("size", ""))})
    finals = {name: v for column, name in FINAL_COLUMNS.items() if (v := number(row[column])) is not None}
    if isinstance(train.get("steps"), int) and isinstance(train.get("batch_size"), int):
        finals["final/tokens"] = float(train["steps"] * train["batch_size"] * int(train.get("seq_len") or 1))
    return Record(
        key=row["run_id"],
        name=name,
        group="study",
        tags=tags,
        config=run_config(row),
        curves=curves_of(epochs, start, evaluation_steps(train, len(epochs))),
        finals=finals,
        start=start,
    )

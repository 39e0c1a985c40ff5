"""Records as MLflow runs in a local tracking store: `<DIR>/mlflow.db` (SQLite; MLflow 3 refuses its
old folder store by default) with artifacts under `<DIR>/artifacts`; no server. `mlflow ui
--backend-store-uri sqlite:///DIR/mlflow.db` shows them; MlflowClient reads them.

A record is a run of the experiment `madsl-<group>` (mad, study, search, leaderboard), named by
its readable name, with the record's tags (spec, task, protocol, study, search, ...) as MLflow tags,
its config as params, its curves as metric histories (step: the epoch, or a pretraining run's
optimizer step), its finals as metrics, and its config with the spec's identity as the artifact
`config.json`. The
tags `madsl.key` and `madsl.digest` make a sync idempotent: a run holding the record's digest is
current and left as it is; one whose curves are a prefix of the record's (a run still training,
synced live) gets the new points and its finals; any other is deleted (MLflow's soft delete) and
logged again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from madsl.report.records import Record

PARAM_CHARS = 6000  # MLflow's limit on a param value
BATCH = 900  # MLflow takes at most 1000 metrics a batch


def _client(folder: Path) -> Any:
    from madsl.errors import MadslError

    try:
        import logging

        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # its store's migrations say INFO lines
        logging.getLogger("alembic").setLevel(logging.WARNING)
    except ImportError as err:
        raise MadslError(
            f"MLflow export needs the mlflow-skinny package ({err})", hint="pip install 'madsl[mlflow]'"
        ) from None
    return MlflowClient(tracking_uri=f"sqlite:///{folder.resolve() / 'mlflow.db'}")


class MlflowSink:
    """Syncs records into a local MLflow store."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.client = _client(self.folder)
        self.experiments: dict[str, str] = {}
        self.existing: dict[str, dict[str, Any]] = {}  # experiment id -> {record key: its run}

    def experiment(self, group: str) -> str:
        if group not in self.experiments:
            name = f"madsl-{group}"
            found = self.client.get_experiment_by_name(name)
            if found is None:
                artifacts = (self.folder.resolve() / "artifacts" / group).as_uri()
                eid = self.client.create_experiment(name, artifact_location=artifacts)
            else:
                eid = found.experiment_id
            self.experiments[group] = eid
            self.existing[eid] = self._runs(eid)
        return self.experiments[group]

    def _runs(self, eid: str) -> dict[str, dict[str, str]]:
        """record key -> what the store holds of it: its MLflow run id and its madsl.* tags."""
        out: dict[str, dict[str, str]] = {}
        token = None
        while True:
            page = self.client.search_runs([eid], max_results=1000, page_token=token)
            for run in page:
                tags = run.data.tags
                if "madsl.key" in tags:
                    out[tags["madsl.key"]] = {k: v for k, v in tags.items() if k.startswith("madsl.")}
                    out[tags["madsl.key"]]["id"] = run.info.run_id
            token = page.token
            if not token:
                return out

    def sync(self, record: Record, text: str) -> bool:
        """Log the record unless MLflow holds it already; True where it wrote."""
        eid = self.experiment(record.group)
        held = self.existing[eid].get(record.key)
        if held is not None and held.get("madsl.digest") == record.digest:
            return False
        points = len(record.curves)
        marks = {"madsl.key": record.key, "madsl.digest": record.digest, "madsl.points": str(points)}
        marks["madsl.head"] = _head(record, points)
        logged = int(held.get("madsl.points", "-1")) if held is not None else -1
        if held is not None and (logged < 0 or logged > points or held.get("madsl.head") != _head(record, logged)):
            self.client.delete_run(held["id"])
            held = None
        if held is None:
            run_id = self._create(eid, record, text, marks)
            self._log(run_id, record, 0, with_params=True)
        else:
            run_id = held["id"]
            self._log(run_id, record, logged, tags=marks)
        self.existing[eid][record.key] = {**marks, "id": run_id}
        return True

    def _create(self, eid: str, record: Record, text: str, marks: dict[str, str]) -> str:
        tags = {k: v[:5000] for k, v in record.tags.items()} | marks
        run = self.client.create_run(eid, start_time=int(record.start * 1000), tags=tags, run_name=record.name)
        self.client.log_text(run.info.run_id, text, "config.json")
        return run.info.run_id

    def _log(
        self, run_id: str, record: Record, logged: int, with_params: bool = False, tags: dict | None = None
    ) -> None:
        from mlflow.entities import Metric, Param, RunTag

        params = [Param(k, str(v)[:PARAM_CHARS]) for k, v in sorted(record.config.items()) if v is not None]
        params = params if with_params else []
        metrics = [
            Metric(k, v, int(wall * 1000), step)
            for step, wall, values in record.curves[logged:]
            for k, v in values.items()
        ]
        last = record.curves[-1][0] if record.curves else 0
        metrics += [Metric(k, v, int(record.end * 1000), last) for k, v in record.finals.items()]
        run_tags = [RunTag(k, v[:5000]) for k, v in ({**record.tags, **tags} if tags else {}).items()]
        while params or metrics or run_tags:
            self.client.log_batch(run_id, metrics=metrics[:BATCH], params=params[:100], tags=run_tags[:100])
            params, metrics, run_tags = params[100:], metrics[BATCH:], run_tags[100:]
        status = record.tags.get("status")
        if status in (None, "done", "skipped", "failed"):  # a search, a leaderboard row, a run that ended
            end = "FAILED" if status == "failed" else "FINISHED"
            self.client.set_terminated(run_id, end, end_time=int(record.end * 1000))

    def close(self) -> None: ...


def _head(record: Record, points: int) -> str:
    """A digest of what an incremental sync keeps: the name, config and the first `points` curve points."""
    from hashlib import sha256

    head = repr((record.name, sorted(record.config.items(), key=str), record.curves[: max(points, 0)]))
    return sha256(head.encode()).hexdigest()[:16]

"""Results where researchers look: the results database replayed into experiment trackers, and one
self-contained HTML page (`madsl report --export tensorboard|mlflow DIR`, `--html DIR`,
`madsl eval|scale|search --track KIND:DIR`; docs/report.md).

    records.py      a run of the database as a tracker record: a readable name, grouping tags, its
                    config, per-step curves, final scores, and a digest of all of it (idempotence)
    collect.py      every record of a database: MAD runs, pretraining runs (studies), the searches
                    whose state lies beside it, the leaderboard's scores
    tensorboard_sink.py  records as TensorBoard event files (written whole, atomically; no TensorFlow)
    mlflow_sink.py  records as MLflow runs in a local store (a SQLite file in the folder; no server)
    export.py       `--export KIND DIR`: the folder checked, every record synced (a record whose
                    digest the tracker already holds is left as it is: a second export writes nothing)
    live.py         `--track KIND:DIR`: a runner Reporter that syncs each run's record as its epochs
                    and end are recorded (on the driver, so under Ray too)
    svg.py          small inline SVG charts (lines, scatter) with no plotting library
    html.py, page.py, sections.py   `--html DIR`: one static page, scripts and styles inline

The trackers (tensorboard, mlflow-skinny) are optional extras, imported only when asked for.
This package sits above the runner and the studies (it reads their records) and below the CLI.
"""

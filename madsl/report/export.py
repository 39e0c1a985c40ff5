"""`madsl report --export tensorboard|mlflow DIR`: every record of a results database synced into a
tracker's folder (tensorboard_sink.py, mlflow_sink.py). The folder is checked before any work
(madsl.outputs.check_output_dir: a folder holding anything the export does not write is refused
unless --force); a record the tracker already holds (its digest) is left as it is, so a second
export of an unchanged database writes nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from madsl.errors import MadslError
from madsl.outputs import check_output_dir
from madsl.report.records import GROUPS

KINDS = ("tensorboard", "mlflow")
OWNS: dict[str, Callable[[str], bool]] = {  # the files it writes at the top of the folder
    "tensorboard": lambda name: False,
    "mlflow": lambda name: name == "mlflow.db" or name.startswith("mlflow.db-"),
}
OWNS_FOLDERS: dict[str, Callable[[str], bool]] = {  # and the folders
    "tensorboard": lambda name: name in GROUPS,
    "mlflow": lambda name: name == "artifacts",
}
WRITES = {"tensorboard": "a TensorBoard run folder per record", "mlflow": "an MLflow store (mlflow.db, artifacts/)"}


@dataclass
class Synced:
    kind: str
    folder: Path
    written: int = 0
    current: int = 0  # records the tracker already held


def check_kind(kind: str, option: str) -> str:
    if kind not in KINDS:
        raise MadslError(f"{option.split()[0]} {kind!r}: no such tracker", expected=", ".join(KINDS))
    return kind


def check_folder(kind: str, folder: str | os.PathLike, option: str, force: bool = False) -> Path:
    """The tracker's folder, checked before any work (symlinks resolved)."""
    kind = check_kind(kind, option)
    return check_output_dir(
        folder, option, OWNS[kind], force=force, writes=WRITES[kind], owns_folders=OWNS_FOLDERS[kind]
    )


def sink(kind: str, folder: Path) -> Any:
    """The tracker's sink (its package imported only now)."""
    if kind == "tensorboard":
        from madsl.report.tensorboard_sink import TensorBoardSink

        return TensorBoardSink(folder)
    from madsl.report.mlflow_sink import MlflowSink

    return MlflowSink(folder)


def export(db: str | os.PathLike, kind: str, folder: str | os.PathLike, force: bool = False) -> Synced:
    """Sync every record of `db` into the tracker `kind` at `folder`; how many were written."""
    from madsl.report.collect import all_records, config_text, read_database

    checked = check_folder(kind, folder, f"--export {kind}", force)
    data = read_database(db)  # (a bad --db is refused before the folder is made)
    records = all_records(db, data)
    out = Synced(kind, checked)
    target = sink(kind, checked)
    try:
        for record in records:
            if target.sync(record, config_text(record)):
                out.written += 1
            else:
                out.current += 1
    except OSError as err:
        raise MadslError(f"--export {kind} {folder}: cannot be written ({err.strerror or err})") from None
    finally:
        target.close()
    return out

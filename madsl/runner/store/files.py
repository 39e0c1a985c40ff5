"""The results folder beside a database (`<db without suffix>.files/`): what madsl keeps there
and how it reads it back.

    checkpoints/<run_id>.pt   a running run's checkpoint (madsl.runner.train.checkpoint)
    data/                     generated task data, cached (madsl.tasks.cache)
    models/                   kept models (madsl.runner.store.kept)
    step-times.json           measured step times (madsl.runner.plan.cost)

Whatever madsl reads back from that folder is untrusted input: no entry of it is followed
when it is a symbolic link (`refuse_links`, `check_files_dir`), a planted link is never
deleted (`discard_checkpoint`), and a read or write that fails says why in words
(`os_error_words`: "no space left on device").

Apart from the database because planning needs the folder's paths without opening the
database (`StoreFiles`), and the checkpoints, the task data cache and the kept models share
its rules.
"""

from __future__ import annotations

import os
from pathlib import Path

from madsl.errors import Location, MadslError
from madsl.oserrors import OS_ERROR_WORDS, os_error_words  # noqa: F401 (the one table, below the tasks' cache too)


def store_files_dir(db: str | os.PathLike) -> Path:
    """The folder beside a database for its checkpoints and cached task data."""
    path = Path(db)
    return path.with_name(path.stem + ".files")


# what madsl keeps in a results folder (`<db>.files/`): folders, except the step-time cache
FILES_ENTRIES = ("checkpoints", "data", "models", "step-times.json")


class LinkError(MadslError):
    """A symbolic link where madsl keeps its own files: refused, never followed, never deleted."""

    def __init__(self, path: Path):
        super().__init__(
            f"{path} is a symbolic link: madsl does not follow links inside its results folder",
            Location(file=str(path)),
            hint="it and what it points to were left as they are; remove the link (or put a real "
            "folder or file in its place) and rerun",
        )
        self.path = path

    def __str__(self) -> str:  # what a failed run records
        return f"{self.message} ({self.hint})"


def refuse_links(*paths: str | os.PathLike) -> None:
    """Raise LinkError for the first of `paths` that is a symbolic link (a missing one is fine)."""
    for path in paths:
        if os.path.islink(path):
            raise LinkError(Path(path))


def discard_checkpoint(path: str | Path) -> None:
    """Remove a run's checkpoint once the store holds everything it had (or its run was skipped):
    only a regular file madsl wrote; a symbolic link planted in its place is left as it is."""
    path = Path(path)
    if not path.is_symlink():
        path.unlink(missing_ok=True)


def check_files_dir(files_dir: Path) -> str | None:
    """What is wrong with a results folder's own entries, if anything (None: nothing): one that is
    a symbolic link (checkpoints/, data/, models/, step-times.json, and every entry of models/),
    or a file where a folder belongs. Reads only: creates and changes nothing."""
    for name in FILES_ENTRIES:
        entry = files_dir / name
        if entry.is_symlink():
            return (
                f"keeps {name} in {entry}, which is a symbolic link (madsl does not follow links inside "
                "its results folder; it was left as it is)"
            )
        if name != "step-times.json" and entry.exists() and not entry.is_dir():
            return f"cannot keep its {name}: {entry} is not a directory"
    models = files_dir / "models"
    if models.is_dir():
        try:
            linked = sorted(entry.name for entry in os.scandir(models) if entry.is_symlink())
        except OSError as err:
            return f"cannot read {models}: {os_error_words(err)}"
        if linked:
            return (
                f"has a symbolic link among its kept models: {models / linked[0]} (madsl does not follow "
                "links inside its results folder; it was left as it is)"
            )
    return None


class StoreFiles:
    """Where a database keeps its files (no connection: planning needs the paths, not the database)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    @property
    def files_dir(self) -> Path:
        return store_files_dir(self.path)

    def checkpoint_path(self, run_id: str) -> Path:
        return self.files_dir / "checkpoints" / f"{run_id}.pt"

    @property
    def data_dir(self) -> Path:
        return self.files_dir / "data"

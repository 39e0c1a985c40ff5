"""Kept models: a run's best weights (`madsl eval --keep best`), exported and loaded back.

When a run kept with `--keep best` finishes, the driver (the only writer of the results
folder, whatever executor ran it) takes the best epoch's weights from the run's final
checkpoint and writes them to `<db>.files/models/<run_id>/`:

    model.safetensors   the TaskModel's state dict at the best epoch (lowest eval perplexity,
                        the epoch whose metrics the store records)
    config.json         how to rebuild the model: the spec (as data), the task, its setting,
                        the head and sizes, and the recorded metrics of that epoch

`madsl export RUN_ID -o DIR` writes those two files into DIR (and touches nothing else
there); `load_run(DIR)` builds the model and loads the weights. The folder is madsl's one model
file format (madsl/model_file.py, which `madsl.compiler.save` writes too): nothing here
unpickles, and both files are read as untrusted input (checked before anything is allocated).
Writing a kept model never follows (nor deletes) a symbolic link in the results folder.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from madsl.errors import MadslError
from madsl.model_file import (
    CONFIG,
    FILES,
    MAX_SIZE,
    WEIGHTS,
    ModelReader,
    safetensors_torch,
    shown,
    write_files,
)
from madsl.outputs import check_output_dir, move_into_place, output_error

FORMAT = "madsl-run-model/1"
# safetensors_torch is asked before a run trains, so that `--keep best` without safetensors is
# refused up front, not after the training
__all__ = [
    "CONFIG",
    "EXPORTED",
    "FORMAT",
    "WEIGHTS",
    "export",
    "keep_best",
    "load_run",
    "models_dir",
    "safetensors_torch",
]


def models_dir(files_dir: str | os.PathLike) -> Path:
    return Path(files_dir) / "models"


def _write_dir(directory: Path, weights: dict[str, Any], config: dict[str, Any]) -> None:
    """Write the two files into a temporary sibling folder, then move it into place whole."""
    from madsl.runner.store.files import refuse_links

    safetensors_torch("keeping a model")
    staging = directory.with_name(f".{directory.name}.{os.getpid()}.tmp")
    refuse_links(directory.parent, directory, staging)  # not madsl's: neither followed nor deleted
    directory.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        write_files(staging, weights, config, "keeping a model")
        if directory.exists():
            shutil.rmtree(directory)
        move_into_place(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def keep_best(
    run_id: str,
    checkpoint_path: Path,
    files_dir: Path,
    spec_data: dict | None,
    build: dict,
    result: dict,
    task: str,
    setting: dict,
) -> Path | None:
    """Save the best weights of a finished run from its final checkpoint. Returns the folder,
    or None when the checkpoint holds no best weights (a run finished before --keep best was asked)."""
    from madsl.runner.train.checkpoint import load_checkpoint

    saved = load_checkpoint(checkpoint_path)
    weights = saved.get("best_state") if saved else None
    if weights is None or spec_data is None:
        return None
    config = {
        "format": FORMAT,
        "run_id": run_id,
        "spec": {key: value for key, value in spec_data.items() if key != "init"},  # its weights are in the file
        "task": task,
        "setting": setting,
        "build": build,
        "best_epoch": result.get("best_epoch"),
        "metrics": result.get("best"),
    }
    from madsl.oserrors import os_error_words

    directory = models_dir(files_dir) / run_id
    try:
        _write_dir(directory, weights, config)
    except OSError as err:
        raise MadslError(
            f"kept model {directory}: could not be written: {os_error_words(err)}"
            + (f" ({err.filename})" if err.filename else ""),
            hint="the run is recorded; free the space (or fix the folder) and evaluate it again "
            "with --keep best to keep its weights",
        ) from None
    return directory


RUN_ID_PREFIX = re.compile(r"[0-9a-f]{4,64}")  # a run id is a sha256; a prefix names it where unique
EXPORTED = FILES


def export(files_dir: Path, run_id: str, out: Path, *, force: bool = False) -> tuple[str, Path]:
    """Write the kept model of `run_id` (or a unique prefix of it, at least 4 hex digits) into the
    folder `out` (symlinks resolved): its model.safetensors and config.json, each atomically.
    Nothing else in `out` is touched; a folder holding anything else is refused unless `force`."""
    if not RUN_ID_PREFIX.fullmatch(run_id):
        raise MadslError(
            f"{run_id!r} is not a run id",
            expected="4 to 64 lowercase hexadecimal digits: a run id or a unique prefix of one",
            hint="`madsl report --format csv --rows runs` lists the run ids",
        )
    folder = check_output_dir(out, "-o", lambda name: name in EXPORTED, force=force, writes=f"{WEIGHTS} and {CONFIG}")
    name, source = kept_folder(files_dir, run_id)
    config = _read_config(source)
    safetensors = safetensors_torch("madsl export")
    try:
        weights = safetensors.load_file(str(source / WEIGHTS))
    except Exception as err:  # noqa: BLE001 - safetensors' own errors: a damaged or planted file
        raise MadslError(f"{source / WEIGHTS}: not a safetensors file ({type(err).__name__})") from None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_files(folder, weights, config, "madsl export")
    except OSError as err:
        raise output_error(err, folder, "-o") from None
    return name, folder


def kept_folder(files_dir: Path, run_id: str) -> tuple[str, Path]:
    """(the run id, the folder of its kept model) for `run_id` or a unique prefix of it; a link in
    the results folder is refused, never followed."""
    if not RUN_ID_PREFIX.fullmatch(run_id):
        raise MadslError(
            f"{run_id!r} is not a run id",
            expected="4 to 64 lowercase hexadecimal digits: a run id or a unique prefix of one",
            hint="`madsl report --format csv --rows runs` lists the run ids",
        )
    kept = models_dir(files_dir)
    matches = sorted(p.name for p in kept.glob(f"{run_id}*") if (p / CONFIG).is_file()) if kept.is_dir() else []
    if not matches:
        raise MadslError(
            f"no kept model for run {run_id!r}",
            hint="runs keep their best weights when evaluated with `madsl eval ... --keep best`",
        )
    if len(matches) > 1:
        raise MadslError(f"run id prefix {run_id!r} is ambiguous", expected="one of " + ", ".join(matches[:5]))
    source = kept / matches[0]
    if source.is_symlink() or any((source / name).is_symlink() for name in EXPORTED):
        raise MadslError(
            f"{source}: a symbolic link in the results folder",
            hint="madsl never follows one there; remove it, or re-run the evaluation with --keep best",
        )
    return matches[0], source


def _reader(directory: Path) -> ModelReader:
    return ModelReader(
        Path(directory), FORMAT, "an exported madsl model", "`madsl export`", "export the run again", "load_run"
    )


def _read_config(directory: Path) -> dict:
    """config.json of a kept or exported model, checked: the model file's checks (size, nesting,
    format tag) and the types and ranges of what rebuilds the model (`_check_config`)."""
    reader = _reader(directory)
    config = reader.config()
    _check_config(config, reader)
    return config


def _check_config(config: dict, reader: ModelReader) -> None:
    """Types and ranges of config.json's fields: what load_run builds from."""
    for key, kind in (("setting", dict), ("metrics", dict), ("task", str), ("run_id", str)):
        value = config.get(key)
        if value is not None and not isinstance(value, kind):
            raise reader.error(
                f"{key} must be a{'n object' if kind is dict else ' string'} (or absent), got {shown(value)}"
            )
    from madsl.conventions import CONVENTIONS
    from madsl.runner.train.heads import HEADS
    from madsl.runner.train.options import LM_HEADS

    build = config["build"]
    for key in ("vocab_size", "max_seq_len", "num_classes"):
        reader.integer(build, key, 1)
    reader.integer(build, "backbone_num_classes", 1, optional=True)
    reader.integer(build, "input_dim", 0)
    reader.integer(build, "target_len", 1, optional=True)
    position = build.get("compression_position")
    if isinstance(position, bool) or not isinstance(position, int) or not -MAX_SIZE <= position < MAX_SIZE:
        raise reader.error(f"build.compression_position must be an integer, got {shown(position)}")
    for key, choices in (("head", HEADS), ("conventions", CONVENTIONS), ("lm_head", LM_HEADS)):
        value = build.get(key, "conventions" if key == "lm_head" else None)
        if value not in choices:
            raise reader.error(f"build.{key} must be one of {', '.join(choices)}, got {shown(value)}")
    if build["head"] == "regress" and build["input_dim"] < 1:
        raise reader.error("build.input_dim must be positive for the regress head")
    if build["head"] == "compression" and build.get("target_len") is None:
        raise reader.error("build.target_len must be set for the compression head")


def _build_model(spec: Any, build: dict):
    from madsl.compiler import compile_spec
    from madsl.runner.train.heads import TaskModel

    backbone = compile_spec(
        spec,
        vocab_size=build["vocab_size"],
        max_seq_len=build["max_seq_len"],
        num_classes=build["backbone_num_classes"],
        seed=0,
    )
    return TaskModel(
        backbone,
        build["head"],
        num_classes=build["num_classes"],
        target_len=build["target_len"],
        input_dim=build["input_dim"],
        compression_position=build["compression_position"],
        conventions=build["conventions"],
        lm_head=build.get("lm_head", "conventions"),
    )


def load_run(directory: str | os.PathLike, *, device: str | None = None):
    """The model of an exported (or kept) run, with its best weights, in eval mode. Its
    `config` attribute holds what `config.json` says (task, setting, recorded metrics)."""
    import torch

    reader = _reader(Path(directory))
    config = reader.config()
    _check_config(config, reader)  # types, ranges
    spec = reader.spec(config)  # madsl's own spec validation
    model = reader.load(lambda: _build_model(spec, config["build"]))  # the header checked before allocating
    model.config = config
    if device is not None:
        model = model.to(torch.device(device))
    return model.eval()

"""Kept models: a run's best weights (`madsl eval --keep best`), exported and loaded back.

When a run kept with `--keep best` finishes, the driver (the only writer of the results
folder, whatever executor ran it) takes the best epoch's weights from the run's final
checkpoint and writes them to `<db>.files/models/<run_id>/`:

    model.safetensors   the TaskModel's state dict at the best epoch (lowest eval perplexity,
                        the epoch whose metrics the store records)
    config.json         how to rebuild the model: the spec (as data), the task, its setting,
                        the head and sizes, and the recorded metrics of that epoch

`madsl export RUN_ID -o DIR` writes those two files into DIR (and touches nothing else
there); `load_run(DIR)` builds the model and loads the weights. Nothing here unpickles:
safetensors and JSON only, so a kept model found in a shared folder cannot execute code.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any

from madsl.errors import MadslError
from madsl.outputs import check_output_dir, output_error, write_file_atomic

FORMAT = "madsl-run-model/1"
WEIGHTS, CONFIG = "model.safetensors", "config.json"
SAFETENSORS_HINT = "pip install safetensors (madsl's torch, ray and cuda extras bring it)"


def safetensors_torch(option: str):
    """safetensors.torch, or a MadslError naming what needs it: asked before a run trains, so
    that `--keep best` without safetensors is refused up front, not after the training."""
    try:
        import safetensors.torch
    except ImportError:
        raise MadslError(f"{option} needs safetensors, which is not installed", hint=SAFETENSORS_HINT) from None
    return safetensors.torch


def models_dir(files_dir: str | os.PathLike) -> Path:
    return Path(files_dir) / "models"


def _write_dir(directory: Path, weights: dict[str, Any], config: dict[str, Any]) -> None:
    """Write the two files into a temporary sibling folder, then move it into place whole."""
    save_file = safetensors_torch("keeping a model").save_file
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.with_name(f".{directory.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        save_file({k: v.contiguous() for k, v in weights.items()}, str(staging / WEIGHTS))
        (staging / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")
        # safetensors writes owner-only (0600): give the weights the umask's mode, as the config has
        os.chmod(staging / WEIGHTS, stat.S_IMODE((staging / CONFIG).stat().st_mode))
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def keep_best(run_id: str, checkpoint_path: Path, files_dir: Path, spec_data: dict | None,
              build: dict, result: dict, task: str, setting: dict) -> Path | None:
    """Save the best weights of a finished run from its final checkpoint. Returns the folder,
    or None when the checkpoint holds no best weights (a run finished before --keep best was asked)."""
    from madsl.runner.checkpoint import load_checkpoint

    saved = load_checkpoint(checkpoint_path)
    weights = saved.get("best_state") if saved else None
    if weights is None or spec_data is None:
        return None
    config = {"format": FORMAT, "run_id": run_id, "spec": spec_data, "task": task, "setting": setting,
              "build": build, "best_epoch": result.get("best_epoch"), "metrics": result.get("best")}
    directory = models_dir(files_dir) / run_id
    _write_dir(directory, weights, config)
    return directory


RUN_ID_PREFIX = re.compile(r"[0-9a-f]{4,64}")  # a run id is a sha256; a prefix names it where unique
EXPORTED = (WEIGHTS, CONFIG)


def export(files_dir: Path, run_id: str, out: Path, *, force: bool = False) -> tuple[str, Path]:
    """Write the kept model of `run_id` (or a unique prefix of it, at least 4 hex digits) into the
    folder `out` (symlinks resolved): its model.safetensors and config.json, each atomically.
    Nothing else in `out` is touched; a folder holding anything else is refused unless `force`."""
    if not RUN_ID_PREFIX.fullmatch(run_id):
        raise MadslError(f"{run_id!r} is not a run id",
                         expected="4 to 64 lowercase hexadecimal digits: a run id or a unique prefix of one",
                         hint="`madsl report --format csv --rows runs` lists the run ids")
    folder = check_output_dir(out, "-o", lambda name: name in EXPORTED, force=force,
                              writes=f"{WEIGHTS} and {CONFIG}")
    kept = models_dir(files_dir)
    matches = sorted(p.name for p in kept.glob(f"{run_id}*") if (p / CONFIG).is_file()) if kept.is_dir() else []
    if not matches:
        raise MadslError(f"no kept model for run {run_id!r}",
                         hint="runs keep their best weights when evaluated with `madsl eval ... --keep best`")
    if len(matches) > 1:
        raise MadslError(f"run id prefix {run_id!r} is ambiguous", expected="one of " + ", ".join(matches[:5]))
    source = kept / matches[0]
    if source.is_symlink() or any((source / name).is_symlink() for name in EXPORTED):
        raise MadslError(f"{source}: a symbolic link in the results folder", hint="madsl never follows one there; "
                         "remove it, or re-run the evaluation with --keep best")
    config = _read_config(source)
    safetensors = safetensors_torch("madsl export")
    try:
        weights = safetensors.load_file(str(source / WEIGHTS))
    except Exception as err:  # noqa: BLE001 - safetensors' own errors: a damaged or planted file
        raise MadslError(f"{source / WEIGHTS}: not a safetensors file ({type(err).__name__})") from None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_file_atomic(folder / WEIGHTS, lambda tmp: safetensors.save_file(
            {k: v.contiguous() for k, v in weights.items()}, tmp))
        write_file_atomic(folder / CONFIG, lambda tmp: Path(tmp).write_text(
            json.dumps(config, indent=2, sort_keys=True, default=str) + "\n"))
    except OSError as err:
        raise output_error(err, folder, "-o") from None
    return matches[0], folder


def _read_config(directory: Path) -> dict:
    try:
        config = json.loads((Path(directory) / CONFIG).read_text())
    except (OSError, ValueError) as err:
        raise MadslError(f"{directory}: not an exported madsl model ({err})",
                         hint=f"a folder written by `madsl export` holds {CONFIG} and {WEIGHTS}") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise MadslError(f"{directory}: not an exported madsl model (format {config.get('format')!r})"
                         if isinstance(config, dict) else f"{directory}: not an exported madsl model")
    return config


def load_run(directory: str | os.PathLike, *, device: str | None = None):
    """The model of an exported (or kept) run, with its best weights, in eval mode. Its
    `config` attribute holds what `config.json` says (task, setting, recorded metrics)."""
    import torch

    from madsl.compiler import compile_spec
    from madsl.runner.heads import TaskModel
    from madsl.spec import spec_from_data

    directory = Path(directory)
    config = _read_config(directory)
    load_file = safetensors_torch("load_run").load_file
    build = config["build"]
    spec = spec_from_data(config["spec"])
    backbone = compile_spec(spec, vocab_size=build["vocab_size"], max_seq_len=build["max_seq_len"],
                             num_classes=build["backbone_num_classes"], seed=0)
    model = TaskModel(backbone, build["head"], num_classes=build["num_classes"], target_len=build["target_len"],
                      input_dim=build["input_dim"], compression_position=build["compression_position"],
                      conventions=build["conventions"], lm_head=build.get("lm_head", "conventions"))
    try:
        weights = load_file(str(directory / WEIGHTS))
    except Exception as err:  # noqa: BLE001 - safetensors' own errors: a damaged or planted file
        raise MadslError(f"{directory / WEIGHTS}: not a safetensors file ({type(err).__name__})") from None
    model.load_state_dict(weights)
    model.config = config
    if device is not None:
        model = model.to(torch.device(device))
    return model.eval()

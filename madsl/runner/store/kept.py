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

Both files are untrusted input. config.json is read with a size cap and checked (types,
ranges, the spec through madsl's own spec validation) before anything is built; then the
model it describes is built on the meta device (no memory) and every tensor of the
safetensors header must have its shape, so a planted config or weights file is a
MadslError naming the file before the model is allocated. Writing a kept model never
follows (nor deletes) a symbolic link in the results folder.
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
    from madsl.runner.store.files import refuse_links

    save_file = safetensors_torch("keeping a model").save_file
    staging = directory.with_name(f".{directory.name}.{os.getpid()}.tmp")
    refuse_links(directory.parent, directory, staging)  # not madsl's: neither followed nor deleted
    directory.parent.mkdir(parents=True, exist_ok=True)
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
    from madsl.runner.train.checkpoint import load_checkpoint

    saved = load_checkpoint(checkpoint_path)
    weights = saved.get("best_state") if saved else None
    if weights is None or spec_data is None:
        return None
    config = {"format": FORMAT, "run_id": run_id, "spec": spec_data, "task": task, "setting": setting,
              "build": build, "best_epoch": result.get("best_epoch"), "metrics": result.get("best")}
    from madsl.runner.store.files import os_error_words

    directory = models_dir(files_dir) / run_id
    try:
        _write_dir(directory, weights, config)
    except OSError as err:
        raise MadslError(f"kept model {directory}: could not be written: {os_error_words(err)}"
                         + (f" ({err.filename})" if err.filename else ""),
                         hint="the run is recorded; free the space (or fix the folder) and evaluate it again "
                              "with --keep best to keep its weights") from None
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


MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a spec is at most 128 KiB of YAML; the rest is a few settings
MAX_CONFIG_DEPTH = 64  # lists and objects inside each other (as in a spec file)
MAX_CONFIG_VALUES = 100_000
MAX_SIZE = 2**31  # vocabulary, lengths, classes: beyond any model madsl trains
MAX_EXTRA_BYTES = 2**30  # buffers a model builds beyond its weights (position tables): at most 1 GiB
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
SAFETENSORS_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64", "I64": "int64",
                      "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def _read_config(directory: Path) -> dict:
    """config.json of a kept or exported model, checked: at most MAX_CONFIG_BYTES, JSON of bounded
    depth, the format tag, and the types and ranges of what rebuilds the model (`_check_config`)."""
    path = Path(directory) / CONFIG
    hint = f"a folder written by `madsl export` holds {CONFIG} and {WEIGHTS}"
    try:
        with open(path, "rb", opener=lambda name, flags: os.open(name, flags | getattr(os, "O_NONBLOCK", 0))) as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ValueError("not a regular file")
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ValueError(f"larger than {MAX_CONFIG_BYTES // 2**20} MiB")
        config = json.loads(raw)
    except RecursionError:
        raise MadslError(f"{path}: not an exported madsl model (nested too deeply)", hint=hint) from None
    except (OSError, ValueError) as err:
        raise MadslError(f"{directory}: not an exported madsl model ({err})", hint=hint) from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise MadslError(f"{directory}: not an exported madsl model (format {config.get('format')!r})"
                         if isinstance(config, dict) else f"{directory}: not an exported madsl model")
    _check_config(config, path)
    return config


def _config_error(path: Path, problem: str) -> MadslError:
    return MadslError(f"{path}: {problem}", hint="a damaged or planted config.json: nothing was built from it; "
                                                 "export the run again")


def _check_config(config: dict, path: Path) -> None:
    """Types and ranges of config.json's fields, bounded nesting: what load_run builds from."""
    stack, values = [(config, 1)], 0
    while stack:
        value, depth = stack.pop()
        values += 1
        if depth > MAX_CONFIG_DEPTH or values > MAX_CONFIG_VALUES:
            raise _config_error(path, f"nested deeper than {MAX_CONFIG_DEPTH} or more than {MAX_CONFIG_VALUES:,} "
                                      "values")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    for key, kind, required in (("spec", dict, True), ("build", dict, True), ("setting", dict, False),
                                ("metrics", dict, False), ("task", str, False), ("run_id", str, False)):
        value = config.get(key)
        if not isinstance(value, kind) and (required or value is not None):
            raise _config_error(path, f"{key} must be a{'n object' if kind is dict else ' string'}"
                                      f"{'' if required else ' (or absent)'}, got {_shown(value)}")
    from madsl.conventions import CONVENTIONS
    from madsl.runner.train.heads import HEADS
    from madsl.runner.train.options import LM_HEADS

    build = config["build"]

    def integer(key: str, low: int, optional: bool = False) -> None:
        value = build.get(key)
        if optional and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_SIZE:
            raise _config_error(path, f"build.{key} must be an integer in {low}..{MAX_SIZE:,}"
                                      f"{' or null' if optional else ''}, got {_shown(value)}")

    for key in ("vocab_size", "max_seq_len", "num_classes"):
        integer(key, 1)
    integer("backbone_num_classes", 1, optional=True)
    integer("input_dim", 0)
    integer("target_len", 1, optional=True)
    position = build.get("compression_position")
    if isinstance(position, bool) or not isinstance(position, int) or not -MAX_SIZE <= position < MAX_SIZE:
        raise _config_error(path, f"build.compression_position must be an integer, got {_shown(position)}")
    for key, choices in (("head", HEADS), ("conventions", CONVENTIONS), ("lm_head", LM_HEADS)):
        value = build.get(key, "conventions" if key == "lm_head" else None)
        if value not in choices:
            raise _config_error(path, f"build.{key} must be one of {', '.join(choices)}, got {_shown(value)}")
    if build["head"] == "regress" and build["input_dim"] < 1:
        raise _config_error(path, "build.input_dim must be positive for the regress head")
    if build["head"] == "compression" and build.get("target_len") is None:
        raise _config_error(path, "build.target_len must be set for the compression head")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _build_model(spec: Any, build: dict):
    from madsl.compiler import compile_spec
    from madsl.runner.train.heads import TaskModel

    backbone = compile_spec(spec, vocab_size=build["vocab_size"], max_seq_len=build["max_seq_len"],
                            num_classes=build["backbone_num_classes"], seed=0)
    return TaskModel(backbone, build["head"], num_classes=build["num_classes"], target_len=build["target_len"],
                     input_dim=build["input_dim"], compression_position=build["compression_position"],
                     conventions=build["conventions"], lm_head=build.get("lm_head", "conventions"))


def _planned_tensors(spec: Any, build: dict, path: Path) -> dict[str, tuple[tuple[int, ...], Any]]:
    """The state dict's (shape, dtype) of the model config.json describes, built on the meta device
    (nothing allocated); a MadslError if it cannot be built, or its other buffers are too large."""
    import torch

    try:
        with torch.device("meta"):
            model = _build_model(spec, build)
    except MadslError as err:
        raise _config_error(path, f"describes a model that cannot be built: {err.one_line()}") from None
    except Exception as err:  # noqa: BLE001 - sizes no model has (an overflow, a negative width)
        raise _config_error(path, f"describes a model that cannot be built ({type(err).__name__}: "
                                  f"{str(err).strip()[:200]})") from None
    state = {name: (tuple(t.shape), t.dtype) for name, t in model.state_dict().items()}
    held = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    saved = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    if held - saved > MAX_EXTRA_BYTES:
        raise _config_error(path, f"describes a model whose buffers need {(held - saved) / 2**30:.3g} GiB "
                                  "beyond its weights")
    return state


def _safetensors_tensors(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each tensor's (shape, dtype) from the safetensors header (validated by safetensors; nothing
    is loaded), or a MadslError naming the file."""
    from safetensors import safe_open

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ValueError("not a regular file")
        with safe_open(str(path), framework="pt") as f:
            return {name: (tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype()) for name in f.keys()}
    except Exception as err:  # noqa: BLE001 - safetensors' own errors: a damaged or planted file
        raise MadslError(f"{path}: not a safetensors file ({type(err).__name__}: {str(err).strip()[:200]})",
                         hint="a damaged or planted weights file: nothing was loaded; export the run again") from None


def _check_tensors(found: dict, planned: dict, path: Path) -> None:
    """Every tensor of the file has the name, shape and kind (floating or not) of the model's."""
    hint = "the weights do not belong to the model config.json describes: nothing was allocated"
    missing, unexpected = sorted(set(planned) - set(found)), sorted(set(found) - set(planned))
    if missing or unexpected:
        what = f"lacks {missing[0]!r}" if missing else f"has {unexpected[0]!r}, which the model does not"
        more = len(missing) + len(unexpected) - 1
        raise MadslError(f"{path}: {what}{f' (and {more} more differences)' if more else ''}", hint=hint)
    for name, (shape, dtype) in planned.items():
        found_shape, found_dtype = found[name]
        if found_shape != shape:
            raise MadslError(f"{path}: tensor {name!r} has shape {list(found_shape)}; the model config.json "
                             f"describes has {list(shape)}", hint=hint)
        floating = dtype.is_floating_point
        if (found_dtype in FLOAT_DTYPES) != floating or \
                (not floating and SAFETENSORS_DTYPES.get(found_dtype) != str(dtype).removeprefix("torch.")):
            raise MadslError(f"{path}: tensor {name!r} is {found_dtype}; the model's is "
                             f"{str(dtype).removeprefix('torch.')}", hint=hint)


def load_run(directory: str | os.PathLike, *, device: str | None = None):
    """The model of an exported (or kept) run, with its best weights, in eval mode. Its
    `config` attribute holds what `config.json` says (task, setting, recorded metrics)."""
    import torch

    from madsl.spec import spec_from_data

    directory = Path(directory)
    config = _read_config(directory)  # checked: types, ranges, size
    safetensors = safetensors_torch("load_run")
    build, config_path, weights_path = config["build"], directory / CONFIG, directory / WEIGHTS
    try:
        spec = spec_from_data(config["spec"])  # madsl's own spec validation
    except MadslError as err:
        raise _config_error(config_path, f"its spec is not a valid spec: {err.one_line()}") from None
    except Exception as err:  # noqa: BLE001 - data no spec file could hold
        raise _config_error(config_path, f"its spec is not a valid spec ({type(err).__name__})") from None
    # before anything is allocated: the model's tensors, on the meta device, against the file's header
    planned = _planned_tensors(spec, build, config_path)
    _check_tensors(_safetensors_tensors(weights_path), planned, weights_path)
    model = _build_model(spec, build)
    try:
        weights = safetensors.load_file(str(weights_path))
        model.load_state_dict(weights)
    except Exception as err:  # noqa: BLE001 - safetensors' own errors: a file changed or damaged since its header
        raise MadslError(f"{weights_path}: not a safetensors file of this model ({type(err).__name__}: "
                         f"{str(err).strip()[:200]})") from None
    model.config = config
    if device is not None:
        model = model.to(torch.device(device))
    return model.eval()

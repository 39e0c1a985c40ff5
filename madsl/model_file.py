"""The model file format: a model is a folder of two files, and madsl saves models in no other form.

    model.safetensors   the state dict (safetensors: tensors and their names, nothing executable)
    config.json         how to rebuild the model: a format tag, the spec (as data) and the build
                        arguments (`build`), and what its writer adds

Two writers use it, each with its own format tag: `madsl.compiler.save` (a compiled Model:
"madsl-model/2", built again by `madsl.compiler.load`) and kept runs (`madsl eval --keep best`,
`madsl export`, `madsl.load_run`: "madsl-run-model/1", a TaskModel with its head and the run's
task, setting and metrics; madsl/runner/store/kept.py). Each file is written atomically
(madsl.outputs).

Nothing here unpickles, so a model found in a shared folder cannot execute code. Both files are
untrusted input (ModelReader): config.json is read with a size cap and bounded nesting, its format
tag and fields checked and its spec put through madsl's own spec validation before anything is
built; then the model it describes is built on the meta device (no memory) and every tensor of the
safetensors header must have its name, shape and kind, so a planted config or weights file is a
MadslError naming the file before the model is allocated. A file in the pickle format madsl once
saved models in (torch.save) is refused with a MadslError that says how to convert it
(`pickle_error`), never loaded.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from madsl.errors import MadslError
from madsl.outputs import write_atomic, write_text_atomic

WEIGHTS, CONFIG = "model.safetensors", "config.json"
FILES = (WEIGHTS, CONFIG)
SAFETENSORS_HINT = "pip install safetensors (madsl's torch, ray and cuda extras bring it)"
MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a spec is at most 128 KiB of YAML; the rest is a few settings
MAX_CONFIG_DEPTH = 64  # lists and objects inside each other (as in a spec file)
MAX_CONFIG_VALUES = 100_000
MAX_SIZE = 2**31  # vocabulary, lengths, classes: beyond any model madsl trains
MAX_EXTRA_BYTES = 2**30  # buffers a model builds beyond its weights (position tables): at most 1 GiB
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
SAFETENSORS_DTYPES = {
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
PICKLE_MAGIC = (b"PK\x03\x04", b"\x80")  # torch.save's zip archive; a bare pickle (protocol 2 and later)


def safetensors_torch(option: str) -> Any:
    """safetensors.torch, or a MadslError naming what needs it (asked before work that needs it)."""
    try:
        import safetensors.torch
    except ImportError:
        raise MadslError(f"{option} needs safetensors, which is not installed", hint=SAFETENSORS_HINT) from None
    return safetensors.torch


def file_tensors(state: Mapping[str, Any]) -> dict[str, Any]:
    """A state dict as safetensors stores it: each tensor on the CPU, contiguous and holding memory
    of its own (a tied weight is one tensor under two names, which safetensors refuses); the bits
    are not changed."""
    out, seen = {}, set()
    for name, tensor in state.items():
        tensor = tensor.detach().cpu().contiguous()
        storage = tensor.untyped_storage()
        whole = tensor.data_ptr() == storage.data_ptr() and tensor.numel() * tensor.element_size() == storage.nbytes()
        if not whole or (tensor.numel() and storage.data_ptr() in seen):
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        out[name] = tensor
    return out


def config_text(config: Mapping[str, Any]) -> str:
    return json.dumps(config, indent=2, sort_keys=True, default=str) + "\n"


def write_files(folder: Path, weights: Mapping[str, Any], config: Mapping[str, Any], option: str) -> None:
    """model.safetensors and config.json into `folder` (which exists), each atomically; nothing
    else there is touched. `option` names what needs safetensors in the error if it is missing."""
    save_file = safetensors_torch(option).save_file
    tensors = file_tensors(weights)
    write_atomic(folder / WEIGHTS, lambda tmp: save_file(tensors, tmp))
    write_text_atomic(folder / CONFIG, config_text(config))


def _starts_like_a_pickle(path: Path) -> bool:
    try:
        with open(path, "rb", opener=lambda name, flags: os.open(name, flags | getattr(os, "O_NONBLOCK", 0))) as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return False
            head = f.read(4)
    except OSError:
        return False
    return head.startswith(PICKLE_MAGIC)


def old_pickle(path: Path) -> Path | None:
    """The file at `path`, or a file directly in the folder `path` without a config.json, that
    starts as a pickle or a torch.save archive does (nothing is unpickled: its first bytes are read)."""
    if path.is_file():
        return path if _starts_like_a_pickle(path) else None
    if path.is_dir() and not (path / CONFIG).exists():
        for entry in sorted(path.iterdir())[:100]:
            if not entry.is_symlink() and entry.is_file() and _starts_like_a_pickle(entry):
                return entry
    return None


def pickle_error(path: Path, what: str) -> MadslError:
    """The refusal of a model file in the pickle format: what it is, why it is not read, how to convert it."""
    return MadslError(
        f"{path}: {what} in the old pickle format (torch.save), which madsl no longer reads: "
        "unpickling a file can run any code it holds",
        hint="save it again in today's format (a folder of model.safetensors and config.json): "
        "compile its spec and save that (`madsl compile SPEC --emit torch -o FOLDER`), or, for "
        "a file you trust, load it as madsl 0.2.0 and earlier did and save it with this madsl "
        "(docs/guide.md, 'Saving and loading a model', shows how)",
    )


@dataclass(frozen=True)
class ModelReader:
    """Reads one model folder as untrusted input (module docstring). `what` names the kind in
    errors ("an exported madsl model"), `writer` what writes such a folder, `again` what to do
    about a damaged one ("export the run again"), `option` what needs safetensors."""

    directory: Path
    format: str
    what: str
    writer: str
    again: str
    option: str

    def error(self, problem: str) -> MadslError:
        """A problem of config.json."""
        return MadslError(
            f"{self.directory / CONFIG}: {problem}",
            hint=f"a damaged or planted config.json: nothing was built from it; {self.again}",
        )

    def config(self) -> dict:
        """config.json, checked: at most MAX_CONFIG_BYTES, JSON of bounded depth, the format tag,
        `spec` and `build` objects."""
        path = self.directory / CONFIG
        hint = f"a folder written by {self.writer} holds {CONFIG} and {WEIGHTS}"
        try:
            with open(path, "rb", opener=lambda name, flags: os.open(name, flags | getattr(os, "O_NONBLOCK", 0))) as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise ValueError("not a regular file")
                raw = f.read(MAX_CONFIG_BYTES + 1)
            if len(raw) > MAX_CONFIG_BYTES:
                raise ValueError(f"larger than {MAX_CONFIG_BYTES // 2**20} MiB")
            config = json.loads(raw)
        except RecursionError:
            raise MadslError(f"{path}: not {self.what} (nested too deeply)", hint=hint) from None
        except (OSError, ValueError) as err:
            raise MadslError(f"{self.directory}: not {self.what} ({err})", hint=hint) from None
        if not isinstance(config, dict) or config.get("format") != self.format:
            raise MadslError(
                f"{self.directory}: not {self.what} (format {config.get('format')!r})"
                if isinstance(config, dict)
                else f"{self.directory}: not {self.what}"
            )
        self._check_nesting(config)
        for key in ("spec", "build"):
            if not isinstance(config.get(key), dict):
                raise self.error(f"{key} must be an object, got {shown(config.get(key))}")
        return config

    def _check_nesting(self, config: dict) -> None:
        stack, values = [(config, 1)], 0
        while stack:
            value, depth = stack.pop()
            values += 1
            if depth > MAX_CONFIG_DEPTH or values > MAX_CONFIG_VALUES:
                raise self.error(f"nested deeper than {MAX_CONFIG_DEPTH} or more than {MAX_CONFIG_VALUES:,} values")
            if isinstance(value, dict):
                stack.extend((v, depth + 1) for v in value.values())
            elif isinstance(value, list):
                stack.extend((v, depth + 1) for v in value)

    def integer(self, build: dict, key: str, low: int, optional: bool = False) -> None:
        """build[key] is an integer in low..MAX_SIZE (or None where `optional`)."""
        value = build.get(key)
        if optional and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_SIZE:
            raise self.error(
                f"build.{key} must be an integer in {low}..{MAX_SIZE:,}"
                f"{' or null' if optional else ''}, got {shown(value)}"
            )

    def spec(self, config: dict) -> Any:
        """The spec config.json holds, through madsl's own spec validation."""
        from madsl.lang.spec import spec_from_data

        try:
            return spec_from_data(config["spec"])
        except MadslError as err:
            raise self.error(f"its spec is not a valid spec: {err.one_line()}") from None
        except Exception as err:  # noqa: BLE001 - data no spec file could hold
            raise self.error(f"its spec is not a valid spec ({type(err).__name__})") from None

    def load(self, build_model: Callable[[], Any]) -> Any:
        """The model `build_model()` builds, with the folder's weights, once the weights file's
        header has been checked against the model built on the meta device."""
        safetensors = safetensors_torch(self.option)
        weights_path = self.directory / WEIGHTS
        check_tensors(safetensors_tensors(weights_path, self.again), self._planned(build_model), weights_path)
        model = build_model()
        try:
            model.load_state_dict(safetensors.load_file(str(weights_path)))
        except Exception as err:  # noqa: BLE001 - safetensors' own errors: a file changed or damaged since its header
            raise MadslError(
                f"{weights_path}: not a safetensors file of this model ({type(err).__name__}: {str(err).strip()[:200]})"
            ) from None
        return model

    def _planned(self, build_model: Callable[[], Any]) -> dict[str, tuple[tuple[int, ...], Any]]:
        """The state dict's (shape, dtype) of the model, built on the meta device (nothing
        allocated); a MadslError if it cannot be built, or its other buffers are too large."""
        import torch

        try:
            with torch.device("meta"):
                model = build_model()
        except MadslError as err:
            raise self.error(f"describes a model that cannot be built: {err.one_line()}") from None
        except Exception as err:  # noqa: BLE001 - sizes no model has (an overflow, a negative width)
            raise self.error(
                f"describes a model that cannot be built ({type(err).__name__}: {str(err).strip()[:200]})"
            ) from None
        state = {name: (tuple(t.shape), t.dtype) for name, t in model.state_dict().items()}
        held = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
        saved = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        if held - saved > MAX_EXTRA_BYTES:
            raise self.error(
                f"describes a model whose buffers need {(held - saved) / 2**30:.3g} GiB beyond its weights"
            )
        return state


def shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def safetensors_tensors(path: Path, again: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each tensor's (shape, dtype) from the safetensors header (validated by safetensors; nothing
    is loaded), or a MadslError naming the file."""
    from safetensors import safe_open

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ValueError("not a regular file")
        with safe_open(str(path), framework="pt") as f:
            return {name: (tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype()) for name in f.keys()}  # noqa: SIM118 - safe_open is not a dict
    except Exception as err:  # noqa: BLE001 - safetensors' own errors: a damaged or planted file
        raise MadslError(
            f"{path}: not a safetensors file ({type(err).__name__}: {str(err).strip()[:200]})",
            hint=f"a damaged or planted weights file: nothing was loaded; {again}",
        ) from None


def check_tensors(found: dict, planned: dict, path: Path) -> None:
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
            raise MadslError(
                f"{path}: tensor {name!r} has shape {list(found_shape)}; the model config.json "
                f"describes has {list(shape)}",
                hint=hint,
            )
        floating = dtype.is_floating_point
        if (found_dtype in FLOAT_DTYPES) != floating or (
            not floating and SAFETENSORS_DTYPES.get(found_dtype) != str(dtype).removeprefix("torch.")
        ):
            raise MadslError(
                f"{path}: tensor {name!r} is {found_dtype}; the model's is {str(dtype).removeprefix('torch.')}",
                hint=hint,
            )

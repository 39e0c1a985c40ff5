"""A spec's `init:`: layers that start from a saved model's weights, and may stay frozen.

    init:
      - from: models/gpt-neo        # a saved madsl model: a folder of config.json + model.safetensors
        layers: [Ag, Al, Mlp, embedding, positions]
        freeze: true                # (default false) these weights do not train

Each name under `layers:` is a symbol (`Mb`), a tag (`#a`), `embedding`, `positions`,
`embedding_norm` or `final_norm`; the k-th use of a symbol in this spec takes the k-th use's weights
in the saved model (its pre-norm too, where both have one of their own), so the spec uses it at most
as often as the saved model (fewer: the first ones, as the seed-004 study took a backbone's first
layers). The folder follows
the read policy of every file a spec names (madsl/lang/spec/named.py): a relative path in the
spec file's folder or below it, or inside $MADSL_SPEC_ROOT; its files are read (and required) only
where the weights are: compiling, and a run's identity. Only a spec file has an `init:`: data
without a file (a search's candidates, a saved model's config) cannot name weights to read.

The weights enter the spec's identity by their bytes (`InitFrom.weights_sha256`), never by their
path: two specs that start from the same weights build the same model wherever the folder is.
Torch-free: the folder is checked and hashed here, the weights loaded by the compiler
(madsl.weights.init).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from madsl.errors import Collector, Location, MadslError, did_you_mean
from madsl.lang.spec.named import resolve_folder

ENTRY_KEYS = ("from", "layers", "freeze")
ENTRY_SCHEMA = {  # the JSON Schema of an entry (madsl schema --kind spec), beside what _entry checks
    "type": "object",
    "properties": {
        "from": {"type": "string", "description": "a saved madsl model's folder, relative to the spec's"},
        "layers": {
            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}],
            "description": "symbols, #tags, embedding, positions, embedding_norm, final_norm",
        },
        "freeze": {"type": "boolean", "default": False},
    },
    "required": ["from", "layers"],
    "additionalProperties": False,
}
MODEL_PARTS = ("embedding", "positions", "embedding_norm", "final_norm")  # the model-level parts an entry may name
FILES = ("config.json", "model.safetensors")  # a saved madsl model (madsl/model_file.py)
_CHUNK = 1 << 20


@dataclass
class InitFrom:
    """One `init:` entry, checked: the saved model's folder (resolved), the names it initialises,
    whether they train, and where the entry is written (for the compiler's errors)."""

    folder: Path
    layers: tuple[str, ...]
    freeze: bool = False
    where: Location | None = None
    index: int = 0
    written: str = ""  # the path as the spec writes it, for messages
    _sha256: str | None = field(default=None, repr=False, compare=False)

    def require_files(self) -> None:
        """The saved model's two files are there, or a MadslError at the entry. Checked where the
        weights are read (compiling, the run identity), not when the spec loads: accounting and
        budget checks of a spec need no weights, and CI machines often have none."""
        for name in FILES:
            if not (self.folder / name).is_file():
                raise MadslError(
                    f"init[{self.index}].from: {self.written or self.folder} holds no {name}",
                    self.where,
                    expected="a saved madsl model: a folder of config.json and model.safetensors",
                    hint="madsl.compiler.save(model, FOLDER) or `madsl import CHECKPOINT --out FOLDER` writes one",
                )

    @property
    def weights_sha256(self) -> str:
        """The SHA-256 of the folder's model.safetensors: what the spec's identity records."""
        if self._sha256 is None:
            self.require_files()
            digest = hashlib.sha256()
            try:
                with open(self.folder / FILES[1], "rb") as weights:
                    while block := weights.read(_CHUNK):
                        digest.update(block)
            except OSError as err:
                raise MadslError(f"init: cannot read {self.folder / FILES[1]}: {err.strerror}", self.where) from None
            self._sha256 = digest.hexdigest()
        return self._sha256

    def identity(self) -> dict[str, Any]:
        return {"weights": self.weights_sha256, "layers": list(self.layers), "freeze": self.freeze}


def parse_init(value: list, names: set[str], at: Any, errors: Collector, file: Path | None) -> list[InitFrom]:
    """The `init:` list -> its entries; each problem goes to `errors` (located) and its entry is
    left out. `names`: what an entry may name (the spec's symbols in use and its tags)."""
    if file is None:
        errors.add(
            MadslError(
                "init: names weights to read, and only a spec file may: these spec data come from no file",
                at.key("init"),
                hint="write the init: in a .mad file (a search's candidates and saved models have their own weights)",
            )
        )
        return []
    entries, seen = [], {}
    for index, entry in enumerate(value):
        with errors.check():
            parsed = _entry(entry, index, names | set(MODEL_PARTS), at, file)
            for name in parsed.layers:
                if name in seen:
                    raise MadslError(
                        f"init[{index}]: {name} is initialised by init[{seen[name]}] already",
                        at.value("init", index, "layers"),
                        hint="name each layer in one entry",
                    )
                seen[name] = index
            entries.append(parsed)
    return entries


def _entry(entry: Any, index: int, names: set[str], at: Any, file: Path) -> InitFrom:
    where = at.value("init", index)
    if not isinstance(entry, dict):
        raise MadslError(
            f"init[{index}] must be a mapping, got {entry!r}",
            where,
            expected="{from: FOLDER, layers: [NAMES], freeze: BOOL}",
        )
    for key in entry:
        if key not in ENTRY_KEYS:
            raise MadslError(
                f"init[{index}]: unknown key {key!r}",
                at.key("init", index, key),
                expected="one of " + ", ".join(ENTRY_KEYS),
                hint=did_you_mean(str(key), ENTRY_KEYS),
            )
    for key in ("from", "layers"):
        if key not in entry:
            raise MadslError(f"init[{index}]: missing {key!r}", at.key("init", index), hint=_HINT)
    freeze = entry.get("freeze", False)
    if not isinstance(freeze, bool):
        raise MadslError(
            f"init[{index}].freeze must be true or false, got {freeze!r}", at.value("init", index, "freeze")
        )
    layers = entry["layers"]
    if isinstance(layers, str):
        layers = [layers]
    if not isinstance(layers, list) or not layers or not all(isinstance(name, str) for name in layers):
        raise MadslError(
            f"init[{index}].layers must list names, got {entry['layers']!r}",
            at.value("init", index, "layers"),
            expected="symbols, #tags, embedding, positions, embedding_norm or final_norm, e.g. [Mb, embedding]",
        )
    for name in layers:
        if name not in names:
            raise MadslError(
                f"init[{index}]: the spec has no layer {name!r} to initialise",
                at.value("init", index, "layers"),
                expected="one of " + ", ".join(sorted(names)),
                hint=did_you_mean(name, sorted(names)),
            )
    location = at.value("init", index, "from")
    naming = Path(location.file) if location is not None and location.file else file
    folder = resolve_folder(entry["from"], naming, location, key="init.from")
    return InitFrom(folder, tuple(dict.fromkeys(layers)), freeze, location, index, str(entry["from"]))


_HINT = "an entry reads {from: FOLDER, layers: [NAMES], freeze: true|false}"

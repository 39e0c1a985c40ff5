"""Where the data files that ship with madsl live (grammar, stdlib, bundled specs).

Installed, they are the subpackages `madsl.grammar` and `madsl.stdlib`; in a
source checkout they are the top-level folders next to `madsl/`.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent


@cache
def _package_dir(package: str, fallback: str) -> Path:
    local = _ROOT / fallback
    if local.is_dir():  # a source checkout (editable install or tests run from the tree)
        return local
    # Installed, the data lies in the folder of that name inside madsl/ (a folder of data files, found
    # by its path; the module that loads the stdlib is madsl.lang.stdlib).
    installed = Path(__file__).resolve().parent / package.rpartition(".")[2]
    if not installed.is_dir():
        raise FileNotFoundError(f"madsl is installed without its {fallback}/ data ({package})")
    return installed


def grammar_file() -> Path:
    return _package_dir("madsl.grammar", "grammar") / "topology.lark"


def stdlib_dir() -> Path:
    return _package_dir("madsl.stdlib", "stdlib")


def specs_dir() -> Path | None:
    """The bundled specs, available in a source checkout."""
    path = _ROOT / "specs"
    return path if path.is_dir() else None

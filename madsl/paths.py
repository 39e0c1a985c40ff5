"""The one rule for paths madsl did not get whole from the user.

- A file read because a path named a folder stays inside that folder: a link (or a link above
  it) that leads out is refused by name, never followed (`inside`, `require_inside`).
- A file written under a name madsl made from data (a search's name, a candidate's name, a
  study's name) is a plain file name inside the output folder given: a name with a path
  separator, `..`, a NUL, a leading dot or nothing at all is refused by name (`safe_file_name`,
  `file_in`).
- An empty path argument is an error, never "the current folder" (`require_path`).
- madsl's own caches live in one folder of the user's (`cache_dir`).

Pure Python, importable without torch or numpy.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from madsl.errors import Location, MadslError

MAX_FILE_NAME = 200  # characters; below every common filesystem's 255 bytes, with room for a suffix
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+\-]*")


def require_path(path: str | os.PathLike | None, what: str, location: Location | None = None) -> Path:
    """`path` as a Path, or a MadslError when it is missing or empty (an unset `$VAR` in a script
    must not mean the current folder)."""
    text = "" if path is None else os.fspath(path)
    if text.strip() == "":
        raise MadslError(
            f"{what}: the path is empty",
            location,
            hint="name a file or folder (an unset shell variable expands to nothing)",
        )
    if "\0" in text:
        raise MadslError(f"{what}: a path cannot contain a NUL character", location)
    return Path(text)


def inside(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether `path`, every link on the way followed, lies in `folder` (itself resolved)."""
    try:
        return Path(path).resolve().is_relative_to(Path(folder).resolve())
    except (OSError, RuntimeError):  # a link loop
        return False


def require_inside(path: str | os.PathLike, folder: str | os.PathLike, what: str = "") -> Path:
    """`path`, or a MadslError naming it when a link takes it out of `folder` (not read)."""
    if not inside(path, folder):
        raise MadslError(
            f"{path}: a symbolic link that leads out of {folder}, not read" + (f" ({what})" if what else ""),
            Location(file=str(path)),
            hint="name the file it points to directly if it is meant to be read",
        )
    return Path(path)


def safe_file_name(name: object, what: str, location: Location | None = None) -> str:
    """`name` if it can be a file name inside an output folder as it is, else a MadslError at
    `location` saying why: not text, empty, a separator, `..`, a leading dot (hidden, or the
    folder itself), characters beyond letters, digits and . _ + -, or longer than MAX_FILE_NAME."""
    expected = (
        f"a name of letters, digits and . _ + - (at most {MAX_FILE_NAME} characters), starting with a letter or digit"
    )
    if not isinstance(name, str):
        raise MadslError(f"{what} {name!r}: not text", location, expected=expected)
    shown = repr(name) if len(name) <= 60 else repr(name[:57]) + "..."
    if name == "":
        reason = "is empty"
    elif "/" in name or "\\" in name or os.sep in name:
        reason = "holds a path separator: it would be written outside the output folder"
    elif ".." in name:
        reason = "holds '..'"
    elif len(name) > MAX_FILE_NAME:
        reason = f"is {len(name):,} characters long"
    elif not _SAFE.fullmatch(name):
        reason = (
            "holds a character that is not safe in a file name" if name[0] not in "._+-" else f"starts with {name[0]!r}"
        )
    else:
        return name
    raise MadslError(f"{what} {shown} {reason}", location, expected=expected)


def file_in(folder: str | os.PathLike, name: str, suffix: str, what: str, location: Location | None = None) -> Path:
    """folder / (name + suffix), with `name` checked by safe_file_name: the path always lies in `folder`."""
    return Path(folder) / (safe_file_name(name, what, location) + suffix)


def cache_dir() -> Path:
    """The folder of madsl's caches: $MADSL_CACHE_DIR where set, else $XDG_CACHE_HOME/madsl,
    else ~/.cache/madsl (not created here)."""
    if os.environ.get("MADSL_CACHE_DIR"):
        return Path(os.environ["MADSL_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "madsl"

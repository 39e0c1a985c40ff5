"""What every command shares: exit codes, the console, error printing, atomic file writes."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from madsl.errors import MadslError
from madsl.outputs import temp_beside

# 0 success, 1 a budget is violated, 2 bad input (a located error, no traceback),
# 3 some eval runs failed, 130 interrupted (eval runs are resumable)
EXIT_OK, EXIT_BUDGET, EXIT_BAD_INPUT, EXIT_RUNS_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def make_console(stderr: bool = False):
    from rich.console import Console

    # pipes and CI logs get a wide table instead of rich's 80-column default
    width = None if sys.stdout.isatty() else max(140, shutil.get_terminal_size((140, 24)).columns)
    return Console(stderr=stderr, highlight=False, width=width)


def print_whole(console, table) -> None:
    """Print a table whose cells are never cut short: where the terminal is too narrow for it, rich
    ends numbers and paths with '…' ('793,1…'); then the table is printed at its full width and
    the terminal wraps the lines instead (text that wraps inside its cell is left to wrap)."""
    from rich.measure import Measurement

    full = Measurement.get(console, console.options.update_width(100_000), table).maximum
    if full > console.width:
        with console.capture() as capture:
            console.print(table)
        if "…" in capture.get():
            width = console.width
            console.width = full  # (print(width=...) cannot go past the console's width)
            try:
                console.print(table)
            finally:
                console.width = width
            return
    console.print(table)


def print_error(err: MadslError) -> None:
    print(err.render(), file=sys.stderr)


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` via a temporary file in the same directory, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_beside(path)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)  # a failed write leaves no partial file
        raise

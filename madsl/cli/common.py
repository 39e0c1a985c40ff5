"""What every command shares: exit codes, the console, error printing, atomic file writes."""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path
from typing import Callable, NoReturn

from madsl.errors import MadslError
from madsl.outputs import write_text_atomic

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


def run_script(main: Callable[[], int]) -> NoReturn:
    """A script's entry point (benchmarks/) with the commands' exit codes: bad input printed
    located, exit 2, no traceback."""
    try:
        code = main()
    except MadslError as err:
        print_error(err)
        sys.exit(EXIT_BAD_INPUT)
    sys.exit(code)


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` (its folder made if missing) atomically: madsl.outputs.write_text_atomic."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)


def add_verbosity(parser, default: object) -> None:
    """-q/--quiet and -v/--verbose on `parser`, either one; `default` for the flag not given
    (argparse.SUPPRESS on a command: a global flag given before it must not be reset)."""
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument(
        "-q", "--quiet", action="store_true", default=default, help="print only errors and the verdict or result"
    )
    verbosity.add_argument(
        "-v", "--verbose", action="store_true", default=default, help="print more detail where the command has it"
    )


FORMAT_RENAMED = {"summary": "text"}  # old --format words -> today's: scripts that use them keep working


def format_word(word: str) -> str:
    """A --format word as argparse reads it (its `type`): an old name becomes today's, with a note."""
    if word in FORMAT_RENAMED:
        print(
            f"note: --format {word} is now --format {FORMAT_RENAMED[word]} (the old name still works)", file=sys.stderr
        )
        return FORMAT_RENAMED[word]
    return word


class WarningLines(logging.Handler):
    """The library's logged warnings as `warning: ...` lines on stderr: in the user's words, with
    no line of madsl's source (which `warnings.warn` would show)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        print(f"warning: {record.getMessage()}", file=sys.stderr)  # sys.stderr now: it may have been replaced


def show_warnings() -> None:
    """Print what the library logs on "madsl.*" (an unusable rate cache, ...), once per process."""
    logger = logging.getLogger("madsl")
    if not any(isinstance(handler, WarningLines) for handler in logger.handlers):
        logger.addHandler(WarningLines())

"""Located, human-readable errors.

Every problem with user input (a spec file, a topology string, a budget) becomes
a `MadslError` that knows where it happened (file, line, column, the source
line) and renders like a compiler diagnostic:

    error: unknown layer 'Hy'
      --> specs/x.mad:4:12
       |
     4 | topology: (Hy:A)x2
       |            ^^
       = expected: a layer symbol (A, H, Mb, ...)
       = hint: did you mean 'H'?

A spec with several independent problems raises one `MadslError` that carries them
all (`diagnostics`, in file order): checks that stay sound after an error keep going
(`Collector`), so one run of `madsl check` lists every error of a file.

The CLI prints `render()` and exits with status 2; no traceback reaches the user.

A message about a setting of the library (`madsl.evaluate(..., checkpoint_every=-1)`) names it
through `option("checkpoint_every")`: its Python name, or, while a command of the command line
runs (`speaking`), that command's word for it (`--checkpoint-every`), so that a notebook and a
terminal each see the names they typed.
"""

from __future__ import annotations

import difflib
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Iterable, Iterator, Mapping

_OPTION_NAMES: dict[str, str] = {}  # a setting's Python name -> the front end's word for it


def option(name: str) -> str:
    """How a message names the setting `name` to whoever gave it (see the module docstring)."""
    return _OPTION_NAMES.get(name, name)


@contextmanager
def speaking(names: Mapping[str, str]) -> Iterator[None]:
    """While the block runs, messages name settings by `names` (a front end's words)."""
    saved = dict(_OPTION_NAMES)
    _OPTION_NAMES.update(names)
    try:
        yield
    finally:
        _OPTION_NAMES.clear()
        _OPTION_NAMES.update(saved)


@dataclass(frozen=True)
class Location:
    file: str | None = None  # None for a topology given on the command line
    line: int | None = None  # 1-based
    column: int | None = None  # 1-based
    source_line: str | None = None
    length: int = 1  # how many characters the caret underlines
    topology_column: int | None = None  # for an error inside a topology string in a file: the column in the string


class MadslError(Exception):
    """An error in user input, with its location.

    One that gathers several (`MadslError.combine`) carries them in `diagnostics`, in file
    order; its own message, location, expected and hint are those of the first."""

    def __init__(
        self, message: str, location: Location | None = None, *, expected: str | None = None, hint: str | None = None
    ):
        super().__init__(message)
        self.message = message
        self.location = location or Location()
        self.expected = expected
        self.hint = hint
        self._diagnostics: tuple[MadslError, ...] = ()

    @property
    def diagnostics(self) -> list["MadslError"]:
        """Every error this one stands for, in file order (just itself, unless combined)."""
        return list(self._diagnostics) or [self]

    @classmethod
    def combine(cls, errors: Iterable["MadslError"], file: str | None = None) -> "MadslError":
        """One error standing for all of `errors`: in file order (errors in `file` first, then by
        file, line and column; unlocated ones keep their place at the end), duplicates dropped."""
        unique: dict[tuple, MadslError] = {}
        for err in errors:
            for one in err.diagnostics:
                loc = one.location
                unique.setdefault((one.message, loc.file, loc.line, loc.column), one)
        if not unique:
            raise ValueError("MadslError.combine needs at least one error")
        ordered = sorted(unique.values(), key=lambda e: _file_order(e.location, file))
        if len(ordered) == 1:
            return ordered[0]
        first = ordered[0]
        combined = cls(first.message, first.location, expected=first.expected, hint=first.hint)
        combined._diagnostics = tuple(ordered)
        return combined

    def relocated(self, location: Location) -> "MadslError":
        """This error at another location (the first, if it stands for several)."""
        return MadslError(self.message, location, expected=self.expected, hint=self.hint)

    def with_hint(self, hint: str | None) -> "MadslError":
        """This error with `hint` (the first, if it stands for several)."""
        return MadslError(self.message, self.location, expected=self.expected, hint=hint or self.hint)

    def render(self) -> str:
        """The compiler-style block(s): message, location, the source line with a caret, expected, hint."""
        if len(self._diagnostics) > 1:
            blocks = [err._render_one() for err in self._diagnostics]
            return "\n\n".join(blocks) + f"\n\n{len(blocks)} errors"
        return self._render_one()

    def one_line(self) -> str:
        """The message with what was expected and the hint, on one line (for `file:line:col: ...`)."""
        text = (
            self.message
            + (f" (expected: {self.expected})" if self.expected else "")
            + (f" (hint: {self.hint})" if self.hint else "")
        )
        return " ".join(text.split())

    def _render_one(self) -> str:
        loc = self.location
        lines = [f"error: {self.message}"]
        if loc.file is not None or loc.line is not None:
            where = loc.file or "<topology>"
            if loc.line is not None:
                where += f":{loc.line}"
                if loc.column is not None:
                    where += f":{loc.column}"
            if loc.topology_column is not None and loc.file is not None:
                where += f" (column {loc.topology_column} of the topology)"
            lines.append(f"  --> {where}")
        if loc.source_line is not None and loc.line is not None:
            number = str(loc.line)
            pad = " " * len(number)
            lines.append(f" {pad} |")
            source, column = _window(loc.source_line.rstrip(), loc.column)
            lines.append(f" {number} | {source}")
            if column is not None:
                lines.append(f" {pad} | {' ' * (column - 1)}{'^' * max(1, min(loc.length, SHOWN_WIDTH))}")
        if self.expected:
            lines.append(f"  = expected: {self.expected}")
        if self.hint:
            lines.append(f"  = hint: {self.hint}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """The first error as plain data (its `diagnostics` give the others)."""
        loc = self.location
        return {
            "error": self.message,
            "file": loc.file,
            "line": loc.line,
            "column": loc.column,
            "topology_column": loc.topology_column,
            "expected": self.expected,
            "hint": self.hint,
        }

    def __str__(self) -> str:
        return self.render()


def _file_order(loc: Location, file: str | None) -> tuple:
    if loc.line is None:
        return (1,)  # unlocated: after the located ones, in the order they were found
    return (0, loc.file != file, loc.file or "", loc.line, loc.column or 0)


class Collector:
    """Gathers independent errors, so that one run reports them all:

    errors = Collector(file)
    with errors.check():
        check_one_thing()      # a MadslError here is recorded, and the next check runs
    errors.raise_any()         # one MadslError carrying all of them, in file order
    """

    def __init__(self, file: str | None = None):
        self.file = file
        self.errors: list[MadslError] = []

    def add(self, err: MadslError) -> None:
        self.errors.append(err)

    @contextmanager
    def check(self) -> Iterator[None]:
        try:
            yield
        except MadslError as err:
            self.errors.append(err)

    def __bool__(self) -> bool:
        return bool(self.errors)

    def raise_any(self) -> None:
        if self.errors:
            raise MadslError.combine(self.errors, self.file)


SHOWN_WIDTH = 100  # a longer source line is shown as the part around the error


def _window(line: str, column: int | None) -> tuple[str, int | None]:
    """The part of a long source line around `column` (1-based), and the column inside it."""
    if len(line) <= SHOWN_WIDTH:
        return line, column
    start = max(0, min((column or 1) - 1 - SHOWN_WIDTH // 2, len(line) - SHOWN_WIDTH))
    shown = (
        ("..." if start else "")
        + line[start : start + SHOWN_WIDTH]
        + ("..." if start + SHOWN_WIDTH < len(line) else "")
    )
    return shown, None if column is None else column - start + (3 if start else 0)


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """'did you mean ...?' for the nearest candidate, if one is near enough."""
    candidates = list(candidates)
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.5)
    if not close:  # symbols are case-sensitive: 'h' should still suggest 'H'
        lower = {c.lower(): c for c in candidates}
        if word.lower() in lower:
            close = [lower[word.lower()]]
    return f"did you mean {close[0]!r}?" if close else None


def at(location: Location, **changes) -> Location:
    return replace(location, **changes)

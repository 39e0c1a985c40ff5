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

The CLI prints `render()` and exits with status 2; no traceback reaches the user.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from typing import Iterable


@dataclass(frozen=True)
class Location:
    file: str | None = None  # None for a topology given on the command line
    line: int | None = None  # 1-based
    column: int | None = None  # 1-based
    source_line: str | None = None
    length: int = 1  # how many characters the caret underlines
    topology_column: int | None = None  # for an error inside a topology string in a file: the column in the string


class MadslError(Exception):
    """An error in user input, with its location."""

    def __init__(self, message: str, location: Location | None = None, *,
                 expected: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.location = location or Location()
        self.expected = expected
        self.hint = hint

    def relocated(self, location: Location) -> "MadslError":
        err = MadslError(self.message, location, expected=self.expected, hint=self.hint)
        return err

    def with_hint(self, hint: str | None) -> "MadslError":
        return MadslError(self.message, self.location, expected=self.expected, hint=hint or self.hint)

    def render(self) -> str:
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
        loc = self.location
        return {"error": self.message, "file": loc.file, "line": loc.line, "column": loc.column,
                "topology_column": loc.topology_column,
                "expected": self.expected, "hint": self.hint}

    def __str__(self) -> str:
        return self.render()


SHOWN_WIDTH = 100  # a longer source line is shown as the part around the error


def _window(line: str, column: int | None) -> tuple[str, int | None]:
    """The part of a long source line around `column` (1-based), and the column inside it."""
    if len(line) <= SHOWN_WIDTH:
        return line, column
    start = max(0, min((column or 1) - 1 - SHOWN_WIDTH // 2, len(line) - SHOWN_WIDTH))
    shown = ("..." if start else "") + line[start:start + SHOWN_WIDTH] + \
        ("..." if start + SHOWN_WIDTH < len(line) else "")
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

"""The checks of a saved search state's values as data (madsl/search/state_check.py is the gate
that uses them): types and ranges, each failure a MadslError located at the state file and naming
the field as a JSON path.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from madsl.errors import Location, MadslError
from madsl.search.state import RESTART


def shown(value: Any) -> str:
    """A value as a message shows it: its repr, shortened."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def json_key(key: str) -> str:
    """A candidate's key in a JSON path, quoted (escaped: a key is data) and shortened."""
    return json.dumps(key if len(key) <= 70 else key[:67] + "...")


class StateValues:
    """Types and ranges of the values of the state file at `path`."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, problem: str, expected: str | None = None) -> MadslError:
        return MadslError(
            f"the search state is damaged: {where}: {problem}",
            Location(str(self.path)),
            expected=expected,
            hint=RESTART,
        )

    # --- types and ranges ------------------------------------------------------------------------

    def integer(self, value: Any, where: str, low: int, high: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            bound = f"from {low:,} to {high:,}" if high is not None else f"of at least {low:,}"
            raise self.fail(where, f"{shown(value)} is not an integer {bound}")
        return value

    def number(self, value: Any, where: str) -> None:
        """None, or a finite number."""
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
        ):
            raise self.fail(where, f"{shown(value)} is not a finite number or null")

    def mapping(self, value: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected an object, got {type(value).__name__}")
        missing = [k for k in required if k not in value]
        if missing:
            raise self.fail(where, f"lacks {', '.join(missing)}", expected=", ".join(required + optional))
        unknown = [k for k in value if k not in required and k not in optional]
        if unknown:
            raise self.fail(where, f"has an unknown field {shown(unknown[0])}", expected=", ".join(required + optional))
        return value

    def listing(self, value: Any, where: str, most: int) -> list:
        if not isinstance(value, list):
            raise self.fail(where, f"expected a list, got {type(value).__name__}")
        if len(value) > most:
            raise self.fail(where, f"holds {len(value):,} entries; this search makes at most {most:,}")
        return value

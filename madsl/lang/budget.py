"""Budgets: bounds on what a spec may cost, and the checks against them.

A budget value is exact (`4096`), with a tolerance (`4096 ± 0%`, `500k ± 10%`,
`1.2M +- 50k`), one-sided (`<= 5M`, `>= 1M`), or a mapping `{min: .., max: ..}`.
Quantities take the suffixes k (10^3), M (10^6), G or B (10^9) and T (10^12).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

# The totals a budget may bound (madsl.graph.Account.totals): `active_params` are the parameters one
# token's output reads, below `params` where routers pick experts (a "30B-A3B" model's 3B).
# `total_state` is fixed_state + kv_cache at the accounted length (the paper's total state).
QUANTITIES = ("params", "active_params", "fixed_state", "conv_state", "kv_cache", "total_state", "flops")
_SUFFIX = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12}
_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_QUANTITY = re.compile(rf"^\s*({_NUMBER})\s*([kKMGBT]?)\s*$")
_TOLERANCE = re.compile(rf"^\s*(.+?)\s*(?:±|\+-|\+/-)\s*({_NUMBER})\s*(%|[kKMGBT]?)\s*$")
_ONE_SIDED = re.compile(r"^\s*(<=|>=|<|>|=<|=>|≤|≥)\s*(.*)$")


class BudgetError(ValueError):
    """A budget value that cannot be read; the message says what was expected."""


def parse_quantity(value: Any) -> float:
    """A count (parameters, state, FLOPs): a finite number, at least 0."""
    if isinstance(value, bool):
        raise BudgetError(f"expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an integer beyond any float
            number = math.inf
        return _counted(number, value)
    if isinstance(value, str):
        match = _QUANTITY.match(value)
        if match:
            return _counted(float(match.group(1)) * _SUFFIX[match.group(2)], value)
    raise BudgetError(f"expected a number such as 4096, 500k or 1.2M, got {_shown(value)}")


def _counted(number: float, written: Any) -> float:
    if not math.isfinite(number):
        raise BudgetError(f"expected a finite number, got {_shown(written)}")
    if number < 0:
        raise BudgetError(f"a budget counts something and cannot be negative, got {_shown(written)}")
    return number


def parse_tolerance(text: str) -> float:
    """A relative tolerance written as 5% or 0.05: finite and at least 0."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise BudgetError(f"expected a tolerance such as 5% or 0.05, got {_shown(text)}") from None
    if not math.isfinite(value):
        raise BudgetError(f"expected a finite tolerance such as 5% or 0.05, got {_shown(text)}")
    if value < 0:
        raise BudgetError("a tolerance cannot be negative")
    return value


def _shown(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's 4,300-digit limit on printing
        return "an integer of more than 4,300 digits"
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text):,} characters)"


@dataclass(frozen=True)
class Bound:
    low: float  # inclusive; -inf when open
    high: float  # inclusive; +inf when open
    text: str  # as the user wrote it, for reports

    def contains(self, value: float) -> bool:
        # a hair of relative slack so that "± 0%" of a float-parsed quantity still matches
        eps = 1e-9 * max(1.0, abs(value))
        return self.low - eps <= value <= self.high + eps

    def describe(self) -> str:
        if self.low == self.high:
            return f"= {_fmt(self.low)}"
        if math.isinf(self.low):
            return f"<= {_fmt(self.high)}"
        if math.isinf(self.high):
            return f">= {_fmt(self.low)}"
        return f"in [{_fmt(self.low)}, {_fmt(self.high)}]"


def parse_bound(value: Any) -> Bound:
    """A budget as written in a spec; raises BudgetError for anything that is not a bound on a count."""
    text = value if isinstance(value, str) else _shown(value)
    if isinstance(value, dict):
        unknown = set(value) - {"min", "max"}
        if unknown or not value:
            raise BudgetError(f"a budget mapping takes 'min' and/or 'max', got {sorted(map(_shown, value))}")
        low = parse_quantity(value["min"]) if "min" in value else -math.inf
        high = parse_quantity(value["max"]) if "max" in value else math.inf
        if low > high:
            raise BudgetError(f"min {_fmt(low)} is larger than max {_fmt(high)}")
        return Bound(low, high, text)
    if isinstance(value, str):
        one_sided = _ONE_SIDED.match(value)
        if one_sided:
            op, rest = one_sided.groups()
            if op not in ("<=", ">="):  # budgets are inclusive: `< 4096` read as `<= 4096` would admit 4096
                inclusive = "<=" if "<" in op or op == "≤" else ">="
                raise BudgetError(f"a one-sided budget is written '{inclusive} X' (inclusive), got {_shown(value)}")
            if not rest.strip():
                raise BudgetError(
                    f"expected a number after '{op}', such as '{op} 4096' or '{op} 1.2M', got {_shown(value)}"
                )
            limit = parse_quantity(rest)
            return Bound(-math.inf, limit, text) if op.startswith("<") else Bound(limit, math.inf, text)
        tolerance = _TOLERANCE.match(value)
        if tolerance:
            center = parse_quantity(tolerance.group(1))
            unit = tolerance.group(3)
            if unit == "%":
                delta = center * parse_tolerance(tolerance.group(2) + "%")
            else:
                delta = parse_quantity(tolerance.group(2) + unit)
            return Bound(center - delta, center + delta, text)
        if "±" in value or "+-" in value:
            raise BudgetError(f"expected VALUE ± TOLERANCE such as '4096 ± 0%' or '500k ± 10%', got {_shown(value)}")
    center = parse_quantity(value)
    return Bound(center, center, text)


@dataclass(frozen=True)
class Violation:
    quantity: str
    actual: float
    bound: Bound

    def message(self) -> str:
        return (
            f"{self.quantity} = {_fmt(self.actual)} is outside its budget {self.bound.text!s} ({self.bound.describe()})"
        )


# A total bounded through its parts where it has no bound of its own: total_state = fixed_state + kv_cache.
SUMMED = {"total_state": ("fixed_state", "kv_cache")}


def upper_bound(budget: dict[str, Any], quantity: str) -> float:
    """The most `quantity` may be under a budget as written (inf where nothing bounds it): its own
    bound, else the sum of its parts' bounds (SUMMED) where every part is bounded."""
    if quantity in budget:
        return parse_bound(budget[quantity]).high
    parts = SUMMED.get(quantity, ())
    if parts and all(p in budget for p in parts):
        return sum(parse_bound(budget[p]).high for p in parts)
    return math.inf


def check(totals: dict[str, float], budget: dict[str, Bound]) -> list[Violation]:
    return [Violation(q, totals[q], b) for q, b in budget.items() if not b.contains(totals[q])]


def _fmt(x: float) -> str:
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.4g}"

"""Budgets that solve themselves: integer search over a spec's free hyperparameters.

`solve(spec, free, budget)` looks for values of the free parameters (`"H.filter_states"`:
a symbol's integer hyperparameter) that put the spec's totals inside its budget bounds.
Each candidate is the spec with new symbol parameters, validated and accounted exactly
as `madsl check` would (so divisibility rules such as "heads divide the width" simply
make a value invalid), never by an approximate formula.

The search assumes what holds for every MAD quantity: a total moves monotonically with
each hyperparameter. It doubles a parameter until the total passes the budget, bisects
to the crossing, then looks at the valid values around it. With several free parameters,
all but the last take the valid values near their current ones, and the last is searched
for each combination. The result holds the solutions inside the budget (best first:
closest to the budget's target), and otherwise the closest solution on either side.
Pure Python, no torch.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from .errors import MadslError
from .graph import account
from .lang.budget import Bound
from .lang.spec import Spec
from .primitives.base import WidthRelative

MAX_VALUE = 1 << 20  # no hyperparameter is searched past this
NEIGHBOURS = 8  # valid values kept on each side of a crossing
WINDOW = 256  # how far from the crossing those are looked for
GRID = 6  # values tried on each side of the current one, per leading free parameter


@dataclass(frozen=True)
class Solution:
    values: dict[str, int]  # "SYMBOL.param" -> value
    totals: dict[str, int]
    within: bool
    distance: float  # relative distance to the budget's target (0: on it)


@dataclass
class FitResult:
    free: list[str]
    budget: dict[str, Bound]
    solutions: list[Solution] = field(default_factory=list)  # inside the budget, best first
    below: Solution | None = None  # closest outside, under the target
    above: Solution | None = None  # closest outside, over the target
    evaluated: int = 0

    @property
    def best(self) -> Solution | None:
        return self.solutions[0] if self.solutions else None


def free_parameters(spec: Spec, free: list[str]) -> list[tuple[str, str]]:
    """(symbol, param) of each `SYMBOL.param`, checked by the spec (`Spec.free_parameter`)."""
    return [spec.free_parameter(item) for item in free]


def with_values(spec: Spec, values: dict[tuple[str, str], int]) -> Spec:
    """The spec with some symbol parameters set (not yet validated)."""
    symbols = dict(spec.symbols)
    for (symbol, param), value in values.items():
        definition = symbols[symbol]
        symbols[symbol] = dataclasses.replace(definition, params={**definition.params, param: value})
    return dataclasses.replace(spec, symbols=symbols)


def _target(bound: Bound) -> float:
    if math.isinf(bound.low):
        return bound.high
    if math.isinf(bound.high):
        return bound.low
    return (bound.low + bound.high) / 2


class _Search:
    def __init__(self, spec: Spec, free: list[tuple[str, str]], budget: dict[str, Bound], seq_len: int | None):
        self.spec, self.free, self.budget, self.seq_len = spec, free, budget, seq_len
        self.primary = next(iter(budget))  # the quantity the 1-D searches follow
        self.seen: dict[tuple[int, ...], dict[str, int] | None] = {}

    def totals(self, values: tuple[int, ...]) -> dict[str, int] | None:
        """The totals with these values, or None where they are not a valid spec."""
        if values not in self.seen:
            try:
                candidate = with_values(self.spec, dict(zip(self.free, values)))
                self.seen[values] = account(candidate, seq_len=self.seq_len).totals
            except MadslError:
                self.seen[values] = None
        return self.seen[values]

    def primary_at(self, prefix: tuple[int, ...], value: int) -> float | None:
        totals = self.totals(prefix + (value,))
        return None if totals is None else totals[self.primary]

    def nearest_valid(self, prefix: tuple[int, ...], value: int, step: int, limit: int = 64) -> int | None:
        for v in range(value, value + step * limit, step):
            if 1 <= v <= MAX_VALUE and self.primary_at(prefix, v) is not None:
                return v
        return None

    def line(self, prefix: tuple[int, ...], start: int) -> None:
        """Search the last free parameter, the others fixed at `prefix`."""
        target = _target(self.budget[self.primary])
        low = self.nearest_valid(prefix, 1, +1)
        if low is None:
            return
        f_low = self.primary_at(prefix, low)
        # the direction the total moves in: compare with a larger valid value
        high = self.nearest_valid(prefix, max(start, low + 1), +1)
        if high is None:
            return
        increasing = self.primary_at(prefix, high) >= f_low

        def below(v: int) -> bool:  # on the "too small" side of the target
            f = self.primary_at(prefix, v)
            return (f < target) if increasing else (f > target)

        # double until the crossing is passed (or the total stops moving: the parameter
        # does not change this quantity, or invalid values wall it off)
        while below(high) and high < MAX_VALUE:
            nxt = self.nearest_valid(prefix, min(2 * high, MAX_VALUE), +1)
            if nxt is None or nxt == high or self.primary_at(prefix, nxt) == self.primary_at(prefix, high):
                break
            low, high = high, nxt
        if not below(low):
            high = low
        # bisect to the first value not below the target
        while high - low > 1:
            middle = self.nearest_valid(prefix, (low + high) // 2, +1, limit=min(64, high - (low + high) // 2))
            if middle is None or middle >= high:
                break
            if below(middle):
                low = middle
            else:
                high = middle
        # the valid values around the crossing (looking at most WINDOW values each way)
        for step in (-1, +1):
            count, v = 0, high if step < 0 else high + 1
            while 1 <= v <= MAX_VALUE and count < NEIGHBOURS and abs(v - high) <= WINDOW:
                if self.primary_at(prefix, v) is not None:
                    count += 1
                v += step

    def run(self) -> None:
        current = [self._current(s, p) for s, p in self.free]
        leading = [self._grid(i, current) for i in range(len(self.free) - 1)]
        for prefix in itertools.product(*leading):
            self.line(tuple(prefix), max(1, current[-1]))

    def _current(self, symbol: str, param: str) -> int:
        value = self.spec.symbols[symbol].params.get(param)
        if isinstance(value, WidthRelative):  # a default stated relative to the width
            value = value.resolve(param, self.spec.dim)
        return value if isinstance(value, int) and not isinstance(value, bool) else 1

    def _grid(self, index: int, current: list[int]) -> list[int]:
        centre = current[index]
        values = {max(1, centre + d) for d in range(-GRID, GRID + 1)} | {max(1, centre * 2), max(1, centre // 2)}
        return sorted(values)


def _distance(totals: dict[str, int], budget: dict[str, Bound]) -> float:
    return sum(abs(totals[q] - _target(b)) / max(1.0, abs(_target(b))) for q, b in budget.items())


def solve(
    spec: Spec, free: list[str], budget: dict[str, Bound] | None = None, *, seq_len: int | None = None
) -> FitResult:
    """Values of the free parameters that meet `budget` (default: the spec's own)."""
    names = free_parameters(spec, free)  # a mistyped free parameter is the first thing to say
    budget = dict(budget if budget is not None else spec.budget)
    if not budget:
        raise MadslError(f"{spec.name}: nothing to fit to", hint="give the spec a budget: section, or use --match")
    search = _Search(spec, names, budget, seq_len or spec.budget_seq_len)
    search.run()
    result = FitResult(list(free), budget, evaluated=len(search.seen))
    primary = search.primary
    target = _target(budget[primary])
    for values, totals in search.seen.items():
        if totals is None:
            continue
        within = all(b.contains(totals[q]) for q, b in budget.items())
        solution = Solution(
            {f"{s}.{p}": v for (s, p), v in zip(names, values)}, totals, within, _distance(totals, budget)
        )
        if within:
            result.solutions.append(solution)
        elif totals[primary] < target:
            if result.below is None or solution.distance < result.below.distance:
                result.below = solution
        elif result.above is None or solution.distance < result.above.distance:
            result.above = solution
    # best first: on target, then with values close to the ones written
    result.solutions.sort(key=lambda s: (s.distance, sum(s.values.values())))
    return result


def fitted(spec: Spec, seq_len: int | None = None) -> tuple[Spec, Solution | None]:
    """The spec as `madsl compile` and `madsl eval` build it: where it asks for a fit
    (`budget.fit`) and its written values leave its budget, with the best solution's values
    (and that solution); else as written (and None). So what is compiled is what is trained."""
    from .lang.budget import check

    if not spec.fit:
        return spec, None
    seq_len = seq_len or spec.budget_seq_len
    if not check(account(spec, seq_len=seq_len).totals, spec.budget):
        return spec, None
    solution = solve(spec, spec.fit, seq_len=seq_len).best
    if solution is None:
        return spec, None
    return with_values(spec, {spec.free_parameter(k): v for k, v in solution.values.items()}), solution


def fit_note(solution: Solution, path: str | None) -> str:
    """What `fitted` did, for the user: the values used, and how to write them into the spec."""
    values = ", ".join(f"{k}={v}" for k, v in solution.values.items())
    return (
        f"budget.fit: using the solution {values} (write it into the spec with "
        f"`madsl fit {path or 'SPEC.mad'} -o FILE`)"
    )


def solved_data(spec: Spec, solution: Solution) -> dict[str, Any]:
    """The spec's data with the solution written under `layers:` and the `fit:` request removed."""
    data = dict(spec.data)
    layers = {k: dict(v) if isinstance(v, dict) else v for k, v in (data.get("layers") or {}).items()}
    for name, value in solution.values.items():
        symbol, _, param = name.partition(".")
        layers.setdefault(symbol, {})[param] = value
    data["layers"] = layers
    if isinstance(data.get("budget"), dict):
        data["budget"] = {k: v for k, v in data["budget"].items() if k != "fit"}
    data.pop("extends", None)
    return data

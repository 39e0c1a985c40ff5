"""Scaling-law fits of a compute sweep, as the MAD paper (Sec. 4, 5, App. C) and Chinchilla do them.

    ScalePoint       one trained model: architecture, IsoFLOP budget C, parameters N, tokens D,
                     final validation loss (nats/token), total state
    fit_isoflop(s)   approach 2: per (arch, budget) a parabola of the loss in log10 N; its minimum
                     is the compute-optimal size N*(C), D*(C) is read off the budget's own points
    fit_frontier(s)  N* ∝ C^a and D* ∝ C^b over the budgets, with bootstrap intervals of the
                     exponents and pointwise bands of the lines (Fig. 4.1)
    state_optima     the compute-optimal loss against the total state at N*(C) (Fig. 4.3, right)

Pure numpy. Every result is a frozen dataclass; madsl.scaling.parametric fits approach 3,
L(N, D) = E + A/N^α + B/D^β, madsl.scaling.correlation sets MAD scores against the
compute-optimal perplexities, madsl.scaling.figures draws them all. Bad input (too few
sizes, a curve without a minimum, mismatched architectures) is a MadslError, never a guess.
"""

from __future__ import annotations

import math
import numbers
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from madsl.errors import MadslError

MORE_SIZES = "add model sizes around the minimum, so the curve turns up on both sides"


def _real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class ScalePoint:
    """One trained model of a sweep. `budget` is its IsoFLOP group's nominal training FLOPs C (points
    group by its exact value); `params` N as the study counts them; `tokens` D; `loss` the final
    validation loss in nats/token; `state` the total state in elements (fixed state + KV cache at
    the training length), needed only for the state-optimal view."""

    arch: str
    budget: float
    params: float
    tokens: float
    loss: float
    state: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.arch, str) or not self.arch:
            raise MadslError(f"a scale point needs an architecture name, not {self.arch!r}")
        named = {"budget": self.budget, "params": self.params, "tokens": self.tokens, "loss": self.loss}
        for name, value in named.items():
            if not _real(value) or not math.isfinite(value) or value <= 0:
                raise MadslError(f"scale point of {self.arch}: {name} must be a positive number, not {value!r}")
        if self.state is not None and not (_real(self.state) and 0 <= self.state < math.inf):
            raise MadslError(f"scale point of {self.arch}: state must be a number >= 0, not {self.state!r}")


@dataclass(frozen=True)
class IsoFlopFit:
    """The parabola loss = a·x² + b·x + c (x = log10 N) through one IsoFLOP group, and its minimum."""

    arch: str
    budget: float
    coefficients: tuple[float, float, float]  # a, b, c
    optimal_params: float  # N*(C) = 10^(-b/2a)
    optimal_tokens: float  # D*(C): log D interpolated against log N among the group's points
    optimal_loss: float  # the parabola's minimum
    bracketed: bool  # N*(C) lies within the sizes measured (else it is an extrapolation)
    points: tuple[ScalePoint, ...]  # the group, by size

    def predict(self, params: float | np.ndarray) -> float | np.ndarray:
        """The parabola's loss at `params` parameters."""
        return np.polyval(self.coefficients, np.log10(params))


BAND_POINTS = 24  # budgets, log-spaced over a frontier's span, at which its band is given


@dataclass(frozen=True)
class PowerLaw:
    """y = coefficient · C^exponent, a least-squares line in log10-log10 space; `interval` is the
    bootstrap percentile interval of the exponent (NaN when every resample was skipped), `band`
    the pointwise percentile band of the line over the same resamples: rows (C, low y, high y) at
    BAND_POINTS budgets spanning the budgets fitted (empty when every resample was skipped)."""

    exponent: float
    coefficient: float
    interval: tuple[float, float]
    band: tuple[tuple[float, float, float], ...] = ()

    def __call__(self, budget: float | np.ndarray) -> float | np.ndarray:
        return self.coefficient * np.asarray(budget, dtype=float) ** self.exponent


@dataclass(frozen=True)
class Frontier:
    """One architecture's compute-optimal frontier: N*(C) ∝ C^a (`params`), D*(C) ∝ C^b (`tokens`)."""

    arch: str
    optima: tuple[IsoFlopFit, ...]  # one per budget, by budget
    params: PowerLaw
    tokens: PowerLaw
    level: float  # of the intervals, e.g. 0.95: the 2.5 and 97.5 percentiles
    resamples: int  # bootstrap resamples drawn
    skipped: int  # resamples left out: some budget's resampled points had no minimum or < 3 sizes

    @property
    def unbracketed(self) -> tuple[float, ...]:
        """The budgets whose optimum lies outside the sizes measured (extrapolated)."""
        return tuple(fit.budget for fit in self.optima if not fit.bracketed)


@dataclass(frozen=True)
class StateOptimum:
    """An architecture's compute-optimal point at one budget, with the total state of a model of that size."""

    arch: str
    budget: float
    params: float  # N*(C)
    loss: float  # the compute-optimal loss
    state: float  # total state (elements) at N*(C)
    bracketed: bool  # N*(C) lies within the sizes measured


# --- approach 2: IsoFLOP parabolas ---------------------------------------------------------


def _group(points: Iterable[ScalePoint]) -> dict[tuple[str, float], list[ScalePoint]]:
    groups: dict[tuple[str, float], list[ScalePoint]] = defaultdict(list)
    for point in points:
        groups[(point.arch, point.budget)].append(point)
    if not groups:
        raise MadslError("no scale points to fit")
    return {key: sorted(groups[key], key=lambda p: p.params) for key in sorted(groups)}


def parabolas(x: np.ndarray, y: np.ndarray, center: float) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares parabolas y = a·u² + b·u + c (u = x − center) through each row of x, y:
    the coefficients (rows × 3) and whether each row is fit (>= 3 distinct x). Normal equations
    in centred x, so that thousands of bootstrap rows solve at once."""
    u = x - center
    powers = np.stack([np.sum(u**k, axis=1) for k in range(5)], axis=1)
    gram = np.stack([powers[:, [4, 3, 2]], powers[:, [3, 2, 1]], powers[:, [2, 1, 0]]], axis=1)
    moments = np.stack([np.sum(y * u * u, axis=1), np.sum(y * u, axis=1), np.sum(y, axis=1)], axis=1)
    sizes = 1 + np.sum(np.diff(np.sort(x, axis=1), axis=1) > 0, axis=1)
    fit = sizes >= 3
    gram[~fit] = np.eye(3)  # a placeholder for rows that cannot be fit, so the batch still solves
    return np.linalg.solve(gram, moments[..., None])[..., 0], fit


def interpolate(x_new: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """y at x_new, piecewise linear through (x, y) (repeated x averaged), extended linearly beyond the ends."""
    xs, inverse = np.unique(x, return_inverse=True)
    ys = np.bincount(inverse, weights=y) / np.bincount(inverse)
    if len(xs) == 1:
        return np.full_like(np.asarray(x_new, float), ys[0])
    i = np.clip(np.searchsorted(xs, x_new) - 1, 0, len(xs) - 2)
    return ys[i] + (x_new - xs[i]) * (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])


def fit_isoflop(points: Sequence[ScalePoint]) -> IsoFlopFit:
    """Approach 2 for one IsoFLOP group (all points of one arch and budget): the parabola of the loss
    in log10 N and its minimum. Fewer than 3 sizes, or a curve that opens downwards, is a MadslError."""
    groups = _group(points)
    if len(groups) != 1:
        raise MadslError(
            f"fit_isoflop takes one IsoFLOP group; these points hold {len(groups)}",
            hint="fit_isoflops(points) fits every (arch, budget) group",
        )
    (arch, budget), group = next(iter(groups.items()))
    where = f"the IsoFLOP curve of {arch} at {budget:.3g} FLOPs"
    log_n = np.log10([p.params for p in group])
    loss = np.array([p.loss for p in group])
    sizes = len(np.unique(log_n))
    if sizes < 3:
        raise MadslError(
            f"{where} has {sizes} model size{'s' * (sizes != 1)}: a parabola needs at least 3", hint=MORE_SIZES
        )
    center = float(np.mean(log_n))
    coefficients, _ = parabolas(log_n[None], loss[None], center)
    a, b, c = coefficients[0]
    if a <= 0:
        raise MadslError(f"{where} has no minimum: the fitted parabola opens downwards (a = {a:.3g})", hint=MORE_SIZES)
    x_opt = center - b / (2 * a)
    log_d = np.log10([p.tokens for p in group])
    coefficients = (float(a), float(b - 2 * a * center), float(c - b * center + a * center**2))
    return IsoFlopFit(
        arch=arch,
        budget=budget,
        coefficients=coefficients,
        optimal_params=float(10**x_opt),
        optimal_tokens=float(10 ** interpolate(x_opt, log_n, log_d)),
        optimal_loss=float(c - b * b / (4 * a)),
        bracketed=bool(log_n[0] <= x_opt <= log_n[-1]),
        points=tuple(group),
    )


def fit_isoflops(points: Iterable[ScalePoint]) -> list[IsoFlopFit]:
    """fit_isoflop for every (arch, budget) group, by arch then budget."""
    return [fit_isoflop(group) for group in _group(points).values()]


# --- the frontier: N*(C), D*(C) power laws, bootstrapped ---------------------------------------


def log_lines(log_c: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares lines y = slope·log_c + intercept, one per row of y."""
    dc = log_c - log_c.mean()
    slope = (y - y.mean(axis=-1, keepdims=True)) @ dc / np.sum(dc * dc)
    return slope, y.mean(axis=-1) - slope * log_c.mean()


def _bootstrap_optima(
    fit: IsoFlopFit, rng: np.random.Generator, resamples: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """log10 N* and log10 D* of `resamples` resamples (with replacement) of the group's points, and
    which resamples have a minimum. D* is read off all the group's points: the N → D map is the
    sweep's design, not a noisy measurement."""
    log_n = np.log10([p.params for p in fit.points])
    log_d = np.log10([p.tokens for p in fit.points])
    loss = np.array([p.loss for p in fit.points])
    rows = rng.integers(0, len(loss), size=(resamples, len(loss)))
    center = float(np.mean(log_n))
    coefficients, ok = parabolas(log_n[rows], loss[rows], center)
    a, b = coefficients[:, 0], coefficients[:, 1]
    ok &= a > 0
    x_opt = center - b / (2 * np.where(ok, a, 1.0))
    return x_opt, interpolate(x_opt, log_n, log_d), ok


def percentile_interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    """The `level` percentile interval of `samples` (NaN where there are none)."""
    if not samples.size:
        return (math.nan, math.nan)
    tail = 50 * (1 - level)
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def _band(
    log_c: np.ndarray, slopes: np.ndarray, intercepts: np.ndarray, level: float
) -> tuple[tuple[float, float, float], ...]:
    """The pointwise `level` percentile band of the resampled lines over the budgets' span."""
    if not slopes.size:
        return ()
    grid = np.linspace(log_c.min(), log_c.max(), BAND_POINTS)
    tail = 50 * (1 - level)
    low, high = np.percentile(intercepts[:, None] + slopes[:, None] * grid, [tail, 100 - tail], axis=0)
    return tuple((float(10**c), float(10**lo), float(10**hi)) for c, lo, hi in zip(grid, low, high))


def check_bootstrap(resamples: int, level: float) -> None:
    """A bootstrap's settings: at least one resample, a level strictly between 0 and 1."""
    if resamples < 1 or not 0 < level < 1:
        raise MadslError(f"bootstrap needs resamples >= 1 and 0 < level < 1, not {resamples} and {level}")


def fit_frontier(
    points: Iterable[ScalePoint], *, resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> Frontier:
    """N*(C) ∝ C^a and D*(C) ∝ C^b for one architecture, least squares in log-log over its budgets'
    optima, with `level` percentile intervals from `resamples` seeded bootstrap resamples (each
    budget's points resampled with replacement, every parabola refit)."""
    optima = fit_isoflops(points)
    archs = sorted({fit.arch for fit in optima})
    if len(archs) != 1:
        raise MadslError(
            f"fit_frontier takes one architecture; these points hold {len(archs)}: {', '.join(archs)}",
            hint="fit_frontiers(points) fits each architecture's frontier",
        )
    if len(optima) < 2:
        raise MadslError(
            f"the frontier of {archs[0]} needs at least 2 IsoFLOP budgets, it has {len(optima)}",
            hint="train the architecture at more compute budgets",
        )
    check_bootstrap(resamples, level)
    log_c = np.log10([fit.budget for fit in optima])
    rng = np.random.default_rng(seed)
    drawn = [_bootstrap_optima(fit, rng, resamples) for fit in optima]
    ok = np.all([d[2] for d in drawn], axis=0)
    laws = []
    for column, values in ((0, [f.optimal_params for f in optima]), (1, [f.optimal_tokens for f in optima])):
        slope, intercept = log_lines(log_c, np.log10(values))
        samples, intercepts = log_lines(log_c, np.stack([d[column] for d in drawn], axis=1)[ok])
        laws.append(
            PowerLaw(
                exponent=float(slope),
                coefficient=float(10**intercept),
                interval=percentile_interval(samples, level),
                band=_band(log_c, samples, intercepts, level),
            )
        )
    return Frontier(
        arch=archs[0],
        optima=tuple(optima),
        params=laws[0],
        tokens=laws[1],
        level=level,
        resamples=resamples,
        skipped=int(resamples - ok.sum()),
    )


def fit_frontiers(
    points: Iterable[ScalePoint], *, resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> dict[str, Frontier]:
    """fit_frontier for each architecture, by name (each with the same seed)."""
    by_arch: dict[str, list[ScalePoint]] = defaultdict(list)
    for point in points:
        by_arch[point.arch].append(point)
    if not by_arch:
        raise MadslError("no scale points to fit")
    return {arch: fit_frontier(by_arch[arch], resamples=resamples, seed=seed, level=level) for arch in sorted(by_arch)}


# --- the state-optimal view (Fig. 4.3, right) ----------------------------------------------------


def state_optima(points: Iterable[ScalePoint], *, method: str = "interpolate") -> list[StateOptimum]:
    """Per arch and budget, the compute-optimal loss and the total state of a model of size N*(C).
    The state is read off all the architecture's points (it depends on the model, not the budget):
    `interpolate` log state over log N (linear beyond the ends), or `nearest`, the state of the
    measured size nearest N*(C) in log N (what the paper's App. C does)."""
    if method not in ("interpolate", "nearest"):
        raise MadslError(f"unknown state method {method!r}", expected="interpolate, nearest")
    points = list(points)
    by_arch: dict[str, list[ScalePoint]] = defaultdict(list)
    for point in points:
        by_arch[point.arch].append(point)
    for arch, group in by_arch.items():
        missing = sum(p.state is None or p.state <= 0 for p in group)
        if missing:
            raise MadslError(
                f"{missing} of the {len(group)} points of {arch} have no state (None or 0): "
                "the state-optimal view takes its logarithm",
                hint="give every ScalePoint its total state (fixed state + KV cache)",
            )
    optima = []
    for fit in fit_isoflops(points):
        log_n = np.log10([p.params for p in by_arch[fit.arch]])
        log_state = np.log10([p.state for p in by_arch[fit.arch]])
        x_opt = math.log10(fit.optimal_params)
        if method == "nearest":
            state = 10 ** log_state[int(np.argmin(np.abs(log_n - x_opt)))]
        else:
            state = 10 ** interpolate(x_opt, log_n, log_state)
        optima.append(
            StateOptimum(
                arch=fit.arch,
                budget=fit.budget,
                params=fit.optimal_params,
                loss=fit.optimal_loss,
                state=float(state),
                bracketed=fit.bracketed,
            )
        )
    return optima

"""Chinchilla's approach 3: the parametric law L(N, D) = E + A/N^α + B/D^β of one architecture,
fitted as Hoffmann et al. (2022) fit it and Besiroglu et al. (2024) replicated it.

    fit_parametric      minimise the summed Huber loss (δ = 1e-3) of log L − logsumexp(a − α log N,
                        b − β log D, e), A = e^a, B = e^b, E = e^e, with scipy's L-BFGS-B from a
                        grid of starting points, keeping the best
    parametric_starts   the starting grid: the replication's 5,400 points, or a 72-point subgrid
    constants_at_bounds which fitted constants sit at the bound of the law's domain (E, A, B, α,
                        β >= 0), where the data do not determine them

Its ParametricFit gives E, A, B, α, β and the allocation exponents they imply, a = β/(α+β) in
N* ∝ C^a and b = α/(α+β) in D* ∝ C^b, with percentile intervals from a seeded bootstrap over the
points where asked (`resamples`) and a warning for each constant at its bound. numpy, and scipy
when a fit runs.
"""

from __future__ import annotations

import ctypes
import math
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from madsl.errors import MadslError
from madsl.scaling.fits import ScalePoint

HUBER_DELTA = 1e-3  # Hoffmann et al.'s δ on log-loss residuals
GRID_ALPHA_BETA = (0.0, 0.5, 1.0, 1.5, 2.0)
GRID_E = (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5)
GRID_A_B = (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)
# The summed Huber loss is ~1e-4, and L-BFGS-B's ftol test is relative to max(|f|, 1): with scipy's
# defaults a run stops early, and on synthetic Chinchilla data only ~2 % of the starts reached the
# best fit; with these about half do.
TOLERANCES = {"ftol": 1e-15, "gtol": 1e-12, "maxiter": 2000}
CONSTANTS = ("E", "A", "B", "alpha", "beta")


@dataclass(frozen=True)
class ParametricFit:
    """L(N, D) = E + A/N^alpha + B/D^beta, fitted by Huber loss on log-loss residuals."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    objective: float  # the summed Huber loss at the fit
    points: int
    starts: int  # L-BFGS-B runs, one per starting point of the grid
    # percentile intervals of E, A, B, alpha, beta and of the exponents a and b ("a", "b") over
    # bootstrap resamples of the points; empty where no bootstrap ran (resamples 0)
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    level: float = 0.95
    resamples: int = 0  # bootstrap resamples drawn
    skipped: int = 0  # resamples whose refit failed (an objective that is not finite)
    at_bound: tuple[str, ...] = ()  # a warning for each constant at its bound (constants_at_bounds)

    @property
    def params_exponent(self) -> float:
        """a in N*(C) ∝ C^a: beta / (alpha + beta)."""
        return self.beta / (self.alpha + self.beta)

    @property
    def tokens_exponent(self) -> float:
        """b in D*(C) ∝ C^b: alpha / (alpha + beta)."""
        return self.alpha / (self.alpha + self.beta)

    def predict(self, params: float | np.ndarray, tokens: float | np.ndarray) -> float | np.ndarray:
        return (
            self.E + self.A / np.asarray(params, float) ** self.alpha + self.B / np.asarray(tokens, float) ** self.beta
        )


def _huber_objective(
    theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_loss: np.ndarray, delta: float
) -> tuple[float, np.ndarray]:
    """The summed Huber loss of log L − logsumexp(a − α log N, b − β log D, e), and its gradient
    in theta = (a, b, e, α, β)."""
    a, b, e, alpha, beta = theta
    terms = np.stack([a - alpha * log_n, b - beta * log_d, np.full_like(log_n, e)])
    top = terms.max(axis=0)
    weights = np.exp(terms - top)
    total = weights.sum(axis=0)
    weights /= total  # d(predicted log L)/d(term): the softmax of the terms
    residual = log_loss - (top + np.log(total))
    small = np.abs(residual) <= delta
    value = np.sum(np.where(small, 0.5 * residual**2, delta * (np.abs(residual) - 0.5 * delta)))
    slope = np.where(small, residual, delta * np.sign(residual))  # d huber / d residual
    gradient = np.array(
        [
            -slope @ weights[0],
            -slope @ weights[1],
            -slope @ weights[2],
            (slope * weights[0]) @ log_n,
            (slope * weights[1]) @ log_d,
        ]
    )
    return float(value), gradient


def _scipy_openblas() -> ctypes.CDLL | None:
    """scipy's bundled OpenBLAS (as its wheels ship it), or None where scipy uses another BLAS."""
    import scipy

    root = Path(scipy.__file__).parent
    for folder in (root.parent / "scipy.libs", root / ".dylibs"):
        for library in sorted(folder.glob("libscipy_openblas*")):
            try:
                found = ctypes.CDLL(str(library))  # the copy scipy loaded: the same path
            except OSError:
                continue
            if hasattr(found, "scipy_openblas_get_num_threads") and hasattr(found, "scipy_openblas_set_num_threads"):
                return found
    return None


@contextmanager
def _blas_on_one_thread() -> Iterator[None]:
    """scipy's OpenBLAS on one thread while the fit runs, as it was after. L-BFGS-B makes a few
    BLAS calls on 5-vectors a step, and waking the BLAS threads for each made a fit 10x slower on a
    busy 2-core machine (10 s instead of 1 s). Without scipy's own OpenBLAS, nothing changes."""
    library = _scipy_openblas()
    if library is None:
        yield
        return
    before = library.scipy_openblas_get_num_threads()
    library.scipy_openblas_set_num_threads(1)
    try:
        yield
    finally:
        library.scipy_openblas_set_num_threads(before)


def parametric_starts(full: bool = False) -> np.ndarray:
    """Starting points (a, b, e, α, β) of the parametric fit. `full`: the grid of Besiroglu et al.'s
    replication, α, β in 0..2 by 0.5, e in −1..1.5 by 0.5, a, b in 0..25 by 5 (5,400 starts, a
    minute or more). Default: its subgrid a, b in {0, 10, 20}, e in {−1, 0.5}, α, β in {0.5, 1.5}
    (72 starts, about a second). With TOLERANCES about half of the starts reach the best fit: on
    synthetic Chinchilla data the subgrid's best matched those of 108- and 243-start grids."""
    if full:
        axes = (GRID_A_B, GRID_A_B, GRID_E, GRID_ALPHA_BETA, GRID_ALPHA_BETA)
    else:
        axes = ((0.0, 10.0, 20.0), (0.0, 10.0, 20.0), (-1.0, 0.5), (0.5, 1.5), (0.5, 1.5))
    mesh = np.meshgrid(*axes, indexing="ij")
    return np.stack([m.ravel() for m in mesh], axis=1)


def _best_of(data: tuple, starts: Iterable[np.ndarray]) -> object | None:
    """L-BFGS-B from each start; the result with the lowest finite objective, or None."""
    from scipy.optimize import minimize

    best = None
    for start in starts:
        result = minimize(_huber_objective, start, args=data, jac=True, method="L-BFGS-B", options=TOLERANCES)
        if np.isfinite(result.fun) and (best is None or result.fun < best.fun):
            best = result
    return best


def _constants(theta: np.ndarray) -> np.ndarray:
    """(E, A, B, alpha, beta, a, b) of rows of theta = (log A, log B, log E, alpha, beta)."""
    a, b, e, alpha, beta = np.moveaxis(np.asarray(theta, dtype=float), -1, 0)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return np.stack(
            [np.exp(e), np.exp(a), np.exp(b), alpha, beta, beta / (alpha + beta), alpha / (alpha + beta)], -1
        )


def _bootstrap(
    data: tuple, theta: np.ndarray, resamples: int, seed: int, level: float
) -> tuple[dict[str, tuple[float, float]], int]:
    """Percentile intervals of the constants over `resamples` seeded resamples (with replacement)
    of the points, and how many refits failed. Each refit starts from the fit to all the points
    (one L-BFGS-B run, about 5 ms, where the starting grid takes about a second): a resample's
    optimum lies near it, and the grid's other basins are the same for every resample."""
    log_n, log_d, log_loss, delta = data
    rows = np.random.default_rng(seed).integers(0, len(log_n), size=(resamples, len(log_n)))
    fitted = []
    with _blas_on_one_thread():
        for row in rows:
            best = _best_of((log_n[row], log_d[row], log_loss[row], delta), [theta])
            if best is not None:
                fitted.append(best.x)
    if not fitted:
        return {name: (math.nan, math.nan) for name in CONSTANTS + ("a", "b")}, resamples
    samples = _constants(np.array(fitted))
    tail = 50 * (1 - level)
    low, high = np.nanpercentile(samples, [tail, 100 - tail], axis=0)
    intervals = {name: (float(lo), float(hi)) for name, lo, hi in zip(CONSTANTS + ("a", "b"), low, high)}
    return intervals, resamples - len(fitted)


def constants_at_bounds(
    fit: ParametricFit, points: Iterable[ScalePoint], *, delta: float = HUBER_DELTA
) -> tuple[str, ...]:
    """A warning for each constant of `fit` at the bound of the law's domain (E, A, B, α, β >= 0),
    where the points do not determine it: E, or a term A/N^α or B/D^β, below `delta` (the Huber
    loss's δ: the scale of log-loss residual the fit resolves) of every loss; or an exponent whose
    power changes by less than `delta` across the sizes (tokens) measured, so that its term cannot
    be told from E."""
    points = list(points)
    loss = np.array([p.loss for p in points])
    found = []
    if fit.E < delta * loss.min():
        found.append(
            f"E = {fit.E:.3g} sits at its bound 0 (under {delta:g} of every loss): the points do not "
            "determine the irreducible loss"
        )
    for constant, exponent, symbol, axis, what in (
        ("A", "α", "N", np.array([p.params for p in points]), "sizes"),
        ("B", "β", "D", np.array([p.tokens for p in points]), "token counts"),
    ):
        scale, power = (fit.A, fit.alpha) if constant == "A" else (fit.B, fit.beta)
        with np.errstate(over="ignore"):
            share = np.max(scale * axis ** (-power) / loss)
        if share < delta:
            found.append(
                f"{constant} = {scale:.3g} sits at its bound 0 ({constant}/{symbol}^{exponent} under {delta:g} of "
                f"every loss): the points show no dependence on {symbol}"
            )
        if -math.expm1(-power * math.log(axis.max() / axis.min())) < delta:
            found.append(
                f"{exponent} = {power:.3g} sits at {'or below ' if power < 0 else ''}its bound 0 ({symbol}^-{exponent} "
                f"changes by under {delta:g} across the {what} measured): {constant}/{symbol}^{exponent} cannot be "
                "told from E"
            )
    return tuple(found)


def fit_parametric(
    points: Iterable[ScalePoint],
    *,
    starts: np.ndarray | None = None,
    delta: float = HUBER_DELTA,
    resamples: int = 0,
    seed: int = 0,
    level: float = 0.95,
) -> ParametricFit:
    """Approach 3 for one architecture: L(N, D) = E + A/N^α + B/D^β as Hoffmann et al. fit it,
    minimising the summed Huber loss (`delta`) of log L − logsumexp(a − α log N, b − β log D, e)
    (A = e^a, B = e^b, E = e^e) with L-BFGS-B from every row (a, b, e, α, β) of `starts`
    (default: parametric_starts()), keeping the best. With `resamples` > 0, `level` percentile
    intervals of the constants from that many seeded bootstrap resamples of the points (about
    5 ms each). Constants at their bound are named in `at_bound` (constants_at_bounds)."""
    points = list(points)
    archs = sorted({p.arch for p in points})
    if len(archs) > 1:
        raise MadslError(f"fit_parametric takes one architecture; these points hold {len(archs)}: {', '.join(archs)}")
    if not delta > 0:
        raise MadslError(f"the Huber loss needs delta > 0, not {delta!r}")
    if len(points) < 5:
        raise MadslError(f"the parametric law has 5 free parameters: it needs at least 5 points, got {len(points)}")
    if resamples < 0 or not 0 < level < 1:
        raise MadslError(f"bootstrap needs resamples >= 0 and 0 < level < 1, not {resamples} and {level}")
    starts = parametric_starts() if starts is None else np.atleast_2d(np.asarray(starts, dtype=float))
    if starts.shape[1:] != (5,) or len(starts) == 0:
        raise MadslError(f"starting points must be rows of (a, b, e, alpha, beta), not shape {starts.shape}")
    data = (
        np.log([p.params for p in points]),
        np.log([p.tokens for p in points]),
        np.log([p.loss for p in points]),
        delta,
    )
    with _blas_on_one_thread():
        best = _best_of(data, starts)
    if best is None:
        raise MadslError("the parametric fit failed from every starting point (the objective is not finite)")
    a, b, e, alpha, beta = (float(v) for v in best.x)
    intervals, skipped = _bootstrap(data, best.x, resamples, seed, level) if resamples else ({}, 0)
    fit = ParametricFit(
        E=math.exp(e),
        A=math.exp(a),
        B=math.exp(b),
        alpha=alpha,
        beta=beta,
        objective=float(best.fun),
        points=len(points),
        starts=len(starts),
        intervals=intervals,
        level=level,
        resamples=resamples,
        skipped=skipped,
    )
    return replace(fit, at_bound=constants_at_bounds(fit, points, delta=delta))

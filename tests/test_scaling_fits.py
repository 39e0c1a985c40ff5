"""The scaling-law fits recover a known law: IsoFLOP sweeps drawn from Hoffmann et al.'s published
fit (E 1.69, A 406.4, B 410.7, alpha 0.34, beta 0.28) with 0.5 % noise on the loss give back its
allocation exponents (approach 2) and its parameters (approach 3); bad sweeps are errors that say
what to add; the correlation and the figures work on the results. Deterministic (seeded)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from madsl.errors import MadslError
from madsl.scaling import figures
from madsl.scaling.correlation import compute_optimal_perplexities, correlate_mad
from madsl.scaling.fits import ScalePoint, fit_frontier, fit_frontiers, fit_isoflop, fit_isoflops, state_optima
from madsl.scaling.parametric import fit_parametric, parametric_starts
from madsl.scaling.study import group_lrs, group_seeds

E, A, B, ALPHA, BETA = 1.69, 406.4, 410.7, 0.34, 0.28  # Hoffmann et al. 2022, approach 3
PARAMS_EXPONENT = BETA / (ALPHA + BETA)  # 0.4516: N* ∝ C^a
TOKENS_EXPONENT = ALPHA / (ALPHA + BETA)  # 0.5484: D* ∝ C^b
BUDGETS = (1e18, 1e19, 1e20, 1e21)

# Tolerances, from 12 noise seeds of this sweep (the spread seen, then some margin): approach 2's
# exponents fell within 0.011 of the law's, approach 3's E within 0.055, alpha and beta within
# 0.015, A and B within 22 % and 31 % (A and B move with the exponents: e^(20 * 0.01) = 1.22).
EXPONENT_TOL = 0.02
E_TOL, ALPHA_BETA_TOL, AB_REL_TOL = 0.08, 0.03, 0.4


def chinchilla_loss(params: float, tokens: float) -> float:
    return E + A / params**ALPHA + B / tokens**BETA


def sweep(noise: float = 0.005, seed: int = 0, arch: str = "chinchilla", budgets=BUDGETS) -> list[ScalePoint]:
    """7 sizes per budget over ±1 decade around sqrt(C/120) (20 tokens a parameter, not the law's
    own optimum, as a study would guess it), D = C/(6N), the loss times (1 + noise · N(0, 1));
    the total state grows as 1000 · sqrt(N)."""
    rng = np.random.default_rng(seed)
    points = []
    for budget in budgets:
        for params in math.sqrt(budget / 120) * np.logspace(-1, 1, 7):
            tokens = budget / (6 * params)
            loss = chinchilla_loss(params, tokens) * (1 + noise * rng.standard_normal())
            points.append(
                ScalePoint(arch, budget, float(params), float(tokens), float(loss), state=1000 * math.sqrt(params))
            )
    return points


@pytest.fixture(scope="module")
def frontier():
    return fit_frontier(sweep(), resamples=1000, seed=0)


def test_approach_2_recovers_the_allocation_exponents(frontier):
    assert frontier.params.exponent == pytest.approx(PARAMS_EXPONENT, abs=EXPONENT_TOL)
    assert frontier.tokens.exponent == pytest.approx(TOKENS_EXPONENT, abs=EXPONENT_TOL)
    # D = C / 6N on every point, so D* ∝ C / N*: the exponents add up to one
    assert frontier.params.exponent + frontier.tokens.exponent == pytest.approx(1, abs=1e-9)
    assert [fit.budget for fit in frontier.optima] == list(BUDGETS) and frontier.unbracketed == ()
    true_optimum = (ALPHA * A / (BETA * B)) ** (1 / (ALPHA + BETA)) * (1e20 / 6) ** PARAMS_EXPONENT
    assert frontier.params(1e20) == pytest.approx(true_optimum, rel=0.15)


def test_bootstrap_intervals_contain_the_estimates_and_are_seeded(frontier):
    for law in (frontier.params, frontier.tokens):
        low, high = law.interval
        assert low < law.exponent < high and high - low < 0.2
    assert frontier.resamples == 1000 and 0 <= frontier.skipped < 100
    again = fit_frontier(sweep(), resamples=1000, seed=0)
    assert again.params.interval == frontier.params.interval and again.skipped == frontier.skipped
    assert fit_frontier(sweep(), resamples=1000, seed=1).params.interval != frontier.params.interval


def test_approach_3_recovers_the_published_fit():
    fit = fit_parametric(sweep())
    assert fit.E == pytest.approx(E, abs=E_TOL)
    assert fit.alpha == pytest.approx(ALPHA, abs=ALPHA_BETA_TOL)
    assert fit.beta == pytest.approx(BETA, abs=ALPHA_BETA_TOL)
    assert fit.A == pytest.approx(A, rel=AB_REL_TOL) and fit.B == pytest.approx(B, rel=AB_REL_TOL)
    assert fit.params_exponent == pytest.approx(PARAMS_EXPONENT, abs=EXPONENT_TOL)
    assert fit.params_exponent + fit.tokens_exponent == pytest.approx(1)
    assert fit.points == 28 and fit.starts == 72
    assert fit.at_bound == () and fit.intervals == {} and fit.resamples == 0  # no bootstrap unless asked


def test_approach_3_converges_on_noise_free_data_from_a_few_starts():
    # no noise: the law itself is the minimum (zero loss). Runs that stop early (scipy's default
    # tolerances) need many starts to find it; converged runs find it from a few
    fit = fit_parametric(sweep(noise=0.0), starts=parametric_starts()[::8])
    assert fit.starts == 9
    assert (fit.E, fit.alpha, fit.beta) == pytest.approx((E, ALPHA, BETA), abs=1e-6)
    assert (fit.A, fit.B) == pytest.approx((A, B), rel=1e-5)
    assert fit.predict(1e9, 2e10) == pytest.approx(chinchilla_loss(1e9, 2e10), rel=1e-9)


def test_the_isoflop_optimum_is_the_parabolas_minimum():
    budget = 6e18
    points = [
        ScalePoint("p", budget, 10**x, budget / (6 * 10**x), 2 * (x - 8.3) ** 2 + 3) for x in (7.5, 8.0, 8.5, 9.0, 9.5)
    ]
    fit = fit_isoflop(points)
    assert fit.optimal_params == pytest.approx(10**8.3) and fit.optimal_loss == pytest.approx(3)
    assert fit.optimal_tokens == pytest.approx(budget / (6 * 10**8.3))
    assert fit.coefficients == pytest.approx((2, -33.2, 2 * 8.3**2 + 3)) and fit.bracketed
    assert fit.predict(10**9.0) == pytest.approx(2 * 0.7**2 + 3)


def test_too_few_sizes_is_an_error_naming_the_curve():
    points = [ScalePoint("hyena", 1e19, n, 1e19 / (6 * n), 3.0) for n in (1e8, 1e8, 3e8)]
    with pytest.raises(MadslError, match=r"hyena at 1e\+19 FLOPs has 2 model sizes") as err:
        fit_isoflops(points)
    assert "sizes around the minimum" in err.value.hint


def test_a_curve_without_a_minimum_is_an_error_and_one_beyond_the_sizes_is_unbracketed():
    concave = [ScalePoint("mamba", 1e19, 10**x, 1e19 / (6 * 10**x), 3 - (x - 8) ** 2) for x in (7, 8, 9)]
    with pytest.raises(MadslError, match="mamba at 1e\\+19 FLOPs has no minimum"):
        fit_isoflop(concave)
    falling = [ScalePoint("mamba", 1e19, 10**x, 1e19 / (6 * 10**x), (x - 10) ** 2 + 2) for x in (7, 8, 9)]
    fit = fit_isoflop(falling)
    assert not fit.bracketed and fit.optimal_params == pytest.approx(1e10)
    assert fit.optimal_tokens == pytest.approx(1e19 / 6e10)  # extrapolated along the IsoFLOP line


def test_the_frontier_needs_two_budgets_of_one_architecture():
    with pytest.raises(MadslError, match="at least 2 IsoFLOP budgets, it has 1"):
        fit_frontier(sweep(budgets=(1e19,)))
    with pytest.raises(MadslError, match="one architecture"):
        fit_frontier(sweep(arch="a") + sweep(arch="b"))
    both = fit_frontiers(sweep(arch="a") + sweep(arch="b", seed=1), resamples=50)
    assert list(both) == ["a", "b"] and both["a"].params.exponent != both["b"].params.exponent


def test_scale_points_reject_impossible_values():
    with pytest.raises(MadslError, match="params must be a positive number"):
        ScalePoint("a", 1e19, -5.0, 1e9, 3.0)
    with pytest.raises(MadslError, match="loss must be a positive number"):
        ScalePoint("a", 1e19, 1e8, 1e9, math.nan)


def test_state_optima_read_the_state_at_the_optimal_size():
    points = sweep()
    interpolated = state_optima(points)
    fits = fit_isoflops(points)
    assert [(o.budget, o.params, o.loss) for o in interpolated] == [
        (f.budget, f.optimal_params, f.optimal_loss) for f in fits
    ]
    for optimum in interpolated:  # state ∝ sqrt(N) is a line in log-log: interpolation is exact
        assert optimum.state == pytest.approx(1000 * math.sqrt(optimum.params), rel=1e-9)
    sizes = np.array(sorted({p.params for p in points}))
    for optimum in state_optima(points, method="nearest"):
        nearest = sizes[np.argmin(abs(np.log(sizes / optimum.params)))]
        assert optimum.state == pytest.approx(1000 * math.sqrt(nearest))
    with pytest.raises(MadslError, match="have no state"):
        state_optima([ScalePoint(p.arch, p.budget, p.params, p.tokens, p.loss) for p in points])


def test_perfectly_monotone_data_has_rank_correlation_one():
    scores = {"a": 0.2, "b": 0.4, "c": 0.5, "d": 0.9}
    rising = {"a": 3.0, "b": 3.1, "c": 5.0, "d": 40.0}
    result = correlate_mad(scores, rising, resamples=500)
    assert result.spearman == pytest.approx(1) and result.kendall == pytest.approx(1)
    assert result.pearson < 0.99 and result.archs == ("a", "b", "c", "d")
    # the test is one-sided towards a negative correlation: a perfect positive one is no evidence
    assert result.tests["spearman"].p_value == 1.0
    # four architectures: no bootstrap interval (it would span about [-1, 1]), and the reason why
    assert math.isnan(result.spearman_interval[0]) and result.interval_method == "none"
    assert "not computed with 4 architectures" in result.interval_note and result.resamples == 0
    falling = {arch: 1 / value for arch, value in rising.items()}
    inverse = correlate_mad(scores, falling, resamples=500)
    assert inverse.spearman == pytest.approx(-1) and inverse.tests["spearman"].p_value == 1 / 24


def test_correlation_intervals_contain_the_estimates_and_bad_input_is_an_error():
    rng = np.random.default_rng(3)
    archs = [f"arch{i}" for i in range(8)]
    scores = {a: float(s) for a, s in zip(archs, rng.uniform(0.3, 0.9, 8))}
    perplexities = {a: 20 - 10 * scores[a] + float(rng.normal(0, 1)) for a in archs}
    result = correlate_mad(scores, perplexities, budget=2e19, resamples=1000, seed=0)
    assert result.pearson < -0.5 and result.spearman < -0.5
    for value, (low, high) in ((result.pearson, result.pearson_interval), (result.spearman, result.spearman_interval)):
        assert low <= value <= high
    assert correlate_mad(scores, perplexities, budget=2e19, resamples=1000, seed=0) == result
    with pytest.raises(MadslError, match="at least 3"):
        correlate_mad({"a": 1, "b": 2}, {"a": 1, "b": 3})
    with pytest.raises(MadslError, match="different architectures: c"):
        correlate_mad({"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 3})


def test_compute_optimal_perplexities_are_the_optimal_losses_exponentiated():
    fits = fit_isoflops(sweep(arch="x") + sweep(arch="y", seed=1))
    perplexities = compute_optimal_perplexities(fits, 1e20)
    assert perplexities == {f.arch: pytest.approx(math.exp(f.optimal_loss)) for f in fits if f.budget == 1e20}
    with pytest.raises(MadslError, match="no IsoFLOP fit at 3e\\+20 FLOPs"):
        compute_optimal_perplexities(fits, 3e20)


def test_figures_write_non_empty_images(tmp_path, frontier):
    points = sweep(arch="x") + sweep(arch="y", seed=1)
    fits = fit_isoflops(points)
    correlation = correlate_mad({"x": 0.5, "y": 0.7, "z": 0.6}, {"x": 9.0, "y": 8.0, "z": 8.7}, resamples=50)
    written = [
        figures.plot_isoflops(fits, tmp_path / "isoflops.png"),
        figures.plot_frontier({"chinchilla": frontier}, tmp_path / "frontier.pdf"),
        figures.plot_state_optimal(state_optima(points), tmp_path / "state.png"),
        figures.plot_correlation(correlation, tmp_path / "mad.png"),
    ]
    assert written == [tmp_path / name for name in ("isoflops.png", "frontier.pdf", "state.png", "mad.png")]
    for path in written:
        assert path.read_bytes()[:4] == (b"%PDF" if path.suffix == ".pdf" else b"\x89PNG")
        assert path.stat().st_size > 10_000
    with pytest.raises(MadslError, match="cannot write a .txt figure"):
        figures.plot_isoflops(fits, tmp_path / "isoflops.txt")


@pytest.mark.parametrize(
    "path", sorted(Path(__file__).resolve().parents[1].joinpath("specs", "scaling").glob("*.yaml"))
)
def test_every_bundled_study_plans(path):
    """Each study file shipped in specs/scaling/ reads, and every architecture takes every size
    of every budget (the plan's grid, at the bytes vocabulary)."""
    from madsl.scaling.grid import plan_study
    from madsl.scaling.study import load_study

    study = load_study(path)
    runs = plan_study(study, 256)
    assert len(runs) == len(study.architectures) * sum(
        len(g.sizes) * group_seeds(study, g) * len(group_lrs(study, g)) for g in study.budgets
    )


def test_the_state_optimal_law_is_the_line_through_the_optima_with_a_bootstrap_interval():
    """P* ∝ M*^c: the least-squares line of log P* over log M* through each budget's optimum
    (M* read at N*, P* = exp(L*)), a seeded percentile interval around it; fewer than two
    bracketed budgets is an error saying so."""
    from madsl.scaling.state_law import fit_state_law, fit_state_laws

    exact = sweep(noise=0.0)
    optima = fit_isoflops(exact)
    x = [math.log10(1000 * math.sqrt(f.optimal_params)) for f in optima]
    y = [math.log10(math.exp(f.optimal_loss)) for f in optima]
    law = fit_state_law(exact, resamples=200, seed=0)
    assert law.law.exponent == pytest.approx(np.polyfit(x, y, 1)[0], rel=1e-9) and law.law.exponent < 0
    assert law.perplexities == pytest.approx([math.exp(f.optimal_loss) for f in optima])
    assert law.law.interval[0] <= law.law.exponent <= law.law.interval[1] and law.skipped < 5
    noisy = fit_state_law(sweep(noise=0.02), resamples=300, seed=1)
    low, high = noisy.law.interval
    assert low < noisy.law.exponent < high and noisy == fit_state_law(sweep(noise=0.02), resamples=300, seed=1)
    one = [p for p in exact if p.budget == BUDGETS[0]]
    with pytest.raises(MadslError, match="needs 2 budgets with a bracketed optimum, it has 1"):
        fit_state_law(one)
    laws, missing = fit_state_laws(
        exact + [ScalePoint("solo", p.budget, p.params, p.tokens, p.loss, p.state) for p in one]
    )
    assert set(laws) == {"chinchilla"} and "it has 1" in missing["solo"]

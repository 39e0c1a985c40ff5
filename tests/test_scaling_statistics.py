"""The statistics of the MAD correlation and of approach 3, as a scaling-law reviewer reads them
(issue 39): exact permutation p-values one-sided in the pre-registered direction (a higher MAD
score, a lower perplexity), the smallest correlation that n architectures can detect, no
bootstrap interval where n is too small for one, only optima inside the sizes trained in the
correlation (an extrapolated one named and left out), and the parametric fit's intervals and
its constants at their bound. Synthetic points with known answers; deterministic, each fast."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from scipy import stats

from madsl.errors import MadslError
from madsl.outputs import json_text
from madsl.scaling.correlation import BCA_FROM, DIRECTION, correlate_mad
from madsl.scaling.fits import BAND_POINTS, ScalePoint, fit_frontier, fit_isoflops
from madsl.scaling.parametric import fit_parametric
from madsl.scaling.report import StudyReport, add_mad_correlation, render_report, report_records

SIX = {f"arch{i}": 0.9 - 0.1 * i for i in range(6)}  # MAD scores: arch0 best


def curve(arch: str, centre: float, depth: float, budget: float = 1e19) -> list[ScalePoint]:
    """An IsoFLOP group at sizes 10^7..10^9: loss = depth + 0.3 (log10 N − centre)², minimum at 10^centre."""
    sizes = (7.0, 7.5, 8.0, 8.5, 9.0)
    return [ScalePoint(arch, budget, 10**x, budget / (6 * 10**x), depth + 0.3 * (x - centre) ** 2) for x in sizes]


def six_ranked_report(extra: dict[str, float] | None = None) -> StudyReport:
    """Six architectures ranked perfectly (a higher MAD score, a lower loss), plus `extra`: name ->
    centre of a curve whose minimum lies outside the sizes (scored 0.95, the best score)."""
    points = [p for i, arch in enumerate(SIX) for p in curve(arch, 8.2, 3.0 + 0.1 * i)]
    for arch, centre in (extra or {}).items():
        points += curve(arch, centre, 2.0)
    report = StudyReport("ranked", points, isoflops=fit_isoflops(points), runs_total=len(points))
    report.mad_scores = dict(SIX) | dict.fromkeys(extra or {}, 0.95)
    add_mad_correlation(report, resamples=100)
    return report


def test_a_perfectly_ranked_six_has_a_permutation_p_value_of_one_in_720():
    report = six_ranked_report()
    c = report.correlation
    assert c.exact and c.permutations == 720 and c.direction == DIRECTION
    for name in ("pearson", "spearman", "kendall"):
        assert c.tests[name].p_value == 1 / 720  # the one ordering as extreme as the data: the data's own
        assert c.tests[name].smallest_p == 1 / 720
    assert c.spearman == pytest.approx(-1) and c.kendall == pytest.approx(-1)
    text = render_report(report)
    assert "exact permutation test over all 720 orderings" in text
    assert text.count("0.001389 (1/720)") == 3
    assert "higher MAD score predicts a lower perplexity (correlation < 0)" in text


def test_the_estimates_are_scipys_and_the_exact_p_values_match_an_enumeration():
    rng = np.random.default_rng(7)
    scores = {f"a{i}": float(v) for i, v in enumerate(rng.uniform(0.3, 0.9, 7))}
    perplexities = {a: 20 - 10 * s + float(rng.normal(0, 2)) for a, s in scores.items()}
    c = correlate_mad(scores, perplexities, resamples=100)
    x, y = np.array(c.scores), np.array(c.perplexities)
    assert c.pearson == pytest.approx(stats.pearsonr(x, y).statistic, abs=1e-12)
    assert c.spearman == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
    assert c.kendall == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)
    orderings = [stats.kendalltau(x[list(order)], y).statistic for order in itertools.permutations(range(7))]
    assert c.tests["kendall"].p_value == pytest.approx(np.mean(np.array(orderings) <= c.kendall + 1e-12), abs=1e-12)


def exact_spearman_null(n: int) -> np.ndarray:
    """Spearman's rho of every ordering of n untied ranks: 1 − 6 Σd² / (n(n² − 1))."""
    ranks = np.arange(n)
    return np.array(
        [1 - 6 * np.sum((ranks - order) ** 2) / (n * (n * n - 1)) for order in itertools.permutations(ranks)]
    )


def test_the_smallest_detectable_correlation_for_six_is_the_exact_distributions():
    null = exact_spearman_null(6)
    # the least negative rho whose one-sided p-value P(rho <= r) is below 0.05
    significant = [r for r in np.unique(null) if r < 0 and np.mean(null <= r + 1e-12) < 0.05]
    assert max(significant) == pytest.approx(-29 / 35)  # -0.829, the tables' one-sided 5 % value for n = 6
    c = six_ranked_report().correlation
    assert c.tests["spearman"].detectable == pytest.approx(29 / 35)
    assert c.tests["kendall"].detectable == pytest.approx(11 / 15)  # 0.733: 12 discordant pairs of 15 at most 2
    assert "0.829" in render_report(six_ranked_report())


def test_three_architectures_cannot_reach_significance_and_say_so():
    c = correlate_mad({"a": 0.9, "b": 0.6, "c": 0.3}, {"a": 5.0, "b": 6.0, "c": 9.0}, resamples=50)
    assert c.tests["spearman"].p_value == pytest.approx(1 / 6) and c.tests["spearman"].detectable is None
    report = StudyReport("three", [], correlation=c)
    assert "none (at best p = 0.1667 (1/6))" in render_report(report)


def test_small_sets_get_no_interval_and_large_sets_get_bca():
    small = six_ranked_report().correlation
    assert small.interval_method == "none" and math.isnan(small.pearson_interval[0])
    assert f"BCa needs {BCA_FROM}" in small.interval_note
    rng = np.random.default_rng(3)
    scores = {f"a{i}": float(v) for i, v in enumerate(rng.uniform(0.3, 0.9, 10))}
    perplexities = {a: 20 - 10 * s + float(rng.normal(0, 1)) for a, s in scores.items()}
    large = correlate_mad(scores, perplexities, resamples=300, draws=2000, seed=1)
    assert large.interval_method == "BCa" and large.interval_note == ""
    for name in ("pearson", "spearman", "kendall"):
        low, high = getattr(large, f"{name}_interval")
        assert -1 <= low <= getattr(large, name) <= high <= 1
    # ten architectures: a seeded Monte Carlo permutation test with the draws it states
    assert not large.exact and large.permutations == 2000
    assert large.tests["spearman"].p_value >= 1 / 2001
    assert correlate_mad(scores, perplexities, resamples=300, draws=2000, seed=1).tests == large.tests


def test_an_extrapolated_optimum_is_left_out_of_the_correlation_and_named():
    report = six_ranked_report(extra={"outside": 10.5})  # its minimum at 10^10.5, the sizes end at 10^9
    c = report.correlation
    assert "outside" not in c.archs and len(c.archs) == 6 and c.tests["spearman"].p_value == 1 / 720
    assert "extrapolated" in report.correlation_left_out["outside"]
    assert any("outside left out" in problem for problem in report.problems)
    text = render_report(report)
    row = next(line for line in text.splitlines() if line.strip().startswith("outside "))
    assert row.endswith("EXTRAPOLATED")
    assert "left out: outside: its optimum" in text
    records = json.loads(json_text(report_records(report)))
    assert [f["extrapolated"] for f in records["isoflops"] if f["arch"] == "outside"] == [True]
    assert set(records["correlation_left_out"]) == {"outside"}
    assert records["correlation"]["tests"]["spearman"]["p_value"] == pytest.approx(1 / 720)


def test_with_every_optimum_extrapolated_no_correlation_is_claimed():
    points = [p for arch in ("a", "b", "c") for p in curve(arch, 10.5, 2.0)]
    report = StudyReport("outside", points, isoflops=fit_isoflops(points))
    report.mad_scores = {"a": 0.5, "b": 0.6, "c": 0.7}
    add_mad_correlation(report, resamples=50)
    assert report.correlation is None
    assert any("no scored architecture has an IsoFLOP optimum inside" in p for p in report.problems)


def test_approach_3_flags_a_constant_at_its_bound_and_gives_seeded_intervals():
    # no irreducible loss: L = A/N^α + B/D^β, so the fit drives E to its bound 0
    points = [
        ScalePoint("no-floor", c, n, c / (6 * n), 406.4 / n**0.34 + 410.7 / (c / (6 * n)) ** 0.28)
        for c in (1e18, 1e19, 1e20)
        for n in np.sqrt(c / 120) * np.logspace(-1, 1, 5)
    ]
    fit = fit_parametric(points, resamples=20, seed=0)
    assert fit.E < 1e-3 and any(w.startswith("E = ") and "bound 0" in w for w in fit.at_bound)
    assert fit.resamples == 20 and set(fit.intervals) == {"E", "A", "B", "alpha", "beta", "a", "b"}
    for name, value in (("alpha", fit.alpha), ("beta", fit.beta), ("a", fit.params_exponent)):
        low, high = fit.intervals[name]
        assert low <= value + 1e-6 and value - 1e-6 <= high
    assert fit_parametric(points, resamples=20, seed=0).intervals == fit.intervals
    report = StudyReport("no-floor", points, parametric={"no-floor": fit})
    assert "warning: E = " in render_report(report)


def test_the_frontier_carries_a_band_around_its_line():
    points = [p for c, centre in ((1e18, 7.8), (1e19, 8.2), (1e20, 8.6)) for p in curve("x", centre, 3.0, c)]
    rng = np.random.default_rng(0)
    noisy = [
        ScalePoint(p.arch, p.budget, p.params, p.tokens, p.loss * (1 + 0.01 * rng.standard_normal())) for p in points
    ]
    frontier = fit_frontier(noisy, resamples=200, seed=0)
    band = np.array(frontier.params.band)
    assert band.shape == (BAND_POINTS, 3) and band[0, 0] == pytest.approx(1e18) and band[-1, 0] == pytest.approx(1e20)
    assert np.all(band[:, 1] <= band[:, 2])
    line = frontier.params(band[:, 0])
    assert np.mean((band[:, 1] <= line) & (line <= band[:, 2])) > 0.9


def test_a_pre_registered_group_is_correlated_over_its_own_architectures(tmp_path):
    """A study's `groups:` (a design chain) get a correlation of their own, at the budget and with
    the left-outs of the correlation over all; a group name or member the study lacks is a
    located error; fewer than 3 in a group is refused."""
    from madsl.scaling.report import _group_correlation
    from madsl.scaling.report_text import render_report as text_of
    from madsl.scaling.study import load_study

    report = six_ranked_report({"outside": 10.0})
    chain = _group_correlation(report, "chain", ("arch0", "arch1", "arch2", "outside"), 100, 0)
    assert chain.archs == ("arch0", "arch1", "arch2") and chain.budget == report.correlation.budget
    assert chain.tests["spearman"].p_value == pytest.approx(1 / 6)  # 3! orderings, the perfect one
    report.group_correlations["chain"] = chain
    assert "MAD score vs compute-optimal perplexity at 1e+19 FLOPs, group chain (3 architectures" in text_of(report)
    assert list(report_records(report)["group_correlations"]["chain"]["archs"]) == ["arch0", "arch1", "arch2"]
    assert _group_correlation(report, "small", ("arch0", "outside", "nope"), 100, 0) is None
    assert "MAD correlation of group small: 1 of its 3 architectures" in report.problems[-1]
    base = (
        "name: s\ndata: bundled:tinyshakespeare\narchitectures:\n  a: bundled:paper/hyena-sg\n"
        "  b: bundled:paper/mamba\n  c: bundled:paper/mh-attention-sg\nbudgets: [1e12]\nsizes: [{dim: 16}]\n"
    )
    (tmp_path / "ok.yaml").write_text(base + "groups: {chain: [a, b, c]}\n")
    assert load_study(tmp_path / "ok.yaml").groups == {"chain": ("a", "b", "c")}
    (tmp_path / "bad.yaml").write_text(base + "groups: {chain: [a, b, d]}\n")
    with pytest.raises(MadslError, match="group chain: 'd' is not an architecture of the study") as raised:
        load_study(tmp_path / "bad.yaml")
    assert (raised.value.location.line, raised.value.location.column) == (9, 24)
    (tmp_path / "few.yaml").write_text(base + "groups: {chain: [a, b]}\n")
    with pytest.raises(MadslError, match="at least 3 distinct architectures"):
        load_study(tmp_path / "few.yaml")


def test_the_seed_spread_is_the_optimum_fitted_on_each_seed_alone():
    from madsl.scaling.report import seed_spread

    by_seed = {0: curve("a", 8.2, 3.0), 1: curve("a", 8.2, 3.1), 2: curve("b", 10.0, 2.0)}
    (row,) = seed_spread(by_seed)  # b: one seed, and its optimum outside the sizes: no spread
    assert row["arch"] == "a" and row["optimal_loss"] == {0: pytest.approx(3.0), 1: pytest.approx(3.1)}
    assert row["max"] - row["min"] == pytest.approx(0.1) and row["sd"] == pytest.approx(0.1 / math.sqrt(2))

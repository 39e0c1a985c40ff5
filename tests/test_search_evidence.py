"""The paired tests of benchmarks/search_evidence.py (issue 40's comparison): the exact sign-flip
permutation p-value and the exact one-sided Wilcoxon signed-rank p-value against counts made by
hand, and the direction of the test."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from search_evidence import paired  # noqa: E402


def test_an_algorithm_better_at_every_seed_reaches_the_smallest_p():
    out = paired([0.5, 0.6, 0.7, 0.8, 0.9], [0.4, 0.4, 0.4, 0.4, 0.4])
    assert out["permutation_p"] == pytest.approx(1 / 32) == out["smallest_p"]
    assert out["wilcoxon_p"] == pytest.approx(1 / 32)
    assert (out["wins"], out["losses"]) == (5, 0) and out["interval_95"][0] > 0


def test_the_permutation_p_counts_the_sign_assignments_at_least_as_extreme():
    a, b = [0.30, 0.10, 0.50, 0.20, 0.40], [0.25, 0.20, 0.35, 0.22, 0.30]
    d = [x - y for x, y in zip(a, b)]
    observed = sum(d) / len(d)
    extreme = sum(
        sum(s * abs(x) for s, x in zip(signs, d)) / len(d) >= observed - 1e-12
        for signs in itertools.product((1, -1), repeat=len(d))
    )
    out = paired(a, b)
    assert out["permutation_p"] == pytest.approx(extreme / 32)
    assert out["mean_difference"] == pytest.approx(observed) and (out["wins"], out["losses"]) == (3, 2)


def test_the_test_is_one_sided_in_the_algorithms_favour():
    worse = paired([0.1, 0.2, 0.3, 0.2, 0.1], [0.5, 0.6, 0.7, 0.8, 0.9])
    assert worse["permutation_p"] == 1.0 and worse["wilcoxon_p"] == 1.0 and worse["interval_95"][1] < 0
    tied = paired([0.3] * 5, [0.3] * 5)
    assert tied["permutation_p"] == 1.0 and tied["wilcoxon_p"] == 1.0 and tied["wins"] == tied["losses"] == 0

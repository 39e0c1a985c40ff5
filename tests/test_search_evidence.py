"""The paired tests of benchmarks/search_evidence.py (issue 40's comparison): the exact sign-flip
permutation p-value and the exact one-sided Wilcoxon signed-rank p-value against counts made by
hand, and the direction of the test; and the analysis refitted from the raw data
(benchmarks/search_evidence_analysis.py): the front, the anytime checkpoints and intervals."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from search_evidence import paired  # noqa: E402
from search_evidence_analysis import checkpoints, exploratory, front_of, read_heldout, t_interval  # noqa: E402

from madsl.errors import MadslError  # noqa: E402


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


# The analysis refitted from the raw data (benchmarks/search_evidence_analysis.py)


def _candidate(score, state):
    return {"score": score, "status": "scored" if score is not None else "failed", "totals": {"total_state": state}}


def test_the_front_keeps_what_no_candidate_beats_on_both_score_and_state():
    candidates = [_candidate(0.5, 4096), _candidate(0.7, 20000), _candidate(0.4, 8000), _candidate(None, 10)]
    front = front_of(candidates)
    # (0.4, 8000) is beaten by (0.5, 4096); the failed candidate is on no front
    assert sorted((c["score"], c["totals"]["total_state"]) for c in front) == [(0.5, 4096), (0.7, 20000)]


def test_the_anytime_checkpoints_are_the_population_and_each_generation():
    assert checkpoints((8, 3, 6)) == [8, 14, 20, 26]


def test_the_t_interval_holds_the_mean_and_widens_with_spread():
    mean, low, high = t_interval([0.4, 0.5, 0.6])
    assert mean == pytest.approx(0.5) and low < mean < high
    assert high - low == pytest.approx(2 * 4.302652729911275 * 0.1 / 3**0.5)  # t(0.975, 2) x s / sqrt(n)


def test_the_exploratory_test_is_two_sided():
    rows = [
        {"algorithm": name, "seed": s, "best_heldout": value, "hypervolume": 0.5}
        for s in range(5)
        for name, value in (("regularized-evolution", 0.2), ("nsga2", 0.6))
    ]
    out = exploratory(rows)["regularized-evolution vs nsga2: best_heldout"]
    # worse at every seed: the one-sided p in its favour is 1, the two-sided p is 2 x 1/32
    assert out["permutation_p"] == 1.0 and out["permutation_p_two_sided"] == pytest.approx(2 / 32)


def test_a_bad_cell_of_heldout_csv_is_a_located_error(tmp_path):
    path = tmp_path / "heldout.csv"
    header = "algorithm,seed,topology,search_score,heldout_seed,heldout_score\n"
    path.write_text(header + "nsga2,0,2DN,0.5,1,0.4\nnsga2,0,2DN,0.5,2,0.4x\n")
    with pytest.raises(MadslError, match="heldout_score: expected a number, got '0.4x'") as err:
        read_heldout(path)
    assert (err.value.location.file, err.value.location.line) == (str(path), 3)
    path.write_text(header.replace(",search_score", "") + "nsga2,0,2DN,1,0.4\n")
    with pytest.raises(MadslError, match="missing columns \\['search_score'\\]"):
        read_heldout(path)
    path.write_text(header + "nsga2,0,2DN,0.5,1,0.4\n")
    assert read_heldout(path)[0]["seed"] == 0 and read_heldout(path)[0]["search_score"] == 0.5

"""The hypervolume of a front (Zitzler & Thiele 1998): the volume of objective space its points
dominate, up to a reference point, every objective minimised. A front dominating more has a
larger one; a point that does not strictly dominate the reference adds nothing.

    hypervolume(points, reference)    exact: a sweep in 2-D, slicing by the last objective in more
                                      (Whale et al.'s HSO); moocore or pymoo for fronts too large
                                      to slice exactly here (EXACT_WORK)
    search_reference(search, state)   a search's reference point (the rule below)
    generation_hypervolumes(...)      each generation's hypervolume of the front found by then

A search's objectives are the score negated and the minimised totals. Its reference point is a
score of 0 (MAD scores are accuracies in [0, 1]: a candidate scoring 0 dominates nothing), and for
each minimised total the budget's upper bound on it where the search file bounds it (total_state:
its own bound, else fixed_state's and kv_cache's summed; madsl.lang.budget.upper_bound), else
REFERENCE_MARGIN x the largest value of any candidate proposed so far (every candidate inside the
box; the largest still counts). A search's hypervolume is the share of the box from the ideal point
(score 1, every total 0) to the reference that its scored candidates dominate: 0 to 1.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from madsl.errors import MadslError
from madsl.lang.budget import upper_bound
from madsl.search.algorithms import objective_vector
from madsl.search.config import SearchFile
from madsl.search.state import SearchState

REFERENCE_MARGIN = 1.1  # an unbounded total's reference over its largest value seen
REFERENCE_RULE = (
    f"score 0; each minimised total at the budget's upper bound on it (total_state: fixed_state's and kv_cache's "
    f"summed where it has none of its own), else {REFERENCE_MARGIN:g} x its largest "
    "value among the candidates proposed; a generation's hypervolume is the share of the box from "
    "(score 1, totals 0) to it that the candidates scored by its end dominate"
)
EXACT_WORK = 2_000_000  # slices the exact n-D computation may take (about a second); beyond: moocore/pymoo


def hypervolume(points: Sequence[Sequence[float]], reference: Sequence[float]) -> float:
    """The volume the `points` dominate up to `reference`, every objective minimised. Points that
    do not strictly dominate the reference are left out; no point left: 0.0."""
    ref = [float(r) for r in reference]
    if not ref or not all(math.isfinite(r) for r in ref):
        raise MadslError(f"a hypervolume's reference point must be finite numbers, got {list(reference)}")
    inside = []
    for point in points:
        p = [float(x) for x in point]
        if len(p) != len(ref):
            raise MadslError(f"a point of {len(p)} objectives against a reference point of {len(ref)}")
        if all(x < r for x, r in zip(p, ref)):
            inside.append(tuple(p))
    front = _non_dominated(sorted(set(inside)))
    if not front:
        return 0.0
    if len(ref) <= 2 or len(front) ** (len(ref) - 2) <= EXACT_WORK:
        return _exact(front, tuple(ref))
    return _installed(front, ref)


def _non_dominated(points: list[tuple[float, ...]]) -> list[tuple[float, ...]]:
    """The points no other weakly dominates (distinct points, so weak domination is domination)."""
    return [p for p in points if not any(q != p and all(a <= b for a, b in zip(q, p)) for q in points)]


def _exact(points: list[tuple[float, ...]], ref: tuple[float, ...]) -> float:
    d = len(ref)
    if d == 1:
        return ref[0] - min(p[0] for p in points)
    if d == 2:  # sweep x upwards: each point adds the strip below the best y so far
        volume, best_y = 0.0, ref[1]
        for x, y in sorted(points):
            if y < best_y:
                volume += (ref[0] - x) * (best_y - y)
                best_y = y
        return volume
    # slices along the last objective: between two consecutive values, the points at or below
    # the lower one dominate the same (d-1)-dimensional region
    ordered = sorted(points, key=lambda p: p[-1])
    volume = 0.0
    for i, point in enumerate(ordered):
        top = ordered[i + 1][-1] if i + 1 < len(ordered) else ref[-1]
        if top > point[-1]:
            below = _non_dominated(sorted({p[:-1] for p in ordered[: i + 1]}))
            volume += (top - point[-1]) * _exact(below, ref[:-1])
    return volume


def _installed(points: list[tuple[float, ...]], ref: list[float]) -> float:
    """A front too large to slice exactly here: moocore's or pymoo's exact indicator."""
    import numpy as np

    data = np.asarray(points, dtype=float)
    try:
        import moocore

        return float(moocore.hypervolume(data, ref=np.asarray(ref)))
    except ImportError:
        pass
    try:
        from pymoo.indicators.hv import HV

        return float(HV(ref_point=np.asarray(ref))(data))
    except ImportError:
        pass
    raise MadslError(
        f"the hypervolume of {len(points)} points in {len(ref)} objectives is too large to compute "
        "exactly without an indicator library",
        hint="install moocore (pip install moocore) or pymoo (pip install pymoo)",
    )


def search_reference(search: SearchFile, state: SearchState) -> list[float]:
    """A search's reference point in its objectives (the score negated, then the minimised totals):
    the module docstring's rule."""
    budget = search.spec_data.get("budget") or {}
    reference = [0.0]
    for quantity in search.objectives.minimize:
        high = upper_bound(budget, quantity)
        if not math.isfinite(high) or high <= 0:  # unbounded: past the largest value seen
            largest = max((float(c["totals"][quantity]) for c in state.candidates.values()), default=0.0)
            high = REFERENCE_MARGIN * largest if largest > 0 else 1.0
        reference.append(float(high))
    return reference


def generation_hypervolumes(search: SearchFile, state: SearchState) -> dict[str, Any]:
    """Each finished generation's hypervolume (the share of the box from the ideal point to the
    reference that the candidates scored by its end dominate), against one reference point."""
    reference = search_reference(search, state)
    scale = [1.0] + reference[1:]  # the score's side of the box is 1 (from -1 to 0)
    scored = [c for c in state.candidates.values() if c.get("score") is not None]
    out = []
    for entry in state.history:
        points = [
            [v / s for v, s in zip(objective_vector(search, state, c["id"]), scale)]
            for c in scored
            if c["generation"] <= entry["generation"]
        ]
        out.append(hypervolume(points, [r / s for r, s in zip(reference, scale)]))
    names = ["score", *search.objectives.minimize]
    return {"reference": dict(zip(names, reference)), "rule": REFERENCE_RULE, "values": out}

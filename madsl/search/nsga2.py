"""NSGA-II's ranking (Deb, Pratap, Agarwal, Meyarivan 2002): fast non-dominated sorting, crowding
distance, the crowded-comparison tournament and the survivors of a generation.

Every objective here is minimised: a maximised one (the MAD score) is passed negated. A candidate
without a score (its runs failed) is passed as +inf in it: infeasible. Domination is Deb's
constrained domination (Deb 2000; NSGA-II's own constraint handling): a feasible point (every
objective finite) dominates every infeasible one whatever their other objectives, infeasible
points dominate none of each other (their violation, a failed run, is the same), so the failed
candidates form the last front and no small state carries one onto the first.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

Vector = Sequence[float]


def feasible(a: Vector) -> bool:
    """Every objective is finite (a scored candidate)."""
    return all(math.isfinite(x) for x in a)


def dominates(a: Vector, b: Vector) -> bool:
    """Constrained domination: a feasible a dominates an infeasible b; between feasible points, a is
    no worse than b in every objective and better in one; an infeasible a dominates nothing."""
    if not feasible(a):
        return False
    if not feasible(b):
        return True
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def non_dominated_sort(points: Sequence[Vector]) -> list[list[int]]:
    """The fronts, best first: each a list of indices into `points` (in index order). Front 0
    holds the points no other dominates; front k those dominated only by fronts before it."""
    dominated_by: list[list[int]] = [[] for _ in points]  # i -> the points i dominates
    counts = [0] * len(points)  # i -> how many points dominate i
    for i, a in enumerate(points):
        for j in range(i + 1, len(points)):
            b = points[j]
            if dominates(a, b):
                dominated_by[i].append(j)
                counts[j] += 1
            elif dominates(b, a):
                dominated_by[j].append(i)
                counts[i] += 1
    fronts: list[list[int]] = []
    current = [i for i, c in enumerate(counts) if c == 0]
    while current:
        fronts.append(sorted(current))
        following = []
        for i in current:
            for j in dominated_by[i]:
                counts[j] -= 1
                if counts[j] == 0:
                    following.append(j)
        current = following
    return fronts


def crowding_distance(points: Sequence[Vector], front: Sequence[int]) -> dict[int, float]:
    """Each point of `front`: the sum over objectives of the gap between its two neighbours along
    that objective, divided by the objective's range on the front; the ends of each objective get
    infinity (they are kept first). Equal values in an objective add nothing."""
    distance = {i: 0.0 for i in front}
    if len(front) < 3:
        return {i: math.inf for i in front}
    for k in range(len(points[front[0]])):
        ordered = sorted(front, key=lambda i: (points[i][k], i))
        low, high = points[ordered[0]][k], points[ordered[-1]][k]
        distance[ordered[0]] = distance[ordered[-1]] = math.inf
        span = high - low
        if span == 0 or not math.isfinite(span):
            continue
        for position in range(1, len(ordered) - 1):
            gap = points[ordered[position + 1]][k] - points[ordered[position - 1]][k]
            distance[ordered[position]] += gap / span
    return distance


def rank_and_crowding(points: Sequence[Vector]) -> tuple[list[int], list[float]]:
    """Each point's front index and crowding distance within its front."""
    rank = [0] * len(points)
    crowding = [0.0] * len(points)
    for r, front in enumerate(non_dominated_sort(points)):
        for i, d in crowding_distance(points, front).items():
            rank[i], crowding[i] = r, d
    return rank, crowding


def crowded_better(i: int, j: int, rank: Sequence[int], crowding: Sequence[float]) -> bool:
    """The crowded-comparison operator: the lower front, then the larger crowding distance."""
    return rank[i] < rank[j] or (rank[i] == rank[j] and crowding[i] > crowding[j])


def tournament(rank: Sequence[int], crowding: Sequence[float], rng: Any) -> int:
    """Binary tournament: two members drawn uniformly, the crowded-better one wins (ties: the first)."""
    i, j = int(rng.integers(len(rank))), int(rng.integers(len(rank)))
    return j if crowded_better(j, i, rank, crowding) else i


def survivors(points: Sequence[Vector], size: int) -> list[int]:
    """The `size` points NSGA-II keeps: whole fronts in order, then from the front that does not
    fit, the largest crowding distances (ties: the lower index). Returned in that order."""
    kept: list[int] = []
    for front in non_dominated_sort(points):
        if len(kept) + len(front) <= size:
            kept.extend(front)
            continue
        distance = crowding_distance(points, front)
        kept.extend(sorted(front, key=lambda i: (-distance[i], i))[: size - len(kept)])
        break
    return kept

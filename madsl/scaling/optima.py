"""A study's compute-optimal points read the ways a reviewer asks for besides the report's own fit:
under each convention of N, and on each seed replicate alone.

    run_params(run, convention)   a run's N: "total" (embedding, positions and head included, as
                                  the paper's Table C.2 counts), "non-embedding" (without them, as
                                  Kaplan et al. count) or "active" (a routed layer's chosen experts
                                  only: what one token reads; the total for a dense model)
    optima_by_convention          each IsoFLOP group's N* with each N on the parabola's axis
    seed_spread                   each group's compute-optimal loss fitted on each seed's runs alone

Torch-free; pure numpy through madsl.scaling.fits.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from madsl.errors import MadslError, option

CONVENTIONS = ("total", "non-embedding", "active")


def check_convention(convention: str) -> str:
    """`convention` if it is one of CONVENTIONS, else a MadslError naming them."""
    if convention not in CONVENTIONS:
        raise MadslError(
            f"{option('params')} {convention!r}: not a parameter convention",
            hint="one of " + ", ".join(CONVENTIONS) + " (default: total)",
        )
    return convention


def run_params(run: Any, convention: str = "total") -> int:
    """A planned run's (madsl.scaling.grid.ScaleRun) parameter count N under `convention`."""
    if convention == "total":
        return run.params
    if convention == "non-embedding":
        return run.params - run.embedding_params
    if convention == "active":
        return run.active_params
    check_convention(convention)
    raise AssertionError(convention)  # (check_convention raised)


def _optima(points: list[Any]) -> dict[tuple[str, float], Any]:
    """(arch, budget) -> the IsoFLOP fit of each group that has one (too few sizes, no minimum: none)."""
    from madsl.scaling.fits import fit_isoflop

    groups: dict[tuple[str, float], list[Any]] = {}
    for point in points:
        groups.setdefault((point.arch, point.budget), []).append(point)
    fitted = {}
    for key, group in sorted(groups.items()):
        try:
            fitted[key] = fit_isoflop(group)
        except MadslError:  # the report names why under the convention it fits; here it is only absent
            continue
    return fitted


def optima_by_convention(points: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Each IsoFLOP group's optimum under every convention (`points`: convention -> the study's
    points with that N): the parabola refitted with that N on its axis, so N* is that
    convention's own minimum, not a conversion of another's (the loss is the same; the axis, and
    so the vertex, differ). Rows: arch, budget, and per convention N* and whether it lies inside
    the sizes trained."""
    fitted = {convention: _optima(group) for convention, group in points.items()}
    keys = sorted({key for by_group in fitted.values() for key in by_group})
    rows = []
    for arch, budget in keys:
        fits = {c: by_group[(arch, budget)] for c, by_group in fitted.items() if (arch, budget) in by_group}
        rows.append(
            {
                "arch": arch,
                "budget": budget,
                "optimal_params": {c: f.optimal_params for c, f in fits.items()},
                "bracketed": {c: f.bracketed for c, f in fits.items()},
            }
        )
    return rows


def seed_spread(by_seed: dict[int, list[Any]]) -> list[dict[str, Any]]:
    """Where a budget has seed replicates: each architecture's compute-optimal loss fitted on
    each seed's own points (bracketed optima only), and their spread: what the noise of one
    training run does to L*(C)."""
    optima: dict[tuple[str, float], dict[int, float]] = {}
    for seed, points in by_seed.items():
        for key, fit in _optima(points).items():
            if fit.bracketed:
                optima.setdefault(key, {})[seed] = fit.optimal_loss
    out = []
    for (arch, budget), losses in sorted(optima.items()):
        if len(losses) >= 2:
            values = list(losses.values())
            out.append(
                {
                    "arch": arch,
                    "budget": budget,
                    "optimal_loss": dict(sorted(losses.items())),
                    "min": min(values),
                    "max": max(values),
                    "sd": statistics.stdev(values),
                }
            )
    return out


def learning_rate_ladder(runs: list[Any], stored: dict[str, Any]) -> list[dict[str, Any]]:
    """Where a budget trains a learning-rate ladder: each model's (architecture, budget, size,
    seed) final loss at each rate and its best rate, with `edge` "lowest" or "highest" where the
    best is an end of the ladder (the ladder does not bracket that model's best rate: its loss may
    be set by the ladder, not the model). `runs`: (ScaleRun, run id) pairs; `stored`: run id ->
    its database row. A rate that diverged or has no loss yet is None; a model with no loss at
    any rate is left out."""
    models: dict[tuple, dict[float, float | None]] = {}
    params: dict[tuple, int] = {}
    for run, run_id in runs:
        key = (run.arch, run.budget, run.size, run.settings.seed)
        row = stored.get(run_id)
        finished = row is not None and row["status"] == "done" and row["diverged_epoch"] is None
        loss = row["best_eval_loss"] if finished else None
        losses = models.setdefault(key, {})
        losses[float(run.settings.lr)] = float(loss) if isinstance(loss, (int, float)) and math.isfinite(loss) else None
        params[key] = run.params
    out = []
    for (arch, budget, size, seed), losses in sorted(
        models.items(), key=lambda item: (item[0][0], item[0][1], params[item[0]], item[0][3])
    ):
        rates = sorted(losses)
        measured = {lr: loss for lr, loss in losses.items() if loss is not None}
        if len(rates) < 2 or not measured:
            continue
        best = min(measured, key=measured.__getitem__)
        edge = "lowest" if best == rates[0] else "highest" if best == rates[-1] else None
        out.append(
            {
                "arch": arch,
                "budget": budget,
                "size": size,
                "params": params[(arch, budget, size, seed)],
                "seed": seed,
                "losses": {lr: losses[lr] for lr in rates},
                "best_lr": best,
                "edge": edge,
            }
        )
    return out

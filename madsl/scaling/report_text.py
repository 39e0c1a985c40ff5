"""A study's report as text (`madsl report --study`): the IsoFLOP optima (an extrapolated one
marked as such) and their N* under each convention of N, the frontiers, the parametric fits with
their intervals and the constants at a bound, the state-optimal view, the seed replicates'
spread, the MAD correlation (over all and over each pre-registered group) with its tests and what
they can detect, and what was not fitted. Reads a madsl.scaling.report.StudyReport; imports
nothing of it.
"""

from __future__ import annotations

import math
from typing import Any

EXTRAPOLATED = "EXTRAPOLATED"
STATISTIC_NAMES = {"pearson": "Pearson r", "spearman": "Spearman ρ", "kendall": "Kendall τ"}
CONVENTION_NAMES = {  # madsl.scaling.optima.CONVENTIONS, as the report's headings say them
    "total": "total parameters, embedding and head included",
    "non-embedding": "parameters without the embedding and head",
    "active": "parameters a token reads, a routed layer's chosen experts only",
}


def perplexity(loss: float) -> float | None:
    """exp(loss), or None where it overflows a float (a loss above ~709 nats)."""
    try:
        return math.exp(loss)
    except OverflowError:
        return None


def _ppl(loss: float, width: int) -> str:
    value = perplexity(loss)
    return f"{value:>{width}.3f}" if value is not None else f"{'?':>{width}}"


def _interval(interval: tuple[float, float], digits: str = ".3f") -> str:
    low, high = interval
    if math.isnan(low) or math.isnan(high):
        return "[n/a]"
    return f"[{low:{digits}}, {high:{digits}}]"


def _isoflops(report: Any) -> list[str]:
    lines = [
        f"IsoFLOP optima (approach 2; N: {CONVENTION_NAMES[getattr(report, 'params', 'total')]})",
        f"  {'arch':<18} {'budget':>8} {'N*':>10} {'D*':>11} {'loss*':>7} {'ppl*':>7}  optimum",
    ]
    for f in report.isoflops:
        lines.append(
            f"  {f.arch:<18} {f.budget:>8.3g} {f.optimal_params:>10.3g} {f.optimal_tokens:>11.3g} "
            f"{f.optimal_loss:>7.4f} {_ppl(f.optimal_loss, 7)}  {'bracketed' if f.bracketed else EXTRAPOLATED}"
        )
    if any(not f.bracketed for f in report.isoflops):
        lines.append(
            f"  {EXTRAPOLATED}: the parabola's minimum lies outside the sizes trained, so its N* and loss* "
            "are not measurements; left out of the frontier, the state-optimal view and the MAD correlation"
        )
    return lines


def _conventions(report: Any) -> list[str]:
    """Each optimum's N* under the three conventions (marked * where it lies outside the sizes)."""
    columns = (("total", 11), ("non-embedding", 14), ("active", 11))
    lines = [
        "",
        "N* under each convention of N (the parabola refitted with that N on its axis; * outside the sizes trained)",
        f"  {'arch':<18} {'budget':>8} " + " ".join(f"{name:>{width}}" for name, width in columns),
    ]
    for row in report.optima_by_convention:
        cells = []
        for name, width in columns:
            n = row["optimal_params"].get(name)
            cell = "-" if n is None else f"{n:.3g}" + ("" if row["bracketed"][name] else "*")
            cells.append(f"{cell:>{width}}")
        lines.append(f"  {row['arch']:<18} {row['budget']:>8.3g} " + " ".join(cells))
    return lines


def _frontiers(report: Any) -> list[str]:
    level = round(100 * next(iter(report.frontiers.values())).level)
    lines = ["", f"Frontiers: N* ∝ C^a, D* ∝ C^b ({level} % bootstrap intervals)"]
    for arch, f in report.frontiers.items():
        lines.append(
            f"  {arch:<18} a = {f.params.exponent:.3f} {_interval(f.params.interval)}   "
            f"b = {f.tokens.exponent:.3f} {_interval(f.tokens.interval)}"
        )
    return lines


def _parametric(report: Any) -> list[str]:
    fits = report.parametric.values()
    bootstrapped = [f for f in fits if f.intervals]
    how = (
        f"; {round(100 * bootstrapped[0].level)} % percentile intervals over {bootstrapped[0].resamples} "
        "bootstrap resamples of the points"
        if bootstrapped
        else ""
    )
    lines = ["", f"Parametric fits: L(N, D) = E + A/N^α + B/D^β (approach 3{how})"]
    for arch, f in report.parametric.items():
        if not f.intervals:
            lines.append(f"  {arch:<18} E {f.E:.3f}  A {f.A:.4g}  B {f.B:.4g}  α {f.alpha:.3f}  β {f.beta:.3f}")
        else:
            i = f.intervals
            lines += [
                f"  {arch:<18} E {f.E:.3f} {_interval(i['E'])}  A {f.A:.4g} {_interval(i['A'], '.4g')}  "
                f"B {f.B:.4g} {_interval(i['B'], '.4g')}",
                f"  {'':<18} α {f.alpha:.3f} {_interval(i['alpha'])}  β {f.beta:.3f} {_interval(i['beta'])}  "
                f"a {f.params_exponent:.3f} {_interval(i['a'])}  b {f.tokens_exponent:.3f} {_interval(i['b'])}"
                + (f"  ({f.skipped} refits failed)" if f.skipped else ""),
            ]
        lines += [f"    warning: {warning}" for warning in f.at_bound]
    return lines


def _p_value(p: float, c: Any) -> str:
    """A p-value; an exact one also as the count of orderings over n! (1/720)."""
    return f"{p:.4g} ({round(p * c.permutations)}/{c.permutations})" if c.exact else f"{p:.4g}"


def _detectable(test: Any, c: Any) -> str:
    if test.detectable is not None:
        return f"{test.detectable:.3f}"
    return f"none (at best p = {_p_value(test.smallest_p, c)})"


def _correlation(report: Any, c: Any = None, group: str | None = None) -> list[str]:
    """The correlation over all scored architectures (`c` None), or over a study's group."""
    c = c if c is not None else report.correlation
    orderings = (
        f"exact permutation test over all {c.permutations:,} orderings of the {len(c.archs)} architectures"
        if c.exact
        else f"Monte Carlo permutation test, {c.permutations:,} seeded random orderings, p = (k+1)/(draws+1)"
    )
    level = round(100 * c.level)
    at = f" at {c.budget:.3g} FLOPs" if c.budget is not None else ""
    lines = [
        "",
        f"MAD score vs compute-optimal perplexity{at}{f', group {group}' if group else ''} "
        f"({len(c.archs)} architectures with an optimum inside the sizes trained)",
        "  sign: correlations of MAD score with perplexity; the test is one-sided in the pre-registered "
        "direction: a higher MAD score predicts a lower perplexity (correlation < 0)",
        f"  p: {orderings}",
        f"  {'':<11} {'value':>7}  {'p (one-sided)':<22} {f'{level} % BCa interval':<22} "
        f"smallest |value| with p < {c.alpha:g}",
    ]
    for name, label in STATISTIC_NAMES.items():
        test = c.tests[name]
        interval = _interval(getattr(c, f"{name}_interval")) if c.interval_method != "none" else "not computed"
        lines.append(
            f"  {label:<11} {test.statistic:>7.3f}  {_p_value(test.p_value, c):<22} {interval:<22} "
            f"{_detectable(test, c)}"
        )
    if c.interval_note:
        lines.append(f"  intervals: {c.interval_note}")
    for arch, why in report.correlation_left_out.items() if group is None else ():
        lines.append(f"  left out: {arch}: {why}")
    for arch, score, ppl in zip(c.archs, c.scores, c.perplexities):
        lines.append(f"  {arch:<18} MAD {score:.3f}  ppl* {ppl:.3f}")
    return lines


def _state_laws(report: Any) -> list[str]:
    """The state-optimal law P* ∝ M*^c of each architecture with 2+ bracketed budgets."""
    laws = getattr(report, "state_laws", {})
    if not laws:
        return []
    first = next(iter(laws.values()))
    lines = [
        "",
        f"State-optimal law: P* ∝ M*^c over the budgets' bracketed optima ({first.level:.0%} bootstrap "
        f"interval, {first.resamples} resamples; two budgets make a two-point line)",
    ]
    for arch, law in laws.items():
        low, high = law.law.interval
        budgets = ", ".join(f"{b:.3g}" for b in law.budgets)
        lines.append(f"  {arch:<18} c = {law.law.exponent:.3f} [{low:.3f}, {high:.3f}]  budgets {budgets}")
    for arch, why in getattr(report, "state_laws_missing", {}).items():
        lines.append(f"  {arch:<18} none: {why}")
    return lines


def _ladder(report: Any) -> list[str]:
    """Each model's best rate of its learning-rate ladder; < and > mark the ladder's lowest and
    highest rate (a best rate at an end: the ladder does not bracket it)."""
    rows = getattr(report, "ladder", [])
    if not rows:
        return []
    rates = sorted({lr for row in rows for lr in row["losses"]})
    seeds = len({row["seed"] for row in rows}) > 1
    lines = [
        "",
        "Learning-rate ladder: each model's best rate of "
        + ", ".join(f"{lr:.3g}" for lr in rates)
        + " (< its lowest, > its highest: the ladder does not bracket it)",
    ]
    groups: dict[tuple, list[str]] = {}
    for row in rows:
        mark = {"lowest": "<", "highest": ">"}.get(row["edge"], "")
        seed = f" s{row['seed']}" if seeds else ""
        groups.setdefault((row["arch"], row["budget"]), []).append(f"{row['size']}{seed} {row['best_lr']:.3g}{mark}")
    for (arch, budget), cells in groups.items():
        lines.append(f"  {arch:<18} {budget:>8.3g}  " + "  ".join(cells))
    edges = [row for row in rows if row["edge"]]
    lowest = sum(row["edge"] == "lowest" for row in edges)
    lines.append(
        f"  best rate at an end of the ladder: {len(edges)} of {len(rows)} models "
        f"({lowest} at the lowest, {len(edges) - lowest} at the highest)"
    )
    return lines


def render_report(report: Any) -> str:
    """The report as text: optima per group, exponents, parametric fits, state, correlation, problems."""
    lines = [f"study {report.study}: {len(report.points)} of {report.runs_total} models done", ""]
    lines += _isoflops(report)
    if getattr(report, "optima_by_convention", None):
        lines += _conventions(report)
    if report.frontiers:
        lines += _frontiers(report)
    if report.parametric:
        lines += _parametric(report)
    if report.state:
        lines += ["", "State-optimal: compute-optimal loss against total state at N*"]
        for s in report.state:
            lines.append(f"  {s.arch:<18} {s.budget:>8.3g}  state {s.state:>10.4g}  loss* {s.loss:.4f}")
    lines += _state_laws(report)
    lines += _ladder(report)
    spread = getattr(report, "seed_spread", [])
    if spread:
        lines += ["", "Seed replicates: the compute-optimal loss fitted on each seed's runs alone"]
        for row in spread:
            seeds = ", ".join(f"seed {s}: {loss:.4f}" for s, loss in row["optimal_loss"].items())
            lines.append(
                f"  {row['arch']:<18} {row['budget']:>8.3g}  {seeds}  "
                f"(min {row['min']:.4f}, max {row['max']:.4f}, sd {row['sd']:.4f})"
            )
    if report.correlation is not None:
        lines += _correlation(report)
    for name, c in getattr(report, "group_correlations", {}).items():
        if c is not None:
            lines += _correlation(report, c, name)
    if report.problems:
        lines += ["", "Not fitted:"] + [f"  {p}" for p in report.problems]
    return "\n".join(lines) + "\n"

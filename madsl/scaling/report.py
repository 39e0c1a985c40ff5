"""A study's results, fitted: the IsoFLOP parabolas and optima, the frontiers N*(C) and D*(C)
with bootstrap intervals, the parametric fit L(N, D), the state-optimal view and the MAD
correlation, as data (`study_report`), text, records (json, csv) and figures.

What cannot be fitted is said, not hidden: an IsoFLOP group whose curve has no minimum, an
architecture with too few budgets for a frontier, too few architectures with MAD scores for a
correlation, each lands in `StudyReport.problems` with the reason, and the rest is fitted.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from madsl.errors import MadslError, option
from madsl.runner.store.results import DEFAULT_DB


@dataclass
class StudyReport:
    study: str
    points: list[Any]  # ScalePoint
    isoflops: list[Any] = field(default_factory=list)  # IsoFlopFit, by arch then budget
    frontiers: dict[str, Any] = field(default_factory=dict)  # arch -> Frontier
    parametric: dict[str, Any] = field(default_factory=dict)  # arch -> ParametricFit
    state: list[Any] = field(default_factory=list)  # StateOptimum
    correlation: Any = None  # Correlation, or None
    mad_scores: dict[str, float] = field(default_factory=dict)  # arch -> MAD score (where the store has one)
    bits_per_byte: dict[str, float] = field(default_factory=dict)  # run label -> bpb, for byte-level data
    problems: list[str] = field(default_factory=list)
    runs_total: int = 0


def _try(report: StudyReport, what: str | None, make: Any) -> Any:
    """`make()`, or None with its error noted under `what` (None: the error names what it is about)."""
    try:
        return make()
    except MadslError as err:
        report.problems.append((f"{what}: " if what else "") + err.message + (f" ({err.hint})" if err.hint else ""))
        return None


def _mad_scores(plan: Any, mad_db: str | os.PathLike) -> dict[str, float]:
    """Each architecture's MAD score in `mad_db`: the spec as the study names it, scored by `madsl eval`."""
    from madsl.runner.reports.outputs import load_scores

    if not Path(mad_db).exists():  # (a --mad-db given is checked before the work: check_report_inputs)
        return {}
    scores = {s.spec_hash: s.score for s in load_scores(mad_db) if s.score is not None}
    found = {}
    for arch, spec in plan.study.architectures.items():
        if spec.hash in scores:
            found[arch] = scores[spec.hash]
    return found


def _correlation(report: StudyReport, budget: float | None, resamples: int, seed: int) -> None:
    from madsl.scaling.correlation import compute_optimal_perplexities, correlate_mad

    fitted_budgets = sorted({f.budget for f in report.isoflops if f.arch in report.mad_scores})
    if budget is None:  # the largest budget where every scored architecture has an optimum
        complete = [
            b for b in fitted_budgets if {f.arch for f in report.isoflops if f.budget == b} >= set(report.mad_scores)
        ]
        budget = complete[-1] if complete else (fitted_budgets[-1] if fitted_budgets else None)
    if budget is None:
        report.problems.append("MAD correlation: no architecture has both a MAD score and an IsoFLOP optimum")
        return
    perplexities = compute_optimal_perplexities([f for f in report.isoflops if f.arch in report.mad_scores], budget)
    scores = {a: s for a, s in report.mad_scores.items() if a in perplexities}
    report.correlation = _try(
        report,
        f"MAD correlation at {budget:.3g} FLOPs",
        lambda: correlate_mad(scores, perplexities, budget=budget, resamples=resamples, seed=seed),
    )


def check_report_inputs(db: str | os.PathLike, mad_db: str | os.PathLike | None = None) -> None:
    """The results database (and a MAD database named apart) read before any work: each must be
    a madsl results database (madsl.runner.store.database.check_database; nothing is changed)."""
    from madsl.runner.store.database import check_database

    if not Path(db).exists() and not Path(db).is_symlink():
        raise MadslError(f"no results database at {db}", hint="run `madsl scale STUDY.yaml --db PATH` first")
    check_database(db, create=False)
    if mad_db is not None:
        check_database(mad_db, create=False)


def _fit_architectures(
    report: StudyReport, points: list, fitted: set[tuple[str, float]], resamples: int, seed: int
) -> None:
    """Each architecture's frontier (from its optima inside the sizes trained, `fitted`) and its
    parametric fit, into `report` (a fit that fails: a problem of the report)."""
    from madsl.scaling import fits
    from madsl.scaling.parametric import fit_parametric

    for arch in sorted({p.arch for p in points}):
        usable = [p for p in points if p.arch == arch and (arch, p.budget) in fitted]
        budgets = len({p.budget for p in usable})
        if budgets < 2:
            report.problems.append(
                f"{arch} frontier: needs optima inside the sizes at 2 budgets or more, has {budgets}"
            )
        else:
            frontier = _try(
                report, f"{arch} frontier", lambda u=usable: fits.fit_frontier(u, resamples=resamples, seed=seed)
            )
            if frontier is not None:
                report.frontiers[arch] = frontier
        mine = [p for p in points if p.arch == arch]
        parametric = _try(report, f"{arch} parametric fit", lambda m=mine: fit_parametric(m))
        if parametric is not None:
            report.parametric[arch] = parametric


def study_report(
    study_path: str | os.PathLike,
    db: str | os.PathLike = DEFAULT_DB,
    *,
    mad_db: str | os.PathLike | None = None,
    budget: float | None = None,
    resamples: int = 1000,
    seed: int = 0,
) -> StudyReport:
    """Fit a study's finished runs in `db`; MAD scores are read from `mad_db` (default: `db`).
    A finished run whose stored loss is no loss (text, 0, infinite, ...) is left out and named
    in `problems` (madsl.scaling.api.study_points)."""
    from madsl.scaling import fits
    from madsl.scaling.api import plan_study_file, study_points

    check_report_inputs(db, mad_db)
    plan = plan_study_file(study_path, db)
    problems: list[str] = []
    points = study_points(plan, db, problems)
    # a model (architecture, budget, size) is one point however many runs its ladder and seeds make
    models = len({(run.arch, run.budget, run.size) for run in plan.runs})
    report = StudyReport(plan.study.name, points, runs_total=models, problems=problems)
    for point in points:
        bpb = plan.tokens.bits_per_byte(point.loss)
        if bpb is not None:
            report.bits_per_byte[f"{point.arch} {point.params:.3g} @ {point.budget:.3g}"] = bpb
    groups: dict[tuple[str, float], list] = {}
    for point in points:
        groups.setdefault((point.arch, point.budget), []).append(point)
    for (arch, budget_flops), group in sorted(groups.items()):
        fit = _try(report, None, lambda g=group: fits.fit_isoflop(g))
        if fit is not None:
            report.isoflops.append(fit)
    # frontiers and the state-optimal view use the optima inside the sizes trained: an extrapolated
    # minimum (the parabola's vertex beyond the sizes) is not a measurement of N*(C)
    fitted = {(f.arch, f.budget) for f in report.isoflops if f.bracketed}
    for f in report.isoflops:
        if not f.bracketed:
            report.problems.append(
                f"{f.arch} at {f.budget:.3g} FLOPs: the optimum {f.optimal_params:.3g} lies "
                "outside the sizes trained; left out of the frontier and the state-optimal "
                "view (add sizes on that side)"
            )
    _fit_architectures(report, points, fitted, resamples, seed)
    usable = [p for p in points if (p.arch, p.budget) in fitted]
    report.state = (_try(report, "state-optimal view", lambda: fits.state_optima(usable)) or []) if usable else []
    report.mad_scores = _mad_scores(plan, mad_db or db)
    if len(report.mad_scores) >= 3:
        _correlation(report, budget, resamples, seed)
    else:
        report.problems.append(
            f"MAD correlation: {len(report.mad_scores)} of the study's architectures have a MAD "
            "score in the results database (needs 3): score them with `madsl eval` on the "
            "same spec files and --db"
        )
    return report


def report_records(report: StudyReport) -> dict[str, Any]:
    """Everything in the report as plain data (the json format)."""

    def plain(value: Any) -> Any:
        return asdict(value) if value is not None and hasattr(value, "__dataclass_fields__") else value

    return {
        "study": report.study,
        "runs_done": len(report.points),
        "runs_total": report.runs_total,
        "points": [plain(p) for p in report.points],
        "isoflops": [plain(f) for f in report.isoflops],
        "frontiers": {a: plain(f) for a, f in report.frontiers.items()},
        "parametric": {a: plain(f) for a, f in report.parametric.items()},
        "state_optimal": [plain(s) for s in report.state],
        "mad_scores": report.mad_scores,
        "correlation": plain(report.correlation),
        "bits_per_byte": report.bits_per_byte,
        "problems": report.problems,
    }


def report_rows(report: StudyReport) -> list[dict[str, Any]]:
    """One row per finished run, with its group's optimum (the csv format)."""
    optimum = {(f.arch, f.budget): f for f in report.isoflops}
    rows = []
    for p in sorted(report.points, key=lambda p: (p.arch, p.budget, p.params)):
        fit = optimum.get((p.arch, p.budget))
        rows.append(
            {
                "arch": p.arch,
                "budget": p.budget,
                "params": p.params,
                "tokens": p.tokens,
                "loss": p.loss,
                "perplexity": perplexity(p.loss),
                "state": p.state,
                "optimal_params": fit.optimal_params if fit else None,
                "optimal_loss": fit.optimal_loss if fit else None,
                "mad_score": report.mad_scores.get(p.arch),
            }
        )
    return rows


def perplexity(loss: float) -> float | None:
    """exp(loss), or None where it overflows a float (a loss above ~709 nats)."""
    try:
        return math.exp(loss)
    except OverflowError:
        return None


def _ppl(loss: float, width: int) -> str:
    value = perplexity(loss)
    return f"{value:>{width}.3f}" if value is not None else f"{'?':>{width}}"


def render_report(report: StudyReport) -> str:
    """The report as text: optima per group, exponents, parametric fits, state, correlation, problems."""
    lines = [
        f"study {report.study}: {len(report.points)} of {report.runs_total} models done",
        "",
        "IsoFLOP optima (approach 2)",
        f"  {'arch':<18} {'budget':>8} {'N*':>10} {'D*':>11} {'loss*':>7} {'ppl*':>7}  bracketed",
    ]
    for f in report.isoflops:
        lines.append(
            f"  {f.arch:<18} {f.budget:>8.3g} {f.optimal_params:>10.3g} {f.optimal_tokens:>11.3g} "
            f"{f.optimal_loss:>7.4f} {_ppl(f.optimal_loss, 7)}  {'yes' if f.bracketed else 'NO'}"
        )
    if report.frontiers:
        lines += ["", "Frontiers: N* ∝ C^a, D* ∝ C^b (95 % bootstrap intervals)"]
        for arch, f in report.frontiers.items():
            lines.append(
                f"  {arch:<18} a = {f.params.exponent:.3f} [{f.params.interval[0]:.3f}, "
                f"{f.params.interval[1]:.3f}]   b = {f.tokens.exponent:.3f} [{f.tokens.interval[0]:.3f}, "
                f"{f.tokens.interval[1]:.3f}]"
            )
    if report.parametric:
        lines += ["", "Parametric fits: L(N, D) = E + A/N^α + B/D^β (approach 3)"]
        for arch, f in report.parametric.items():
            lines.append(f"  {arch:<18} E {f.E:.3f}  A {f.A:.4g}  B {f.B:.4g}  α {f.alpha:.3f}  β {f.beta:.3f}")
    if report.state:
        lines += ["", "State-optimal: compute-optimal loss against total state at N*"]
        for s in report.state:
            lines.append(f"  {s.arch:<18} {s.budget:>8.3g}  state {s.state:>10.4g}  loss* {s.loss:.4f}")
    if report.correlation is not None:
        c = report.correlation
        lines += [
            "",
            f"MAD score vs compute-optimal perplexity at {c.budget:.3g} FLOPs ({len(c.archs)} architectures)",
            f"  Pearson r {c.pearson:.3f} [{c.pearson_interval[0]:.3f}, {c.pearson_interval[1]:.3f}]   "
            f"Spearman ρ {c.spearman:.3f} [{c.spearman_interval[0]:.3f}, {c.spearman_interval[1]:.3f}]",
        ]
        for arch, score, ppl in zip(c.archs, c.scores, c.perplexities):
            lines.append(f"  {arch:<18} MAD {score:.3f}  ppl* {ppl:.3f}")
    if report.problems:
        lines += ["", "Not fitted:"] + [f"  {p}" for p in report.problems]
    return "\n".join(lines) + "\n"


FIGURES = ("isoflops.png", "frontier.png", "state_optimal.png", "correlation.png")


def check_figures_folder(folder: str | os.PathLike, force: bool = True) -> Path:
    """The folder the figures go into, checked before the work (madsl.outputs.check_output_dir):
    not a file, writable, a figure's name there a regular file; other entries only with `force`."""
    from madsl.outputs import check_output_dir

    return check_output_dir(
        folder,
        option("plot"),
        lambda name: name in FIGURES,
        force=force,
        writes="the study's figures (" + ", ".join(FIGURES) + ")",
    )


def write_figures(report: StudyReport, folder: str | os.PathLike) -> list[Path]:
    """The four figures (IsoFLOP curves, frontier, state-optimal, correlation) that have data, into `folder`."""
    from madsl.outputs import output_error
    from madsl.scaling import figures

    folder = check_figures_folder(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise output_error(err, folder, option("plot")) from None
    written = []
    if report.isoflops:
        written.append(figures.plot_isoflops(report.isoflops, folder / "isoflops.png"))
    if report.frontiers:
        written.append(figures.plot_frontier(report.frontiers, folder / "frontier.png"))
    if report.state:
        written.append(figures.plot_state_optimal(report.state, folder / "state_optimal.png"))
    if report.correlation is not None:
        written.append(figures.plot_correlation(report.correlation, folder / "correlation.png"))
    return written

"""A study's results, fitted: the IsoFLOP parabolas and optima, the frontiers N*(C) and D*(C)
with bootstrap intervals, the parametric fit L(N, D) with bootstrap intervals, the state-optimal
view and the MAD correlation (permutation tests, BCa intervals where n allows; over all the scored
architectures and over each of the study's pre-registered groups), each optimum's N* under the
three conventions of N and the seed replicates' spread (madsl.scaling.optima), as data
(`study_report`), text, records (json, csv) and figures. The runs come from the results database
or from a runs file (madsl.scaling.raw_runs), the MAD scores from a database or a scores file.

What cannot be fitted is said, not hidden: an IsoFLOP group whose curve has no minimum, an
architecture with too few budgets for a frontier, too few architectures with MAD scores for a
correlation, an optimum outside the sizes trained (extrapolated: left out of the frontier, the
state-optimal view and the MAD correlation), each lands in `StudyReport.problems` with the
reason, and the rest is fitted.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from madsl.errors import MadslError, option
from madsl.runner.store.results import DEFAULT_DB
from madsl.scaling.optima import seed_spread  # noqa: F401 (tests read it here)
from madsl.scaling.report_text import perplexity, render_report  # noqa: F401 (madsl.cli.report reads it here)

PARAMETRIC_RESAMPLES = 200  # the parametric fit's bootstrap: about 5 ms a resample, a second an architecture


@dataclass
class StudyReport:
    study: str
    points: list[Any]  # ScalePoint
    isoflops: list[Any] = field(default_factory=list)  # IsoFlopFit, by arch then budget
    frontiers: dict[str, Any] = field(default_factory=dict)  # arch -> Frontier
    parametric: dict[str, Any] = field(default_factory=dict)  # arch -> ParametricFit
    state: list[Any] = field(default_factory=list)  # StateOptimum
    correlation: Any = None  # Correlation, or None
    correlation_left_out: dict[str, str] = field(default_factory=dict)  # scored arch -> why it is not in it
    # the study's pre-registered groups (a design chain): name -> Correlation over its architectures (None: too few)
    group_correlations: dict[str, Any] = field(default_factory=dict)
    seed_spread: list[dict[str, Any]] = field(default_factory=list)  # madsl.scaling.optima.seed_spread's rows
    ladder: list[dict[str, Any]] = field(default_factory=list)  # madsl.scaling.optima.learning_rate_ladder's rows
    state_laws: dict[str, Any] = field(default_factory=dict)  # arch -> StateLaw (P* ∝ M*^c)
    state_laws_missing: dict[str, str] = field(default_factory=dict)  # arch -> why it has no state law
    params: str = "total"  # the convention of N the points, frontiers and parametric fits use
    optima_by_convention: list[dict[str, Any]] = field(default_factory=list)  # optima.optima_by_convention's rows
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


def export_raw(
    study_path: str | os.PathLike,
    db: str | os.PathLike,
    mad_db: str | os.PathLike | None,
    runs_path: str | os.PathLike | None,
    scores_path: str | os.PathLike | None,
) -> list[Path]:
    """The study's raw data from its databases into files (madsl.scaling.raw_runs): every run with
    a stored result into `runs_path`, the MAD scores into `scores_path` (each where given)."""
    from madsl.scaling import raw_runs
    from madsl.scaling.api import plan_study_file, stored_runs

    check_report_inputs(db, mad_db)
    plan = plan_study_file(study_path, db)
    written = []
    if runs_path is not None:
        written.append(raw_runs.write_runs_csv(plan, stored_runs(plan, db), runs_path))
    if scores_path is not None:
        written.append(raw_runs.write_scores_csv(plan, _mad_scores(plan, mad_db or db), scores_path))
    return written


def _correlation_budget(report: StudyReport, budget: float | None) -> float | None:
    """The budget the MAD correlation is taken at: `budget`, or the largest of those with the most
    scored architectures whose optimum lies inside the sizes trained (None: there is none)."""
    if budget is not None:
        return budget
    bracketed: dict[float, int] = {}
    for fit in report.isoflops:
        if fit.arch in report.mad_scores and fit.bracketed:
            bracketed[fit.budget] = bracketed.get(fit.budget, 0) + 1
    return max(bracketed, key=lambda b: (bracketed[b], b)) if bracketed else None


def add_mad_correlation(
    report: StudyReport, budget: float | None = None, *, resamples: int = 1000, seed: int = 0
) -> None:
    """The MAD correlation of `report.mad_scores` at `budget` (default: _correlation_budget) into
    `report.correlation`, of the scored architectures whose optimum there lies inside the sizes
    trained: an extrapolated optimum is the parabola's vertex beyond the data, not a measured loss.
    The others are left out and named in `problems` and `correlation_left_out`."""
    from madsl.scaling.correlation import compute_optimal_perplexities, correlate_mad

    scored = [f for f in report.isoflops if f.arch in report.mad_scores]
    budget = _correlation_budget(report, budget)
    if budget is None:
        report.problems.append(
            "MAD correlation: no scored architecture has an IsoFLOP optimum inside its sizes trained at "
            "any budget (every optimum is extrapolated or missing): add sizes around the minima"
        )
        return
    perplexities = compute_optimal_perplexities(scored, budget)
    at_budget = {f.arch: f for f in scored if f.budget == budget}
    for arch in sorted(set(report.mad_scores) - set(perplexities)):
        fit = at_budget.get(arch)
        report.correlation_left_out[arch] = (
            f"its optimum (N* {fit.optimal_params:.3g}, loss* {fit.optimal_loss:.4f}) lies outside the "
            "sizes trained: extrapolated, not measured"
            if fit is not None
            else "no IsoFLOP optimum at this budget"
        )
        report.problems.append(
            f"MAD correlation at {budget:.3g} FLOPs: {arch} left out: {report.correlation_left_out[arch]}"
        )
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
    report: StudyReport,
    points: list,
    fitted: set[tuple[str, float]],
    resamples: tuple[int, int],
    seed: int,
) -> None:
    """Each architecture's frontier (from its optima inside the sizes trained, `fitted`) and its
    parametric fit, with `resamples` (frontier, parametric) bootstrap resamples, into `report`
    (a fit that fails: a problem of the report)."""
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
                report, f"{arch} frontier", lambda u=usable: fits.fit_frontier(u, resamples=resamples[0], seed=seed)
            )
            if frontier is not None:
                report.frontiers[arch] = frontier
        mine = [p for p in points if p.arch == arch]
        parametric = _try(
            report,
            f"{arch} parametric fit",
            lambda m=mine: fit_parametric(m, resamples=resamples[1], seed=seed),
        )
        if parametric is not None:
            report.parametric[arch] = parametric


def study_report(
    study_path: str | os.PathLike,
    db: str | os.PathLike = DEFAULT_DB,
    *,
    mad_db: str | os.PathLike | None = None,
    budget: float | None = None,
    runs: str | os.PathLike | None = None,
    mad_scores: str | os.PathLike | None = None,
    params: str = "total",
    resamples: int = 1000,
    seed: int = 0,
    parametric_resamples: int = PARAMETRIC_RESAMPLES,
) -> StudyReport:
    """Fit a study's finished runs in `db`; MAD scores are read from `mad_db` (default: `db`).
    `resamples` bootstrap resamples give the frontiers' and the MAD correlation's intervals,
    `parametric_resamples` those of the parametric fits (0: none). A finished run whose stored
    loss is no loss (text, 0, infinite, ...) is left out and named in `problems`
    (madsl.scaling.api.study_points). `runs` and `mad_scores`: the study's raw data as files
    (madsl.scaling.raw_runs) in place of the databases: a refit with no database. `params`: the
    convention of N the fits use (madsl.scaling.optima.CONVENTIONS); N* is also given under each."""
    from madsl.scaling import fits, raw_runs
    from madsl.scaling.api import plan_study_file, stored_runs, study_points, study_points_by_seed
    from madsl.scaling.optima import CONVENTIONS, check_convention, learning_rate_ladder, optima_by_convention
    from madsl.scaling.state_law import fit_state_laws

    check_convention(params)
    if runs is None:
        check_report_inputs(db, mad_db)
    plan = plan_study_file(study_path, db)
    problems: list[str] = []
    stored = raw_runs.read_runs_csv(plan, runs) if runs is not None else stored_runs(plan, db)
    points = study_points(plan, db, problems, stored, params)
    # a model (architecture, budget, size) is one point however many runs its ladder and seeds make
    models = len({(run.arch, run.budget, run.size) for run in plan.runs})
    report = StudyReport(plan.study.name, points, runs_total=models, problems=problems, params=params)
    report.bits_per_byte = _bits_per_byte(plan, points)
    report.seed_spread = seed_spread(study_points_by_seed(plan, db, stored, params))
    report.optima_by_convention = optima_by_convention(
        {c: points if c == params else study_points(plan, db, None, stored, c) for c in CONVENTIONS}
    )
    fitted = _fit_isoflops(report, points)
    _fit_architectures(report, points, fitted, (resamples, parametric_resamples), seed)
    usable = [p for p in points if (p.arch, p.budget) in fitted]
    report.state = (_try(report, "state-optimal view", lambda: fits.state_optima(usable)) or []) if usable else []
    report.state_laws, report.state_laws_missing = fit_state_laws(points, resamples=resamples, seed=seed)
    report.ladder = learning_rate_ladder(list(zip(plan.runs, plan.run_ids)), stored)
    report.mad_scores = (
        raw_runs.read_scores_csv(plan, mad_scores) if mad_scores is not None else _mad_scores(plan, mad_db or db)
    )
    _correlate(report, budget, resamples, seed, plan.study.groups)
    return report


def _fit_isoflops(report: StudyReport, points: list[Any]) -> set[tuple[str, float]]:
    """Each IsoFLOP group's parabola into `report.isoflops` (one that fails: a problem); the
    (arch, budget) groups whose optimum lies inside the sizes trained."""
    from madsl.scaling import fits

    groups: dict[tuple[str, float], list] = {}
    for point in points:
        groups.setdefault((point.arch, point.budget), []).append(point)
    for _, group in sorted(groups.items()):
        fit = _try(report, None, lambda g=group: fits.fit_isoflop(g))
        if fit is not None:
            report.isoflops.append(fit)
    # frontiers and the state-optimal view use the optima inside the sizes trained: an extrapolated
    # minimum (the parabola's vertex beyond the sizes) is not a measurement of N*(C)
    for f in report.isoflops:
        if not f.bracketed:
            report.problems.append(
                f"{f.arch} at {f.budget:.3g} FLOPs: the optimum {f.optimal_params:.3g} lies "
                "outside the sizes trained (extrapolated); left out of the frontier, the "
                "state-optimal view and the MAD correlation (add sizes on that side)"
            )
    return {(f.arch, f.budget) for f in report.isoflops if f.bracketed}


def _bits_per_byte(plan: Any, points: list[Any]) -> dict[str, float]:
    """Each point's loss in bits per byte, where the data is byte-level (run label -> bpb)."""
    out = {}
    for point in points:
        bpb = plan.tokens.bits_per_byte(point.loss)
        if bpb is not None:
            out[f"{point.arch} {point.params:.3g} @ {point.budget:.3g}"] = bpb
    return out


def _group_correlation(report: StudyReport, name: str, members: tuple[str, ...], resamples: int, seed: int) -> Any:
    """The MAD correlation over a group's architectures, at the budget and with the architectures
    of the correlation over all (so the same ones are left out, for the same reasons)."""
    from madsl.scaling.correlation import correlate_mad

    c = report.correlation
    inside = [arch for arch in c.archs if arch in members]
    if len(inside) < 3:
        report.problems.append(
            f"MAD correlation of group {name}: {len(inside)} of its {len(members)} architectures are scored "
            "with an optimum inside their sizes (needs 3)"
        )
        return None
    scores = {a: s for a, s in zip(c.archs, c.scores) if a in inside}
    perplexities = {a: p for a, p in zip(c.archs, c.perplexities) if a in inside}
    return _try(
        report,
        f"MAD correlation of group {name}",
        lambda: correlate_mad(scores, perplexities, budget=c.budget, resamples=resamples, seed=seed),
    )


def _correlate(
    report: StudyReport, budget: float | None, resamples: int, seed: int, groups: dict[str, tuple[str, ...]]
) -> None:
    """The MAD correlation where at least 3 architectures are scored (and over each of the study's
    groups), else why not."""
    if len(report.mad_scores) >= 3:
        add_mad_correlation(report, budget, resamples=resamples, seed=seed)
        for name, members in groups.items() if report.correlation is not None else ():
            report.group_correlations[name] = _group_correlation(report, name, members, resamples, seed)
    else:
        report.problems.append(
            f"MAD correlation: {len(report.mad_scores)} of the study's architectures have a MAD "
            "score in the results database (needs 3): score them with `madsl eval` on the "
            "same spec files and --db"
        )


def report_records(report: StudyReport) -> dict[str, Any]:
    """Everything in the report as plain data (the json format)."""

    def plain(value: Any) -> Any:
        return asdict(value) if value is not None and hasattr(value, "__dataclass_fields__") else value

    return {
        "study": report.study,
        "runs_done": len(report.points),
        "runs_total": report.runs_total,
        "params_convention": report.params,
        "points": [plain(p) for p in report.points],
        "isoflops": [{**plain(f), "extrapolated": not f.bracketed} for f in report.isoflops],
        "optima_by_convention": report.optima_by_convention,
        "frontiers": {a: plain(f) for a, f in report.frontiers.items()},
        "parametric": {a: plain(f) for a, f in report.parametric.items()},
        "state_optimal": [plain(s) for s in report.state],
        "state_laws": {a: plain(law) for a, law in report.state_laws.items()},
        "learning_rate_ladder": report.ladder,
        "mad_scores": report.mad_scores,
        "correlation": plain(report.correlation),
        "correlation_left_out": report.correlation_left_out,
        "group_correlations": {name: plain(c) for name, c in report.group_correlations.items()},
        "seed_spread": report.seed_spread,
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
                "optimum_extrapolated": (not fit.bracketed) if fit else None,
            }
        )
    return rows


FIGURES = ("isoflops.png", "frontier.png", "state_optimal.png", "correlation.png", "ladder.png")


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
    """The figures (IsoFLOP curves, frontier, state-optimal, correlation, learning-rate ladder) that
    have data, into `folder`."""
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
    if report.ladder:
        written.append(figures.plot_ladder(report.ladder, folder / "ladder.png"))
    return written

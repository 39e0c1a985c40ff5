"""Figures of the scaling-law fits, drawn like the MAD paper's (needs matplotlib: madsl[plot]).

    plot_isoflops        validation loss against parameters, one colour per IsoFLOP budget and one
                         panel per architecture: points, fitted parabola, optimum (Fig. 4.1, top)
    plot_frontier        N*(C) and D*(C) against training FLOPs, log-log, with each architecture's
                         power law, its bootstrap band shaded and its exponent's interval in the
                         legend (Fig. 4.1, bottom)
    plot_state_optimal   compute-optimal loss against total state, one colour per architecture and
                         one marker per budget (Fig. 4.3, right)
    plot_ladder          final loss against learning rate, one panel per architecture and one line
                         per size, each size's best rate ringed: where the best sits at an end, the
                         ladder does not bracket it
    plot_correlation     MAD score against compute-optimal perplexity; r, rho and tau with their
                         one-sided permutation p-values (and BCa intervals where computed) in the
                         title (Fig. 5.1)

Each takes the results of madsl.scaling.fits (or .correlation) and a path, writes the figure in
the format the suffix names (.png, .pdf, .svg) through a temporary file, and returns the path.
matplotlib is imported when a figure is drawn, on the Agg backend. An optimum outside the sizes
measured (an extrapolation) is drawn hollow.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from madsl.errors import MadslError
from madsl.scaling.correlation import Correlation
from madsl.scaling.fits import Frontier, IsoFlopFit, PowerLaw, StateOptimum

FIGURE_SUFFIXES = (".png", ".pdf", ".svg")
BUDGET_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
LOSS_LABEL = "validation loss (nats/token)"


def _pyplot(path: str | os.PathLike) -> tuple[object, Path]:
    """matplotlib.pyplot on the Agg backend, and the path, once its suffix names a format we write."""
    from madsl.runner.reports.plots import pyplot

    path = Path(path)
    if path.suffix.lower() not in FIGURE_SUFFIXES:
        raise MadslError(
            f"{path}: cannot write a {path.suffix or 'suffix-less'} figure",
            expected="a file ending in " + ", ".join(FIGURE_SUFFIXES),
        )
    return pyplot("a scaling figure"), path


def _save(plt, fig, path: Path) -> Path:
    from madsl.runner.reports.plots import save_atomic

    try:
        if fig.get_layout_engine() is None:
            fig.tight_layout()
        return save_atomic(fig, path, dpi=150)
    finally:
        plt.close(fig)


def _flops(budget: float) -> str:
    """1e+19 → '1e19', 2.5e+20 → '2.5e20': budgets as the paper writes them."""
    mantissa, exponent = f"{budget:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _budget_colours(plt, budgets: Iterable[float]) -> dict[float, object]:
    budgets = sorted(set(budgets))
    return {b: plt.cm.viridis(0.9 * i / max(1, len(budgets) - 1)) for i, b in enumerate(budgets)}


def _panels(plt, count: int, width: float = 4.6, height: float = 3.6):
    columns = min(3, count)
    rows = math.ceil(count / columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(width * columns, height * rows + 0.5), squeeze=False, layout="constrained"
    )
    for ax in axes.ravel()[count:]:
        ax.set_visible(False)
    return fig, list(axes.ravel()[:count])


def _optimum_marker(ax, x: float, y: float, colour, bracketed: bool, marker: str = "*", size: float = 14) -> None:
    """An optimum: filled where it lies within the sizes measured, hollow where it is extrapolated."""
    ax.plot(
        [x],
        [y],
        marker=marker,
        markersize=size,
        linestyle="none",
        markeredgecolor=colour,
        markerfacecolor=colour if bracketed else "none",
        markeredgewidth=1.4,
        zorder=4,
    )


EXTRAPOLATED_SPAN = 3.0  # how far beyond the sizes measured an IsoFLOP panel draws a curve


def plot_isoflops(fits: Sequence[IsoFlopFit], path: str | os.PathLike) -> Path:
    """The IsoFLOP curves: per architecture a panel of loss against N, per budget its points,
    fitted parabola and optimum (a star; hollow where it lies outside the sizes measured, left out
    where it lies more than EXTRAPOLATED_SPAN beyond them)."""
    if not fits:
        raise MadslError("no IsoFLOP fits to plot")
    plt, path = _pyplot(path)
    archs = sorted({fit.arch for fit in fits})
    colours = _budget_colours(plt, (fit.budget for fit in fits))
    fig, axes = _panels(plt, len(archs))
    for ax, arch in zip(axes, archs):
        for fit in sorted((f for f in fits if f.arch == arch), key=lambda f: f.budget):
            colour = colours[fit.budget]
            sizes = [p.params for p in fit.points]
            ax.scatter(sizes, [p.loss for p in fit.points], color=colour, s=18, zorder=3)
            # an extrapolated optimum far beyond the sizes would squash the panel: the curve goes at
            # most EXTRAPOLATED_SPAN beyond them, and an optimum past that is not drawn (the report lists it)
            reach = (min(sizes) / EXTRAPOLATED_SPAN, max(sizes) * EXTRAPOLATED_SPAN)
            shown = reach[0] <= fit.optimal_params <= reach[1]
            ends = sizes + ([fit.optimal_params] if shown else [])
            curve = np.logspace(math.log10(min(ends)) - 0.05, math.log10(max(ends)) + 0.05, 120)
            ax.plot(curve, fit.predict(curve), color=colour, linewidth=1.2)
            if shown:
                _optimum_marker(ax, fit.optimal_params, fit.optimal_loss, colour, fit.bracketed)
        ax.set_xscale("log")
        ax.set_title(arch)
        ax.set_xlabel("parameters N")
        ax.set_ylabel(LOSS_LABEL)
        ax.grid(True, which="both", alpha=0.25)
    handles = [plt.Line2D([], [], color=colour, marker="o", markersize=4) for colour in colours.values()]
    handles.append(plt.Line2D([], [], marker="*", markersize=10, color="grey", linestyle="none"))
    labels = [f"{_flops(budget)} FLOPs" for budget in colours] + ["optimum N* (hollow: extrapolated)"]
    fig.legend(
        handles,
        labels,
        loc="outside lower center",
        ncol=min(len(labels), 5),
        fontsize=8,
        title="IsoFLOP budget",
        title_fontsize=8,
    )
    return _save(plt, fig, path)


def _law_label(arch: str, law: PowerLaw, symbol: str) -> str:
    low, high = law.interval
    interval = "n/a" if math.isnan(low) else f"{low:.3f}, {high:.3f}"
    return f"{arch}: {symbol} = {law.exponent:.3f} [{interval}]"


def plot_frontier(frontiers: Mapping[str, Frontier] | Sequence[Frontier], path: str | os.PathLike) -> Path:
    """The compute-optimal frontier: N*(C) (left) and D*(C) (right) against training FLOPs, log-log,
    each architecture's optima and its power law, shaded by its pointwise bootstrap band, the
    exponent with its interval in the legend."""
    frontiers = list(frontiers.values()) if isinstance(frontiers, Mapping) else list(frontiers)
    if not frontiers:
        raise MadslError("no frontiers to plot")
    plt, path = _pyplot(path)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, frontier in enumerate(sorted(frontiers, key=lambda f: f.arch)):
        colour = plt.cm.tab10(i % 10)
        budgets = np.array([fit.budget for fit in frontier.optima])
        line = np.logspace(math.log10(budgets.min()), math.log10(budgets.max()), 50)
        for ax, law, symbol, values in (
            (left, frontier.params, "a", [fit.optimal_params for fit in frontier.optima]),
            (right, frontier.tokens, "b", [fit.optimal_tokens for fit in frontier.optima]),
        ):
            ax.plot(line, law(line), color=colour, linewidth=1.3, label=_law_label(frontier.arch, law, symbol))
            if law.band:
                band = np.array(law.band)
                ax.fill_between(band[:, 0], band[:, 1], band[:, 2], color=colour, alpha=0.15, linewidth=0)
            for fit, value in zip(frontier.optima, values):
                _optimum_marker(ax, fit.budget, value, colour, fit.bracketed, marker="o", size=7)
    level = f"{round(100 * frontiers[0].level)}% bootstrap interval"
    for ax, what, law in ((left, "optimal parameters N*", "N* ∝ C^a"), (right, "optimal tokens D*", "D* ∝ C^b")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("training compute C (FLOPs)")
        ax.set_ylabel(what)
        ax.set_title(f"{law}  (exponent [{level}]; shaded: the line's pointwise band)", fontsize=9)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7)
    return _save(plt, fig, path)


def plot_state_optimal(optima: Sequence[StateOptimum], path: str | os.PathLike) -> Path:
    """The state-optimal view: each architecture's compute-optimal loss against the total state
    (elements) of its compute-optimal model, one marker per budget, the budgets joined by a line."""
    if not optima:
        raise MadslError("no state optima to plot")
    plt, path = _pyplot(path)
    budgets = sorted({o.budget for o in optima})
    if len(budgets) > len(BUDGET_MARKERS):
        raise MadslError(
            f"{len(budgets)} budgets: the state-optimal figure has markers for {len(BUDGET_MARKERS)}",
            hint="plot a subset of the budgets",
        )
    markers = dict(zip(budgets, BUDGET_MARKERS))
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for i, arch in enumerate(sorted({o.arch for o in optima})):
        colour = plt.cm.tab10(i % 10)
        mine = sorted((o for o in optima if o.arch == arch), key=lambda o: o.budget)
        ax.plot([o.state for o in mine], [o.loss for o in mine], color=colour, linewidth=1, label=arch)
        for o in mine:
            ax.plot(
                [o.state],
                [o.loss],
                marker=markers[o.budget],
                color=colour,
                linestyle="none",
                markerfacecolor=colour if o.bracketed else "none",
                markersize=7,
            )
    first = ax.legend(fontsize=7, title="architecture", title_fontsize=7, loc="upper right")
    ax.add_artist(first)
    handles = [plt.Line2D([], [], marker=markers[b], color="grey", linestyle="none") for b in budgets]
    ax.legend(
        handles, [f"{_flops(b)} FLOPs" for b in budgets], fontsize=7, title="budget", title_fontsize=7, loc="lower left"
    )
    ax.set_xscale("log")
    ax.set_xlabel("total state at N* (elements: fixed state + KV cache)")
    ax.set_ylabel("compute-optimal " + LOSS_LABEL)
    ax.set_title("state-optimal scaling")
    ax.grid(True, which="both", alpha=0.25)
    return _save(plt, fig, path)


def _correlation_title(correlation: Correlation) -> str:
    """Each correlation with its one-sided p-value (and BCa interval where computed), and how they were tested."""
    labels = {"pearson": "Pearson r", "spearman": "Spearman ρ", "kendall": "Kendall τ"}
    parts = []
    for name, label in labels.items():
        low, high = getattr(correlation, f"{name}_interval")
        interval = "" if math.isnan(low) or math.isnan(high) else f" [{low:.2f}, {high:.2f}]"
        test = correlation.tests.get(name)
        p = f", p = {test.p_value:.2g}" if test is not None else ""
        parts.append(f"{label} = {getattr(correlation, name):.2f}{interval}{p}")
    how = "exact" if correlation.exact else "Monte Carlo"
    intervals = (
        f"{round(100 * correlation.level)}% BCa intervals" if correlation.interval_method == "BCa" else "no intervals"
    )
    return (
        "\n".join(parts) + f"\n[{len(correlation.archs)} architectures; {how} permutation p, one-sided: "
        f"higher MAD score, lower perplexity; {intervals}]"
    )


def plot_correlation(correlation: Correlation, path: str | os.PathLike) -> Path:
    """MAD score against compute-optimal perplexity, one labelled point per architecture, a
    least-squares line, the correlations with their p-values and intervals in the title."""
    plt, path = _pyplot(path)
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    x, y = np.array(correlation.scores), np.array(correlation.perplexities)
    ax.scatter(x, y, color="tab:blue", zorder=3)
    for arch, score, perplexity in zip(correlation.archs, x, y):
        ax.annotate(arch, (score, perplexity), textcoords="offset points", xytext=(4, 4), fontsize=7)
    slope, intercept = np.polyfit(x, y, 1)
    span = np.linspace(x.min(), x.max(), 2)
    ax.plot(span, slope * span + intercept, color="grey", linestyle="--", linewidth=1)
    ax.set_title(_correlation_title(correlation), fontsize=7)
    ax.set_xlabel("MAD score (mean accuracy over the tasks)")
    at = f" at {_flops(correlation.budget)} FLOPs" if correlation.budget is not None else ""
    ax.set_ylabel("compute-optimal perplexity" + at)
    ax.grid(True, alpha=0.25)
    return _save(plt, fig, path)


def plot_ladder(rows: Sequence[Mapping], path: str | os.PathLike) -> Path:
    """Each model's final loss at each rate of its learning-rate ladder (the rows of
    madsl.scaling.optima.learning_rate_ladder), one panel per architecture and budget, one line per
    size and seed, its best rate ringed."""
    plt, path = _pyplot(path)
    panels: dict[tuple[str, float], list[Mapping]] = {}
    for row in rows:
        panels.setdefault((row["arch"], row["budget"]), []).append(row)
    fig, axes = _panels(plt, len(panels))
    for ax, ((arch, budget), models) in zip(axes, panels.items()):
        colours = plt.cm.viridis(np.linspace(0, 0.9, len(models)))
        for colour, model in zip(colours, models):
            rates = [lr for lr, loss in model["losses"].items() if loss is not None]
            label = f"{model['size']} ({model['params']:,})" + (f" s{model['seed']}" if model["seed"] else "")
            ax.plot(rates, [model["losses"][lr] for lr in rates], "o-", color=colour, markersize=3, label=label)
            ax.plot(model["best_lr"], model["losses"][model["best_lr"]], "o", mfc="none", mec="red", markersize=9)
        ax.set_xscale("log")
        ax.set_title(f"{arch} at {_flops(budget)} FLOPs", fontsize=9)
        ax.set_xlabel("learning rate")
        ax.set_ylabel(LOSS_LABEL, fontsize=8)
        ax.legend(fontsize=6)
        ax.grid(True, alpha=0.25)
    return _save(plt, fig, path)

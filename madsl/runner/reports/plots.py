"""Figures of a results database (needs matplotlib: the `plot` extra, madsl[plot]).

    heatmap   architectures x (tasks + aggregate), like Fig. 3.7 of the MAD paper (`--plot PATH`)
    sweeps    per task, the score against each difficulty knob its runs vary (sequence length,
              training-set size, vocabulary size, noise, tokens to copy, ...), one line per
              architecture: the paper's figure for each task (`--plot-sweeps DIR`, one PNG per task)

Every file is written atomically (a temporary file in the same folder, then renamed), so a
failed or interrupted write leaves the previous file or none, never half a figure.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

from madsl.errors import MadslError, option
from madsl.outputs import write_atomic

PLOT_EXTRA_HINT = "pip install 'madsl[plot]' (matplotlib)"
SETTING_PREFIX = "setting."


def pyplot(option: str):
    """matplotlib.pyplot on a file backend, or a MadslError naming the extra that brings it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MadslError(f"{option} needs matplotlib, which is not installed", hint=PLOT_EXTRA_HINT) from None
    return plt


def save_atomic(fig, path: Path, **savefig_kwargs) -> Path:
    """fig.savefig(path) through a temporary file beside it: readers never see half an image."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image_format = path.suffix.lstrip(".").lower() or "png"
    return write_atomic(path, lambda tmp: fig.savefig(tmp, format=image_format, **savefig_kwargs), suffix=path.suffix)


def heatmap(names: Sequence[str], columns: Sequence[str], values, title: str, path: Path) -> Path:
    """values: len(names) x len(columns) accuracies (NaN: none); the last column is the aggregate."""
    import numpy as np

    plt = pyplot(option("plot"))
    fig, ax = plt.subplots(figsize=(1.3 * len(columns) + 3, 0.45 * len(names) + 1.8))
    try:
        image = ax.imshow(values, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(columns)), list(columns), rotation=35, ha="right")
        ax.set_yticks(range(len(names)), list(names))
        for (i, j), value in np.ndenumerate(values):
            if not np.isnan(value):
                ax.text(
                    j,
                    i,
                    f"{value:.2f}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="black" if value > 0.6 else "white",
                )
        ax.axvline(len(columns) - 1.5, color="white", linewidth=2)
        fig.colorbar(image, ax=ax, label="accuracy")
        ax.set_title(title)
        fig.tight_layout()
        return save_atomic(fig, path, dpi=150)
    finally:
        plt.close(fig)


# --- difficulty sweeps ---------------------------------------------------------------------


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _sort_key(value: Any) -> tuple:
    return (0, float(value), "") if _numeric([value]) else (1, 0.0, json.dumps(value, sort_keys=True))


def sweep_series(
    rows: Sequence[Mapping[str, Any]], knob: str, name_of: Mapping[tuple, str]
) -> list[tuple[str, list[tuple[Any, float]]]]:
    """The lines of one knob's panel: (label, [(knob value, score), ...]) for every architecture
    and every combination of the other knobs under which the knob takes two values or more
    (a one-knob-at-a-time sweep gives one line per architecture: the other knobs at baseline)."""
    column = SETTING_PREFIX + knob
    lines: dict[tuple, dict] = defaultdict(dict)
    for r in rows:
        if column not in r:
            continue
        others = json.dumps(
            {k: v for k, v in r.items() if k.startswith(SETTING_PREFIX) and k != column}, sort_keys=True
        )
        lines[(name_of[_architecture(r)], others)][json.dumps(r[column])] = (r[column], r["score"])
    kept = {key: points for key, points in lines.items() if len(points) >= 2}
    # where the other knobs differ between lines of one architecture (a grid), the label names them
    contexts: dict[str, list[dict]] = defaultdict(list)
    for name, others in kept:
        contexts[name].append(json.loads(others))
    varying = {
        k
        for group in contexts.values()
        if len(group) > 1
        for k in set().union(*group)
        if len({json.dumps(d.get(k)) for d in group}) > 1
    }
    out = []
    for (name, others), points in sorted(kept.items()):
        extra = [
            f"{k[len(SETTING_PREFIX) :]}={v:g}" if _numeric([v]) else f"{k[len(SETTING_PREFIX) :]}={v}"
            for k, v in json.loads(others).items()
            if k in varying
        ]
        label = name + (f" ({', '.join(extra)})" if extra else "")
        out.append((label, sorted(points.values(), key=lambda p: _sort_key(p[0]))))
    return out


def _architecture(row: Mapping[str, Any]) -> tuple:
    return row["spec"], row["spec_hash"], row["protocol"], row["conventions"]


def figure_file_name(task: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", task) + ".png"


def sweep_figures(
    rows: Sequence[Mapping[str, Any]],
    name_of: Mapping[tuple, str],
    task_order: Sequence[str],
    out_dir: Path,
    title_suffix: str = "",
) -> tuple[list[Path], list[str]]:
    """One PNG per task in `out_dir` (setting rows of madsl.runner.reports.tables); returns the files
    written and the tasks left without a figure (no knob took two values for one architecture)."""
    plt = pyplot(option("plot_sweeps"))
    by_task: dict[str, list] = defaultdict(list)
    for r in rows:
        if r["row"] == "setting":
            by_task[r["task"]].append(r)
    order = {t: i for i, t in enumerate(task_order)}
    written, flat = [], []
    for task in sorted(by_task, key=lambda t: (order.get(t, len(order)), t)):
        task_rows = by_task[task]
        knobs = sorted({k[len(SETTING_PREFIX) :] for r in task_rows for k in r if k.startswith(SETTING_PREFIX)})
        panels = [(knob, series) for knob in knobs if (series := sweep_series(task_rows, knob, name_of))]
        if not panels:
            flat.append(task)
            continue
        written.append(
            _task_figure(plt, task, task_rows[0]["metric"], panels, out_dir / figure_file_name(task), title_suffix)
        )
    return written, flat


def _task_figure(plt, task: str, metric: str, panels, path: Path, title_suffix: str) -> Path:
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 1.5, 3.8), squeeze=False)
    try:
        names = sorted({label for _, series in panels for label, _ in series})
        colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(names)}
        for ax, (knob, series) in zip(axes[0], panels):
            values = sorted({json.dumps(x) for _, points in series for x, _ in points})
            xs_all = [json.loads(v) for v in values]
            numeric = _numeric(xs_all)
            positions = {v: i for i, v in enumerate(sorted(values, key=lambda v: _sort_key(json.loads(v))))}
            for label, points in series:
                xs = [x if numeric else positions[json.dumps(x)] for x, _ in points]
                ax.plot(xs, [y for _, y in points], marker="o", label=label, color=colors[label])
            if numeric and min(xs_all) > 0 and max(xs_all) >= 8 * min(xs_all):
                ax.set_xscale("log", base=2)
            if numeric:
                ax.set_xticks(sorted(xs_all), [f"{x:g}" for x in sorted(xs_all)], rotation=30)
                ax.minorticks_off()
            else:
                ax.set_xticks(list(positions.values()), list(positions), rotation=30)
            ax.set_xlabel(knob)
            ax.set_ylabel("accuracy" if metric == "accuracy" else "eval MSE")
            if metric == "accuracy":
                ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
        handles, labels = axes[0][0].get_legend_handles_labels()
        for ax in axes[0][1:]:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                if label not in labels:
                    handles.append(handle)
                    labels.append(label)
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
        fig.suptitle(f"{task}: {metric} per setting (best over lr x wd, mean over seeds){title_suffix}")
        fig.tight_layout()
        return save_atomic(fig, path, dpi=150, bbox_inches="tight")
    finally:
        plt.close(fig)

"""The leaderboard's text tables fit the terminal: at 100 columns no task or architecture
name is cut or ellipsized (long names break after their hyphens, nowhere else)."""

from __future__ import annotations

import json
import re

import pytest

from madsl.runner.reports.leaderboard import hyphen_wrap, mad_task_order, render_text
from madsl.runner.reports.scores import spec_scores

SPECS = ("striped-linear-attention-moe", "striped-gated-deltanet-sg", "mamba")


def _scores(conventions=("mad-lab",)):
    rows, labels = [], {}
    for spec in SPECS:
        for convention in conventions:
            for task in mad_task_order():
                run_id = f"{spec}-{task}-{convention}"
                rows.append(
                    {
                        "run_id": run_id,
                        "spec_hash": spec,
                        "spec_name": spec,
                        "task": task,
                        "setting": json.dumps({"seq_len": 128}),
                        "status": "done",
                        "best_eval_acc": 0.5,
                        "best_eval_ppl": 2.0,
                        "best_eval_loss": 0.7,
                        "lr": 1e-3,
                        "wd": 0.0,
                        "seed": 0,
                        "train_seconds": 1234.0,
                        "train_config": json.dumps({"conventions": convention}),
                        "diverged_epoch": None,
                    }
                )
                labels[run_id] = ["paper"]
    return spec_scores(rows, labels, mad_task_order())


def _column_texts(lines: list[str]) -> dict[int, str]:
    """Right-aligned header cells: the words of `lines` joined top to bottom by their last column."""
    by_end: dict[int, str] = {}
    for line in lines:
        for word in re.finditer(r"\S+", line):
            by_end[word.end()] = by_end.get(word.end(), "") + word.group()
    return by_end


def _fragments_are_whole_names(fragments: list[str]) -> str:
    assert all(f.endswith("-") for f in fragments[:-1]), fragments  # broken after hyphens only
    return "".join(fragments)


@pytest.mark.parametrize("conventions", [("mad-lab",), ("mad-lab", "madsl")])
def test_the_leaderboard_fits_100_columns_without_cutting_a_name(conventions):
    text = render_text(_scores(conventions), width=100)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100 and "…" not in text
    rules = [i for i, line in enumerate(lines) if set(line.strip()) <= set("─━┡╇┩") and line.strip()]
    # the board: every MAD task is a header, whole, in the lines above its first rule
    title_end = next(i for i, line in enumerate(lines) if "settings)" in line)
    headers = set(_column_texts(lines[title_end + 1 : rules[0]]).values())
    assert set(mad_task_order()) <= headers, headers
    assert "MAD score" in "\n".join(lines[title_end + 1 : rules[0]])  # the six MAD tasks: their aggregate
    # the per-task table: each row's task cell, read down its column, is a whole task name
    header = lines[rules[1] - 1]
    start, end = header.index("task"), header.index("score")
    tasks, fragments = [], []
    for line in lines[rules[1] + 1 :]:
        cell, score = line[start:end].strip(), line[end : end + 6].strip()
        if score and fragments:
            tasks.append(_fragments_are_whole_names(fragments))
            fragments = []
        if cell:
            fragments.append(cell)
    tasks.append(_fragments_are_whole_names(fragments))
    assert tasks == mad_task_order() * len(SPECS) * len(conventions)
    if len(conventions) > 1:  # rows under two convention sets: their names say which
        assert "mamba [madsl]" in text and "conventions mad-lab" not in text
    else:  # shared by every row: in the title
        assert "conventions mad-lab" in text


def test_a_wide_terminal_keeps_the_names_and_columns_whole():
    text = render_text(_scores(), width=200)
    assert "striped-linear-attention-moe" in text and "fuzzy-in-context-recall" in text
    assert "time/run" in text and "…" not in text


def test_hyphen_wrap_breaks_only_after_hyphens_and_keeps_every_character():
    assert hyphen_wrap("fuzzy-in-context-recall", 12) == "fuzzy-in-\ncontext-\nrecall"
    assert hyphen_wrap("memorization", 4) == "memorization"
    assert hyphen_wrap("in-context-recall", None) == "in-context-recall"
    assert hyphen_wrap("a-b-c", 1).replace("\n", "") == "a-b-c"
    assert hyphen_wrap("striped-mamba [quick, mad-lab]", 8) == "striped-\nmamba [quick, mad-lab]"

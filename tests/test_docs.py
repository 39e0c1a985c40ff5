"""The documentation's links resolve: every relative link of README.md, DEVELOPERS.md and docs/
names a file of the repository, and every #anchor a heading of the page it points at."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "DEVELOPERS.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces as '-',
    repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        if not line.startswith("#"):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def links(page: Path) -> list[str]:
    return [target for target in LINK.findall(FENCE.sub("", page.read_text()))
            if not re.match(r"[a-z]+:", target)]  # http:, https:, mailto: are not checked


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_anchors_resolve(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(f"{target}: no heading with that anchor in {where.relative_to(REPO)}")
    assert not broken, broken


# ---- docs/tasks.md: the examples are what the generators make ----------------------------------

TASK_EXAMPLE = re.compile(r"^### (\S+)|^```\n(-- .*?)^```", re.S | re.M)


def task_examples(text: str) -> list[tuple[str, str, dict, str]]:
    """(task, split, settings, shown text) of every `-- split (k=v, ...)` example of tasks.md; a
    part without settings repeats the previous part's."""
    import yaml

    out, task = [], None
    for match in TASK_EXAMPLE.finditer(text):
        if match.group(1):
            task = match.group(1)
            continue
        settings: dict = {}
        for part in re.split(r"^-- ", match.group(2), flags=re.M)[1:]:
            head, _, shown = part.partition("\n")
            split, _, written = head.partition(" ")
            if written:
                pairs = (kv.split("=") for kv in re.split(r"[,;]\s*", written.strip("()")))
                settings = {k: yaml.safe_load(v) for k, v in pairs}
            out.append((task, split, settings, shown.rstrip("\n")))
    return out


def test_task_examples_are_real_output_of_show_example_at_seed_1():
    from madsl.tasks import get_task
    from madsl.tasks.show import example

    examples = task_examples((REPO / "docs/tasks.md").read_text())
    assert len(examples) >= 16
    stale = [(task, split, settings) for task, split, settings, shown in examples
             if example(get_task(task, "madsl"), settings, split, seed=1) != shown]
    assert not stale, stale


def test_every_example_of_the_topology_table_compiles_with_the_stdlib():
    """docs/language.md's table of topology forms: each example, as a reader would paste it
    into `madsl compile -t`, loads and accounts."""
    import madsl
    from madsl.spec import spec_from_topology

    text = (REPO / "docs/language.md").read_text()
    table = text[text.index("| form | example | meaning |"):text.index("Whitespace is ignored.")]
    examples = [example.replace("\\|", "|") for row in table.splitlines()[2:] if row.startswith("|")
                for example in re.findall(r"`([^`]*)`", row.split(" | ")[1])]
    assert len(examples) >= 20 and "(2H:2A)X6" in examples
    for example in examples:
        madsl.account(spec_from_topology(example))

"""The documentation holds: every relative link of README.md, DEVELOPERS.md and docs/ names a
file of the repository and every #anchor a heading of the page it points at; and the pages'
deterministic output (tasks.md's examples, language.md's topology forms, guide.md's `madsl fit`
transcripts, runner.md's plan and column tables, convert.md's public configurations,
accounting.md's state and filter tables) is parsed from the page and compared with the program's."""

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
    return [
        target for target in LINK.findall(FENCE.sub("", page.read_text())) if not re.match(r"[a-z]+:", target)
    ]  # http:, https:, mailto: are not checked


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
    stale = [
        (task, split, settings)
        for task, split, settings, shown in examples
        if example(get_task(task, "madsl"), settings, split, seed=1) != shown
    ]
    assert not stale, stale


def test_every_example_of_the_topology_table_compiles_with_the_stdlib():
    """docs/language.md's table of topology forms: each example, as a reader would paste it
    into `madsl compile -t`, loads and accounts."""
    import madsl
    from madsl.spec import spec_from_topology

    text = (REPO / "docs/language.md").read_text()
    table = text[text.index("| form | example | meaning |") : text.index("Whitespace is ignored.")]
    examples = [
        example.replace("\\|", "|")
        for row in table.splitlines()[2:]
        if row.startswith("|")
        for example in re.findall(r"`([^`]*)`", row.split(" | ")[1])
    ]
    assert len(examples) >= 20 and "(2H:2A)X6" in examples
    for example in examples:
        madsl.account(spec_from_topology(example))


# ---- pages whose shown output is deterministic: the page is checked against the program ---------


def section(page: str, start: str, end: str) -> str:
    text = (REPO / page).read_text()
    return text[text.index(start) : text.index(end, text.index(start))]


def table_rows(text: str) -> list[list[str]]:
    """The cells of every row of the markdown tables in `text`, the header and rule left out."""
    rows = [
        [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        for line in text.splitlines()
        if line.lstrip().startswith("|")
    ]
    return [row for row in rows if not set("".join(row)) <= set("-| ")][1:]


def number(text: str) -> int:
    return int(re.match(r"[\d,]+", text.strip()).group().replace(",", ""))


def test_guide_fit_transcripts_are_what_madsl_fit_prints(tmp_path, monkeypatch, capsys):
    """docs/guide.md, steps 1-3 as a reader does them: the spec of step 1 with the budget of step
    3, `madsl fit` on it, then on `topology: 4H:mA`; every `$ madsl fit` block that shows output
    shows what the command prints (and the compile verdict of step 2 is what compile says)."""
    import shlex

    import yaml

    from madsl.cli import main

    text = (REPO / "docs/guide.md").read_text()
    spec = yaml.safe_load(re.search(r"```yaml\n(# my/hyena-attn\.mad\n.*?)```", text, re.S).group(1))
    spec["budget"] = yaml.safe_load(re.search(r"```yaml\n(budget:\n.*?)```", text, re.S).group(1))["budget"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "specs").symlink_to(REPO / "specs")
    (tmp_path / "my").mkdir()
    (tmp_path / "my/hyena-attn.mad").write_text(yaml.safe_dump(spec, allow_unicode=True, sort_keys=False))

    verdict = re.search(r"fails \(exit status (\d)\)[^`]*```\n(.*?)\n```", text, re.S)
    assert main(["compile", "my/hyena-attn.mad"]) == int(verdict.group(1))
    assert verdict.group(2) in capsys.readouterr().out

    blocks = re.findall(r"```sh\n(\$ madsl fit [^\n]*)\n(.*?)```", text, re.S)
    shown = [(command, output.rstrip("\n").splitlines()) for command, output in blocks if output.strip()]
    assert len(shown) >= 3
    retopology = re.search(r"with\s+`topology: (\S+)`", text).group(1)
    for i, (command, expected) in enumerate(shown):
        if i == 1:  # the guide moves to the topology that can be iso-state
            spec["topology"] = retopology
            (tmp_path / "my/hyena-attn.mad").write_text(yaml.safe_dump(spec, allow_unicode=True, sort_keys=False))
        code = main(shlex.split(command)[2:])
        assert capsys.readouterr().out.rstrip("\n").splitlines() == expected, command
        assert code == (1 if expected[0].startswith("no solution") else 0), command


def test_runner_tables_for_analysis_list_the_columns_in_order():
    """docs/runner.md's `--rows runs` and `--rows settings` tables name every fixed column of
    madsl report's analysis tables, in their order."""
    from madsl.runner.reports.tables import RUN_COLUMNS, SETTING_COLUMNS

    for rows, columns in (("runs", RUN_COLUMNS), ("settings", SETTING_COLUMNS)):
        table = section("docs/runner.md", f"`--rows {rows}` (", "\n\n`")
        documented = [name for row in table_rows(table) for name in re.findall(r"`([^`]+)`", row[0])]
        assert documented == list(columns), rows


def test_runner_results_database_table_is_the_schema(tmp_path):
    """docs/runner.md's table of the results database: each table's key and columns, in order."""
    import sqlite3

    from madsl.runner.store.results import Store

    Store(tmp_path / "results.db").close()
    with sqlite3.connect(tmp_path / "results.db") as conn:
        schema = {
            name: [column[1] for column in conn.execute(f"PRAGMA table_info({name})")]
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
    table = section("docs/runner.md", "| table | key | columns |", "\n\n")
    checked = []
    for name, key, columns in table_rows(table):
        name = name.strip("`")
        if name in ("meta", "run_labels"):  # a key-value table, and one of keys only: prose, not columns
            continue
        keys = re.findall(r"\w+", key)
        listed = [c.strip() for c in re.split(r"[,;]", re.sub(r"\([^()]*\)", "", columns)) if c.strip()]
        assert keys + listed == schema[name], name
        checked.append(name)
    assert checked == ["specs", "runs", "epochs", "length_evals"]


def test_convert_public_configurations_table_is_the_accounting():
    """docs/convert.md's table of the bundled public configurations: madsl's count (and its
    difference from the published size), fixed state, conv state and KV cache at 8192."""
    import madsl

    rows = table_rows(section("docs/convert.md", "| spec | published |", "\n\n"))
    assert len(rows) == len(list((REPO / "specs/public").glob("*.mad"))) == 16
    for name, published, count, fixed, conv, kv in rows:
        name = re.match(r"`([^`]+)`", name).group(1)
        totals = madsl.account(REPO / "specs/public" / f"{name}.mad", seq_len=8192).totals
        assert (number(count), number(fixed), number(conv), number(kv)) == (
            totals["params"],
            totals["fixed_state"],
            totals["conv_state"],
            totals["kv_cache"],
        ), name
        size = float(published.rstrip("B")) * 1e9
        percent = float(re.search(r"\(([+−-][\d.]+)%\)", count).group(1).replace("−", "-"))
        assert round(100 * (totals["params"] - size) / size, 1) == percent, name


def test_convert_examples_show_the_topology_convert_writes():
    """docs/convert.md's `madsl convert --from-hf CONFIG --name NAME` examples: the topology in
    the comment under each is the converted spec's (`...` stands for a repeated stretch)."""
    from madsl.hf_config import from_hf_config

    examples = re.findall(
        r"madsl convert --from-hf (\S+) --name (\S+) .*\n#   topology: (\S+)", (REPO / "docs/convert.md").read_text()
    )
    assert len(examples) == 7
    for config, name, topology in examples:
        written = from_hf_config(REPO / config, name)["topology"]
        assert re.fullmatch(".*".join(map(re.escape, topology.split("..."))), written), (config, written)


def test_accounting_fixed_states_per_primitive_at_width_128():
    """docs/accounting.md's "Per primitive" table: each bold value is the fixed state of the
    symbols of its row, alone at width 128 with the stdlib defaults."""
    import madsl
    from madsl.spec import spec_from_topology

    table = section("docs/accounting.md", "| primitive | fixed state | value | why |", "\n\n")
    checked = {}
    for first, _, value, _ in table_rows(table):
        symbols = re.findall(r"`([^`]+)`", first)
        bold = [int(v) for v in re.findall(r"\*\*(\d+)\*\*", value)]
        if not bold:
            continue
        for symbol, expected in zip(symbols, bold if len(bold) == len(symbols) else bold * len(symbols)):
            checked[symbol] = expected
            assert madsl.account(spec_from_topology(symbol)).totals["fixed_state"] == expected, symbol
    assert {"H", "mH", "He", "Mb", "M2", "mAlg", "GDN", "DN", "Ret", "mL", "Lin", "mLin", "R5", "R6"} <= set(checked)


def test_accounting_filter_table_at_width_64():
    """docs/accounting.md's table of the long-convolution filters: one order-2 H at width 64."""
    import madsl
    from madsl.spec import spec_from_topology

    table = section("docs/accounting.md", "| `filter=` | filter params | layer params |", "\n\n")
    rows = table_rows(table)
    assert len(rows) == 7
    for kind, filter_params, layer_params, fixed, kv_1024, kv_4096 in rows:
        spec = spec_from_topology(f"H{{filter={kind.strip('`')}}}-none", dim=64)
        short, long = (madsl.account(spec, seq_len=n).layers[0] for n in (1024, 4096))
        params = short.params - short.norm_params
        assert (number(layer_params), number(fixed), number(kv_1024), number(kv_4096)) == (
            params,
            short.fixed_state,
            short.kv_cache,
            long.kv_cache,
        ), kind
        assert params - number(filter_params) == 17_408, kind  # the page: everything but the filter


def test_runner_dry_run_plan_counts_runs_tokens_and_flops_as_shown(tmp_path, monkeypatch, capsys):
    """docs/runner.md's `--dry-run` example: the plan's runs, tokens and FLOPs (not its times,
    which are this machine's: its training rate is stood in for)."""
    import shlex

    from runner_helpers import stand_in_rates

    from madsl.cli import main

    command, shown = re.search(
        r"```\n\$ madsl (eval [^\n]*--dry-run)\n(.*?)```", (REPO / "docs/runner.md").read_text(), re.S
    ).groups()
    stand_in_rates(monkeypatch, tmp_path / "cache")
    monkeypatch.chdir(REPO)
    assert main([*shlex.split(command), "--db", str(tmp_path / "results.db")]) == 0
    printed = capsys.readouterr().out.splitlines()

    def untimed(line):  # a line without its estimated time
        return line.split(", ~")[0]

    assert [untimed(line) for line in printed[:2]] == [untimed(line) for line in shown.splitlines()[:2]]


def test_every_flag_the_user_pages_name_is_an_option_of_madsl():
    """A `--flag` in README.md, guide, runner, cluster, convert, ci and accounting is one of the
    madsl commands' options, except in a paragraph about a script of scripts/ or benchmarks/
    (gpu.md and tasks.md also name the benchmarks' and the seed study's, and are left out)."""
    import argparse

    from madsl.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    options = {o for parser in commands.values() for action in parser._actions for o in action.option_strings}
    not_madsl = {"--storage"}  # cluster.md: the shared-filesystem option madsl chose not to have
    pages = ["README.md", *(f"docs/{p}.md" for p in ("guide", "runner", "cluster", "convert", "ci", "accounting"))]
    unknown = [
        (page, flag)
        for page in pages
        for paragraph in (REPO / page).read_text().split("\n\n")
        if not re.search(r"\b(scripts|benchmarks)/", paragraph)
        for flag in re.findall(r"`(--[a-z][\w-]*)", paragraph)
        if flag not in options | not_madsl
    ]
    assert not unknown

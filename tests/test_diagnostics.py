"""Every error of a spec in one run, in file order, in each output format of `madsl check`."""

from __future__ import annotations

import json

import pytest

import madsl
from madsl.cli import main
from madsl.errors import MadslError

# six independent problems, written out of the order in which the loader checks them
MANY = """\
name: many
dim: 128
topology: (H{filter_sates=8}:mA{heads=0}:Ax)x2
norm: batch
colour: blue
layers:
  H: {order: 2, shrt: 3}
budget:
  fixed_state: 4096
  paramz: 1M
"""
MANY_ERRORS = [  # (line, column, message) in file order
    (3, 14, "H (hyena) has no parameter 'filter_sates'"),
    (3, 39, "mA: attention: heads must be positive, got 0"),
    (3, 42, "unknown layer 'Ax'"),
    (4, 7, "norm must be one of rms, layer, got 'batch'"),
    (5, 1, "unknown key 'colour'"),
    (7, 17, "layers.H: hyena has no parameter 'shrt'"),
    (10, 3, "unknown budget 'paramz'"),
]
OVER = "name: over\ndim: 128\ntopology: 3H:mA\nbudget:\n  kv_cache: <= 1k\n  fixed_state: 4096\n"


@pytest.fixture
def specs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "many.mad").write_text(MANY)
    (tmp_path / "over.mad").write_text(OVER)
    return tmp_path


def check(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["check", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_load_spec_raises_every_independent_error_in_file_order(specs):
    with pytest.raises(MadslError) as info:
        madsl.load_spec("many.mad")
    found = [(e.location.line, e.location.column, e.message) for e in info.value.diagnostics]
    assert found == MANY_ERRORS
    assert info.value.message == MANY_ERRORS[0][2]  # the first is the headline
    rendered = info.value.render()
    assert rendered.endswith(f"\n\n{len(MANY_ERRORS)} errors")
    assert [line.strip() for line in rendered.splitlines() if line.strip().startswith("-->")] == [
        "--> many.mad:3:14 (column 4 of the topology)",
        "--> many.mad:3:39 (column 29 of the topology)",
        "--> many.mad:3:42 (column 32 of the topology)",
        "--> many.mad:4:7",
        "--> many.mad:5:1",
        "--> many.mad:7:17",
        "--> many.mad:10:3",
    ]


def test_check_line_format_lists_every_problem_of_every_file_in_order(specs, capsys):
    code, out, _ = check(capsys, "many.mad", "over.mad", "--format", "line")
    assert code == 2  # bad input in any file
    located = [line.split(": error: ")[0] for line in out.splitlines()]
    assert located == [f"many.mad:{line}:{column}" for line, column, _ in MANY_ERRORS] + [
        "over.mad:5:3",
        "over.mad:6:3",
    ]  # budget violations at their keys, in file order
    lines = out.splitlines()
    assert lines[0] == (
        "many.mad:3:14: error: H (hyena) has no parameter 'filter_sates' (expected: one of order, "
        "inner_factor, proj_groups, short_filter, filter, filter_states, filter_order, "
        "filter_emb_dim, filter_size, filter_modes, filter_length, filter_emb_learned, bias) "
        "(hint: did you mean 'filter_states'?)"
    )
    assert lines[3] == "many.mad:4:7: error: norm must be one of rms, layer, got 'batch'"
    assert lines[-2] == (
        "over.mad:5:3: error: over: kv_cache = 32,768 is outside its budget <= 1k (<= 1,000); from mA x1 (32,768 each)"
    )
    assert lines[-1] == (
        "over.mad:6:3: error: over: fixed_state = 6,144 is outside its budget 4096 (= 4,096); from H x3 (2,048 each)"
    )


def test_check_github_format_is_one_annotation_per_problem(specs, capsys):
    code, out, _ = check(capsys, "over.mad", "many.mad", "--format", "github")
    assert code == 2
    lines = out.splitlines()
    assert [line.split("::")[1] for line in lines] == [
        "error file=over.mad,line=5,col=3",
        "error file=over.mad,line=6,col=3",
    ] + [f"error file=many.mad,line={line},col={column}" for line, column, _ in MANY_ERRORS]
    assert lines[5] == "::error file=many.mad,line=4,col=7::norm must be one of rms, layer, got 'batch'"


def test_check_text_format_locates_budget_violations_at_their_keys(specs, capsys):
    code, _, err = check(capsys, "over.mad")
    assert code == 1  # budget violations only
    assert [line.strip() for line in err.splitlines() if line.strip().startswith("-->")] == [
        "--> over.mad:5:3",
        "--> over.mad:6:3",
    ]
    assert "error: over: kv_cache = 32,768 is outside its budget <= 1k (<= 1,000); from mA x1 (32,768 each)" in err


def test_check_text_and_json_formats_show_every_error(specs, capsys):
    code, _, err = check(capsys, "many.mad", "--format", "text")
    assert code == 2
    assert [line.split()[0] for line in err.splitlines() if line.startswith("error: ")] == ["error:"] * 7
    assert [m for *_, m in MANY_ERRORS] == [
        line[len("error: ") :] for line in err.splitlines() if line.startswith("error: ")
    ]
    code, out, _ = check(capsys, "many.mad", "over.mad", "--format", "json")
    report = json.loads(out)
    assert code == 2 and not report["ok"]
    assert [(e["path"], e["line"], e["column"], e["error"]) for e in report["errors"]] == [
        ("many.mad", *e) for e in MANY_ERRORS
    ]


def test_an_unparsable_topology_stops_the_checks_that_need_it(specs, capsys):
    (specs / "syntax.mad").write_text(
        "name: s\ndim: 128\ncolour: blue\ntopology: (Hx{o=1}:A))x2:(B\n"
        "layers:\n  H: {shrt: 3}\nbudget:\n  fixed_state: 1\n"
    )
    code, out, _ = check(capsys, "syntax.mad", "--format", "line")
    assert code == 2
    # the first syntax error, nothing resolved in (or accounted for) the topology; the
    # unknown key and the bad layers: entry are independent of it and still reported
    assert out.splitlines() == [
        "syntax.mad:3:1: error: unknown key 'colour' (expected: one of name, description, extends, dim, vocab, "
        "seq_len, topology, channel_mixer, norm, tie_embeddings, positions, embedding_std, linear_std, final_norm, "
        "embedding_norm, meta_tokens, "
        "norm_eps, embedding_scale, residual_scale, postnorm, residual_factors, logit_divisor, logit_soft_cap, init, "
        "layers, budget, "
        "eval)",
        "syntax.mad:4:22: error: unexpected ')' (expected: the end of the topology)",
        "syntax.mad:6:7: error: layers.H: hyena has no parameter 'shrt' (expected: one of order, inner_factor, "
        "proj_groups, short_filter, filter, filter_states, filter_order, filter_emb_dim, filter_size, filter_modes, "
        "filter_length, filter_emb_learned, bias) (hint: did you mean 'short_filter'?)",
    ]


def test_cascades_are_not_reported(specs):
    # a misspelled required key is one error, not also 'missing required key'; a layer based
    # on a broken symbol, or a bad width, does not repeat the error in every layer that uses it
    (specs / "cascade.mad").write_text("name: c\ndim: -1\ntopolgy: H\n")
    with pytest.raises(MadslError) as info:
        madsl.load_spec("cascade.mad")
    assert [e.message for e in info.value.diagnostics] == [
        "dim must be a positive integer, got -1",
        "unknown key 'topolgy'",
    ]
    (specs / "based.mad").write_text(
        "name: b\ndim: 128\ntopology: X:Y\nlayers:\n  X: {primitive: hyena, ordr: 2}\n  Y: {base: X}\n"
    )
    with pytest.raises(MadslError) as info:
        madsl.load_spec("based.mad")
    assert [e.message for e in info.value.diagnostics] == ["layers.X: hyena has no parameter 'ordr'"]
    (specs / "width.mad").write_text("name: w\ndim: 0\ntopology: H{ordr=2}:Q\n")
    with pytest.raises(MadslError) as info:  # names are still checked without a width
        madsl.load_spec("width.mad")
    assert [e.message for e in info.value.diagnostics] == [
        "dim must be a positive integer, got 0",
        "H (hyena) has no parameter 'ordr'",
        "unknown layer 'Q'",
    ]


def test_the_language_references_error_sample_is_real_output(tmp_path, monkeypatch, capsys):
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs/language.md").read_text()
    section = doc[doc.index("## Errors") :]
    spec, blocks, lines = re.findall(r"```(?:yaml)?\n(.*?)```", section, re.S)[:3]
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs/x.mad").write_text(spec)
    monkeypatch.chdir(tmp_path)
    assert check(capsys, "specs/x.mad")[2] == blocks
    out = check(capsys, "specs/x.mad", "--format", "line")[1]
    patterns = [re.escape(line).replace(re.escape("..."), ".*") for line in lines.splitlines()]
    assert len(patterns) == len(out.splitlines())
    for pattern, line in zip(patterns, out.splitlines()):
        assert re.fullmatch(pattern, line), (pattern, line)


def test_check_reports_the_eval_sections_errors_with_the_rest(specs, capsys):
    (specs / "ev.mad").write_text(
        "name: e\ndim: 128\ntopology: Hx\neval:\n  taskz: [x]\n  lr: abc\n  epochs: 0\nnorm: b\n"
    )
    code, out, _ = check(capsys, "ev.mad", "--format", "line")
    assert code == 2
    assert [line.split(": error: ")[0] for line in out.splitlines()] == [
        "ev.mad:3:11",
        "ev.mad:5:3",
        "ev.mad:6:7",
        "ev.mad:7:11",
        "ev.mad:8:7",
    ]
    assert "unknown key 'taskz' in eval:" in out.splitlines()[1]
    (specs / "ok.mad").write_text("name: ok\ndim: 128\ntopology: H\neval:\n  tasks: [x]\n  task: y\n")
    code, out, _ = check(capsys, "ok.mad", "--format", "line")
    assert code == 2 and out == "ok.mad:6:3: error: eval: give either tasks: or task:, not both\n"


def test_errors_in_an_extended_spec_follow_the_files_own_named_as_ci_wants(specs, capsys):
    (specs / "shared").mkdir()
    (specs / "shared/base.mad").write_text("name: base\ndim: 128\ntopology: H\ncolr: 1\nlayers:\n  H: {ordr: 2}\n")
    (specs / "child.mad").write_text("extends: shared/base.mad\nname: child\nnorm: x\n")
    code, out, _ = check(capsys, "child.mad", "--format", "github")
    assert code == 2
    assert [line.split("::")[1] for line in out.splitlines()] == [
        "error file=child.mad,line=3,col=7",  # the file checked first, then what it extends
        "error file=shared/base.mad,line=4,col=1",
        "error file=shared/base.mad,line=6,col=7",
    ]

"""`madsl schema`: every bundled spec validates; specs the loader refuses, the schema refuses too,
naming what is wrong; what the loader reads, the schema's patterns (topology, budgets) accept."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema.exceptions import best_match

import madsl
from madsl.lang.budget import BudgetError, parse_bound
from madsl.schema import spec_schema
from madsl.spec import spec_from_data

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = sorted(ROOT.glob("specs/**/*.mad"))
VALIDATOR = jsonschema.Draft202012Validator(spec_schema())

GOOD = "name: g\ndim: 128\ntopology: H:mA\n"
BAD = {  # each refused by the loader (a MadslError) and by the schema
    "unknown top-level key": GOOD + "topolgy: H\n",
    "missing dim": "name: g\ntopology: H\n",
    "dim not an integer": "name: g\ndim: 12x\ntopology: H\n",
    "dim a boolean": "name: g\ndim: true\ntopology: H\n",
    "dim zero": "name: g\ndim: 0\ntopology: H\n",
    "empty name": "name: ' '\ndim: 128\ntopology: H\n",
    "norm not a choice": GOOD + "norm: batch\n",
    "unknown parameter of a stdlib symbol": GOOD + "layers:\n  H: {filter_sates: 8}\n",
    "parameter of the wrong type": GOOD + "layers:\n  mA: {heads: four}\n",
    "parameter not among its choices": GOOD + "layers:\n  H: {filter: wavelet}\n",
    "new symbol without primitive or base": GOOD + "layers:\n  Zz: {heads: 2}\n",
    "new symbol with an unknown primitive": GOOD + "layers:\n  Zz: {primitive: transformer}\n",
    "parameter of another primitive": GOOD + "layers:\n  Zz: {primitive: attention, d_state: 4}\n",
    "symbol named none": GOOD + "layers:\n  none: {primitive: attention}\n",
    "unknown budget quantity": GOOD + "budget:\n  fixed_states: 4096\n",
    "budget seq_len not an integer": GOOD + "budget:\n  seq_len: long\n",
    "layers not a mapping": GOOD + "layers: [H]\n",
    "unknown symbol in the topology": "name: g\ndim: 128\ntopology: 3H:mQ\n",
    "topology syntax": "name: g\ndim: 128\ntopology: H::mA\n",
    "tag without a name": "name: g\ndim: 128\ntopology: 'H# : mA'\n",
    "none as a sequence mixer": "name: g\ndim: 128\ntopology: none-Sg\n",
    "unknown channel mixer": GOOD + "channel_mixer: Sgg\n",
    "budget value not a bound": GOOD + "budget:\n  fixed_state: lots\n",
    "budget strictly below": GOOD + "budget:\n  params: < 5M\n",
    "budget unknown unit": GOOD + "budget:\n  params: 5 parsecs\n",
    "budget mapping key": GOOD + "budget:\n  params: {mni: 4}\n",
    "budget mapping value": GOOD + "budget:\n  params: {max: lots}\n",
    "budget negative": GOOD + "budget:\n  params: -4\n",
    "misspelled parameter of a stdlib symbol": GOOD + "layers:\n  mA: {hedas: 8}\n",
    "misspelled parameter of a based symbol": GOOD + "layers:\n  Zz: {base: mA, hedas: 8}\n",
}
# what the loader accepts, the schema accepts (each with the feature the schema's patterns read)
ACCEPTED = {
    "a symbol of its own": "name: g\ndim: 128\ntopology: 2Big:mA\nlayers:\n  Big: {primitive: attention, heads: 4}\n",
    "groups, repeats, attributes": "name: g\ndim: 128\ntopology: '(2H:4mA{heads=2}:H){residual=gated}x2 : 2(H:A)'\n",
    "parallel mixers, tags, no channel": "name: g\ndim: 128\ntopology: '[H | mA]-Sg : H#a-none : H#a'\n",
    "the other repeat sign": "name: g\ndim: 128\ntopology: (H:A)×2\nchannel_mixer: none\n",
    "every budget form": GOOD + "budget:\n  params: 500k ± 10%\n  flops: <= 200M\n  fixed_state: 4096\n"
    "  kv_cache: {max: 40k}\n  conv_state: 1.2M +- 50k\n  seq_len: 64\n",
    "budget numbers": GOOD + "budget:\n  params: 7B\n  flops: '>= 1e3'\n  kv_cache: {min: 0, max: 1.5e6}\n",
}
# the schema's messages name what is wrong: the value, the symbol, the key (jsonschema's best_match,
# as an editor shows it)
NAMED = {
    "name: g\ndim: 128\ntopology: 3H:mQ\n": (["topology"], "'3H:mQ'"),
    GOOD + "budget:\n  fixed_state: lots\n": (["budget", "fixed_state"], "'lots'"),
    GOOD + "layers:\n  mA: {hedas: 8}\n": (["layers", "mA"], "'hedas' was unexpected"),
    GOOD + "layers:\n  Zz: {primitive: attention, d_state: 4}\n": (["layers", "Zz"], "'d_state' was unexpected"),
    GOOD + "layers:\n  Zz: {primitive: transformer}\n": (["layers", "Zz", "primitive"], "'transformer'"),
    GOOD + "budget:\n  params: {max: lots}\n": (["budget", "params", "max"], "'lots'"),
    GOOD + "channel_mixer: Sgg\n": (["channel_mixer"], "'Sgg'"),
}


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_bundled_spec_validates(path):
    errors = [e.message for e in VALIDATOR.iter_errors(yaml.safe_load(path.read_text()))]
    assert not errors, errors[:3]


@pytest.mark.parametrize("name", sorted(BAD))
def test_what_the_loader_refuses_the_schema_refuses(name, tmp_path):
    text = BAD[name]
    path = tmp_path / "bad.mad"
    path.write_text(text)
    with pytest.raises(madsl.MadslError):
        madsl.account(madsl.load_spec(path))
    assert not VALIDATOR.is_valid(yaml.safe_load(text)), name


def test_the_schema_is_valid_and_madsl_schema_prints_it(tmp_path):
    jsonschema.Draft202012Validator.check_schema(spec_schema())
    proc = subprocess.run([sys.executable, "-m", "madsl", "schema"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and json.loads(proc.stdout) == spec_schema()
    out = tmp_path / "mad.schema.json"
    proc = subprocess.run([sys.executable, "-m", "madsl", "schema", "-o", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0 and json.loads(out.read_text()) == spec_schema()
    # every stdlib symbol's parameters are there, with their defaults
    h = spec_schema()["$defs"]["own-hyena"]["properties"]
    assert h["filter_states"]["type"] == "integer" and "modal" in h["filter"]["enum"]


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_what_the_loader_accepts_the_schema_accepts(name, tmp_path):
    path = tmp_path / "good.mad"
    path.write_text(ACCEPTED[name])
    madsl.account(madsl.load_spec(path))
    errors = [e.message for e in VALIDATOR.iter_errors(yaml.safe_load(ACCEPTED[name]))]
    assert not errors, errors[:3]


@pytest.mark.parametrize("text", sorted(NAMED))
def test_the_message_names_what_is_wrong(text):
    where, named = NAMED[text]
    error = best_match(VALIDATOR.iter_errors(yaml.safe_load(text)))
    assert list(error.absolute_path) == where and named in error.message, error.message
    assert "is not valid under any of the given schemas" not in error.message


def test_a_spec_that_defines_or_inherits_symbols_is_checked_for_syntax_only():
    """The schema cannot see the symbols a spec defines or inherits: it checks their syntax."""
    defines = yaml.safe_load("name: g\ndim: 128\ntopology: 2Big:mQ\nlayers:\n  Big: {primitive: attention}\n")
    extends = yaml.safe_load("extends: base.mad\ntopology: 2Big:mQ\n")
    assert VALIDATOR.is_valid(defines) and VALIDATOR.is_valid(extends)
    assert not VALIDATOR.is_valid({**extends, "topology": "2Big::mQ"})


_TOKENS = [
    "H",
    "mA",
    "Sg",
    "none",
    "Hx",
    "2",
    "10",
    "x",
    "×",
    ":",
    "|",
    "-",
    "(",
    ")",
    "[",
    "]",
    "#a",
    "#",
    "{",
    "}",
    "heads=2",
    "residual=gated",
    "k='v'",
    ",",
    "=",
    " ",
    "  ",
]


def _loads(data: dict) -> bool:
    try:
        madsl.account(spec_from_data(data))
    except madsl.MadslError:
        return False
    return True


def _topologies() -> st.SearchStrategy[str]:
    """Topology strings the grammar reads: every construct, with and without spaces."""
    gap = st.sampled_from(["", " ", "  "])
    count = st.sampled_from(["", "2", "3 "])

    def joined(*parts):
        return st.tuples(*parts).map("".join)

    layer = joined(
        st.sampled_from(["H", "mA", "A", "Mb", "Sg"]),
        st.sampled_from(["", "#a", " #b"]),
        st.sampled_from(["", "{heads=2}", "{ }", "{k='v', n=-1.5e2}"]),
    )
    mixer = layer | st.lists(layer, min_size=2, max_size=3).map(lambda ls: "[" + " | ".join(ls) + "]")
    block = joined(mixer, st.sampled_from(["", "-Sg", " - Mlp", "-none"]))

    def groups(sequence):
        branches = st.lists(sequence, min_size=1, max_size=2).map(" | ".join)
        return joined(
            count,
            st.just("("),
            branches,
            st.just(")"),
            st.sampled_from(["", "{residual=gated}", "{split=res, combine=res}"]),
            st.sampled_from(["", "x2", " × 3"]),
        )

    items = st.recursive(joined(count, block), lambda inner: inner | groups(inner), max_leaves=6)
    return st.lists(items, min_size=1, max_size=3).flatmap(lambda xs: gap.map(lambda g: f"{g}:{g}".join(xs)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_TOKENS), min_size=1, max_size=9).map("".join) | _topologies())
def test_the_topology_pattern_never_refuses_what_the_loader_reads(topology):
    data = {"name": "g", "dim": 64, "topology": topology}
    if _loads(data):
        assert VALIDATOR.is_valid(data), topology


_BUDGET_TOKENS = [
    "4096",
    "1.5",
    ".5",
    "1e3",
    "-2",
    "k",
    "M",
    "B",
    "T",
    "%",
    "±",
    "+-",
    "+/-",
    "<=",
    ">=",
    "<",
    " ",
    "lots",
    "x",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_BUDGET_TOKENS), min_size=1, max_size=6))
def test_the_budget_pattern_is_the_budget_grammar(tokens):
    """Every bound budget.py reads matches; what matches but is refused is refused for its
    number only (negative, or beyond a float), not for its form."""
    value = "".join(tokens)
    data = yaml.safe_load(GOOD) | {"budget": {"params": value}}
    try:
        parse_bound(value)
    except BudgetError as err:
        if VALIDATOR.is_valid(data):
            assert "negative" in str(err) or "finite" in str(err), (value, str(err))
    else:
        assert VALIDATOR.is_valid(data), value


@pytest.mark.skipif(shutil.which("node") is None, reason="node (an ECMA-262 engine) is not installed")
def test_every_pattern_is_an_ecma_regular_expression_too(tmp_path):
    """Editors (yaml-language-server) compile patterns as JavaScript RegExps in unicode mode,
    which refuses escapes Python allows; they must agree with Python on the three examples."""
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(spec_schema()))
    script = """
const schema = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
const patterns = [];
(function walk(o) { if (o && typeof o === "object") for (const [k, v] of Object.entries(o))
    k === "pattern" ? patterns.push(v) : walk(v); })(schema);
patterns.forEach(p => new RegExp(p, "u"));
const known = new RegExp(schema.allOf[1].then.properties.topology.pattern, "u");
const bound = new RegExp(schema.properties.budget.properties.params.pattern, "u");
console.log(JSON.stringify([patterns.length, known.test("3H:mQ"), known.test("(2H:4A:4H:2A)x2"),
                            bound.test("lots"), bound.test("500k ± 10%")]));
"""
    proc = subprocess.run(["node", "-e", script, str(schema_file)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    count, unknown, paper, lots, tolerance = json.loads(proc.stdout)
    assert count >= 3 and not unknown and paper and not lots and tolerance

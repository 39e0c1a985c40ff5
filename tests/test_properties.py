"""Property-based tests (Hypothesis) over the topology grammar and the spec loader.

- every topology the grammar accepts prints a canonical form that parses back to the same
  architecture, value for value and type for type;
- any string, and any mutation of a valid topology or spec file, is either accepted or
  refused with madsl's own located error (MadslError), never another exception, and fast.

Derandomized, so CI sees the same examples every run."""

import math
import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from madsl import account, load_spec
from madsl import topology as topo
from madsl.errors import MadslError

# No deadline: examples are timed by wall clock, which a loaded CI machine turns into flaky failures.
PROFILE = dict(derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- generated valid topologies -------------------------------------------------------

symbols = st.sampled_from(["H", "A", "mA", "Mb", "Alg", "Sg", "MoE", "X_1", "none"])
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
spaces = st.sampled_from(["", "", " ", "  ", "\n"])


@st.composite
def written_values(draw) -> str:
    """A value as a user might write it inside {...}."""
    kind = draw(st.sampled_from(["int", "float", "word", "keyword", "quoted"]))
    if kind == "int":
        return str(draw(st.integers(-(2**63) + 1, 2**63 - 1)))
    if kind == "float":
        number = draw(st.floats(allow_nan=False, allow_infinity=False))
        text = draw(st.sampled_from([repr(number), f"{number:e}", f"{number:.3f}"]))
        return text if "e" in text or "." in text else text + ".0"
    if kind == "word":
        return draw(names)
    if kind == "keyword":
        return draw(st.sampled_from(["true", "false", "null", "True", "NULL", "FALSE"]))
    quote = draw(st.sampled_from(['"', "'"]))
    body = draw(st.text(st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters=quote), max_size=8))
    return f"{quote}{body}{quote}"


@st.composite
def written_layers(draw) -> str:
    text = draw(symbols)
    if draw(st.booleans()):
        text += "#" + draw(st.from_regex(r"[A-Za-z0-9_]{1,3}", fullmatch=True))
    if draw(st.integers(0, 3)) == 0:
        keys = draw(st.lists(names, min_size=0, max_size=3, unique=True))
        text += "{" + ",".join(f"{k}{draw(spaces)}={draw(spaces)}{draw(written_values())}" for k in keys) + "}"
    return text


@st.composite
def written_blocks(draw) -> str:
    if draw(st.integers(0, 4)) == 0:
        mixer = "[" + " | ".join(draw(st.lists(written_layers(), min_size=2, max_size=3))) + "]"
    else:
        mixer = draw(written_layers())
    if draw(st.booleans()):
        mixer += "-" + draw(written_layers())
    return mixer


def written_topologies(max_depth: int = 3):
    def group(inner):
        @st.composite
        def make(draw) -> str:
            branches = [draw(inner) for _ in range(draw(st.sampled_from([1, 1, 2, 3])))]
            text = "(" + " | ".join(branches) + ")"
            attrs = []
            if draw(st.booleans()):
                attrs.append("residual=" + draw(st.sampled_from(["add", "gated", "none", '"add"'])))
            if len(branches) > 1 and draw(st.booleans()):
                attrs.append("split=" + draw(st.sampled_from(["copy", "res", "gated"])))
                attrs.append("combine=" + draw(st.sampled_from(["mean", "res", "gated"])))
            if draw(st.integers(0, 3)) == 0:
                attrs.append(draw(st.sampled_from(["norm=layer", "norm=rms", "linear_std=0.02", "linear_std=1"])))
            if attrs:
                text += "{" + ", ".join(draw(st.permutations(attrs))) + "}"
            if draw(st.booleans()):
                text += draw(st.sampled_from(["x", "X", "×"])) + str(draw(st.integers(1, 3)))
            return text

        return make()

    @st.composite
    def sequence(draw, item) -> str:
        items = draw(st.lists(item, min_size=1, max_size=4))
        prefixed = [(str(draw(st.integers(1, 3))) if draw(st.booleans()) else "") + i for i in items]
        return (draw(spaces) + ":" + draw(spaces)).join(prefixed)

    return st.recursive(
        written_blocks(), lambda inner: sequence(st.one_of(written_blocks(), group(inner))), max_leaves=12
    )


def typed(topology):
    """The expanded topology with every value's type beside it (1 == 1.0 == True in Python)."""
    return topo.expand(topology), [layer.override_types for layer in topo.layers(topo.expand(topology))]


@settings(max_examples=200, **PROFILE)
@given(written_topologies())
def test_canonical_form_parses_back_to_the_same_architecture(text):
    try:
        parsed = topo.parse(text)
    except topo.TopologySyntaxError as err:  # the generator can nest its way past the block limit
        assume(f"the limit is {topo.MAX_BLOCKS:,}" not in err.message)
        raise
    printed = topo.canonical(parsed)
    again = topo.parse(printed)
    assert typed(again) == typed(parsed), printed
    assert topo.canonical(again) == printed  # the canonical form is a fixed point


# --- anything else: accepted, or madsl's own error ------------------------------------------


def parses_or_refuses(text: str) -> None:
    try:
        topo.parse(text)
    except topo.TopologySyntaxError as err:
        located = topo.locate(err, err.span, text)
        assert located.location.line >= 1 and located.location.column >= 1
        located.render()


GRAMMAR_CHARS = "HAmMbSg()[]{}|:-#=,x×X0123456789.eE+-\"' \n_\\\x00é"


@settings(max_examples=300, **PROFILE)
@given(st.text(st.sampled_from(GRAMMAR_CHARS), max_size=40) | st.text(max_size=20))
def test_any_string_parses_or_gets_a_located_error(text):
    parses_or_refuses(text)


@st.composite
def mutated(draw, base) -> str:
    """A valid text with a few characters inserted, deleted or replaced."""
    text = draw(base)
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "replace", "repeat"]))
        char = draw(st.sampled_from(GRAMMAR_CHARS) | st.characters())
        if op == "insert":
            text = text[:at] + char + text[at:]
        elif op == "delete":
            text = text[:at] + text[at + 1 :]
        elif op == "replace":
            text = text[:at] + char + text[at + 1 :]
        else:  # a long run of one character: deep nesting, huge numbers, many blocks
            text = text[:at] + char * draw(st.sampled_from([40, 400, 5000])) + text[at:]
    return text


@settings(max_examples=200, **PROFILE)
@given(mutated(written_topologies()))
def test_mutated_topologies_parse_or_get_a_located_error(text):
    parses_or_refuses(text)


SPEC = """\
name: fuzz
dim: 128
vocab: 16
topology: '(H:mA-MoE)x2'
channel_mixer: Sg
layers:
  mA: {heads: 8}
  Hx: {base: H, order: 3}
budget:
  params: <= 2M
  fixed_state: 4096 ± 10%
eval: {}
"""
_TMP = tempfile.TemporaryDirectory(prefix="madsl-properties-")  # removed when the test run ends
_DIR = Path(_TMP.name)


YAML_HAZARDS = [
    "&a ",
    "*a",
    "<<: *a\n",
    "<<: ",
    "? ",
    "- ",
    "[",
    "]",
    "{",
    "}",
    ": ",
    "\t",
    "\x07",
    "---\n",
    "!!python/object:os.system ",
    "!!binary ",
    "!!set ",
    ".inf",
    ".nan",
    "1.0e+999",
    "9" * 5000,
    "'",
    '"',
    "|\n",
    ">-\n",
    "%YAML 1.1\n",
    "\ufeff",
    "\u2028",
]


VALUE_HAZARDS = [
    "9" * 5000,
    "-" + "9" * 5000,
    ".inf",
    "-.inf",
    ".nan",
    "1.0e+999",
    "1e400",
    "-5",
    "0",
    "*a",
    "&a 5",
    "[" * 300,
    "{a: " * 100,
    "!!python/name:os.system",
    "<<",
    "{<<: *a}",
    "[*a, *a]",
    "0x" + "f" * 5000,
    "1:" * 300 + "1",
    '"\\x07"',
    "~",
    "''",
    "é",
]
_VALUES = re.compile(r"(?<=: )[^\n,}]+")


@st.composite
def yaml_mutated(draw, base) -> str:
    """A spec with YAML constructs dropped in (anchors, aliases, merge keys, tags) and values
    replaced by odd ones (huge, non-finite, deep)."""
    text = draw(base)
    for _ in range(draw(st.integers(1, 4))):
        values = list(_VALUES.finditer(text))
        if values and draw(st.booleans()):
            value = draw(st.sampled_from(values))
            text = text[: value.start()] + draw(st.sampled_from(VALUE_HAZARDS)) + text[value.end() :]
        else:
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.sampled_from(YAML_HAZARDS)) + text[at:]
    return text


@settings(max_examples=300, **PROFILE)
@given(mutated(st.just(SPEC)) | yaml_mutated(st.just(SPEC)))
def test_mutated_spec_files_load_or_get_a_located_error(text):
    path = _DIR / "fuzz.mad"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        spec = load_spec(path)
        account(spec)
    except MadslError as err:
        assert err.location.file == str(path) and err.location.line, err.render()
        err.render()


def test_float_printing_covers_the_whole_range():
    for number in (5e-324, 2.2250738585072014e-308, 1e16, 1.7976931348623157e308, -0.0, 0.1):
        (block,) = topo.parse(topo.canonical(topo.parse(f"A{{x={number!r}}}")))
        value = dict(block.mixer.overrides)["x"]
        assert value == number and math.copysign(1, value) == math.copysign(1, number)

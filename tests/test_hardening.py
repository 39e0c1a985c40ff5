"""Adversarial input: every bad topology or spec is a located MadslError (exit 2 from the CLI,
no traceback) that answers fast, whatever its size, depth or numbers."""

import subprocess
import sys
import time

import pytest

from madsl import topology as topo
from madsl.errors import MadslError
from madsl.spec import load_spec, spec_from_topology

# A guard against hangs (alias bombs, exponential parsing), not a speed target: the suite runs on
# loaded machines, and speed is measured in benchmarks/. Before the limits these inputs never finished.
HANG = 30.0


def topology_error(text: str) -> MadslError:
    with pytest.raises(topo.TopologySyntaxError) as info:
        topo.parse(text)
    return topo.locate(info.value, info.value.span, text)


HUGE = "9" * 5000  # past Python's 4,300-digit limit on int()

BAD_TOPOLOGIES = [  # (text, message, column)
    ("(" * 300 + "H" + ")" * 300, "nested more than 32 deep", 33),
    ("(" * 33 + "H" + ")" * 33, "nested more than 32 deep", 33),
    (HUGE + "H", "beyond the limit of 1,024 blocks", 1),
    ("(H:A)x" + HUGE, "beyond the limit of 1,024 blocks", 7),
    ("(H:A)x1025", "beyond the limit", 7),
    ("A{heads=" + HUGE + "}", "too large", 9),
    ("A{heads=9223372036854775808}", "too large", 9),
    ("A{rotary_base=1e999}", "out of range", 15),
    ("A{rotary_base=-" + HUGE + ".0}", "out of range", 15),
    ("A{rotary_base=1e-999}", "too small to represent", 15),
    ("((H:A)x1000)x1000", "expands to 2,000,000 blocks", 1),
    ("(H:A)x512:H", "expands to 1,025 blocks", 1),
    ("[" + "|".join(["A"] * 1100) + "]", "more than 1,024 blocks", 2049),
    (":".join(["H"] * 1_000_000), "characters long; the limit is 65,536", 1),
    ('A{x="a\nb"}', "control characters", 5),
    ("H\x1c", "unexpected character", 2),
    ("H\u2028:A", "unexpected character", 2),
    ('A{x="ab}', "unexpected character", 5),
]


@pytest.mark.parametrize("text,message,column", BAD_TOPOLOGIES, ids=range(len(BAD_TOPOLOGIES)))
def test_bad_topologies_are_located_errors_fast(text, message, column):
    start = time.perf_counter()
    err = topology_error(text)
    assert time.perf_counter() - start < HANG
    assert message in err.message, err.render()
    assert (err.location.line, err.location.column) == (1, column), err.render()
    assert "^" in err.render()


def test_limits_hold_at_the_boundary():
    assert topo.size(topo.parse("(" * 32 + "H" + ")" * 32)) == 1
    assert topo.size(topo.parse("(H:A)x512")) == topo.MAX_BLOCKS == 1024
    assert topo.size(topo.parse("[H | mA]:H")) == 3  # a parallel block counts once per branch
    assert topo.size(topo.parse(":".join(["H"] * 1024))) == 1024
    value = dict(topo.parse("A{x=9223372036854775807}")[0].mixer.overrides)["x"]
    assert value == 2**63 - 1
    assert dict(topo.parse("A{x=1e308, y=0.0, z=0e5}")[0].mixer.overrides) == {"x": 1e308, "y": 0.0, "z": 0.0}


def test_the_largest_accepted_topology_resolves_quickly():
    # 1,024 blocks that do not compress: the whole spec pipeline (parse, resolve, canonical form)
    text = ":".join(["H", "A", "Mb", "mA-MoE", "[H | mA]", "Alg"][i * 7 % 6] for i in range(860))
    assert 900 < topo.size(topo.parse(text)) <= topo.MAX_BLOCKS
    start = time.perf_counter()
    spec = spec_from_topology(text)
    spec.identity()
    assert time.perf_counter() - start < HANG


def test_spec_files_past_the_size_limit_are_refused_unread(tmp_path):
    path = tmp_path / "big.mad"
    path.write_text("name: big\ndim: 128\ntopology: H\n" + "# padding\n" * 20_000)
    with pytest.raises(MadslError, match="larger than 128 KiB") as info:
        load_spec(path)
    assert info.value.location.file == str(path)


def madsl(*args):
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "madsl", *args], capture_output=True, text=True, timeout=60)
    return proc, time.perf_counter() - start


@pytest.mark.parametrize(
    "args,message",
    [
        (["check", "/dev/zero"], "larger than 128 KiB"),
        (["check", "README.md/x.mad"], "cannot read"),
        (["compile", "-t", "(" * 400 + "H" + ")" * 400], "nested more than 32 deep"),
        (["expand", "(H)x" + HUGE], "beyond the limit"),
        (["compile", "-t", "A{rotary_base=1e999}"], "out of range"),
    ],
)
def test_cli_bad_input_exits_2_without_traceback(args, message):
    proc, seconds = madsl(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and message in proc.stderr, proc.stderr
    assert seconds < HANG


def test_cli_a_million_block_spec_is_refused_before_parsing(tmp_path):
    path = tmp_path / "million.mad"
    path.write_text("name: m\ndim: 128\ntopology: (H:A)x500000\n")
    proc, _ = madsl("check", str(path))
    assert proc.returncode == 2 and "beyond the limit" in proc.stderr and f"{path}:3:" in proc.stderr, proc.stderr


# --- one model, one identity -------------------------------------------------------------


@pytest.mark.parametrize(
    "a,b",
    [
        ("A{heads=1}", "A"),
        ("A{rotary_base=10000}", "A"),
        ("H-Sg{inner=512}", "H"),
        ("A{heads=1}:A", "(A)x2"),
        ("[A{heads=1} | H]-MoE", "[A | H]-MoE"),
        ("Mb{d_state=4}-none", "Mb"),
        ("A#t{heads=1}:H:A#t", "A#t:H:A#t"),
    ],
)
def test_overrides_that_restate_a_default_do_not_change_the_identity(a, b):
    assert spec_from_topology(a).identity() == spec_from_topology(b).identity()
    assert spec_from_topology(a).canonical() == spec_from_topology(b).canonical()


def test_overrides_compare_with_the_spec_s_own_symbol_values(tmp_path):
    def spec(topology):
        path = tmp_path / "s.mad"
        path.write_text(f"name: s\ndim: 128\ntopology: '{topology}'\nlayers:\n  A: {{heads: 4}}\n")
        return load_spec(path)

    assert spec("A{heads=4}").identity() == spec("A").identity()
    assert spec("A{heads=1}").canonical() == "A{heads=1}"  # not this spec's A any more
    assert spec_from_topology("A{heads=2}").identity() != spec_from_topology("A").identity()


# --- budgets -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bound,message",
    [
        ("-5", "cannot be negative"),
        ("1e400", "finite"),
        ("1.0e+400", "finite"),
        (".nan", "finite"),
        ("<= -1", "cannot be negative"),
        ("{max: 1e400}", "finite"),
        ("{min: -1k}", "cannot be negative"),
        ("500k ± 1e400%", "finite"),
        ("500k ± -5", "cannot be negative"),
        ("500k ± -5%", "cannot be negative"),
        ("-5 ± 10%", "cannot be negative"),
    ],
)
def test_budgets_that_bound_nothing_are_bad_input(tmp_path, bound, message):
    path = tmp_path / "b.mad"
    path.write_text(f"name: b\ndim: 128\ntopology: H\nbudget:\n  params: {bound}\n")
    with pytest.raises(MadslError, match=message) as info:
        load_spec(path)
    # at the value; a number YAML reads as non-finite, at that number
    assert (info.value.location.line, info.value.location.column) == (5, 17 if bound == "{max: 1e400}" else 11)


def test_cli_bad_budgets_and_tolerances_exit_2(tmp_path):
    path = tmp_path / "b.mad"
    path.write_text("name: b\ndim: 128\ntopology: H\nbudget:\n  params: -5\n")
    proc, _ = madsl("check", str(path))
    assert proc.returncode == 2 and f"{path}:5:11" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    proc, _ = madsl("check", "specs/paper/hyena-sg.mad", "--iso-params", "nan")
    assert proc.returncode == 2 and "--iso-params" in proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize("text", ["nan", "inf", "-1%", "1e400%", "five"])
def test_iso_params_tolerances_that_are_not_numbers_are_refused(text):
    from madsl.lang.budget import BudgetError, parse_tolerance

    with pytest.raises(BudgetError):
        parse_tolerance(text)
    assert parse_tolerance("5%") == 0.05 and parse_tolerance("0.05") == 0.05


def test_an_error_in_a_long_line_shows_the_part_around_it():
    text = ":".join(["H"] * 1000) + ":Hy{" + ",".join(f"k{i}=1" for i in range(4000)) + "}"
    err = topology_error(text.replace("Hy{", "Hy{(", 1))
    rendered = err.render()
    assert len(rendered) < 1000 and err.location.column == 2004, rendered
    source, caret = rendered.splitlines()[3:5]
    assert source[caret.index("^")] == "(" and source.count("...") == 2


# --- YAML ----------------------------------------------------------------------------------


def laughs(levels: int, fan: int = 9) -> str:
    """A billion-laughs document: each anchor is a list of `fan` aliases of the one before."""
    lines = ["name: x", "dim: 128", "topology: H", "description: &a0 lol"]
    lines += [f"l{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fan)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "text,message,line,column",
    [
        (laughs(9), "more than 10,000 values", 9, 10),
        (laughs(5), "more than 10,000 values", 9, 10),
        ("name: x\ndim: 128\ntopology: H\neval: " + "[" * 1000 + "]" * 1000 + "\n", "nest", 4, None),
        (
            "name: x\ndim: 128\ntopology: H\neval:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 200)),
            "nested more than 64 deep",
            68,
            None,
        ),
        ("name: x\ndim: 128\ntopology: 'é\x07'\n", "character '\\x07' is not allowed", 3, 13),
        ("name: x\ndim: " + "9" * 5000 + "\ntopology: H\n", "too large", 2, 6),
        ("name: x\ndim: .inf\ntopology: H\n", "not a finite number", 2, 6),
        ("name: x\ndim: 128\ntopology: H\nbudget: {params: 1.0e+999}\n", "not a finite number", 4, 18),
        ("name: x\ndim: 128\ntopology: H\nbase: &b {dim: 64}\n<<: 5\n", "for merging", 5, 5),
        ("name: x\ndim: 128\ntopology: H\neval: &e {set: *e}\n", "inside the value it names", 4, 16),
        (
            "name: x\ndim: 128\ntopology: A\nlayers:\n  A: &a {heads: 2}\n  mA: &m {<<: *a}\n  Alg: {<<: *m}\n",
            "merges inside merges are not supported",
            7,
            9,
        ),
        ("name: x\ndim: 128\ntopology: H\n!!set s: 1\n", "a key must be a name or a number", 4, 1),
    ],
)
def test_bad_yaml_is_a_located_error_fast(tmp_path, text, message, line, column):
    path = tmp_path / "y.mad"
    path.write_text(text, encoding="utf-8")
    start = time.perf_counter()
    with pytest.raises(MadslError) as info:
        load_spec(path)
    assert time.perf_counter() - start < HANG
    err = info.value
    assert message in err.message, err.render()
    assert err.location.file == str(path) and err.location.line == line, err.render()
    if column is not None:
        assert err.location.column == column, err.render()


def test_yaml_aliases_and_merge_keys_within_the_limits_work(tmp_path):
    path = tmp_path / "m.mad"
    path.write_text(
        "name: m\ndim: 128\ntopology: A:mA\nlayers:\n  A: &heads {heads: 4}\n  mA:\n    <<: *heads\n    head_dim: 32\n"
    )
    spec = load_spec(path)
    assert spec.symbols["A"].params["heads"] == 4
    assert spec.symbols["mA"].params["heads"] == 4 and spec.symbols["mA"].params["head_dim"] == 32
    # a merged key is located where it is written: here, in mA's mapping (gla has no head_dim)
    path.write_text(
        "name: m\ndim: 128\ntopology: mA:Alg\nlayers:\n  mA: &m {heads: 8, head_dim: 16}\n  Alg: {<<: *m}\n"
    )
    with pytest.raises(MadslError, match="no parameter 'head_dim'") as info:
        load_spec(path)
    assert (info.value.location.line, info.value.location.column) == (5, 21), info.value.render()
    path.write_text(laughs(3))  # 9^3 aliases: fine, and fast
    start = time.perf_counter()
    with pytest.raises(MadslError, match="unknown key 'l1'"):
        load_spec(path)
    assert time.perf_counter() - start < HANG


def test_cli_yaml_bombs_exit_2_fast(tmp_path):
    path = tmp_path / "bomb.mad"
    path.write_text(laughs(12))
    proc, seconds = madsl("check", str(path))
    assert proc.returncode == 2 and f"{path}:9:10" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert seconds < HANG

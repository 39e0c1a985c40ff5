"""The topology language: Table D.1 strings, every syntax form, canonical form, located errors."""

import pytest

from madsl import topology as topo

TABLE_D1 = [
    "(1H:1A)x12",
    "(2H:2A)x6",
    "(3H:3A)x4",
    "(4H:4A)x3",
    "(6H:6A)x2",
    "12H:12A",
    "(2H:4A:4H:2A)x2",
    "(H:5A:5H:A)x2",
    "4H:10A:8H:2A",
    "4H:12A:8H",
    "6H:12A:6H",
    "8H:12A:4A",
]


def symbols(text):
    return [b.mixer.symbol for b in topo.blocks(topo.parse(text))]


@pytest.mark.parametrize("text", TABLE_D1)
def test_table_d1_strings_are_24_layers_of_hyena_and_attention(text):
    seq = symbols(text)
    assert len(seq) == 24
    assert set(seq) == {"H", "A"}


def test_table_d1_meanings():
    assert symbols("(2H:4A:4H:2A)x2") == list("HHAAAAHHHHAA") * 2
    assert symbols("(H:5A:5H:A)x2") == (["H"] + ["A"] * 5 + ["H"] * 5 + ["A"]) * 2
    assert symbols("8H:12A:4A") == ["H"] * 8 + ["A"] * 16
    assert symbols("(1H:1A)x12") == ["H", "A"] * 12


@pytest.mark.parametrize(
    "text",
    TABLE_D1
    + [
        "H-Sg:mA-MoE",
        "[H | mA]-Sg",
        "A{heads=4}",
        "(2A:2Mb){residual=gated}",
        "H#a : A : H#a",
        "((H:A)x2:Mb)x3",
        "(H:A)×2",
        "2(H:A)x3",
        "H-none",
        "Alg{key_dim=16,value_dim=32}",
        "[H#x | mA{heads=2}]-MoE",
        "(A:(2Mb){residual=add})x2",
        "Mb{expand=2.0}",
        'H{filter="hyena"}',
    ],
)
def test_canonical_round_trip(text):
    parsed = topo.parse(text)
    printed = topo.canonical(parsed)
    assert topo.expand(topo.parse(printed)) == topo.expand(parsed)
    assert topo.canonical(topo.parse(printed)) == printed  # idempotent


@pytest.mark.parametrize(
    "a,b",
    [
        ("(1H:1A)x12", "H:A:H:A:H:A:H:A:H:A:H:A:H:A:H:A:H:A:H:A:H:A:H:A"),
        ("4A", "A:A:A:A"),
        ("(2H:2A)x6", "(H:H:A:A)x6"),
        ("2(H:A)", "(H:A)x2"),
        ("((H:A)x2)x3", "(H:A)x6"),
        ("(H:A){residual=none}", "H:A"),
        ("A{heads=4, bias=false}", "A{bias=false,heads=4}"),
        ("(H : A) x 2", "(H:A)x2"),
    ],
)
def test_two_spellings_are_one_architecture(a, b):
    assert topo.canonical(topo.parse(a)) == topo.canonical(topo.parse(b))


def test_canonical_forms_of_table_d1():
    assert topo.canonical(topo.parse("(1H:1A)x12")) == "(H:A)x12"
    assert topo.canonical(topo.parse("12H:12A")) == "12H:12A"
    assert topo.canonical(topo.parse("(2H:4A:4H:2A)x2")) == "(2H:4A:4H:2A)x2"


def test_structure_of_blocks_parallel_groups_tags():
    (block,) = topo.parse("H-Sg")
    assert block.mixer.symbol == "H" and block.channel.symbol == "Sg"
    (block,) = topo.parse("[H | mA]")
    assert isinstance(block.mixer, topo.Parallel) and [b.symbol for b in block.mixer.branches] == ["H", "mA"]
    (group,) = topo.parse("(2A:2Mb){residual=gated}")
    assert isinstance(group, topo.Group) and dict(group.attrs) == {"residual": "gated"}
    layers = [b.mixer for b in topo.blocks(topo.parse("H#a : A : H#a"))]
    assert layers[0] == layers[2] and layers[0].tag == "a"
    (block,) = topo.parse("A{heads=4, rotary=false, rotary_base=1e4}")
    assert dict(block.mixer.overrides) == {"heads": 4, "rotary": False, "rotary_base": 1e4}


def test_expanded_text():
    assert topo.expanded_text(topo.parse("(H:2A)x2")) == "H : A : A : H : A : A"


BAD = {
    "": "empty",
    "(": "ends too early",
    "H::A": "unexpected ':'",
    "()": "unexpected ')'",
    "(H:A)x0": "at least 1",
    "0A": "at least 1",
    "H-": "ends too early",
    "[H]": "unexpected ']'",
    "(H){resid=add}": "unknown group attribute",
    "(H){residual=maybe}": "must be one of",
    "A{heads=4": "ends too early",
    "H * 2": "unexpected character",
    "(H:A)x2{residual=gated}": "unexpected '{'",
    "A{heads=4,heads=5}": "set twice",
    "H:A)": "unexpected ')'",
    "H#": "ends too early",
    "3": "ends too early",
    "H A": "unexpected 'A'",
    "(H:A)x": "ends too early",
    "H-Sg-Sg": "unexpected '-'",
}


@pytest.mark.parametrize("text,message", list(BAD.items()))
def test_bad_topologies_give_located_errors(text, message):
    with pytest.raises(topo.TopologySyntaxError) as info:
        topo.parse(text)
    err = topo.locate(info.value, info.value.span, text)
    assert message in err.message
    rendered = err.render()
    assert err.location.line == 1 and err.location.column >= 1
    assert "^" in rendered and "-->" in rendered


@pytest.mark.parametrize(
    "text,printed",
    [
        ('A{heads="true"}', 'A{heads="true"}'),
        ("A{heads='NULL'}", 'A{heads="NULL"}'),
        ("A{x=True}", "A{x=true}"),
        ('A{x="é"}', 'A{x="é"}'),
        ("A{x='say \"hi\"'}", "A{x='say \"hi\"'}"),
        ('A{x="it\'s"}', 'A{x="it\'s"}'),
        ('A{x="4"}', 'A{x="4"}'),
        ('A{x=""}', 'A{x=""}'),
        ('A{x="a b,}"}', 'A{x="a b,}"}'),
        ("A{x=1e16}", "A{x=1e+16}"),
        ("A{x=1.5e-7}", "A{x=1.5e-07}"),
        ("A{x=-3}", "A{x=-3}"),
        ('A{x="inf"}', "A{x=inf}"),
    ],
)
def test_canonical_values_read_back_as_the_same_value_and_type(text, printed):
    parsed = topo.parse(text)
    assert topo.canonical(parsed) == printed
    again = topo.parse(printed)
    assert again == parsed
    assert [type(v) for _, v in again[0].mixer.overrides] == [type(v) for _, v in parsed[0].mixer.overrides]


def test_equal_values_of_different_types_are_different_layers():
    # 1 == 1.0 == True in Python; in a topology they are three different settings
    assert topo.canonical(topo.parse("A{x=1}:A{x=1.0}:A{x=true}")) == "A{x=1}:A{x=1.0}:A{x=true}"
    assert topo.canonical(topo.parse("A{x=1}:A{x=1}")) == "2A{x=1}"

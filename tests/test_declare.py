"""The configuration language (madsl.lang.declare): one declaration per key makes it readable,
checked with a located error, and part of its file kind's JSON Schema (`madsl schema --kind`).

Each case adds a toy key in one place, the section its file kind declares, and reads a file that
sets it, a file that sets it wrong, and the schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from madsl.cli import main
from madsl.errors import MadslError
from madsl.lang.declare import Key, Number, Section, Where
from madsl.lang.yamlsource import load, scalar
from madsl.runner.plan import sweep
from madsl.scaling import study
from madsl.schema import KINDS, file_schema
from madsl.search import keys as search_keys
from madsl.search.reading import load_search

REPO = Path(__file__).resolve().parent.parent
TOY = Key("toy", Number(integer=True, minimum=1), "a toy key of this test")

SWEEP = "specs: [{spec}]\ntrain: {{lr: [1e-3]}}\ntoy: {value}\n"
STUDY = """\
name: tiny
data: bundled:tinyshakespeare
seq_len: 32
architectures: {{transformer: {spec}}}
budgets: [2e9]
sizes: [{{dim: 16}}]
recipe:
  batch_size: 8
  toy: {value}
"""
SEARCH = """\
name: small
dim: 32
space: {{sequence_mixers: [H, A], blocks: 2}}
objectives: {{score: {{protocol: smoke}}}}
algorithm:
  name: random
  population: 2
  generations: 1
  toy: {value}
"""


CASES = {
    # kind: (module holding the file's section, its name there, the section below, text, line, column, reader)
    "sweep": (sweep, "SWEEP_FILE", (), SWEEP, 3, 6, lambda p: sweep.load_sweep(p)),
    "study": (study, "STUDY_FILE", ("recipe",), STUDY, 9, 8, lambda p: study.load_study(p)),
    "search": (search_keys, "SEARCH_FILE", ("algorithm",), SEARCH, 9, 8, lambda p: load_search(p)),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_toy_key_is_read_checked_and_in_the_schema(kind, tmp_path, monkeypatch):
    module, name, below, text, line, column, read = CASES[kind]
    spec = REPO / "specs" / "paper" / "hyena-sg.mad"
    (tmp_path / "hyena-sg.mad").write_text(spec.read_text())
    monkeypatch.setattr(module, name, getattr(module, name).adding(TOY, below))

    good = tmp_path / f"good.{kind}.yaml"
    good.write_text(text.format(spec="hyena-sg.mad", value=3))
    read(good)  # the toy key is known
    data = load(good).data
    jsonschema.validate(data, file_schema(kind))

    bad = tmp_path / f"bad.{kind}.yaml"
    bad.write_text(text.format(spec="hyena-sg.mad", value=0))
    with pytest.raises(MadslError) as raised:
        read(bad)
    err = raised.value.diagnostics[0] if raised.value.diagnostics else raised.value
    assert "toy: expected an integer at least 1, got 0" in err.message
    assert (err.location.file, err.location.line, err.location.column) == (str(bad), line, column)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(load(bad).data, file_schema(kind))

    toy_schema = file_schema(kind)
    for key in below:
        toy_schema = toy_schema["properties"][key]
    assert toy_schema["properties"]["toy"] == {"type": "integer", "minimum": 1, "description": TOY.help}


@pytest.mark.parametrize("kind", KINDS)
def test_every_schema_is_valid_and_printed(kind, capsys):
    jsonschema.Draft202012Validator.check_schema(file_schema(kind))
    assert main(["schema", "--kind", kind]) == 0
    assert json.loads(capsys.readouterr().out) == file_schema(kind)
    assert main(["schema", "--kind", kind, "--format", "text"]) == 0
    assert "required" in capsys.readouterr().out


def test_bundled_files_validate_against_their_schemas():
    """Every bundled study and search file (and sweep file, none bundled today) is valid by the
    schema of its kind."""
    found = {"sweep": 0, "study": 0, "search": 0}
    for path in sorted(REPO.glob("**/*.yaml")):
        if ".venv" in path.parts or "stdlib" in path.parts or ".github" in path.parts:
            continue
        data = load(path).data
        if not isinstance(data, dict):
            continue
        kind = "sweep" if "specs" in data else "study" if "budgets" in data else "search" if "space" in data else None
        if kind:
            jsonschema.validate(data, file_schema(kind))
            found[kind] += 1
    assert found["study"] and found["search"], found


def test_numbers_are_read_as_yaml_1_2_reads_them():
    """One float resolver: 1e-3 is a number in every file madsl reads and on the command line."""
    assert scalar("1e-3") == 0.001 and scalar("2E+5") == 200000.0 and scalar("1.5") == 1.5
    assert scalar("2.5e11") == 2.5e11 and scalar(".5e1") == 5.0 and scalar("-3.e2") == -300.0
    assert scalar("12") == 12 and scalar("1e") == "1e" and scalar("e5") == "e5"
    import yaml

    assert yaml.safe_load("1e-3") == "1e-3"  # PyYAML's own loader is left as it is


def test_a_section_locates_unknown_and_missing_keys(tmp_path):
    path = tmp_path / "f.yaml"
    path.write_text("a: 1\nbee: 2\n")
    section = Section("a toy file", (Key("a", Number(), "a"), Key("b", Number(), "b")))
    with pytest.raises(MadslError) as raised:
        section.check(load(path).data, Where(load(path)), "")
    assert raised.value.message == "unknown key 'bee' in a toy file"
    assert (raised.value.location.line, raised.value.location.column) == (2, 1)
    assert raised.value.hint == "did you mean 'b'?"
    from madsl.lang.declare import REQUIRED

    needing = Section("a toy file", (Key("a", Number(), "a"), Key("c", Number(), "the c", REQUIRED)))
    with pytest.raises(MadslError, match=r"a toy file needs c: \(the c\)"):
        needing.check({"a": 1}, Where(), "")

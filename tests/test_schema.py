"""`madsl schema`: every bundled spec validates; specs the loader refuses, the schema refuses too."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

import madsl
from madsl.schema import spec_schema

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

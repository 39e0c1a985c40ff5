"""Freezing named layers from `madsl eval` (hybrid fine-tuning, issue 5)."""

import subprocess
import sys

from madsl.runner.plan.overrides import overrides_from_spec_eval


def test_unknown_layer_to_freeze_is_a_located_error(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "madsl",
            "eval",
            "specs/hybrid/selcopy-hybrid-gated-1.mad",
            "--freeze",
            "Mx",
            "--db",
            str(tmp_path / "r.db"),
            "--quiet",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "did you mean 'Mb'" in proc.stderr and "Traceback" not in proc.stderr


def test_freeze_from_the_spec_eval_section():
    assert overrides_from_spec_eval({"freeze": ["Mb", "#a"]}).freeze == ("Mb", "#a")
    assert overrides_from_spec_eval({"freeze": "embedding"}).freeze == ("embedding",)

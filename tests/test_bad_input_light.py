"""Bad input on the surfaces that train (data prepare, scale, search, report --study, eval) is
answered before torch is imported: a mistake costs no torch start-up and none of its threads."""

import subprocess
import sys

import pytest

PROBE = """
import sys
from madsl.cli import main
code = main(sys.argv[1:])
print("torch imported" if "torch" in sys.modules else "no torch", code)
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["data", "prepare", "missing.txt", "--tokenizer", "bytes", "-o", "out"],
        ["data", "prepare", "", "--tokenizer", "bytes", "-o", "out"],
        ["scale", "study.yaml", "--dry-run"],
        ["scale", "study.yaml"],
        ["search", "search.yaml", "--dry-run"],
        ["search", "search.yaml"],
        ["report", "--study", "study.yaml"],
        ["eval", "missing.mad"],
    ],
)
def test_bad_input_never_imports_torch(tmp_path, argv):
    (tmp_path / "study.yaml").write_text("name: s\ndata: bundled:tinyshakespeare\nbudgets: [1e12]\n")
    (tmp_path / "search.yaml").write_text("name: ../evil\n")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert proc.stdout.split()[-3:] == ["no", "torch", "2"], proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr

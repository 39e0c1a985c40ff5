"""pyproject.toml lists packages explicitly (because of the package-dir mapping); a package left out would be
missing from the wheel, so every package under madsl/ must be listed."""
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_under_madsl_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "madsl").rglob("__init__.py")}
    assert found <= listed, f"add to pyproject.toml's packages: {sorted(found - listed)}"
    mapped = set(config["package-dir"])
    assert listed - found == mapped, "listed packages that do not exist"

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


def test_every_extra_that_installs_torch_installs_what_eval_keep_best_needs():
    """`pip install 'madsl[torch]'` is the documented install for eval (docs/ci.md): `--keep best`
    and `madsl export` write safetensors, so each extra that brings torch brings it too."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    names = {extra: {req.split(">")[0].split("=")[0].split(";")[0].strip() for req in reqs}
             for extra, reqs in extras.items()}
    with_torch = [extra for extra, reqs in names.items() if "torch" in reqs]
    assert {"torch", "ray", "cuda", "dev"} <= set(with_torch)
    assert [extra for extra in with_torch if "safetensors" not in names[extra]] == []


def test_the_built_wheel_works_installed_without_torch(tmp_path):
    """Build the wheel, install it (no dependencies) into a folder away from the checkout and
    check a spec from there, as `pip install` and the pre-commit hook do: the grammar and
    stdlib data must be found inside the installed package."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    wheel_dir, target = tmp_path / "wheel", tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheel_dir), str(root)], capture_output=True, text=True)
    if build.returncode != 0 and "No module named pip" in build.stderr:
        pytest.skip("pip is not available")
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = wheel_dir.glob("madsl-*.whl")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                              str(wheel)], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-2000:]
    spec = tmp_path / "mamba.mad"
    spec.write_text((root / "specs/paper/mamba.mad").read_text())
    proc = subprocess.run([sys.executable, "-m", "madsl", "check", str(spec), "-q"], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert str(target) in subprocess.run([sys.executable, "-c", "import madsl; print(madsl.__file__)"],
                                         capture_output=True, text=True, cwd=tmp_path,
                                         env={**os.environ, "PYTHONPATH": str(target)}).stdout

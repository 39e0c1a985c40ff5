"""pyproject.toml lists packages explicitly (because of the package-dir mapping); a package left out would be
missing from the wheel, so every package under madsl/ must be listed."""

import re
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
    names = {extra: _installed_by(extras, extra) for extra in extras}
    with_torch = [extra for extra, reqs in names.items() if "torch" in reqs]
    assert {"torch", "ray", "cuda", "dev"} <= set(with_torch)
    assert [extra for extra in with_torch if "safetensors" not in names[extra]] == []


def _installed_by(extras: dict, extra: str) -> set[str]:
    """The package names an extra installs, its self-references (madsl[torch]) followed."""
    names = set()
    for requirement in extras[extra]:
        name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip()
        if name == "madsl":
            for included in re.search(r"\[(.*)\]", requirement).group(1).split(","):
                names |= _installed_by(extras, included.strip())
        else:
            names.add(name)
    return names


def test_installs_are_pinned_by_one_constraints_file():
    """The README's two commands and .ci/run install with constraints.txt, which pins (==) every
    package the dev extra brings, so that a fresh clone resolves the versions the suite is tested with."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[name.lower().replace("_", "-")] = version
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    wanted = {n.lower().replace("_", "-") for n in _installed_by(extras, "dev")}
    assert wanted - set(pins) == set(), "pin these in constraints.txt"
    for place in ("README.md", ".ci/run"):
        text = (ROOT / place).read_text(encoding="utf-8")
        installs = re.findall(r"pip install -q[^\n&]*-e '\.\[dev\]'", text)
        assert installs and all("-c constraints.txt" in i for i in installs), place


def test_the_built_wheel_works_installed_without_torch(tmp_path):
    """Build the wheel, install it (no dependencies) into a folder away from the checkout and
    check a spec from there, as `pip install` and the pre-commit hook do: the grammar and
    stdlib data must be found inside the installed package."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    wheel_dir, target = tmp_path / "wheel", tmp_path / "site"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheel_dir),
            str(root),
        ],
        capture_output=True,
        text=True,
    )
    if build.returncode != 0 and "No module named pip" in build.stderr:
        pytest.skip("pip is not available")
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = wheel_dir.glob("madsl-*.whl")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    spec = tmp_path / "mamba.mad"
    spec.write_text((root / "specs/paper/mamba.mad").read_text())
    proc = subprocess.run(
        [sys.executable, "-m", "madsl", "check", str(spec), "-q"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(target)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        str(target)
        in subprocess.run(
            [sys.executable, "-c", "import madsl; print(madsl.__file__)"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(target)},
        ).stdout
    )

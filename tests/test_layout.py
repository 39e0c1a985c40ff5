"""The package stays readable top to bottom: no module of madsl over MAX_MODULE_LINES lines, no
function over MAX_FUNCTION_LINES, each of the runner's sub-packages says what it holds, and the
runner's docstring names every one of them (DEVELOPERS.md: one idea per module)."""

from __future__ import annotations

import ast
from pathlib import Path

import madsl

PACKAGE_DIR = Path(madsl.__file__).parent
REPO = PACKAGE_DIR.parent
RUNNER_DIR = PACKAGE_DIR / "runner"

MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60

# What exceeds a limit today, with its size when this list was written (as committed): each may
# shrink, none may grow, and one that comes within its limit must leave the list (so the list only
# ever shrinks). Nothing else may join it: split the module, or the function, instead.
LONG_MODULES = {}
LONG_FUNCTIONS: dict[str, int] = {  # "path:qualified name" (a method as Class.method)
}


def modules() -> list[Path]:
    return sorted(PACKAGE_DIR.rglob("*.py"))


def relative(path: Path, root: Path = REPO) -> str:
    return path.relative_to(root).as_posix()


def module_lines() -> dict[str, int]:
    return {relative(path): len(path.read_text(encoding="utf-8").splitlines()) for path in modules()}


def function_lines(path: Path, root: Path = REPO) -> dict[str, int]:
    """Every function of the module (methods and nested functions too) by "path:qualified name":
    its lines from `def` to its last line (decorators aside)."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                out[f"{relative(path, root)}:{name}"] = child.end_lineno - child.lineno + 1
                visit(child, name + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), "")
    return out


def all_function_lines() -> dict[str, int]:
    return {name: size for path in modules() for name, size in function_lines(path).items()}


def over(sizes: dict[str, int], limit: int, allowed: dict[str, int]) -> list[str]:
    """What breaks the rule: a size over `limit` not listed, a listed one that grew, a listed one
    gone or back within the limit (to be struck from the list)."""
    problems = [
        f"{name}: {size} lines (at most {limit})"
        for name, size in sorted(sizes.items())
        if size > limit and name not in allowed
    ]
    for name, recorded in sorted(allowed.items()):
        size = sizes.get(name)
        if size is None:
            problems.append(f"{name}: listed as too long, but it is gone: strike it from the list")
        elif size > recorded:
            problems.append(f"{name}: {size} lines, grew past the {recorded} it is listed with")
        elif size <= limit:
            problems.append(f"{name}: {size} lines, within {limit} now: strike it from the list")
    return problems


def test_no_module_is_too_long():
    assert over(module_lines(), MAX_MODULE_LINES, LONG_MODULES) == []


def test_no_function_is_too_long():
    assert over(all_function_lines(), MAX_FUNCTION_LINES, LONG_FUNCTIONS) == []


def test_the_check_sees_methods_and_nested_functions(tmp_path):
    # the check must be able to fail where a long function hides: in a class, or in a function
    source = tmp_path / "madsl" / "m.py"
    source.parent.mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(3))
    source.write_text(f"class A:\n    def f(self):\n{body}\n\n\ndef g():\n    def h():\n{body}\n    return h\n")
    sizes = function_lines(source, root=tmp_path)
    assert sizes == {"madsl/m.py:A.f": 4, "madsl/m.py:g": 6, "madsl/m.py:g.<locals>.h": 4}
    assert over(sizes, 3, {"madsl/m.py:g": 6}) == [
        "madsl/m.py:A.f: 4 lines (at most 3)",
        "madsl/m.py:g.<locals>.h: 4 lines (at most 3)",
    ]
    assert over(sizes, 3, {"madsl/m.py:g": 5}) == [
        "madsl/m.py:A.f: 4 lines (at most 3)",
        "madsl/m.py:g.<locals>.h: 4 lines (at most 3)",
        "madsl/m.py:g: 6 lines, grew past the 5 it is listed with",
    ]
    assert over(sizes, 6, {"madsl/m.py:g": 9, "madsl/m.py:gone": 70}) == [
        "madsl/m.py:g: 6 lines, within 6 now: strike it from the list",
        "madsl/m.py:gone: listed as too long, but it is gone: strike it from the list",
    ]


def runner_subpackages() -> list[Path]:
    return sorted(path.parent for path in RUNNER_DIR.glob("*/__init__.py"))


def test_every_runner_subpackage_says_what_it_holds():
    assert runner_subpackages(), "the runner has no sub-packages?"
    for package in runner_subpackages():
        docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8")))
        assert docstring and docstring.strip(), f"{relative(package)}/__init__.py has no docstring"


def test_the_runners_docstring_names_every_subpackage():
    import madsl.runner

    for package in runner_subpackages():
        assert f"    {package.name}/ " in madsl.runner.__doc__, (
            f"madsl/runner/__init__.py's docstring does not describe its room {package.name}/"
        )

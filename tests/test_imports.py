"""The package's import graph, read from its `import` statements, has no loop (DEVELOPERS.md: data flows one way)."""

from pathlib import Path

from test_layers import imports

import madsl

PACKAGE_DIR = Path(madsl.__file__).parent


def module_names() -> dict[str, Path]:
    """madsl.x.y -> its file; a package is named by its __init__.py."""
    names = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = ("madsl",) + path.relative_to(PACKAGE_DIR).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The madsl modules that `name` imports anywhere in its body (inside functions too), as the deepest
    known module each import statement names (test_layers.imports, without the lines)."""
    return {target for target, _ in imports(name, path, known)}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def import_graph() -> dict[str, set[str]]:
    names = module_names()
    return {name: imported_modules(name, path, set(names)) for name, path in names.items()}


def test_the_package_import_graph_has_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_nothing_below_the_cli_imports_it():
    graph = import_graph()
    importers = sorted(
        m
        for m, deps in graph.items()
        if not m.startswith("madsl.cli") and any(d == "madsl.cli" or d.startswith("madsl.cli.") for d in deps)
    )
    assert importers == ["madsl.__main__"]


def test_the_cycle_finder_finds_a_cycle_across_function_level_and_relative_imports(tmp_path):
    # the check must be able to fail: the loop cli.py <-> runner/cli_commands.py it was written for
    pkg = tmp_path / "madsl"
    (pkg / "runner").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text("def build():\n    from .runner import cli_commands\n")
    (pkg / "runner" / "__init__.py").write_text("")
    (pkg / "runner" / "cli_commands.py").write_text("from madsl.cli import _positive_int\n")
    names = {
        n: p
        for n, p in {
            "madsl": pkg / "__init__.py",
            "madsl.cli": pkg / "cli.py",
            "madsl.runner": pkg / "runner" / "__init__.py",
            "madsl.runner.cli_commands": pkg / "runner" / "cli_commands.py",
        }.items()
    }
    graph = {n: imported_modules(n, p, set(names)) for n, p in names.items()}
    assert find_cycle(graph) == ["madsl.cli", "madsl.runner.cli_commands", "madsl.cli"]

"""The package is layered (DEVELOPERS.md, madsl/runner/__init__.py): every module belongs to a layer
and imports only from its own layer or the ones below it, read from every `import` statement
(inside functions and under TYPE_CHECKING too). Bottom first:

    base       errors, paths, outputs, OS error words, resources, the version
    language   the topology and spec languages, the stdlib and primitives, the graph, budgets, fit
    interop    conversions to and from other tools' configurations (Megatron, Hugging Face)
    model      the layers, kernels and the compiler (torch), the model file format
    tasks      the MAD tasks
    corpus     text for pretraining
    runner     plans, trains and records runs; inside it, its rooms in this order:
               common < train < store < execute < batched < pretrain < plan < reports < its API
    studies    scaling studies and architecture search, built on the runner
    report     the results where researchers look: trackers (TensorBoard, MLflow) and the HTML page,
               read from the runner's records and the studies'
    schema     `madsl schema`: the schemas of every file kind, from the language's keys and the
               sections the runner and the studies declare
    cli        the command line, and the package's own face (madsl/__init__.py)

tests/test_imports.py checks there is no cycle at all; this test checks the direction."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Sequence

import madsl

PACKAGE_DIR = Path(madsl.__file__).parent
REPO = PACKAGE_DIR.parent

# (layer, modules): "x.*" is x and everything below it, "x" that module alone
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("madsl._version", "madsl.errors", "madsl.paths", "madsl.outputs", "madsl.oserrors", "madsl.resources")),
    (
        "language",
        (
            "madsl.lang.*",
            "madsl.primitives.*",
            "madsl.graph",
            "madsl.plan_layout",
            "madsl.structure",
            "madsl.fit",
            "madsl.conventions",
            "madsl.report_text",
            "madsl.spec",
            "madsl.topology",
        ),
    ),  # (first addresses)
    ("interop", ("madsl.interop.*", "madsl.convert", "madsl.hf_config")),
    (
        "model",
        (
            "madsl.layers.*",
            "madsl.kernels.*",
            "madsl.model",
            "madsl.model_parts",
            "madsl.compiler",
            "madsl.model_file",
            "madsl.weights.*",
        ),
    ),
    ("tasks", ("madsl.tasks.*",)),
    ("corpus", ("madsl.corpus.*",)),
    ("runner", ("madsl.runner.*",)),
    ("studies", ("madsl.scaling.*", "madsl.search.*")),
    ("report", ("madsl.report.*",)),
    ("schema", ("madsl.schema", "madsl.schema_patterns")),
    ("cli", ("madsl.cli.*", "madsl.__main__", "madsl")),
)
RUNNER_ROOMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("runner/common", ("madsl.runner.common.*",)),
    ("runner/train", ("madsl.runner.train.*",)),
    ("runner/store", ("madsl.runner.store.*",)),
    ("runner/execute", ("madsl.runner.execute.*",)),
    ("runner/batched", ("madsl.runner.batched.*",)),
    ("runner/pretrain", ("madsl.runner.pretrain.*",)),
    ("runner/plan", ("madsl.runner.plan.*",)),
    ("runner/reports", ("madsl.runner.reports.*",)),
    ("runner's API", ("madsl.runner", "madsl.runner.config", "madsl.runner.launch", "madsl.runner.api")),
)
Order = Sequence[tuple[str, Sequence[str]]]


def module_names(package_dir: Path = PACKAGE_DIR) -> dict[str, Path]:
    """madsl.x.y -> its file; a package is named by its __init__.py."""
    names = {}
    for path in package_dir.rglob("*.py"):
        parts = (package_dir.name,) + path.relative_to(package_dir).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(the madsl module imported, the line) of every import statement of `name`, anywhere in its
    body, as the deepest known module it names: `from madsl.runner import api` -> madsl.runner.api."""
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            targets = [f"{origin}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # madsl.lang.spec.load_spec -> madsl.lang.spec
                target = target.rpartition(".")[0]
            if target and target != name:
                out.append((target, node.lineno))
    return out


def rank(module: str, order: Order) -> tuple[int, str] | None:
    """(its layer's place in `order`, the layer's name); the most specific pattern decides."""
    found = None
    for index, (layer, patterns) in enumerate(order):
        for pattern in patterns:
            stem = pattern.removesuffix(".*")
            covers = module == stem or (pattern.endswith(".*") and module.startswith(stem + "."))
            if covers and (found is None or len(stem) > found[0]):
                found = (len(stem), index, layer)
    return None if found is None else found[1:]


def place(module: str, layers: Order = LAYERS, rooms: Order = RUNNER_ROOMS) -> tuple[tuple[int, str], ...] | None:
    """Where a module sits: its layer, and inside the runner its room as well."""
    layer = rank(module, layers)
    if layer is None:
        return None
    room = rank(module, rooms)
    return (layer, room) if room is not None else (layer,)


def upward_imports(
    modules: dict[str, Path], layers: Order = LAYERS, rooms: Order = RUNNER_ROOMS, root: Path = REPO
) -> list[str]:
    """Every import from a lower layer (or runner room) to a higher one, and every module in no layer,
    each with its file:line."""
    problems = []
    known = set(modules)
    for name, path in sorted(modules.items()):
        here = place(name, layers, rooms)
        where = path.relative_to(root).as_posix()
        if here is None:
            problems.append(f"{where}: {name} is in no layer (place it in tests/test_layers.py's LAYERS)")
            continue
        for target, line in imports(name, path, known):
            there = place(target, layers, rooms)
            if there is None:
                continue  # reported as a module of its own
            higher = there[0][0] > here[0][0] or (
                len(here) == len(there) == 2 and there[0][0] == here[0][0] and there[1][0] > here[1][0]
            )
            if higher:
                problems.append(
                    f"{where}:{line}: {name} ({here[-1][1]}) imports {target} ({there[-1][1]}), a higher layer"
                )
    return problems


def test_every_import_goes_down_the_layers():
    problems = upward_imports(module_names())
    assert not problems, "imports against the layers (DEVELOPERS.md):\n" + "\n".join(problems)


def test_the_language_does_not_import_the_runner():
    modules = module_names()
    offending = [
        f"{name} imports {target} (line {line})"
        for name, path in sorted(modules.items())
        if place(name) is not None and place(name)[0][1] in ("base", "language")
        for target, line in imports(name, path, set(modules))
        if target.startswith("madsl.runner")
    ]
    assert offending == []


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))  # __version__ is public


def test_no_module_imports_another_modules_private_names():
    # evaluate, scale and search plan their jobs, then run them through the runner's public API;
    # and anywhere in madsl, a name another module uses is public (no leading underscore)
    modules = module_names()
    offending = []
    for name, path in sorted(modules.items()):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            origin = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
            if origin.startswith("madsl") and origin != name:
                offending += [
                    f"{name}:{node.lineno} imports {node.module}.{alias.name}"
                    for alias in node.names
                    if _private(alias.name) or _private(alias.asname or "")
                ]
    assert offending == []


def test_the_runners_rooms_are_all_placed():
    # a new room of the runner must be given its place (and its line in madsl/runner/__init__.py)
    rooms = {path.parent.name for path in (PACKAGE_DIR / "runner").glob("*/__init__.py")}
    placed = {layer.partition("/")[2] for layer, _ in RUNNER_ROOMS if "/" in layer}
    assert rooms == placed


def test_the_check_finds_an_upward_import_with_its_line(tmp_path):
    # the check must be able to fail: a language module that reaches up into the runner, a runner
    # room that reaches up into the plan (a function-level, relative import), and a module in no layer
    pkg = tmp_path / "madsl"
    files = {
        "__init__.py": "",
        "errors.py": "",
        "lang/__init__.py": "",
        "lang/spec.py": "import os\n\ndef f():\n    from madsl.runner.plan import settings\n",
        "runner/__init__.py": "",
        "runner/plan/__init__.py": "",
        "runner/plan/settings.py": "from madsl import errors\n",
        "runner/train/__init__.py": "",
        "runner/train/loop.py": "def g():\n    from ..plan import settings\n",
        "stray.py": "",
    }
    for relative, text in files.items():
        (pkg / relative).parent.mkdir(parents=True, exist_ok=True)
        (pkg / relative).write_text(text)
    layers = (
        ("base", ("madsl.errors",)),
        ("language", ("madsl.lang.*",)),
        ("runner", ("madsl.runner.*",)),
        ("cli", ("madsl",)),
    )
    rooms = (
        ("runner/train", ("madsl.runner.train.*",)),
        ("runner/plan", ("madsl.runner.plan.*",)),
        ("runner's API", ("madsl.runner",)),
    )
    problems = upward_imports(module_names(pkg), layers, rooms, root=tmp_path)
    assert problems == [
        "madsl/lang/spec.py:4: madsl.lang.spec (language) imports madsl.runner.plan.settings (runner/plan), "
        "a higher layer",
        "madsl/runner/train/loop.py:2: madsl.runner.train.loop (runner/train) imports madsl.runner.plan.settings "
        "(runner/plan), a higher layer",
        "madsl/stray.py: madsl.stray is in no layer (place it in tests/test_layers.py's LAYERS)",
    ]

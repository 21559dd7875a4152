"""The import rules of DESIGN.md and the README, checked on the sources of ``components/`` and
``pipelines/``: imports run down (no circle between packages), nothing in ``components`` imports
``pipelines``, a step reads another step's output only through that step's ``output`` module
(its contract), ``gnn`` reads of the steps only partition's contract, the shared core imports
neither a step nor ``gnn``, and no file is over 400 lines.

Every import counts, at module level or inside a function (and under ``TYPE_CHECKING``): one in a
function still makes its module depend on the other, and a circle through it needs only the
right call order to fail."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP_PACKAGES = ("components", "pipelines")
STEPS = ("preprocess", "serialize", "partition", "train", "register", "infer", "report", "export")
SHARED_CORE = ("runtime", "tables", "tfrecord", "storage", "config", "schema", "errors", "warehouse", "beam_pipeline", "demo")
GNN_MAY_READ = {"components.partition.output"}  # partition's contract: stored partitions and range books
MAX_LINES = 400


@cache
def _modules() -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` under the top packages."""
    return {
        ".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): f
        for top in TOP_PACKAGES
        for f in sorted((ROOT / top).rglob("*.py"))
    }


def _imported_names(module: str, path: Path) -> Iterator[str]:
    """Every name an import statement anywhere in ``path`` imports (relative ones resolved):
    ``from a.b import c`` gives ``a.b.c``, whether ``c`` is a module or a name defined in ``a.b``."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            yield from (f"{base}.{alias.name}" for alias in node.names)


@cache
def _imports() -> dict[str, frozenset[str]]:
    """Module → the modules of ``components`` and ``pipelines`` it imports (anywhere in its file):
    each imported name's longest prefix that is a module."""
    modules = _modules()
    found: dict[str, frozenset[str]] = {}
    for module, path in modules.items():
        targets = set()
        for name in _imported_names(module, path):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                targets.add(name)
        found[module] = frozenset(targets - {module})
    return found


def _package(module: str) -> str:
    """The unit circles are checked between: ``components.gnn``, ``pipelines.tune``, ``pipelines.dag``."""
    return ".".join(module.split(".")[:2])


def _layer(module: str) -> str:
    """``components.train.step`` → ``train``; ``pipelines.cli`` → ``pipelines``."""
    parts = module.split(".")
    return parts[1] if parts[0] == "components" and len(parts) > 1 else parts[0]


def package_circles(imports: dict[str, frozenset[str]]) -> list[str]:
    """Each pair of packages that import each other, directly or through others, with the imports
    that leave the first for the second (so the message says where to cut)."""
    edges: dict[str, dict[str, list[str]]] = {}
    for module, targets in imports.items():
        for target in targets:
            if _package(target) != _package(module):
                edges.setdefault(_package(module), {}).setdefault(_package(target), []).append(f"{module} imports {target}")

    def reaches(start: str, goal: str) -> bool:
        seen, todo = {start}, [start]
        while todo:
            for nxt in edges.get(todo.pop(), {}):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    return sorted(
        f"{a} -> {b} -> ... -> {a} ({'; '.join(sorted(via))})"
        for a, targets in edges.items()
        for b, via in targets.items()
        if a == b or reaches(b, a)
    )


def test_the_checks_see_imports_inside_functions_and_pipelines() -> None:
    """The rules below are only as good as the graph: it must hold imports made inside functions
    (``pipelines.cli`` imports ``local_run`` only when ``gnnflow run`` runs) and ``pipelines``."""
    imports = _imports()
    assert "pipelines.local_run" in imports["pipelines.cli"]
    assert "pipelines.dag" in imports["pipelines.run_request"]  # imported inside pipeline_package()
    assert "components.partition.output" in imports["components.gnn.glt_dataset"]


def test_package_circles_are_found() -> None:
    """A circle made only of imports inside functions is still found, and named."""
    imports = {
        "pipelines.tune.command": frozenset({"pipelines.tuning_pipeline"}),
        "pipelines.tuning_pipeline": frozenset({"pipelines.tune.space"}),
        "pipelines.tune.space": frozenset(),
    }
    assert package_circles(imports) == [
        "pipelines.tune -> pipelines.tuning_pipeline -> ... -> pipelines.tune (pipelines.tune.command imports pipelines.tuning_pipeline)",
        "pipelines.tuning_pipeline -> pipelines.tune -> ... -> pipelines.tuning_pipeline "
        "(pipelines.tuning_pipeline imports pipelines.tune.space)",
    ]


def test_no_import_circle_between_packages() -> None:
    assert package_circles(_imports()) == []


def test_components_never_import_pipelines() -> None:
    upward = sorted(
        f"{module} imports {target}"
        for module, targets in _imports().items()
        if module.startswith("components")
        for target in targets
        if target.startswith("pipelines")
    )
    assert upward == []


def test_a_step_reads_another_step_only_through_its_output_module() -> None:
    reaching_in = sorted(
        f"{module} imports {target}"
        for module, targets in _imports().items()
        if module.startswith("components.") and _layer(module) in STEPS
        for target in targets
        if target.startswith("components.")
        and (step := _layer(target)) in STEPS
        and step != _layer(module)
        and target != f"components.{step}.output"
    )
    assert reaching_in == []


def test_gnn_reads_of_the_steps_only_partitions_contract() -> None:
    """``gnn`` (what train and infer share) sits below train and infer and above partition's
    output contract, the stored partitions and range books every downstream reader imports."""
    reaching_up = sorted(
        f"{module} imports {target}"
        for module, targets in _imports().items()
        if _layer(module) == "gnn"
        for target in targets
        if _layer(target) in STEPS and target not in GNN_MAY_READ
    )
    assert reaching_up == []


def test_the_shared_core_imports_no_step_and_not_gnn() -> None:
    reaching_up = sorted(
        f"{module} imports {target}"
        for module, targets in _imports().items()
        if module.startswith("components.") and _layer(module) in SHARED_CORE
        for target in targets
        if _layer(target) in (*STEPS, "gnn")
    )
    assert reaching_up == []


def test_every_file_is_at_most_400_lines() -> None:
    long_files = sorted(
        f"{path.relative_to(ROOT)}: {count} lines"
        for path in _modules().values()
        if (count := len(path.read_text().splitlines())) > MAX_LINES
    )
    assert long_files == []

"""The import rules of DESIGN.md, checked on the sources: imports run down (no circles between
the packages of ``components``), and a step reads another step's output only through that
step's ``output`` module, its contract."""

from __future__ import annotations

import ast
from pathlib import Path

COMPONENTS = Path(__file__).resolve().parents[1] / "components"
STEPS = ("preprocess", "serialize", "partition", "train", "infer", "report", "export")


def _module_imports() -> dict[str, set[str]]:
    """Module → the ``components`` modules it imports at module level (imports inside functions
    run later and cannot form an import-time circle)."""
    modules = {
        ".".join(f.relative_to(COMPONENTS.parent).with_suffix("").parts).removesuffix(".__init__"): f for f in COMPONENTS.rglob("*.py")
    }
    imports: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("components"):
                submodules = {f"{node.module}.{alias.name}" for alias in node.names} & modules.keys()
                found |= submodules or {node.module}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name.startswith("components")}
        imports[name] = found & modules.keys()
    return imports


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_import_circle_between_packages() -> None:
    edges: dict[str, set[str]] = {}
    for module, targets in _module_imports().items():
        edges.setdefault(_package(module), set()).update(_package(t) for t in targets if _package(t) != _package(module))

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in edges.get(start, ()))

    circles = sorted(f"{a} -> {b} -> ... -> {a}" for a, targets in edges.items() for b in targets if reaches(b, a, {b}))
    assert circles == []


def test_a_step_reads_another_step_only_through_its_output_module() -> None:
    reaching_in = sorted(
        f"{module} imports {target}"
        for module, targets in _module_imports().items()
        for target in targets
        if (step := target.split(".")[1]) in STEPS
        and module.split(".")[1] != step
        and module.split(".")[1] in STEPS
        and target != f"components.{step}.output"
    )
    assert reaching_in == []

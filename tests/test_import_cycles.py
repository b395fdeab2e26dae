"""No module of ssmport imports, at module level, a module that imports it back (directly or
through others): the arrows between modules point one way. Imports inside functions are
not walked (they run later, on demand)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "ssmport").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _module_level_imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    named = set()
    for statement in ast.parse(path.read_text()).body:
        nodes = ast.walk(statement) if isinstance(statement, (ast.If, ast.Try)) else [statement]
        for node in nodes:
            if isinstance(node, ast.Import):
                named |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                named |= {base} | {f"{base}.{a.name}" for a in node.names}
    targets = set()
    for target in named:
        while target and target not in known:  # `from pkg import name`: the module, or pkg itself
            target = target.rpartition(".")[0]
        if target and target != name:
            targets.add(target)
    return targets


def test_no_module_level_import_cycle():
    known = _modules()
    graph = {name: _module_level_imports(name, path, known) for name, path in known.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    cycles = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append(" -> ".join(path[path.index(target) :] + [target]))
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert len(graph) > 100 and graph["ssmport.exporter"], "the walk found too little to mean anything"
    assert not cycles, "module-level import cycles:\n" + "\n".join(cycles)

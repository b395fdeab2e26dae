"""ssmport's imports form no cycle: arrows point down (issue 27). Every import counts, at module
level or inside a function (an import deferred to first use, to keep `import ssmport` light,
is still an arrow: a cycle through one is a cycle of responsibilities, and moving that import
to the top would make it a load-order cycle); only those under `if TYPE_CHECKING:` (never
run) do not."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(node: ast.AST):
    """Every import under `node` but those under `if TYPE_CHECKING:` (never run)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            yield from (n for block in child.orelse for n in _imports_in(block))
        else:
            yield from _imports(child)


def _imports_in(stmt: ast.stmt):
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        yield stmt
    else:
        yield from _imports(stmt)


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Every module of `package` under `root` -> the modules of the package it imports."""
    paths = {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}
    graph = {}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        arrows = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: from the module's package
                    anchor = name.split(".")[: len(name.split(".")) - node.level + is_package]
                    base = ".".join(anchor + ([base] if base else []))
                # `from pkg import sub` imports the submodule pkg.sub where there is one
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            arrows |= {t for t in targets if t in paths and t != name}
        graph[name] = arrows
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as its modules in order (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_ssmport_has_no_import_cycle():
    graph = import_graph(ROOT, "ssmport")
    assert len(graph) > 100 and graph["ssmport.exporter.pipeline"]  # the walk found the package and its arrows
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_walk_finds_a_cycle_and_skips_what_is_no_arrow(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import c\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n"
                              "def f():\n    import pkg.sub\n")  # fmt: skip
    (pkg / "b.py").write_text("from pkg.sub import c\n")
    (pkg / "sub" / "c.py").write_text("try:\n    from ..b import x\nexcept ImportError:\n    pass\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph == {"pkg": set(), "pkg.a": {"pkg.sub"}, "pkg.b": {"pkg.sub.c"}, "pkg.sub": {"pkg.sub.c"},
                     "pkg.sub.c": {"pkg.b"}}  # fmt: skip
    cycle = find_cycle(graph)
    assert set(cycle) == {"pkg.b", "pkg.sub.c"} and len(cycle) == 3 and cycle[0] == cycle[-1]
    (pkg / "sub" / "c.py").write_text("")
    assert find_cycle(import_graph(tmp_path, "pkg")) is None

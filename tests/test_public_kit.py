"""The public kit: everything the built-in families import from ssmport is listed in the
table of docs/adding-an-architecture.md ("The API an architecture file uses"), so a plugin
author can build a family from the table alone. A built-in that starts importing an unlisted
helper fails here: list it (and so make it public), or stop using it.

A family package (ssmport/models/<family>/) may import its own modules and another family's
package (a variant builds on its base: qwen3_5_moe on qwen3_5); everything else it, or a shared
module under ssmport/models, imports from ssmport must be in the table."""

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "ssmport" / "models"
DOC = ROOT / "docs" / "adding-an-architecture.md"
SECTION = "## The API an architecture file uses"
FAMILIES = {p.parent.name for p in MODELS.glob("*/__init__.py")} - {"layers"}


def kit_table() -> tuple[set[tuple[str, str]], set[str]]:
    """(listed (module, name) pairs, modules listed whole) from the doc's table."""
    text = DOC.read_text()
    section = text[text.index(SECTION) + len(SECTION):]
    section = section[: section.index("\n## ")]
    names, modules = set(), set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cell = line[2:].split(" | ")[0]
        listed = re.fullmatch(r"`([\w.]+)`: (.*)", cell)
        if listed:
            names |= {(listed[1], n) for n in re.findall(r"`(\w+)`", listed[2])}
        else:
            modules |= set(re.findall(r"`([\w.]+)`", cell))
    for module, name in list(names):  # a module listed by name is listed whole
        if _is_module(f"{module}.{name}"):
            modules.add(f"{module}.{name}")
    return names, modules


def _is_module(dotted: str) -> bool:
    try:
        importlib.import_module(dotted)
    except ImportError:
        return False
    return True


def _imports(path: Path):
    """(module, name, line) of each absolute ssmport import; a module imported by name
    (`from ssmport.models import hybrid`) yields the attributes the file reads from it."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "ssmport":
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                if _own_or_family(dotted) or not _is_module(dotted):
                    yield node.module, alias.name, node.lineno
                    continue
                local = alias.asname or alias.name
                for use in ast.walk(tree):
                    if isinstance(use, ast.Attribute) and isinstance(use.value, ast.Name) and use.value.id == local:
                        yield dotted, use.attr, use.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "ssmport":
                    yield alias.name, None, node.lineno


def _own_or_family(module: str) -> bool:
    parts = module.split(".")
    return len(parts) >= 3 and parts[:2] == ["ssmport", "models"] and parts[2] in FAMILIES


def unlisted(paths) -> list[str]:
    """Each import in `paths` (modules of ssmport/models) that the table does not list."""
    names, modules = kit_table()
    found = []
    for path in paths:
        for module, name, line in _imports(path):
            dotted = module if name is None else f"{module}.{name}"
            if _own_or_family(dotted) or (module, name) in names or module in modules or dotted in modules:
                continue
            where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            found.append(f"{where}:{line}: " + (f"import {module}" if name is None else f"{module}.{name}"))
    return sorted(set(found))


def test_every_name_the_built_ins_import_is_in_the_table():
    missing = unlisted(sorted(MODELS.rglob("*.py")))
    assert not missing, "imported by a built-in, not in docs/adding-an-architecture.md's table:\n" + "\n".join(missing)


def test_every_name_in_the_table_exists():
    names, modules = kit_table()
    assert len(names) > 50 and modules, "the table was not found or not parsed"
    absent = [f"{m}: {n}" for m, n in sorted(names) if not hasattr(importlib.import_module(m), n)]
    absent += [m for m in sorted(modules) if not _is_module(m)]
    assert not absent, absent


@pytest.mark.parametrize("line, listed", [
    ("from ssmport.models.loading import _flat", False),
    ("from ssmport.exporter.pipeline import export", False),
    ("from ssmport.models.loading import ConfigReader", True),
    ("from ssmport.ops.norms import rms_norm", True),
    ("from ssmport.models.qwen3_5.config import Qwen35Config", True),
    ("from ssmport.models import hybrid\nhybrid.HybridConfig", True),
    ("from ssmport.models import hybrid\nhybrid._helper", False),
    ("import ssmport.exporter", False),
])  # fmt: skip
def test_an_unlisted_import_is_found(tmp_path, line, listed):
    """The check itself: a module that imports a private or pipeline helper is reported."""
    probe = tmp_path / "probe.py"
    probe.write_text(line + "\n")
    assert bool(unlisted([probe])) != listed

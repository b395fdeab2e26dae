"""A neutral description of a bundle: what Apple's loader and engines look at, nothing else.

Built from a bundle directory (`describe_directory`) plus the functions of its asset, which
the caller reads from the converted program (names, shapes with dynamic dimensions, dtypes),
or written by hand in tests to break one rule at a time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ssmport.errors import SsmportError

DYNAMIC = None  # a dimension the runtime resolves per call (a `-1` in Core AI's descriptor)


@dataclass(frozen=True)
class TensorDesc:
    name: str
    shape: tuple[int | None, ...]  # None: dynamic
    dtype: str  # numpy spelling: "float16", "float32", "bfloat16", "int32", ...

    @property
    def is_dynamic(self) -> bool:
        return any(d is None for d in self.shape)


@dataclass(frozen=True)
class FunctionDesc:
    """One function of the asset, each list in the descriptor's order."""

    inputs: tuple[TensorDesc, ...] = ()
    outputs: tuple[TensorDesc, ...] = ()
    states: tuple[TensorDesc, ...] = ()

    def state(self, name: str) -> TensorDesc:
        return next(s for s in self.states if s.name == name)


@dataclass(frozen=True)
class BundleDesc:
    """``metadata``: parsed ``metadata.json`` (None when absent); ``files``: paths relative to the
    bundle directory, ``/``-separated (an ``.aimodel`` directory counts as a file); ``functions``:
    the functions of the asset ``assets.main`` names, by function name."""

    metadata: Mapping | None
    files: frozenset[str] = frozenset()
    functions: Mapping[str, FunctionDesc] = field(default_factory=dict)
    tokenizer_config: Mapping | None = None  # tokenizer/tokenizer_config.json
    tokenizer_has_merges: bool = False  # tokenizer/tokenizer.json's model has a merges list

    @property
    def language(self) -> Mapping:
        lang = (self.metadata or {}).get("language")
        return lang if isinstance(lang, Mapping) else {}

    @property
    def main_name(self) -> str:
        """The function the engines load: ``language.function_map.main[0]``, else ``main``
        (CoreAIRunner.swift:74@86b363d)."""
        fmap = self.language.get("function_map")
        names = fmap.get("main") if isinstance(fmap, Mapping) else None
        return names[0] if isinstance(names, list) and names and isinstance(names[0], str) else "main"


def describe_directory(bundle_dir: str | Path, functions: Mapping[str, FunctionDesc]) -> BundleDesc:
    """Read ``metadata.json``, the file list and ``tokenizer/tokenizer_config.json`` of a bundle."""
    root = Path(bundle_dir)
    if not root.is_dir():
        raise SsmportError(f"{root}: not a bundle directory")
    files = frozenset(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.suffix == ".aimodel")
    return BundleDesc(
        metadata=_read_json(root / "metadata.json"),
        files=files,
        functions=dict(functions),
        tokenizer_config=_read_json(root / "tokenizer" / "tokenizer_config.json"),
        tokenizer_has_merges=_has_merges(_read_json(root / "tokenizer" / "tokenizer.json")),
    )


def _has_merges(tokenizer_json: Mapping | None) -> bool:
    model = (tokenizer_json or {}).get("model")
    return isinstance(model, Mapping) and isinstance(model.get("merges"), list)


def _read_json(path: Path) -> Mapping | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SsmportError(f"{path}: not readable JSON ({exc})") from None
    return data if isinstance(data, Mapping) else {}

"""The architecture registry. Built-ins register here; others via `register_architecture`."""

from __future__ import annotations

from ssmport.architectures.base import Architecture, LoadedModel, Preset
from ssmport.errors import SsmportError

_ARCHITECTURES: dict[str, Architecture] = {}


def register_architecture(arch: Architecture, *, replace: bool = False) -> Architecture:
    """Make an architecture (and its presets) available to every ssmport command."""
    if not isinstance(arch, Architecture):
        raise TypeError(f"expected an ssmport Architecture, got {type(arch).__name__}")
    if arch.name in _ARCHITECTURES and not replace:
        raise ValueError(f"architecture {arch.name!r} is already registered (pass replace=True)")
    taken = {p.name for a in _ARCHITECTURES.values() if a.name != arch.name for p in a.presets}
    clash = [p.name for p in arch.presets if p.name in taken]
    if clash:
        raise ValueError(f"preset name(s) already registered: {', '.join(clash)}")
    _ARCHITECTURES[arch.name] = arch
    return arch


def architectures() -> list[Architecture]:
    return list(_ARCHITECTURES.values())


def get_architecture(name: str) -> Architecture:
    if name not in _ARCHITECTURES:
        raise SsmportError(f"unknown architecture {name!r}; available: {', '.join(_ARCHITECTURES)}")
    return _ARCHITECTURES[name]


def presets() -> dict[str, Preset]:
    return {p.name: p for a in _ARCHITECTURES.values() for p in a.presets}


def _register_builtins() -> None:
    from ssmport.architectures.gated_deltanet import GATED_DELTANET
    from ssmport.architectures.rwkv7 import RWKV7

    register_architecture(RWKV7)
    register_architecture(GATED_DELTANET)


_register_builtins()

__all__ = [
    "Architecture",
    "LoadedModel",
    "Preset",
    "architectures",
    "get_architecture",
    "presets",
    "register_architecture",
]

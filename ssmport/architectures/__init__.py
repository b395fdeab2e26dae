"""The architecture registry.

Every architecture, built-in or not, is an `Architecture` instance passed to
`register_architecture`; nothing else in ssmport knows their names. Architectures from
outside the package are registered by importing their module: in Python, or on the command
line with `ssmport --plugin FILE_OR_MODULE ...` / `SSMPORT_PLUGINS` (see `ssmport.plugins`).
"""

from __future__ import annotations

from ssmport.architectures.base import Architecture, LoadedModel, Preset, Provenance
from ssmport.errors import SsmportError

_ARCHITECTURES: dict[str, Architecture] = {}
_BUILTINS_REGISTERED = False


def _registry() -> dict[str, Architecture]:
    """The registry, with the built-ins in it. They are registered on first use rather than at
    import, so `import ssmport.models.rwkv7` works on its own (the packages import
    `ssmport.architectures.base`, which runs this module)."""
    global _BUILTINS_REGISTERED
    if not _BUILTINS_REGISTERED:
        _BUILTINS_REGISTERED = True
        _register_builtins()
    return _ARCHITECTURES


def register_architecture(arch: Architecture, *, replace: bool = False) -> Architecture:
    """Make an architecture (and its presets) available to every ssmport command.

    Args:
        arch: an instance of an `Architecture` subclass.
        replace: allow replacing an architecture registered under the same name.

    Returns `arch`, so a module can write `MY = register_architecture(MyArch(...))`.

    Raises:
        TypeError: `arch` is not an `Architecture`.
        ValueError: the name is taken (and not `replace`), a preset name is taken by
            another architecture, a preset names another architecture, or `tiny_preset` is
            not one of its presets.
    """
    if not isinstance(arch, Architecture):
        raise TypeError(f"expected an ssmport Architecture, got {type(arch).__name__}")
    registry = _registry()
    if arch.name in registry and not replace:
        raise ValueError(f"architecture {arch.name!r} is already registered (pass replace=True)")
    foreign = [p.name for p in arch.presets if p.architecture != arch.name]
    if foreign:
        raise ValueError(f"preset(s) {', '.join(foreign)} of {arch.name!r} name another architecture")
    if arch.tiny_preset is not None and arch.tiny_preset not in {p.name for p in arch.presets}:
        raise ValueError(f"tiny_preset {arch.tiny_preset!r} is not one of {arch.name!r}'s presets")
    taken = {p.name for a in registry.values() if a.name != arch.name for p in a.presets}
    clash = [p.name for p in arch.presets if p.name in taken]
    if clash:
        raise ValueError(f"preset name(s) already registered: {', '.join(clash)}")
    registry[arch.name] = arch
    return arch


def architectures() -> list[Architecture]:
    """Every registered architecture, in registration order (built-ins first, by package name)."""
    return list(_registry().values())


def get_architecture(name: str) -> Architecture:
    """The registered architecture called `name`, or a one-line `SsmportError`."""
    registry = _registry()
    if name not in registry:
        raise SsmportError(
            f"unknown architecture {name!r}; available: {', '.join(registry)} "
            "(an architecture from outside ssmport is loaded with --plugin FILE or SSMPORT_PLUGINS)"
        )
    return registry[name]


def presets() -> dict[str, Preset]:
    """Every registered preset, by name."""
    return {p.name: p for a in _registry().values() for p in a.presets}


def _register_builtins() -> None:
    """Register every architecture object a package under ssmport.models exposes, in the
    packages' name order: a family is built in by adding its package, nothing else. An
    architecture already registered as this very object is skipped."""
    for arch in _builtin_architectures():
        if _ARCHITECTURES.get(arch.name) is not arch:
            register_architecture(arch)


def _builtin_architectures() -> list[Architecture]:
    import importlib
    import pkgutil

    import ssmport.models

    found: list[Architecture] = []
    for info in sorted(pkgutil.iter_modules(ssmport.models.__path__), key=lambda i: i.name):
        if not info.ispkg:
            continue
        module = importlib.import_module(f"ssmport.models.{info.name}")
        found += [v for v in vars(module).values() if isinstance(v, Architecture) and all(v is not f for f in found)]
    return found


__all__ = [
    "Architecture",
    "LoadedModel",
    "Preset",
    "Provenance",
    "architectures",
    "get_architecture",
    "presets",
    "register_architecture",
]

"""Load architectures that live outside ssmport, for the command line.

A plugin is a Python file or an importable module that calls
`ssmport.register_architecture(...)` when imported. In Python, importing it is enough; on
the command line name it with `ssmport --plugin FILE_OR_MODULE ...` (repeatable) or in
`SSMPORT_PLUGINS` (entries separated by the OS path separator, ":" here), so that
`ssmport gate` and `ssmport logits --backend torch` can rebuild a plugin bundle's source.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from ssmport.errors import SsmportError

ENV_VAR = "SSMPORT_PLUGINS"
# architecture name -> the plugin (resolved file, or module name) whose import registered it:
# recorded in a bundle's manifest, so that a command rebuilding its source can name it.
_ORIGINS: dict[str, str] = {}


def plugin_of(architecture: str) -> str | None:
    """The plugin that registered `architecture` in this process, or None (a built-in, or
    registered by a plain import)."""
    return _ORIGINS.get(architecture)


def load_plugin(spec: str) -> ModuleType:
    """Import a plugin given as a `.py` path or a module name; loading one twice is a no-op.

    Raises `SsmportError` (one line) when it cannot be found or fails while importing.
    """
    from ssmport.architectures import architectures

    before = {a.name for a in architectures()}
    path = Path(spec).expanduser()
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise SsmportError(f"plugin {spec}: no such file")
        if path.suffix != ".py":  # a .txt has no loader; a .so would be loaded as native code
            raise SsmportError(f"plugin {spec}: not a Python file (a plugin is a .py file or an importable module)")
        origin, module = str(path.resolve()), _import_file(path.resolve(), spec)
    else:
        origin, module = spec, _import_module(spec)
    for arch in architectures():
        if arch.name not in before:
            _ORIGINS[arch.name] = origin
    return module


def _import_module(spec: str) -> ModuleType:
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        if exc.name and spec.startswith(exc.name):
            raise SsmportError(f"plugin {spec}: no such file or importable module") from None
        raise _import_failed(spec, exc) from exc
    except (Exception, SystemExit) as exc:  # a plugin's own bug (or a sys.exit): say where, in one line
        raise _import_failed(spec, exc) from exc


def load_plugins(specs: list[str] | None = None) -> list[ModuleType]:
    """Load the `SSMPORT_PLUGINS` entries, then `specs` (the CLI's --plugin values)."""
    env = [s for s in os.environ.get(ENV_VAR, "").split(os.pathsep) if s.strip()]
    return [load_plugin(s.strip()) for s in [*env, *(specs or [])]]


def _import_file(path: Path, spec: str) -> ModuleType:
    for loaded in list(sys.modules.values()):  # already imported, under any name
        file = getattr(loaded, "__file__", None)
        if file and Path(file).resolve() == path:
            return loaded
    name = f"ssmport_plugin_{path.stem}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        module_spec.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules[name]
        if isinstance(exc, (Exception, SystemExit)):  # a plugin's bug, or a sys.exit(): never a success
            raise _import_failed(spec, exc) from exc
        raise
    return module


def _import_failed(spec: str, exc: BaseException) -> SsmportError:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""
    if isinstance(exc, SystemExit):
        return SsmportError(f"plugin {spec} called sys.exit({exc.code!r}){where} while importing")
    return SsmportError(f"plugin {spec} failed to import: {type(exc).__name__}: {exc}{where}")

"""The bundle on disk: `model.aimodel/`, `manifest.json`, `gate.json`, `tokenizer/`.

Bundles are written atomically (a temp directory renamed into place) and read back only
through `Bundle.open`, which checks the layout before anything trusts it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ssmport.errors import BundleError, SsmportError
from ssmport.interrupts import raise_if_interrupted
from ssmport.manifest import Manifest

MANIFEST = "manifest.json"
ASSET = "model.aimodel"
GATE = "gate.json"
TOKENIZER_DIR = "tokenizer"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON via a sibling temp file and rename, so readers never see half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@dataclass
class Bundle:
    path: Path
    manifest: Manifest

    @classmethod
    def open(cls, path: str | Path) -> Bundle:
        path = Path(path)
        if not path.is_dir():
            raise BundleError(f"{path}: not a bundle directory")
        mpath = path / MANIFEST
        if not mpath.is_file():
            raise BundleError(f"{path}: not an ssmport bundle (no {MANIFEST})")
        try:
            data = json.loads(mpath.read_text())
        except (ValueError, OSError) as exc:
            raise BundleError(f"{mpath}: unreadable manifest ({exc})") from None
        manifest = Manifest.from_json(data, str(mpath))
        if not (path / ASSET).is_dir():
            raise BundleError(f"{path}: bundle is incomplete (no {ASSET}/)")
        return cls(path, manifest)

    @property
    def asset_path(self) -> Path:
        return self.path / ASSET

    @property
    def vocab_path(self) -> Path | None:
        tok = self.manifest.tokenizer
        return self.path / tok.path if tok else None

    def save_manifest(self) -> None:
        write_json_atomic(self.path / MANIFEST, self.manifest.to_json())


@contextmanager
def staged_directory(final: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a temp directory beside `final`; on success rename it into place.

    On any error the temp directory is removed and `final` is untouched, so a failed or
    interrupted export never leaves a partial bundle behind.
    """
    if final.exists() and not overwrite:
        raise SsmportError(f"{final} already exists (pass --overwrite to replace it)")
    for parent in (final.parent, *final.parent.parents):
        if parent.exists() and not parent.is_dir():
            raise SsmportError(f"{parent} is not a directory")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=final.parent))
    except OSError as exc:
        raise SsmportError(f"{final.parent}: cannot write there ({exc.strerror})") from None
    try:
        yield tmp
        raise_if_interrupted()  # under interrupts_deferred(), a Ctrl-C so far stops it here
        if final.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
            os.replace(final, trash / final.name)
            os.replace(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except OSError as exc:  # disk full, quota, permissions: one line, and nothing left behind
        shutil.rmtree(tmp, ignore_errors=True)
        where = f" ({exc.filename})" if exc.filename else ""
        raise SsmportError(f"writing {final} failed: {exc.strerror or exc}{where}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

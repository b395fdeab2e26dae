"""The lowering cache: each asset is lowered for the Linux Core AI runtime once.

`$SSMPORT_CACHE/lowered/<key>.aimodelx`, key = sha256 of the asset's bytes + the coreai-core
version. A stamp written last inside each entry records its key and the size and mtime of every
file it holds; an entry whose stamp is missing, unreadable or for another key, or whose files
differ from the stamp (missing, truncated, rewritten), is stale or corrupt and is rebuilt. File
stats, not a re-hash, so a cached load stays in milliseconds; it matters: the runtime dies
(SIGILL) loading damaged lowered bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ssmport.bundle import Bundle, write_json_atomic
from ssmport.errors import BundleError


def cache_root() -> Path:
    env = os.environ.get("SSMPORT_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ssmport"


def _coreai_version() -> str:
    from importlib.metadata import version

    return version("coreai-core")


STAMP = "ssmport-lowered.json"
_HASH_CHUNK = 8 << 20


def _file_list(root: Path) -> list[tuple[str, int, int]]:
    """(relative path, size, mtime_ns) of every file under `root`, sorted."""
    return sorted(
        (p.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() and (st := p.stat())
    )


def asset_sha256(asset: Path) -> str:
    """sha256 over the asset's files (names and bytes), remembered per path and file stats,
    so an unchanged asset is hashed once (hashing 0.1B takes ~1.5 s, 1.5B ~12 s)."""
    asset = asset.resolve()
    files = _file_list(asset)
    memo = _hash_memo(asset)
    try:
        saved = json.loads(memo.read_text())
        if saved["files"] == [list(f) for f in files]:
            return saved["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no memo, or an unreadable one: hash again
    digest = hashlib.sha256()
    for rel, _, _ in files:
        digest.update(rel.encode() + b"\0")
        with open(asset / rel, "rb") as f:
            while chunk := f.read(_HASH_CHUNK):
                digest.update(chunk)
    value = digest.hexdigest()
    memo.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(memo, {"asset": str(asset), "files": files, "sha256": value})
    return value


def lowering_key(bundle: Bundle) -> str:
    return hashlib.sha256(f"{asset_sha256(bundle.asset_path)}:{_coreai_version()}".encode()).hexdigest()[:32]


def _hash_memo(asset: Path) -> Path:
    return cache_root() / "asset-hashes" / (hashlib.sha256(str(asset.resolve()).encode()).hexdigest()[:24] + ".json")


def forget_lowering(bundle: Bundle) -> None:
    """Drop the bundle's cache entry and remembered asset hash (the next load is a first load)."""
    shutil.rmtree(lowered_path(bundle), ignore_errors=True)
    _hash_memo(bundle.asset_path).unlink(missing_ok=True)


def lowered_path(bundle: Bundle) -> Path:
    return cache_root() / "lowered" / f"{lowering_key(bundle)}.aimodelx"


def cached_lowering_ok(target: Path, key: str) -> bool:
    """Whether `target` is a complete lowering for `key` (stamp present, files as stamped)."""
    try:
        stamp = json.loads((target / STAMP).read_text())
        if stamp["key"] != key:
            return False
        files = {rel: [size, mtime] for rel, size, mtime in _file_list(target) if rel != STAMP}
        return bool(files) and files == stamp["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def uses_os_runtime() -> bool:
    """macOS with the OS Core AI framework: it loads `.aimodel` assets itself (and caches
    their specialization), the way `AIModelAsset.executable()` decides. Not testable on this
    Linux machine."""
    import coreai.runtime

    return sys.platform == "darwin" and bool(getattr(coreai.runtime, "_use_os_coreai", False))


def ensure_lowered(bundle: Bundle, rebuild: bool = False) -> tuple[Path, bool]:
    """Return (loadable model dir, whether it was lowered now). Lowering is atomic; a stale
    or corrupt cache entry (or any entry, with `rebuild`) is replaced."""
    if uses_os_runtime():
        return bundle.asset_path, False
    key = lowering_key(bundle)
    target = cache_root() / "lowered" / f"{key}.aimodelx"
    if not rebuild and cached_lowering_ok(target, key):
        return target, False
    from coreai.authoring import AIModelAsset

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".lowering-", suffix=".aimodelx", dir=target.parent))
    try:
        try:
            asset = AIModelAsset.load(bundle.asset_path)
        except RuntimeError as exc:
            raise BundleError(f"{bundle.asset_path}: not a loadable Core AI asset ({exc})") from None
        # Private in coreai-core 1.0.0b3 (what `asset.executable()` does on every entry);
        # wrapped here only, and the cache key carries the coreai-core version.
        asset._write_odix(tmp)
        del asset
        files = {rel: [size, mtime] for rel, size, mtime in _file_list(tmp)}
        write_json_atomic(tmp / STAMP, {"key": key, "asset": str(bundle.asset_path.resolve()),
                                        "coreai_core": _coreai_version(), "files": files})  # fmt: skip
        _replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target, True


def _replace_dir(new: Path, target: Path) -> None:
    """Move `new` to `target`; an existing (stale, corrupt, or raced) entry is moved aside
    first and then deleted, so readers never see a half-removed directory."""
    if target.exists():
        trash = Path(tempfile.mkdtemp(prefix=".stale-", dir=target.parent))
        try:
            os.replace(target, trash / target.name)
        except OSError:
            pass  # another process replaced it first; ours replaces theirs below
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.replace(new, target)
    except OSError:  # a racing process put a fresh entry in place meanwhile: keep theirs
        shutil.rmtree(new, ignore_errors=True)

"""The lowering cache: each asset is lowered for the Linux Core AI runtime once.

`$SSMPORT_CACHE/lowered/<key>.aimodelx`, key = sha256 of the asset's bytes + the coreai-core
version. A stamp written last inside each entry records its key and the size and mtime of every
file it holds; an entry whose stamp is missing, unreadable or for another key, or whose files
differ from the stamp (missing, truncated, rewritten), is stale or corrupt and is rebuilt. File
stats, not a re-hash, so a cached load stays in milliseconds; it matters: the runtime dies
(SIGILL) loading damaged lowered bytes.

The cache holds at most `$SSMPORT_CACHE_LIMIT` bytes of lowered models (default 20 GB; a size
like `50GB`): placing a new entry removes the least recently used others until it fits (a hit
marks its entry used). The new entry itself always stays, whatever its size. Unbounded, it
reached 45 GB here and filled the disk.

Before anything reads an asset, its files are checked against the sha256s the manifest
recorded at export (remembered per file stats too), and lowering itself runs in a child
process: the runtime aborts (SIGABRT) on an .mlirb it cannot parse, and that must be an error
message, not the end of ssmport, nor half a cache entry.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ssmport.bundle import Bundle, write_json_atomic
from ssmport.errors import BundleError, SsmportError
from ssmport.files import OWNER_MARKER, OwnedDir, check_free_space, stale_dirs, utf8_path
from ssmport.interrupts import stops_at_once
from ssmport.quant.budget import parse_size


def cache_root() -> Path:
    env = os.environ.get("SSMPORT_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ssmport"


def cache_dir(*parts: str) -> Path:
    """A folder of the cache, created; a cache that is a file, cannot be created, or has a
    path the runtime cannot encode is one line naming SSMPORT_CACHE."""
    root = cache_root()
    label = f"SSMPORT_CACHE={root}" if os.environ.get("SSMPORT_CACHE") else f"the ssmport cache {root}"
    utf8_path(root, "SSMPORT_CACHE")
    folder = root.joinpath(*parts)
    try:
        if os.path.lexists(root) and not root.is_dir():
            raise SsmportError(f"{label}: not a directory (point SSMPORT_CACHE at a folder)")
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SsmportError(f"{label}: cannot be written ({exc.strerror}); point SSMPORT_CACHE at a writable folder") from None
    return folder


def _coreai_version() -> str:
    from importlib.metadata import version

    return version("coreai-core")


STAMP = "ssmport-lowered.json"
DEFAULT_CACHE_LIMIT = 20 << 30
_HASH_CHUNK = 8 << 20


def _file_list(root: Path) -> list[tuple[str, int, int]]:
    """(relative path, size, mtime_ns) of every file under `root`, sorted."""
    return sorted(
        (p.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() and (st := p.stat())
    )


def _asset_hashes(asset: Path) -> tuple[str, dict[str, str]]:
    """(sha256 over the asset's files, names and bytes; {file: sha256}), remembered per path
    and file stats, so an unchanged asset is hashed once (hashing 0.1B takes ~1.5 s, 1.5B ~12 s)."""
    asset = asset.resolve()
    files = _file_list(asset)
    memo = _hash_memo(asset)
    try:
        saved = json.loads(memo.read_text())
        if saved["files"] == [list(f) for f in files] and isinstance(saved["file_sha256"], dict):
            return saved["sha256"], saved["file_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no memo, or an unreadable one: hash again
    digest, per_file = hashlib.sha256(), {}
    for rel, _, _ in files:
        digest.update(rel.encode() + b"\0")
        one = hashlib.sha256()
        with open(asset / rel, "rb") as f:
            while chunk := f.read(_HASH_CHUNK):
                digest.update(chunk)
                one.update(chunk)
        per_file[rel] = one.hexdigest()
    value = digest.hexdigest()
    write_json_atomic(memo, {"asset": str(asset), "files": files, "sha256": value, "file_sha256": per_file})
    return value, per_file


def asset_sha256(asset: Path) -> str:
    """sha256 over the asset's files (names and bytes): the lowering cache's key."""
    return _asset_hashes(asset)[0]


def asset_file_hashes(asset: Path) -> dict[str, str]:
    """{path inside the asset: sha256} of every file: what the manifest records at export."""
    return _asset_hashes(asset)[1]


def verify_asset(bundle: Bundle) -> None:
    """The asset's files must be the ones the manifest recorded at export (bundles exported
    before that was recorded are not checked): a truncated or bit-flipped .mlirb aborts the
    runtime, and a flipped weight bit would run silently with other weights."""
    recorded = bundle.manifest.asset.files
    if not recorded:
        return
    got = asset_file_hashes(bundle.asset_path)
    problems = [f"{n} is missing" for n in sorted(set(recorded) - set(got))]
    problems += [f"{n} does not match its recorded sha256" for n in sorted(recorded) if n in got and got[n] != recorded[n]]
    problems += [f"{n} was not part of the export" for n in sorted(set(got) - set(recorded))]
    if problems:
        raise BundleError(f"{bundle.asset_path}: damaged or changed since export ({'; '.join(problems[:3])}); "
                          "re-export the bundle")  # fmt: skip


def lowering_key(bundle: Bundle) -> str:
    return hashlib.sha256(f"{asset_sha256(bundle.asset_path)}:{_coreai_version()}".encode()).hexdigest()[:32]


def _hash_memo(asset: Path) -> Path:
    name = hashlib.sha256(os.fsencode(asset.resolve())).hexdigest()[:24] + ".json"
    return cache_dir("asset-hashes") / name


def forget_lowering(bundle: Bundle) -> None:
    """Drop the bundle's cache entry and remembered asset hash (the next load is a first load)."""
    shutil.rmtree(lowered_path(bundle), ignore_errors=True)
    _hash_memo(bundle.asset_path).unlink(missing_ok=True)


def lowered_path(bundle: Bundle) -> Path:
    return cache_dir("lowered") / f"{lowering_key(bundle)}.aimodelx"


PAGE_IN_CHUNK = 16 << 20


def page_in(entry: Path) -> int:
    """Read every file of a lowered model once, so its pages sit in the page cache; returns
    the bytes read. The runtime keeps a row-looked-up constant (the embedding table) mapped
    from these files, so a token's first lookup reads its row from disk once the pages have
    been evicted: 3-5 ms against 0.025 ms for a cached row here (an LFM2-350M bundle, its
    files evicted with posix_fadvise(DONTNEED), then read back; benchmarks/README.md)."""
    total = 0
    buf = bytearray(PAGE_IN_CHUNK)
    for rel, _, _ in _file_list(entry):
        with open(entry / rel, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total


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
    """Return (loadable model dir, whether it was lowered now). The asset is checked against
    the manifest first; a stale or corrupt cache entry (or any entry, with `rebuild`) is
    replaced. Lowering runs in a child process into a staging folder: a crash of the runtime
    on a bad asset is an error here, and never leaves half a cache entry."""
    utf8_path(bundle.asset_path.resolve(), "bundle")
    verify_asset(bundle)
    if uses_os_runtime():
        return bundle.asset_path, False
    limit = cache_limit()  # a bad value is refused on every load, not only the first
    key = lowering_key(bundle)
    target = cache_dir("lowered") / f"{key}.aimodelx"
    if not rebuild and cached_lowering_ok(target, key):
        _mark_used(target)
        return target, False
    _remove_stale_lowerings(target.parent)
    _evict_least_recent(target.parent, target, bundle.manifest.asset.bytes, limit)
    # A full cache disk crashed the lowering child (SIGBUS), which read as a bad asset.
    check_free_space(target.parent, bundle.manifest.asset.bytes, f"lowering {bundle.path} for this runtime (SSMPORT_CACHE)")
    staging = OwnedDir(target.parent, ".lowering-", ".aimodelx")
    try:
        entry = staging.path / "entry"
        entry.mkdir()
        with stops_at_once():  # a stop signal kills the child (subprocess.run does) and the staging goes
            _lower_in_child(bundle.asset_path, entry)
        files = {rel: [size, mtime] for rel, size, mtime in _file_list(entry)}
        write_json_atomic(entry / STAMP, {"key": key, "asset": str(bundle.asset_path.resolve()),
                                          "coreai_core": _coreai_version(), "files": files})  # fmt: skip
        # A process that lowered the same asset meanwhile may be loading its entry already:
        # a complete one is kept (replacing it would pull the files from under that load).
        # Checking first, then replacing, left a window in which both processes finished at
        # once and one replaced the entry the other had just placed and was loading (test_clean_exit:
        # "No such file or directory", 1 run in about 60); the placement itself must refuse.
        if rebuild:
            _replace_dir(entry, target)
        elif not _place_if_absent(entry, target) and not cached_lowering_ok(target, key):
            _replace_dir(entry, target)  # what is there is stale or damaged
    finally:
        staging.remove()
    _evict_least_recent(target.parent, target, 0, limit)
    return target, True


def cache_limit() -> int:
    """The most bytes of lowered models the cache keeps ($SSMPORT_CACHE_LIMIT)."""
    text = os.environ.get("SSMPORT_CACHE_LIMIT")
    return DEFAULT_CACHE_LIMIT if not text else parse_size(text, "SSMPORT_CACHE_LIMIT")


def _mark_used(entry: Path) -> None:
    """A hit moves the entry to the back of the eviction order (its stamp's mtime, which the
    stamp check does not compare)."""
    try:
        os.utime(entry / STAMP)
    except OSError:
        pass  # a read-only cache: the order is only less exact


def _entries_by_last_use(folder: Path) -> list[tuple[float, int, Path]]:
    """(last use, bytes, path) of every entry, least recently used first."""
    found = []
    for entry in folder.glob("*.aimodelx"):
        try:
            stamp = entry / STAMP
            used = (stamp if stamp.exists() else entry).stat().st_mtime
            found.append((used, sum(size for _, size, _ in _file_list(entry)), entry))
        except OSError:
            continue  # removed meanwhile
    return sorted(found)


def _evict_least_recent(folder: Path, keep: Path, room: int, limit: int) -> None:
    """Remove the least recently used entries (never `keep`) until the rest and `room` more
    bytes fit `limit`. A process still loading a removed entry keeps the files it opened, and
    the runner lowers again once when a cached entry fails to load."""
    entries = _entries_by_last_use(folder)
    total = room + sum(size for _, size, _ in entries)
    for _, size, entry in entries:
        if total <= limit:
            return
        if entry != keep:
            _discard(entry)
            total -= size


# Run by `_lower_in_child` as `python -c`: only coreai is imported there (0.4 s).
# `_write_odix` is private in coreai-core 1.0.0b3 (what `asset.executable()` does on every
# entry); wrapped here only, and the cache key carries the coreai-core version.
_LOWER = """
import sys
from pathlib import Path
from coreai.authoring import AIModelAsset
try:
    asset = AIModelAsset.load(Path(sys.argv[1]))
except RuntimeError as exc:
    sys.stderr.write("ssmport-child: " + " ".join(str(exc).split()) + "\\n")
    sys.exit(3)
asset._write_odix(Path(sys.argv[2]))
"""


def _lower_in_child(asset: Path, out: Path) -> None:
    """Lower `asset` into the existing folder `out` in a child process. A damaged asset the
    runtime cannot parse aborts the process that reads it (SIGABRT, measured on truncated and
    bit-flipped .mlirb files): here that is the child, reported in one line."""
    proc = subprocess.run([sys.executable, "-c", _LOWER, os.fspath(asset), os.fspath(out)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace")  # fmt: skip
    if proc.returncode == 0:
        return
    lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
    said = next((ln.removeprefix("ssmport-child: ") for ln in lines if ln.startswith("ssmport-child: ")), None)
    errors = [ln for ln in lines if "error" in ln.lower()]
    if said is None:
        said = errors[0] if errors else (lines[-1] if lines else "no message")
        if proc.returncode < 0:
            said = f"the runtime crashed reading it ({signal.Signals(-proc.returncode).name}): {said}"
    raise BundleError(f"{asset}: not a loadable Core AI asset ({said[:300]})")


def _remove_stale_lowerings(folder: Path) -> None:
    """Staging folders of lowerings whose process died (killed, crashed), unmarked ones an
    older ssmport left (a day old: never a lowering still running), and discarded entries
    whose removal was cut short (`_discard`: nothing reads them by name)."""
    for d in [*stale_dirs(folder, ".lowering-*"), *folder.glob(".stale-*")]:
        shutil.rmtree(d, ignore_errors=True)
    for d in folder.glob(".lowering-*"):
        try:
            old = not (d / OWNER_MARKER).exists() and time.time() - d.stat().st_mtime > 86400
        except OSError:
            continue
        if old:
            shutil.rmtree(d, ignore_errors=True)


def _place_if_absent(new: Path, target: Path) -> bool:
    """Move `new` to `target` unless an entry is there already (False). rename(2) never
    replaces a non-empty directory, so the test and the move are one atomic step."""
    try:
        os.rename(new, target)
        return True
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        raise


def _replace_dir(new: Path, target: Path) -> None:
    """Move `new` to `target`; an existing (stale, corrupt, or raced) entry is moved aside
    first and then deleted, so readers never see a half-removed directory."""
    if target.exists():
        _discard(target)  # if another process replaced it first, ours replaces theirs below
    try:
        os.replace(new, target)
    except OSError:  # a racing process put a fresh entry in place meanwhile: keep theirs
        shutil.rmtree(new, ignore_errors=True)


def _discard(entry: Path) -> None:
    """Remove an entry by moving it aside first, so readers never see half of it."""
    trash = Path(tempfile.mkdtemp(prefix=".stale-", dir=entry.parent))
    try:
        os.replace(entry, trash / entry.name)
    except OSError:
        pass  # gone already, or replaced by another process
    shutil.rmtree(trash, ignore_errors=True)

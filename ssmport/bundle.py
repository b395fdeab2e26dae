"""The bundle on disk: `model.aimodel/`, `manifest.json`, `gate.json`, `tokenizer/`.

Bundles are written atomically (a temp directory renamed into place, never over anything that
is not a bundle) and read back only through `Bundle.open`, which checks the layout before
anything trusts it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ssmport.errors import BundleError, SsmportError
from ssmport.files import OWNER_MARKER, OwnedDir, PathLock, rename_noreplace, stale_dirs, write_output
from ssmport.interrupts import cleaned_at_hard_stop, raise_if_interrupted
from ssmport.manifest import FORMAT, Manifest

MANIFEST = "manifest.json"
ASSET = "model.aimodel"
GATE = "gate.json"
TOKENIZER_DIR = "tokenizer"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so readers never see half a file (see `files.write_output`); a bundle's or
    the cache's own file, so never to a device or a pipe, and never through a link (a bundle
    from elsewhere may hold `gate.json -> ~/.bashrc`)."""
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    write_output(path, lambda f: f.write(text.encode()), streams=False, follow_links=False)


MAX_MANIFEST_BYTES = 256 << 20  # the per-tensor plan of a 13B model is ~1 MB


def _inside(root: Path, rel: str) -> bool:
    """Whether `rel` names something inside `root` (no absolute path, no '..' out of it)."""
    p = Path(rel)
    return not p.is_absolute() and ".." not in p.parts and str(rel).strip() != ""


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _odd_kind(path: Path) -> str | None:
    """What `path` is when it is neither a regular file nor a folder (never following a link)."""
    mode = os.lstat(path).st_mode
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "a named pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"


def check_bundle_tree(root: Path) -> None:
    """Refuse a bundle that holds a link, a pipe, a socket or a device anywhere inside it.

    A bundle may come from elsewhere: a planted `gate.json -> ~/.bashrc` would have the next
    `ssmport gate` write outside the bundle, a `manifest.json -> /dev/zero` or a FIFO would
    hang a reader. ssmport reads and writes a bundle's own files only as regular files."""
    try:
        for folder, dirs, files in os.walk(root):  # never descends into a linked folder
            for name in sorted(dirs + files):
                kind = _odd_kind(Path(folder) / name)
                if kind is not None:
                    raise BundleError(f"{Path(folder) / name} is {kind} inside the bundle; a bundle holds only regular "
                                      "files and folders (ssmport never reads or writes its files through one)")  # fmt: skip
    except OSError as exc:
        raise BundleError(f"{root}: unreadable bundle ({exc.strerror}: {exc.filename})") from None


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
        check_bundle_tree(path)
        try:
            if mpath.stat().st_size > MAX_MANIFEST_BYTES:
                raise ValueError(f"{mpath.stat().st_size:,} bytes; a manifest is at most {MAX_MANIFEST_BYTES >> 20} MB")
            data = json.loads(mpath.read_bytes().decode("utf-8"))
        except (ValueError, OSError, RecursionError) as exc:  # RecursionError: JSON nested too deeply
            raise BundleError(f"{mpath}: unreadable manifest ({exc})") from None
        manifest = Manifest.from_json(data, str(mpath))
        for what, rel in (("asset", manifest.asset.path), ("tokenizer", manifest.tokenizer and manifest.tokenizer.path)):
            if rel and not _inside(path, rel):
                raise BundleError(f"{mpath}: the {what} path {rel!r} points outside the bundle")
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


# What an export writes at the top of a bundle: --overwrite replaces only a folder that holds
# nothing else (anything more is the user's, and stays).
BUNDLE_ENTRIES = frozenset({MANIFEST, ASSET, GATE, TOKENIZER_DIR, "metadata.json"})
# ... in tokenizer/ (vocab.tsv or tokenizer.json, with its config and template), and in the
# asset of a bundle whose manifest predates `asset.files`.
TOKENIZER_FILES = frozenset({"vocab.tsv", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"})
_OLD_ASSET_FILES = frozenset({"main.mlirb", "main.hash", "metadata.json"})
_NAME_MAX = 200  # bytes; the staging directory's name adds ~30 to it (NAME_MAX is 255)


def check_bundle_name(name: str) -> str:
    """A bundle's folder name must be one path component: `--name ..` or `a/../../x` would
    put the bundle (and what --overwrite replaces) outside -o."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise SsmportError(f"bundle name {name!r} must be a single folder name (no '/', not '.' or '..'); see --name")
    if len(name.encode("utf-8", "surrogateescape")) > _NAME_MAX:
        raise SsmportError(f"bundle name is {len(name.encode('utf-8', 'surrogateescape'))} bytes long; "
                           f"the limit is {_NAME_MAX} (see --name)")  # fmt: skip
    return name


def replaceable_bundle(path: Path, protect: Iterable[Path] = ()) -> None:
    """Raise unless `path` is an ssmport bundle that --overwrite may replace: a real folder
    (not a link) whose manifest.json says it is a bundle, holding only bundle files, and not
    holding any of `protect` (the files the export reads)."""
    if path.is_symlink():
        raise SsmportError(f"{path} is a symbolic link; --overwrite replaces only a bundle folder (remove the link yourself)")
    if not path.is_dir():
        raise SsmportError(f"{path} is a file, not an ssmport bundle; --overwrite replaces only bundles (remove it yourself)")
    try:
        if not stat.S_ISREG(os.lstat(path / MANIFEST).st_mode):  # a link or a FIFO: never read through it
            raise ValueError("not a regular file")
        data = json.loads((path / MANIFEST).read_text())
        is_bundle = isinstance(data, dict) and data.get("format") == FORMAT
    except (OSError, ValueError):
        is_bundle = False
    if not is_bundle:
        raise SsmportError(f"{path} is not an ssmport bundle (no manifest.json saying so); --overwrite replaces "
                           "only bundles (pick another --name or -o, or remove it yourself)")  # fmt: skip
    root = path.resolve()
    for p in protect:
        if Path(p).resolve().is_relative_to(root):
            raise SsmportError(f"{path} holds {p}, which this export reads; --overwrite will not replace it "
                               "(write the bundle elsewhere)")  # fmt: skip
    extra = foreign_entries(path, data)
    if extra:
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        raise SsmportError(f"{path} holds files an export did not write ({shown}); --overwrite will not delete them "
                           "(move them out first)")  # fmt: skip


def foreign_entries(path: Path, manifest: dict) -> list[str]:
    """What in bundle folder `path` an export did not write, as paths inside it (sorted, walked
    without following links): anything at the top but the bundle's entries, in tokenizer/ but
    tokenizer files, in the asset but the files its manifest lists; a link or a pipe anywhere."""
    asset_files = (manifest.get("asset") or {}).get("files") if isinstance(manifest.get("asset"), dict) else None
    asset_files = set(asset_files) if isinstance(asset_files, dict) and asset_files else None
    asset_dirs = {p.as_posix() for f in asset_files or () for p in Path(f).parents if p != Path(".")}
    found = []
    for folder, dirs, files in os.walk(path):
        for name in sorted(dirs + files):
            rel = (Path(folder) / name).relative_to(path)
            top, inner = rel.parts[0], Path(*rel.parts[1:]).as_posix() if len(rel.parts) > 1 else None
            is_dir = name in dirs and not os.path.islink(Path(folder) / name)
            if _odd_kind(path / rel) is not None:
                ours = False
            elif inner is None:
                ours = top in BUNDLE_ENTRIES and is_dir == (top in (ASSET, TOKENIZER_DIR))
            elif top == TOKENIZER_DIR:
                ours = not is_dir and inner in TOKENIZER_FILES
            elif top == ASSET:
                ours = (inner in asset_dirs) if is_dir else inner in (asset_files or _OLD_ASSET_FILES)
            else:
                ours = False
            if not ours:
                found.append(rel.as_posix())
                if is_dir:
                    dirs.remove(name)  # named once, not file by file
    return sorted(found)


def remove_stale_staging(parent: Path) -> None:
    """Delete the staging folders that exports killed outright (SIGKILL, power loss) left in
    `parent`; a bundle caught half-way through --overwrite's swap is put back first."""
    for tmp in stale_dirs(parent, ".*.partial-*"):
        shutil.rmtree(tmp, ignore_errors=True)
    for trash in stale_dirs(parent, ".*.old-*"):
        for old in trash.iterdir():
            if old.name != OWNER_MARKER and not os.path.lexists(parent / old.name):
                with contextlib.suppress(OSError):
                    rename_noreplace(old, parent / old.name)
        shutil.rmtree(trash, ignore_errors=True)


@contextmanager
def staged_directory(final: Path, overwrite: bool, protect: Iterable[Path] = ()) -> Iterator[Path]:
    """Yield a temp directory beside `final`; on success rename it into place.

    On any error the temp directory is removed and `final` is untouched, so a failed or
    interrupted export never leaves a partial bundle behind. `final` is replaced only with
    `overwrite` and only if it is a bundle (`replaceable_bundle`; `protect`: paths the export
    reads, never inside what is replaced). One export per target at a time (a lock file beside
    it); without `overwrite`, a target that appears during the export is left alone and the
    export fails (the final rename refuses an existing target).
    """
    check_bundle_name(final.name)
    parent = final.parent
    for p in (parent, *parent.parents):
        if p.exists() and not p.is_dir():
            raise SsmportError(f"{p} is not a directory")

    def check_target() -> None:
        if os.path.lexists(final):
            if not overwrite:
                raise SsmportError(f"{final} already exists (pass --overwrite to replace it)")
            replaceable_bundle(final, protect)

    check_target()
    created = [p for p in (parent, *parent.parents) if not os.path.lexists(p)]  # removed again on failure
    delivered = False

    def remove_created() -> None:  # deepest first; only the empty folders this export made
        for p in created:
            with contextlib.suppress(OSError):
                p.rmdir()

    try:
        try:
            parent.mkdir(parents=True, exist_ok=True)
            lock = PathLock(parent / f".{final.name}.lock")
            locked = lock.acquire()
        except OSError as exc:
            raise SsmportError(f"{parent}: cannot write there ({exc.strerror})") from None
        if not locked:
            raise SsmportError(f"another ssmport export is writing {final} now (pid {lock.holder()}); "
                               "wait for it to finish, or pick another --name")  # fmt: skip
        try:
            remove_stale_staging(parent)
            check_target()  # again, under the lock: another export may have just finished it
            try:
                staging = OwnedDir(parent, f".{final.name}.partial-")
            except OSError as exc:
                raise SsmportError(f"{parent}: cannot write there ({exc.strerror})") from None
            def abandon() -> None:  # the finally blocks below, for a stop ending the process in a runtime call
                staging.remove()
                lock.release()
                remove_created()

            try:
                with cleaned_at_hard_stop(abandon):
                    yield staging.path
                raise_if_interrupted()  # under interrupts_deferred(), a signal so far stops it here
                _deliver(staging, final, overwrite, check_target)
                delivered = True
            except OSError as exc:  # disk full, quota, permissions: one line, and nothing left behind
                where = f" ({exc.filename})" if exc.filename else ""
                raise SsmportError(f"writing {final} failed: {exc.strerror or exc}{where}") from None
            finally:
                staging.remove()
        finally:
            lock.release()
    finally:
        if not delivered:
            remove_created()


def _deliver(staging: OwnedDir, final: Path, overwrite: bool, check_target) -> None:
    """Move the finished bundle into place; an old bundle (with `overwrite`) is moved aside
    first, put back if the move fails, and deleted after."""
    staging.disown()
    if not overwrite or not os.path.lexists(final):
        try:
            rename_noreplace(staging.path, final)  # the existence check and the rename in one step
        except FileExistsError:
            raise SsmportError(f"{final} appeared while the export ran; it was left as it is and nothing was "
                               "written (run again with --overwrite to replace a bundle)") from None  # fmt: skip
        return
    check_target()  # it may have changed since the export began
    trash = OwnedDir(final.parent, f".{final.name}.old-")
    try:
        os.rename(final, trash.path / final.name)
        try:
            rename_noreplace(staging.path, final)
        except BaseException:
            os.rename(trash.path / final.name, final)
            raise
    finally:
        if os.path.lexists(final):
            trash.remove()
        else:  # the old bundle could not be put back: the next export's cleanup restores it
            trash.abandon()

"""Writing to the user's disk without destroying what is there.

- `write_output`: a regular file (or a missing one) is written to a temp file beside it and
  renamed over it, so no reader sees half a file; a character device or a FIFO (`/dev/null`,
  `/dev/stdout`, a named pipe) is written as a stream: renaming over it would replace the
  device node itself (as root, `--out /dev/null` would have broken the machine's
  `/dev/null`). Directories, sockets and block devices are refused A symlink
  the user typed is followed; with `follow_links=False` (a bundle's own files) it is refused.
- `check_output`: the same rules checked before a long job, so a chat or a gate does not run
  for minutes and then fail to save.
- `rename_noreplace`: rename that fails if the target exists, atomically (renameat2
  RENAME_NOREPLACE on Linux): the existence check and the rename are one step.
- `PathLock`: an exclusive, non-blocking flock on a lock file, for "one writer per target".
- `OwnedDir`: a temp directory with an owner marker whose flock lives as long as its
  process; `remove_stale` deletes the ones whose owner is gone (killed, crashed), however
  it died. A lock, not a pid, says whether the owner lives: pids are reused and are not
  comparable across containers.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from ssmport.errors import SsmportError

OWNER_MARKER = ".ssmport-owner"
_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def utf8_path(path: str | Path, what: str = "") -> Path:
    """`path`, refused in one line if it holds bytes that are not UTF-8: the runtime's Swift
    side cannot encode such a path and dies (SIGILL) on it."""
    text = os.fspath(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(text).decode("utf-8", "backslashreplace")
        raise SsmportError(f"{what + ' ' if what else ''}{shown}: the path is not valid UTF-8 "
                           "(the Core AI runtime cannot open it); rename it") from None  # fmt: skip
    return Path(path)


def missing_file(path: str | Path, fallback: str = "no such file") -> str:
    """Why `path` cannot be read as a file: "no such file", unless something else is there
    (a FIFO or a device given as a checkpoint or a vocab was called "no such file")."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return fallback
    if stat.S_ISDIR(mode):
        return "a directory, not a file"
    kind = "a named pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
    return f"{kind}, not a regular file (ssmport reads files it can size, not streams)"


def describe_os_error(exc: OSError) -> str:
    """`path: reason` for an OSError, in the user's terms."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename is not None else reason


# --- renames ----------------------------------------------------------------------------
def _renameat2():
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not glibc >= 2.28
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return fn


_RENAMEAT2 = _renameat2()


def rename_noreplace(src: str | Path, dst: str | Path) -> None:
    """Rename `src` to `dst`; FileExistsError if `dst` exists (as a file, a directory, a link).

    Atomic where the kernel and filesystem support RENAME_NOREPLACE; elsewhere an lstat just
    before the rename (callers hold a `PathLock`, so only a non-ssmport writer can race it).
    """
    if _RENAMEAT2 is not None:
        if _RENAMEAT2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):  # EINVAL: fs without NOREPLACE
            raise OSError(err, os.strerror(err), os.fspath(dst))
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(dst))
    os.rename(src, dst)


# --- locks ------------------------------------------------------------------------------
class PathLock:
    """An exclusive flock on `path` (created if missing), taken without waiting.

    `acquire()` returns False when another process holds it. `release()` unlinks the file
    while still holding the lock; a process that opened the old file in between sees, after
    locking, that the path no longer names its file and tries again, so two processes never
    both believe they hold it.
    """

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self._fd = fd
                return True
            os.close(fd)  # the holder released (and unlinked) it meanwhile: lock the new file

    def holder(self) -> str:
        """The pid the holder wrote, for messages ("?" if unreadable)."""
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"

    def release(self, unlink: bool = True) -> None:
        """Unlock; `unlink=False` keeps the file (an `OwnedDir` abandoned to the next cleanup)."""
        if self._fd is None:
            return
        if unlink:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        os.close(self._fd)
        self._fd = None


# --- owned temp directories -------------------------------------------------------------
class OwnedDir:
    """A new directory `parent/<prefix><pid>-<random><suffix>` holding an owner marker that
    this process keeps locked. `disown()` removes the marker (before the directory is renamed
    into place: the marker is no part of what is delivered)."""

    def __init__(self, parent: Path, prefix: str, suffix: str = ""):
        self.path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", suffix=suffix, dir=parent))
        self._owner = PathLock(self.path / OWNER_MARKER)
        if not self._owner.acquire():  # a fresh folder: nobody else can hold it
            raise OSError(errno.EBUSY, "owner marker held by another process", str(self.path))

    def disown(self) -> None:
        self._owner.release()

    def abandon(self) -> None:
        """Let go of the lock but keep the marker: `stale_dirs` then treats it as a dead owner's."""
        self._owner.release(unlink=False)

    def remove(self) -> None:
        self.disown()
        shutil.rmtree(self.path, ignore_errors=True)


def owner_gone(directory: Path) -> bool:
    """Whether `directory` is an `OwnedDir` whose process no longer holds its marker."""
    try:
        fd = os.open(directory / OWNER_MARKER, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False  # no marker: not ours, or delivered; never touched
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def stale_dirs(parent: Path, pattern: str) -> list[Path]:
    """The `OwnedDir`s matching `pattern` in `parent` whose owners are gone."""
    try:
        candidates = sorted(parent.glob(pattern))
    except OSError:
        return []
    return [p for p in candidates if p.is_dir() and not p.is_symlink() and owner_gone(p)]


# --- outputs ----------------------------------------------------------------------------
def _target_kind(path: Path, what: str, streams: bool = True, follow_links: bool = True) -> tuple[Path, str]:
    """(the path to write, "stream" | "file"), symlinks followed; refused when it is
    something ssmport must not write over (a device or FIFO too, without `streams`; a link,
    without `follow_links`: a file inside a bundle that may come from elsewhere)."""
    label = f"{what} {path}" if what else str(path)
    if not follow_links and os.path.islink(path):
        raise SsmportError(f"{label} is a symbolic link; ssmport writes a bundle's own files only as regular files, "
                           "never through a link (remove the link)")  # fmt: skip
    real = Path(os.path.realpath(path))  # through symlinks: a link is never replaced
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return real, "file"
    except OSError as exc:
        raise SsmportError(f"{label}: cannot write there ({exc.strerror})") from None
    if stat.S_ISREG(st.st_mode):
        return real, "file"
    if streams and (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        return real, "stream"
    if stat.S_ISDIR(st.st_mode):
        raise SsmportError(f"{label} is a directory; give a file path")
    kinds = "a regular file, a device or a pipe" if streams else "a regular file"
    raise SsmportError(f"{label} is not {kinds}; refusing to write there")


def check_output(path: str | Path, what: str = "", *, streams: bool = True, follow_links: bool = True) -> None:
    """Refuse, before any work, an output path that `write_output` would fail on: a directory,
    a missing parent, a place that cannot be written (read-only, /proc, no permission)."""
    path = Path(path)
    label = f"{what} {path}" if what else str(path)
    real, kind = _target_kind(path, what, streams, follow_links)
    if kind == "stream":
        return  # opening a FIFO to test it would block until a reader comes
    parent = real.parent
    if not parent.is_dir():
        raise SsmportError(f"{label}: {parent} is not an existing directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{real.name[:64]}.", suffix=".probe", dir=parent)
    except OSError as exc:
        raise SsmportError(f"{label}: cannot write there ({exc.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def write_output(
    path: str | Path,
    write: Callable[[BinaryIO], None],
    *,
    verify: Callable[[Path], None] | None = None,
    what: str = "",
    streams: bool = True,
    follow_links: bool = True,
) -> None:
    """Write a whole output with `write(f)`; `verify(tmp)` may check the written file first.

    A regular or missing target is replaced atomically (temp file beside it, same mode as a
    plain write); a device or FIFO is streamed to (after `verify` on a temp copy elsewhere),
    or refused with `streams=False` (a bundle's own files: nothing reads a pipe there).
    """
    path = Path(path)
    label = f"{what} {path}" if what else str(path)
    real, kind = _target_kind(path, what, streams, follow_links)
    directory = real.parent if kind == "file" else Path(tempfile.gettempdir())
    tmp = directory / f".{real.name[:64]}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)  # umask applies
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            if verify is not None:
                verify(tmp)
            if kind == "file":
                os.replace(tmp, real)
            else:
                with open(tmp, "rb") as src, open(real, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        except OSError as exc:
            raise SsmportError(f"{label}: cannot write ({exc.strerror or exc})") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


# --- room for a large write -------------------------------------------------------------
def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def check_free_space(directory: Path, need: int, what: str) -> None:
    """Refuse, before it starts, a write of about `need` bytes (one file at most that large)
    into `directory` that the disk's free space or the file-size limit (`ulimit -f`) cannot
    take: the writers of a Core AI asset and of a lowering (LLVM's) end the process on a
    failed write, so the failure could not be reported, or cleaned up, after it happened."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != resource.RLIM_INFINITY and soft < need:
        raise SsmportError(f"{what} needs a file of about {_size(need)}, and the file-size limit (ulimit -f) "
                           f"is {_size(soft)}; raise the limit")  # fmt: skip
    try:
        free = shutil.disk_usage(directory).free
    except OSError as exc:
        raise SsmportError(f"{directory}: cannot write there ({exc.strerror})") from None
    if free < need:
        raise SsmportError(f"{directory}: {_size(free)} free on its disk, and {what} needs about {_size(need)}; "
                           "free some space or write elsewhere")  # fmt: skip

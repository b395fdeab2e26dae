"""Entry point: parse, dispatch, and turn user errors into one line and a non-zero exit.

Exit statuses: 0 success; 1 a bundle written (or gated) that failed its gate; 2 a user error
(`ssmport: error: ...`); 130 Ctrl-C; 128 + N for SIGTERM (143) and SIGHUP (129); 70 an
internal error, i.e. a bug in ssmport: one line naming the file its traceback was saved to.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import time
import traceback

from ssmport.version import __version__
from ssmport.errors import SsmportError

EXIT_GATE_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 70  # EX_SOFTWARE
COMMANDS = ("export", "gate", "logits", "generate", "chat", "inspect", "check-engine", "list", "bench", "tokenize",
            "tokenizer")  # fmt: skip
INTERNAL_ERROR = "ssmport: internal error:"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit status 2) like every other."""

    def error(self, message: str):
        self.exit(EXIT_USER_ERROR, f"ssmport: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ssmport",
        description="Port recurrent / linear-attention LMs (RWKV-7, ...) to Core AI decode bundles: "
        "no KV cache, O(1) state, parity-gated against torch.",
        epilog="Start with: ssmport export rwkv7-pydoc --quant fp32 -o out/  (embedded default, no download)",
    )
    parser.add_argument("--version", action="version", version=f"ssmport {__version__}")
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="FILE_OR_MODULE",
        help="import an architecture defined outside ssmport (a .py file or a module name) "
        "before running the command; repeatable; also read from $SSMPORT_PLUGINS",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # Imported here, not at module level, so a Ctrl-C while torch loads is handled by main().
    for name in COMMANDS:
        importlib.import_module(f"ssmport.cli.{name.replace('-', '_')}_cmd").add_parser(sub)
    return parser


def user_errors() -> tuple[type[BaseException], ...]:
    from ssmport.tokenizers import TokenizerError, VocabError

    return (SsmportError, TokenizerError, VocabError)


class OutputError(SsmportError):
    """Standard output cannot be written (a full disk, a closed descriptor, an I/O error)."""


class _GuardedStdout:
    """sys.stdout, with a failed write reported as one line instead of a traceback; a closed
    pipe (`ssmport ... | head`) stays a BrokenPipeError, which ends the command quietly."""

    def __init__(self, stream):
        self._stream = stream

    def _guard(self, fn, *args):
        try:
            return fn(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(f"cannot write to standard output ({exc.strerror or exc})") from None

    def write(self, text: str) -> int:
        try:
            return self._guard(self._stream.write, text)
        except UnicodeEncodeError:  # PYTHONIOENCODING=ascii, a Latin-1 locale: show "?" for what it cannot
            encoding = getattr(self._stream, "encoding", None) or "ascii"
            return self._guard(self._stream.write, text.encode(encoding, "replace").decode(encoding))

    def flush(self) -> None:
        self._guard(self._stream.flush)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def check_arguments(argv: list[str]) -> None:
    """Refuse arguments that are not valid UTF-8 (Linux hands undecodable bytes over as lone
    surrogates): every path reaches the runtime, whose Swift side dies (SIGILL) on them."""
    for n, arg in enumerate(argv, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = os.fsencode(arg).decode("utf-8", "backslashreplace")
            raise SsmportError(f"argument {n} ({shown}) is not valid UTF-8; ssmport takes UTF-8 paths and text") from None


def _stopped_by_exit(exc: SystemExit) -> SsmportError:
    """A sys.exit() inside a command (a plugin's) must not pass for the command's result."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""
    return SsmportError(f"sys.exit({exc.code!r}){where} stopped the command before it finished (a plugin?)")


def _save_traceback(exc: BaseException) -> str:
    """Write the traceback of an unexpected exception to a file; return where."""
    text = "".join(traceback.format_exception(exc))
    name = f"ssmport-error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    try:
        from ssmport.runtime.lowering import cache_root

        folder = cache_root() / "errors"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        path.write_text(f"ssmport {__version__}, argv {sys.argv!r}\n{text}")
        return str(path)
    except Exception:  # the cache itself may be what is broken: the temp dir, else nowhere
        import tempfile

        try:
            path = os.path.join(tempfile.gettempdir(), name)
            with open(path, "w") as f:
                f.write(text)
            return path
        except OSError:
            return "(could not be saved)"


def _run(argv: list[str] | None) -> int:
    from ssmport.interrupts import Terminated, stop_line, stop_status, terminate_raises

    try:
        with terminate_raises():
            check_arguments(sys.argv[1:] if argv is None else argv)
            if sys.stdout is None:  # started with stdout closed: fd 1 may be any file we open
                raise OutputError("standard output is closed (run it with >/dev/null to discard the output)")
            args = build_parser().parse_args(argv)
            try:
                from ssmport.plugins import load_plugins

                load_plugins(args.plugin)
                code = args.func(args) or 0
                sys.stdout.flush()
            except SystemExit as exc:
                raise _stopped_by_exit(exc) from None
    except user_errors() as exc:
        _say(f"ssmport: error: {exc}")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        _say(stop_line(signal.SIGINT))
        return stop_status(signal.SIGINT)
    except Terminated as exc:
        _say(stop_line(exc.signum))
        return stop_status(exc.signum)
    except BrokenPipeError:  # `ssmport ... | head`: the reader stopped reading; not an error
        _quiet_broken_stdout()
        return 0
    except OSError as exc:  # the filesystem refused something (a path too long, a loop of links, ...)
        from ssmport.files import describe_os_error

        _say(f"ssmport: error: {describe_os_error(exc)}")
        return EXIT_USER_ERROR
    except Exception as exc:  # a bug: one line, and the traceback kept for the report
        _say(f"{INTERNAL_ERROR} {type(exc).__name__}: {exc} (a bug in ssmport; traceback saved to "
             f"{_save_traceback(exc)})")  # fmt: skip
        return EXIT_INTERNAL_ERROR
    return code


def _say(line: str) -> None:
    """One line on stderr, whatever the message holds (newlines, undecodable path bytes)."""
    if sys.stderr is not None:
        text = " ".join(line.split("\n")).encode("utf-8", "backslashreplace").decode("utf-8")
        try:
            print(text, file=sys.stderr, flush=True)
        except OSError:  # stderr on a full disk, or closed under us: the exit status still tells
            _discard_stderr()


def _discard_stderr() -> None:
    """Point fd 2 at /dev/null, so the interpreter's own flush at exit neither fails (exit 1,
    "Exception ignored") nor prints a traceback nowhere."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stderr.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no fd behind it (a test's capture)
        pass


def main(argv: list[str] | None = None) -> int:
    real_stdout = sys.stdout
    if sys.stdout is not None:
        sys.stdout = _GuardedStdout(sys.stdout)
    try:
        code = _run(argv)
    finally:
        sys.stdout = real_stdout
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:
        _quiet_broken_stdout()
    except OSError as exc:
        _say(f"ssmport: error: cannot write to standard output ({exc.strerror or exc})")
        code = code or EXIT_USER_ERROR
    if sys.stderr is not None:
        try:
            sys.stderr.flush()
        except OSError:
            _discard_stderr()
    return code


def _quiet_broken_stdout() -> None:
    """After a closed pipe, point fd 1 at /dev/null so the interpreter's own flush at exit
    does not print "Exception ignored ... BrokenPipeError"."""
    if getattr(sys.stdout, "_stream", sys.stdout) is sys.__stdout__ and sys.__stdout__ is not None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())

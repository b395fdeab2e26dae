"""Keep toolchain chatter out of user-facing output.

coreai-torch prints a banner (and a rich bar) while converting, the runtime's native code
writes `ODIE [default]: Loading function ...` to fd 2 on every load, and coreai-torch warns
that torch `2.13.0+cpu` is newer than `2.13.0`. None of it is actionable for a user.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator

_NOISE = re.compile(r"^ODIE \[\w+\]: Loading function")


def silence_version_warning() -> None:
    # The +cpu local version suffix makes 2.13.0+cpu compare newer than 2.13.0.
    warnings.filterwarnings("ignore", message="coreai-torch has only been validated with torch")


@contextlib.contextmanager
def python_stdout_captured() -> Iterator[io.StringIO]:
    """Capture Python-level prints (the converter's banner and progress)."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        yield buffer


@contextlib.contextmanager
def native_stderr_filtered() -> Iterator[None]:
    """Capture fd 2 (native code writes there directly) and replay all but known noise."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            for line in capture.read().decode(errors="replace").splitlines():
                if line.strip() and not _NOISE.match(line):
                    print(line, file=sys.stderr)

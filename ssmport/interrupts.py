"""Ctrl-C handling for long jobs and for runtime calls.

Python raises KeyboardInterrupt wherever the main thread happens to be. During an export
that is often somewhere it must not be: measured here, a Ctrl-C landing in a weakref
callback run by the garbage collector inside `torch.export` was printed as "Exception
ignored in ..." and lost (the export finished and exited 0), and one landing in a torch C++
callback aborted the process (SIGABRT, the staging directory left behind). So a job wrapped
in `interrupts_deferred()` only records the first Ctrl-C; `raise_if_interrupted()` raises it
at the next safe point (a stage boundary, each stored weight, before the final rename). A
second Ctrl-C raises at once, for a user who will not wait.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_pending = False  # a Ctrl-C recorded by interrupts_deferred() and not yet raised
_deferring = False


def _handler_we_can_replace() -> bool:
    """Only the main thread can set handlers; SIG_IGN / SIG_DFL are the caller's choice."""
    return threading.current_thread() is threading.main_thread() and callable(signal.getsignal(signal.SIGINT))


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Inside the block a first Ctrl-C is recorded and raised by `raise_if_interrupted()`;
    one still pending when the block ends is raised there."""
    global _pending, _deferring
    if _deferring or not _handler_we_can_replace():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def record(signum, frame):
        global _pending
        if _pending:
            previous(signum, frame)  # the second Ctrl-C: the default handler raises now
        _pending = True

    signal.signal(signal.SIGINT, record)
    _deferring, _pending = True, False
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        pending, _deferring, _pending = _pending, False, False
    if pending:
        raise KeyboardInterrupt


def raise_if_interrupted() -> None:
    """A safe point: raise the Ctrl-C that `interrupts_deferred()` recorded, if any."""
    global _pending
    if _pending:
        _pending = False
        raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold a SIGINT that arrives inside the block and deliver it when the block ends."""
    if not _handler_we_can_replace():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    caught: list[tuple] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            previous(*caught[0])

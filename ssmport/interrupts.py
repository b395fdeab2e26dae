"""Ctrl-C, SIGTERM and SIGHUP: for long jobs and for runtime calls.

Python raises KeyboardInterrupt wherever the main thread happens to be. During an export
that is often somewhere it must not be: measured here, a Ctrl-C landing in a weakref
callback run by the garbage collector inside `torch.export` was printed as "Exception
ignored in ..." and lost (the export finished and exited 0), and one landing in a torch C++
callback aborted the process (SIGABRT, the staging directory left behind). So a job wrapped
in `interrupts_deferred()` only records the first stop signal; `raise_if_interrupted()`
raises it at the next safe point (a stage boundary, each stored weight, before the final
rename). A second one raises at once, for a user who will not wait. A block that may be
abandoned anywhere (a Hub download, whose partial files are discarded) stops at once
(`stops_at_once()`). There too the exception can land in a garbage-collector callback and be
lost (seen in CI: a SIGTERM during a blocked Hub read waited out the read's 60 s timeout), so
the signal is sent to the main thread again until the exception leaves the block, and the
block's end raises it if the block finished anyway.

SIGTERM (`kill`, a job scheduler, a container stopping) and SIGHUP (the terminal closing)
stop a command the way Ctrl-C does, as `Terminated`: the CLI installs `terminate_raises()`,
cleans up (no staging directory is left) and exits 128 + the signal number (143, 129), the
shell's convention. A signal the caller set to be ignored (nohup's SIGHUP) stays ignored.

A runtime call is never abandoned with the process going on (ssmport.coreai_loop), so
`interrupts_held()` holds a stop signal until the call returns. One call can take an hour on
this runtime (a 64-row prefill chunk of rwkv7-1.5b at int8keepproj, emulated fp16), and two
SIGTERMs sent to such a gate were measured not to stop it within two minutes. So a held
signal whose call is still running STOP_WAIT_S later, or a second one, ends the process
there: the cleanups registered with `cleaned_at_hard_stop()` run (the export's staging
directory is deleted), the same one line is said, and the process exits with the same status,
without finalizing the interpreter (whose teardown the runtime's worker thread would abort).
This is done only where the signal would otherwise have stopped the program (Python's own
SIGINT handler, SIGTERM / SIGHUP by default), never over a handler the caller installed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_pending: int | None = None  # the first stop signal recorded by interrupts_deferred(), not yet raised
_deferring = False
_at_once = False  # inside stops_at_once(): a stop signal raises where it lands
_raised_at_once: int | None = None  # a stop signal raised inside stops_at_once() whose exception has not left it
RESEND_S = 0.2  # how often that signal is sent again while its exception may have been lost
_resend_lock = threading.Lock()  # no signal is sent again once the block has seen its exception
STOP_WAIT_S = 5.0  # how long a held stop signal waits for its runtime call before the process ends
_hard_stop_cleanups: list[Callable[[], None]] = []


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: stop like Ctrl-C (a BaseException, so only cleanup runs)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_exception(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def stop_status(signum: int) -> int:
    """The exit status of a command a stop signal ended: 130 for Ctrl-C, 128 + the signal else."""
    return 130 if signum == signal.SIGINT else 128 + signum


def stop_line(signum: int) -> str:
    """The one line a command a stop signal ended says."""
    return "ssmport: interrupted" if signum == signal.SIGINT else f"ssmport: terminated ({signal.Signals(signum).name})"


@contextlib.contextmanager
def cleaned_at_hard_stop(cleanup: Callable[[], None]) -> Iterator[None]:
    """Inside the block, `cleanup` (deleting a staging directory) also runs if a stop signal
    ends the process during a runtime call (see the module's docstring)."""
    _hard_stop_cleanups.append(cleanup)
    try:
        yield
    finally:
        _hard_stop_cleanups.remove(cleanup)


def _hard_stop(signum: int) -> None:
    for cleanup in reversed(_hard_stop_cleanups):
        with contextlib.suppress(Exception):
            cleanup()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        os.write(2, (stop_line(signum) + "\n").encode())
    os._exit(stop_status(signum))


def _would_stop(previous) -> bool:
    """Whether the handler replaced would have stopped the program (so ending it is no surprise)."""
    return previous is signal.default_int_handler or previous == signal.SIG_DFL or getattr(previous, "stops", False)


def _raise_terminated(signum, frame):
    raise Terminated(signum)


_raise_terminated.stops = True  # type: ignore[attr-defined]  # see _would_stop


def _ours_to_replace(signum: int) -> bool:
    """Only the main thread can set handlers; SIG_IGN is the caller's choice, and so is
    SIG_DFL for SIGINT (a shell's background job). SIG_DFL for SIGTERM / SIGHUP is taken over
    so that a library caller's export cleans up too."""
    if threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(signum)
    if signum == signal.SIGINT:
        return callable(current)
    return callable(current) or current == signal.SIG_DFL


@contextlib.contextmanager
def _handlers(handler) -> Iterator[dict[int, object]]:
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS if _ours_to_replace(s)}
    for s in previous:
        signal.signal(s, handler)
    try:
        yield previous
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def terminate_raises() -> Iterator[None]:
    """Inside the block SIGTERM / SIGHUP raise `Terminated` (the CLI's whole run)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    for s, h in previous.items():
        if h == signal.SIG_DFL:
            signal.signal(s, _raise_terminated)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _deliver(signum: int, previous) -> None:
    """What the signal would have done without us: the previous handler, or an exception."""
    if callable(previous):
        previous(signum, None)  # Python's SIGINT handler raises KeyboardInterrupt
    else:
        raise stop_exception(signum)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Inside the block a first stop signal is recorded and raised by
    `raise_if_interrupted()`; one still pending when the block ends is raised there."""
    global _pending, _deferring
    if _deferring:
        yield
        return
    previous: dict[int, object] = {}

    def record(signum, frame):
        global _pending
        if _at_once:  # a block that may stop anywhere
            _pending = None
            _deliver_until_it_lands(signum, previous.get(signum))
            return
        if _pending is not None:  # the second one
            _pending = None
            _deliver(signum, previous.get(signum))
        _pending = signum

    record.stops = True  # type: ignore[attr-defined]  # see _would_stop
    with _handlers(record) as replaced:
        previous.update(replaced)
        _deferring, _pending = True, None
        try:
            yield
        finally:
            pending, _deferring, _pending = _pending, False, None
    if pending is not None:
        raise stop_exception(pending)


@contextlib.contextmanager
def stops_at_once() -> Iterator[None]:
    """Inside `interrupts_deferred()`, a block that may be abandoned anywhere (it has written
    nothing a half-done step would spoil, and cleans up in its own `finally`): a stop signal
    raises where it lands, and one recorded before the block raises on entry. For blocking
    reads: a Hub that accepts the connection and never answers never reaches a safe point."""
    global _at_once
    if not _deferring or _at_once:
        yield
        return
    try:
        # stopping at once first, then the check: a signal between the two is raised, not recorded
        _at_once = True
        raise_if_interrupted()
        yield
    except (KeyboardInterrupt, Terminated):
        _landed()
        raise
    finally:
        _at_once = False
        lost = _landed()
        if lost is not None:  # its exception was swallowed where it landed: raise it here
            raise stop_exception(lost)  # in place of whatever ended the block (the read's timeout)


def _deliver_until_it_lands(signum: int, previous) -> None:
    """Inside stops_at_once(): deliver the signal; if that raised, send it to the main thread
    again every RESEND_S until the exception leaves the block (it may land where Python
    swallows it: a weakref or __del__ callback the garbage collector ran)."""
    global _raised_at_once
    try:
        _deliver(signum, previous)
    except BaseException:
        if _raised_at_once is None:
            _raised_at_once = signum
            threading.Thread(target=_resend, args=(signum,), daemon=True).start()
        raise


def _resend(signum: int) -> None:
    main = threading.main_thread().ident
    while True:
        time.sleep(RESEND_S)
        with _resend_lock:
            if _raised_at_once != signum or not _at_once:
                return
            signal.pthread_kill(main, signum)


def _landed() -> int | None:
    """The exception of a stop signal raised inside stops_at_once() left the block: stop sending it."""
    global _raised_at_once
    with _resend_lock:
        signum, _raised_at_once = _raised_at_once, None
    return signum


def raise_if_interrupted() -> None:
    """A safe point: raise the stop signal that `interrupts_deferred()` recorded, if any."""
    global _pending
    if _pending is not None:
        signum, _pending = _pending, None
        raise stop_exception(signum)


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold a stop signal that arrives inside the block (a runtime call) and deliver it when
    the block ends; if the block outlasts it by STOP_WAIT_S, or a second one comes, end the
    process (see the module's docstring)."""
    caught: list[int] = []
    previous: dict[int, object] = {}
    timers: list[threading.Timer] = []

    def hold(signum, frame):
        stops = _would_stop(previous.get(signum, signal.SIG_DFL))
        if caught and stops:
            _hard_stop(signum)
        caught.append(signum)
        if stops and not timers:
            timers.append(threading.Timer(STOP_WAIT_S, _hard_stop, (signum,)))
            timers[0].daemon = True
            timers[0].start()

    try:
        with _handlers(hold) as replaced:
            previous.update(replaced)
            yield
    finally:
        for timer in timers:
            timer.cancel()
        if caught:
            _deliver(caught[0], previous.get(caught[0]))

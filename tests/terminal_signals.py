"""The stop signals as a terminal delivers them, whatever the test run inherited.

A shell's background job starts with SIGINT ignored, nohup ignores SIGHUP, and ssmport keeps a
signal its caller ignored ignored (ssmport.interrupts): a test that sends one of them sets
these first (the `terminal_signals` fixture in-process, `reset_in_child` for a child process).
"""

from __future__ import annotations

import signal

TERMINAL_SIGNALS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL,
                    signal.SIGHUP: signal.SIG_DFL}  # fmt: skip


def reset_in_child() -> None:
    """preexec_fn of a child the test signals (its Python installs its own SIGINT handler)."""
    for sig in TERMINAL_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)

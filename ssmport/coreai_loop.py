"""The asyncio event loop ssmport drives coreai.runtime's async calls with.

coreai-core 1.0.0b3's Swift-Python bridge resolves each call's future from a libdispatch
worker thread with `loop.call_soon_threadsafe(future.set_result, result)`. Two defects of
that bridge were measured here, and this loop works around both:

1. It never releases the Handle that `call_soon_threadsafe` returns, so the handle kept the
   future and its result alive: every decode step leaked its logits (264 KB per step at
   vocab 65,536, i.e. 2.6 GB over a 10,000-token run). Here the handle's callback lets go of
   the future and the result as soon as it has run; what still leaks is the empty handle.
2. After resolving the future, the Swift task drops its references to Python objects (the
   future, the loop) on the worker thread, a moment after Python has the result. If the
   interpreter is already finalizing, CPython 3.11 ends a thread that asks for the GIL with
   `pthread_exit`, whose forced unwind through Swift frames aborts the whole process:
   "C++ exception handling detected but the Swift runtime was compiled with exceptions
   disabled", SIGABRT, exit 134 (backtrace: `completeTaskWithClosure` -> `swift_release` ->
   `PyGILState_Ensure` -> `take_gil` -> `PyThread_exit_thread`). `settle()` waits until the
   runtime has let go of every future it resolved; runners call it when they close, and it
   runs again at exit, before finalization starts.

A call must also never be abandoned half-way (a Ctrl-C arriving while the loop waits for it):
the runtime would later resolve its future on a loop that may be closed by then (a fatal
error in the bridge), and the states would be updated without the runner knowing.
`ssmport.interrupts.interrupts_held()` delays a Ctrl-C until the call is complete.
"""

from __future__ import annotations

import asyncio
import atexit
import time
import weakref

SETTLE_TIMEOUT_S = 30.0  # a safety net only: the wait normally ends within microseconds

# Futures the runtime has resolved (or is about to) and may still hold a reference to.
# A future leaves this set when it is freed, which for these happens on the runtime's own
# worker thread when it drops its last reference.
_held_by_runtime: weakref.WeakSet[asyncio.Future] = weakref.WeakSet()


class CoreAILoop(asyncio.SelectorEventLoop):
    def call_soon_threadsafe(self, callback, *args, context=None):
        target = getattr(callback, "__self__", None)
        if isinstance(target, asyncio.Future):
            _held_by_runtime.add(target)
            del target
        # The runtime keeps the returned handle forever (defect 1): give it a callback
        # that forgets the real callback and its arguments once it has run.
        cell = [callback, args]
        del callback, args

        def run_once() -> None:
            fn, fn_args = cell
            cell.clear()
            fn(*fn_args)

        return super().call_soon_threadsafe(run_once, context=context)


def settle(timeout: float = SETTLE_TIMEOUT_S) -> bool:
    """Wait (with the GIL released) until the runtime's worker threads have dropped every
    future they resolved. Returns False if some are still held after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while len(_held_by_runtime):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0002)
    return True


atexit.register(settle)

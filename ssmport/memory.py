"""Where an export's memory goes: the peak resident set size of each stage.

On Linux the kernel keeps the process's high-water mark (VmHWM in /proc/self/status), and
writing "5" to /proc/self/clear_refs resets it to the current RSS. At every stage boundary
the trace reads the mark, credits it to every stage still open, and resets it, so each
stage's peak is exact (the kernel's own count, no sampling) and a nested stage's peak is
also its parent's. The cost: `getrusage` maxrss (and `/usr/bin/time`) then only see the
last window, which is why the trace is opt-in (`ssmport export --profile-memory`); its
`peak_mb` is the whole run's peak.

Elsewhere (macOS) there is only the monotonic maxrss: a stage's figure is then the
process's peak so far, exact for the stage that set it and an upper bound for the others.

Only this process is counted: the Core AI runtime lowers and runs in-process.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import gc
import resource
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from ssmport.progress import Stages

_STATUS, _CLEAR_REFS = "/proc/self/status", "/proc/self/clear_refs"
_CURRENT: contextvars.ContextVar[MemoryTrace | None] = contextvars.ContextVar("memory_trace", default=None)


def _status_kb(field: str) -> int | None:
    try:
        with open(_STATUS) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_mb() -> float | None:
    """The current resident set size (None where /proc is absent)."""
    kb = _status_kb("VmRSS")
    return None if kb is None else kb / 1024


def maxrss_mb() -> float:
    """getrusage's peak RSS of this process (kB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def _reset_high_water() -> bool:
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@dataclass
class StageMemory:
    name: str
    depth: int  # 0: a top-level stage; 1: a part of the stage above it, ...
    start_mb: float
    peak_mb: float
    end_mb: float
    seconds: float


class MemoryTrace:
    """`with MemoryTrace() as trace:` ... `with section("torch.export"):` ... `trace.records`."""

    def __init__(self):
        self.records: list[StageMemory] = []
        self._open: list[tuple[StageMemory, float]] = []
        self.peak_mb = maxrss_mb()  # before the first reset: what came before counts too
        self._resets = _reset_high_water()
        self.method = "VmHWM, reset per stage" if self._resets else "maxrss (monotonic: peak so far)"
        self._token = None

    def __enter__(self) -> MemoryTrace:
        self._token = _CURRENT.set(self)
        self._boundary()
        return self

    def __exit__(self, *exc) -> None:
        self._boundary()
        _CURRENT.reset(self._token)

    def finish(self) -> None:
        """Bring `peak_mb` up to now (the trace stays active)."""
        self._boundary()

    def _high_water(self) -> float:
        kb = _status_kb("VmHWM") if self._resets else None
        return kb / 1024 if kb is not None else maxrss_mb()

    def _now(self) -> float:
        current = rss_mb()
        return self._high_water() if current is None else current

    def _boundary(self) -> float:
        """Credit the high-water mark since the last boundary to every open stage, restart it."""
        mark = self._high_water()
        self.peak_mb = max(self.peak_mb, mark)
        for record, _ in self._open:
            record.peak_mb = max(record.peak_mb, mark)
        if self._resets:
            _reset_high_water()
        return mark

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[StageMemory]:
        self._boundary()
        now = self._now()
        record = StageMemory(name, len(self._open), now, now, now, 0.0)
        self.records.append(record)
        self._open.append((record, time.perf_counter()))
        try:
            yield record
        finally:
            self._boundary()
            _, started = self._open.pop()
            record.end_mb, record.seconds = self._now(), time.perf_counter() - started
            record.peak_mb = max(record.peak_mb, record.end_mb)

    def to_json(self) -> dict:
        stages = [{k: round(v, 2 if k == "seconds" else 1) if isinstance(v, float) else v for k, v in asdict(r).items()}
                  for r in self.records]  # fmt: skip
        return {"method": self.method, "peak_mb": round(self.peak_mb, 1), "stages": stages}

    def lines(self) -> list[str]:
        """The trace as a table (MB)."""
        width = max((2 * r.depth + len(r.name) for r in self.records), default=5)
        out = [f"memory: peak RSS {self.peak_mb / 1024:.2f} GB ({self.method})",
               f"  {'stage':<{width}}  {'start':>7} {'peak':>7} {'end':>7} {'seconds':>8}"]  # fmt: skip
        for r in self.records:
            label = "  " * r.depth + r.name
            out.append(f"  {label:<{width}}  {r.start_mb:7.0f} {r.peak_mb:7.0f} {r.end_mb:7.0f} {r.seconds:8.1f}")
        return out


def section(name: str):
    """A traced part of the work: a no-op unless a `MemoryTrace` is active."""
    trace = _CURRENT.get()
    return contextlib.nullcontext() if trace is None else trace.section(name)


class TracedStages(Stages):
    """Progress stages that are also memory-trace sections."""

    @contextlib.contextmanager
    def stage(self, name: str, total: float | None = 1) -> Iterator[Stages]:
        with section(name), super().stage(name, total) as stages:
            yield stages


# A full collection costs ~0.35 s a call in a process holding many objects (a pytest worker:
# 6.7 s of test_qwen35_coreai's 73 s), and what an export this small leaves behind is not worth it.
FREE_MEMORY_FROM_PARAMETERS = 50_000_000


def return_freed_memory(parameters: int) -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc keeps them otherwise), for an
    export of `parameters` weights; skipped below FREE_MEMORY_FROM_PARAMETERS."""
    if parameters < FREE_MEMORY_FROM_PARAMETERS:
        return
    gc.collect()
    trim_heap()


def trim_heap() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass

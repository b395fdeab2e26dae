"""A rich progress display over the stages of a long job (on stderr, never stdout).

On a terminal: a bar per stage. Elsewhere (a CI log, nohup, a file) bars would be noise, and
nothing at all left a 40-minute export's log empty, with no way to tell which stage it was in
(docs/quantization.md, the 4B export on the GPU machine). There a stage that runs longer than
LOG_AFTER_S gets a line, another every LOG_EVERY_S, and one when it ends. A stage quicker
than that leaves no line, so a user error stays the one line it is.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.text import Text

from ssmport.interrupts import raise_if_interrupted

LOG_AFTER_S = 30.0
LOG_EVERY_S = 300.0


class Stages:
    """`with stages.stage("Converting"):` shows a spinner/bar per stage and its time."""

    def __init__(self, enabled: bool = True):
        self.console = Console(stderr=True)
        self.enabled = enabled and self.console.is_terminal  # logs and pipes get no bars
        self._log = _StageLog() if enabled and not self.console.is_terminal else None
        self.times: dict[str, float] = {}
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            _TransferColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,  # cleared when done: the command's own summary lines remain
            disable=not self.enabled,
        )
        self._task = None

    def __enter__(self) -> Stages:
        self._progress.start()
        if self._log is not None:
            self._log.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()
        if self._log is not None:
            self._log.stop()

    @contextlib.contextmanager
    def stage(self, name: str, total: float | None = 1) -> Iterator[Stages]:
        raise_if_interrupted()
        self._task = self._progress.add_task(name, total=total)
        start = time.perf_counter()
        if self._log is not None:
            self._log.enter(name, total)
        ended = False
        try:
            yield self
            raise_if_interrupted()
            self._progress.update(self._task, completed=self._progress.tasks[self._task].total or 1)
            ended = True
        finally:
            if self._log is not None:
                self._log.leave(ended)
            self.times[name] = time.perf_counter() - start
            self._task = None

    @contextlib.contextmanager
    def download(self, name: str, total: int) -> Iterator[Callable[[int], None]]:
        """A bar of `total` bytes with the bytes done and the rate; yields `advance(nbytes)`
        (callable from download threads; a recorded Ctrl-C is raised there)."""
        task = self._progress.add_task(name, total=total, transfer=True)

        def advance(nbytes: int) -> None:
            raise_if_interrupted()
            self._progress.advance(task, nbytes)

        start = time.perf_counter()
        try:
            yield advance
        finally:
            self.times[name] = time.perf_counter() - start

    def advance(self, amount: float = 1) -> None:
        raise_if_interrupted()
        if self._task is not None:
            self._progress.advance(self._task, amount)
        if self._log is not None:
            self._log.advance(amount)


class _TransferColumn(ProgressColumn):
    """Bytes done / total and the rate, on download bars only."""

    def __init__(self):
        super().__init__()
        self._size, self._rate = DownloadColumn(), TransferSpeedColumn()

    def render(self, task) -> Text:
        if not task.fields.get("transfer"):
            return Text("")
        return Text.assemble(self._size.render(task), " ", self._rate.render(task))


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    return f"{minutes // 60} h {minutes % 60} min"


class _StageLog:
    """The lines a non-terminal stderr gets (see the module's docstring). A thread of its own
    writes them, so a stage blocked in one long call (a runtime call, torch.export) still says
    where it is."""

    def __init__(self):
        self._lock = threading.Lock()
        self._stack: list[dict] = []  # stages may nest (the gate's inside an export)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="ssmport-stage-log", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def enter(self, name: str, total: float | None) -> None:
        now = time.monotonic()
        with self._lock:
            self._stack.append({"name": name, "total": total, "done": 0.0, "start": now,
                                "due": now + LOG_AFTER_S, "said": False})  # fmt: skip

    def advance(self, amount: float) -> None:
        with self._lock:
            if self._stack:
                self._stack[-1]["done"] += amount

    def leave(self, ended: bool) -> None:
        with self._lock:
            stage = self._stack.pop()
            if stage["said"]:  # a stage that said it was running says how it ended
                how = "done" if ended else "stopped"
                _line(f"{stage['name']}: {how} after {_duration(time.monotonic() - stage['start'])}")

    def _until_due(self) -> float:
        """Seconds to wait before looking again: until the running stage's next line is due (a
        fixed poll could wake just before it and then sleep past a short stage), else 1 s."""
        with self._lock:
            if not self._stack:
                return 1.0
            return min(1.0, max(0.0, self._stack[-1]["due"] - time.monotonic()) + 0.01)

    def _watch(self) -> None:
        while not self._stop.wait(self._until_due()):
            now = time.monotonic()
            with self._lock:
                if not self._stack or now < self._stack[-1]["due"]:
                    continue
                stage = self._stack[-1]
                stage["due"], stage["said"] = now + LOG_EVERY_S, True
                _line(f"{stage['name']}: {_count(stage['done'], stage['total'])}{_duration(now - stage['start'])} so far")


def _count(done: float, total: float | None) -> str:
    """Steps as "3 of 8 done" (whole ones: a reference advances in fractions of a step), a
    large total (weights stored) as a percentage."""
    if not total or total <= 1:
        return ""
    if total <= 10_000:
        return f"{int(done)} of {total:.0f} done, "
    return f"{100 * done / total:.0f}% done, "


def _line(text: str) -> None:
    if sys.stderr is None:
        return
    try:
        print(f"ssmport: [{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed or full: the log is lost, the job goes on
        pass

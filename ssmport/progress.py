"""A rich progress display over the stages of a long job (on stderr, never stdout)."""

from __future__ import annotations

import contextlib
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


class Stages:
    """`with stages.stage("Converting"):` shows a spinner/bar per stage and its time."""

    def __init__(self, enabled: bool = True):
        self.console = Console(stderr=True)
        self.enabled = enabled and self.console.is_terminal  # logs and pipes get no bars
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
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    @contextlib.contextmanager
    def stage(self, name: str, total: float | None = 1) -> Iterator[Stages]:
        raise_if_interrupted()
        self._task = self._progress.add_task(name, total=total)
        start = time.perf_counter()
        try:
            yield self
            raise_if_interrupted()
            self._progress.update(self._task, completed=self._progress.tasks[self._task].total or 1)
        finally:
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


class _TransferColumn(ProgressColumn):
    """Bytes done / total and the rate, on download bars only."""

    def __init__(self):
        super().__init__()
        self._size, self._rate = DownloadColumn(), TransferSpeedColumn()

    def render(self, task) -> Text:
        if not task.fields.get("transfer"):
            return Text("")
        return Text.assemble(self._size.render(task), " ", self._rate.render(task))

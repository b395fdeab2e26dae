"""A rich progress display over the stages of a long job (on stderr, never stdout)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

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

    def advance(self, amount: float = 1) -> None:
        raise_if_interrupted()
        if self._task is not None:
            self._progress.advance(self._task, amount)

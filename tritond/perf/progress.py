"""Live progress for `tritond perf` and `tritond analyze` (rich), on stderr when it is a
terminal; elsewhere (CI logs, pipes) one plain line per finished step instead."""
from __future__ import annotations

import sys
from typing import TextIO


class Display:
    """An optional bar over trials (with ETA) above a line for the level being measured."""

    def __init__(self, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if enabled is None else enabled
        self._progress = None
        self._trials = None
        self._level = None
        if self.live:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                      MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA"),
                                      TimeRemainingColumn(), console=Console(file=self.stream),
                                      transient=True)

    def __enter__(self) -> "Display":
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def log(self, text: str) -> None:
        """A line that stays (above the live bars when they are shown)."""
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def trials_total(self, total: int) -> None:
        """The bar over trials (created on first use); the total may be re-estimated later."""
        if self._progress is None:
            return
        if self._trials is None:
            self._trials = self._progress.add_task("trials", total=total)
        else:
            self._progress.update(self._trials, total=total)

    def trial_done(self) -> None:
        if self._progress is not None and self._trials is not None:
            self._progress.advance(self._trials)

    def level(self, label: str, windows: int) -> None:
        """A level starts: a bar over its measurement windows (at most `windows`)."""
        if self._progress is None:
            return
        if self._level is not None:
            self._progress.remove_task(self._level)
        self._level = self._progress.add_task(label, total=windows)

    def window(self, label: str, done: int, total: int, infer_per_sec: float, latency_ms: float,
               stable: bool) -> None:
        if self._progress is None or self._level is None:
            return
        state = "stable" if stable else "stabilizing"
        self._progress.update(self._level, completed=done, total=total,
                              description=f"{label}: {infer_per_sec:,.1f} infer/s, {latency_ms:.2f} ms ({state})",
                              refresh=True)

    def level_done(self) -> None:
        if self._progress is not None and self._level is not None:
            self._progress.remove_task(self._level)
            self._level = None
            self._progress.refresh()

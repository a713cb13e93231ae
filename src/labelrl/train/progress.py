"""A rich progress bar for training loops (step, key figures, ETA); plain log lines with --quiet.

While the bar is up it hosts other counts (``labelrl.progress.hosting``): the val scoring
every ``--eval-every`` steps shows "val 64/200" in the bar's status instead of a second bar."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


class StepProgress:
    """``with StepProgress(total, "rl") as p: p.update(step, {"reward": 0.5})``."""

    def __init__(self, total: int, name: str, *, quiet: bool = False, start: int = 0) -> None:
        self.total, self.name, self.quiet, self.start = total, name, quiet, start
        self.console = Console(stderr=True)
        self._progress: Progress | None = None
        self._task = None
        self._t0 = time.perf_counter()
        self._info = ""
        self._hosting = None

    def __enter__(self) -> "StepProgress":
        if not self.quiet and self.console.is_terminal:
            self._progress = Progress(
                TextColumn(f"[bold]{self.name}[/]"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("eta"),
                TimeRemainingColumn(), console=self.console,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task(self.name, total=self.total, completed=self.start, info="")
            from labelrl.progress import hosting

            self._hosting = hosting(self._set_status)
            self._hosting.__enter__()
        return self

    def _set_status(self, text: str) -> None:
        """Another count (e.g. val scoring) shown after the step's figures while it runs."""
        if self._progress is not None:
            self._progress.update(self._task, info=f"{self._info}  {text}" if text else self._info)

    def update(self, step: int, figures: dict) -> None:
        info = "  ".join(f"{k} {_fmt(v)}" for k, v in figures.items())
        self._info = info
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info)
        else:
            elapsed = time.perf_counter() - self._t0
            print(f"{self.name} step {step}/{self.total}  {info}  ({elapsed:.0f}s)", file=sys.stderr, flush=True)

    def __exit__(self, *exc) -> None:
        if self._hosting is not None:
            self._hosting.__exit__(*exc)
        if self._progress is not None:
            self._progress.__exit__(*exc)

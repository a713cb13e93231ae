"""Progress of work that can take more than a few seconds: a count and an ETA, never silence.

``with Counter(total, "scoring val") as count: ... count.advance(n)``

* On a terminal: a rich bar on stderr (what, bar, done/total, elapsed, eta), left in place
  when done, so the log keeps how long each phase took.
* Elsewhere (a log file, CI, a pipe): plain lines on stderr, one when the work starts, one at
  least every ``PLAIN_EVERY`` seconds while it runs and one when it ends, each with the count,
  the elapsed time and an ETA (elapsed / done × left).
* Inside another live display (rich allows one per terminal), e.g. the step bar of a training
  run, the count goes to that display's status text instead (``hosting``).

Used by scoring (val, holdout, out-of-domain), the SmolLM2 conversion, distillation and
relabelling; the training loops have their own step bar (``labelrl.train.progress``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Callable, Iterator

PLAIN_EVERY = 10.0  # seconds between plain progress lines

_HOSTS: list[Callable[[str], None]] = []  # status setters of the live displays now open, innermost last


@contextlib.contextmanager
def hosting(set_status: Callable[[str], None]) -> Iterator[None]:
    """While open, counters show their count through ``set_status`` (a live display's status
    text) instead of drawing a second live display."""
    _HOSTS.append(set_status)
    try:
        yield
    finally:
        _HOSTS.remove(set_status)
        set_status("")


def clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Counter:
    """Counts ``total`` units of work (see the module docstring); ``plain`` prints lines even on a
    terminal (``--quiet``: no bar), ``quiet`` shows nothing."""

    def __init__(self, total: int, description: str, *, unit: str = "items", plain: bool = False,
                 quiet: bool = False, console=None) -> None:
        self.total, self.description, self.unit, self.quiet, self.plain = total, description, unit, quiet, plain
        self.done = 0
        self._lock = threading.Lock()  # advance may come from worker threads (endpoint requests)
        self._shown = -1  # the count of the last plain line
        self._console = console
        self._bar = self._task = None
        self._host: Callable[[str], None] | None = None
        self._started = self._last_line = time.monotonic()

    def __enter__(self) -> "Counter":
        self._started = self._last_line = time.monotonic()
        if self.quiet:
            return self
        if _HOSTS:
            self._host = _HOSTS[-1]
            self._host(self._status())
            return self
        from rich.console import Console

        console = self._console or Console(stderr=True)
        if console.is_terminal and not self.plain:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn(self.unit), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                 console=console)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=self.total)
        else:
            self._line()
        return self

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            if self.quiet:
                return
            if self._host is not None:
                self._host(self._status())
            elif self._bar is not None:
                self._bar.update(self._task, completed=self.done)
            elif time.monotonic() - self._last_line >= PLAIN_EVERY:
                self._line()

    def __exit__(self, *exc) -> None:
        if self.quiet:
            return
        if self._host is not None:
            self._host("")
        elif self._bar is not None:
            self._bar.__exit__(*exc)
        elif exc[0] is None and self._shown != self.done:
            self._line()

    def _status(self) -> str:
        return f"{self.description} {self.done}/{self.total}{self._eta()}"

    def _eta(self) -> str:
        """``, eta 0:01:03`` from the pace so far (elapsed / done × left); empty before the first unit."""
        if not 0 < self.done < self.total:
            return ""
        elapsed = time.monotonic() - self._started
        return f", eta {clock(elapsed / self.done * (self.total - self.done))}"

    def _line(self) -> None:
        """``scoring val: 64/400 items, 0:00:12 elapsed, eta 0:01:03``."""
        self._last_line, self._shown = time.monotonic(), self.done
        out = self._console.file if self._console is not None else sys.stderr
        print(f"{self.description}: {self.done}/{self.total} {self.unit}, {clock(self._last_line - self._started)} "
              f"elapsed{self._eta()}", file=out, flush=True)

"""Progress of work that can take more than a few seconds: a count and an ETA, never silence.

``with Counter(total, "scoring val") as count: ... count.advance(n)``

* On a terminal: a rich bar on stderr (what, bar, done/total, elapsed, eta), left in place
  when done, so the log keeps how long each phase took.
* Elsewhere (a log file, CI, a pipe): plain lines on stderr, one when the work starts, one at
  least every ``PLAIN_EVERY`` seconds while it runs and one when it ends, each with the count,
  the elapsed time and an ETA (elapsed / done × left).
* Inside another live display (rich allows one per terminal), e.g. the step bar of a training
  run, the count goes to that display's status text instead (``hosting``).
* ``work``: where units differ in cost (scoring takes its prompts shortest first, and a 3,000-token
  text costs a hundred times a 30-token one), the caller gives the total work (tokens) and each
  advance's share; the ETA and the bar then follow the work done, the count stays in units.

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
    terminal (``--quiet``: no bar), ``quiet`` shows nothing; ``work``: the units' total cost, each
    ``advance`` then says its part of it, and the ETA is elapsed / work done × work left."""

    def __init__(self, total: int, description: str, *, unit: str = "items", plain: bool = False,
                 quiet: bool = False, console=None, work: float | None = None) -> None:
        if work is not None and not work > 0:
            raise ValueError(f"Counter work={work!r}: the total cost must be positive (or None to count units only)")
        self.total, self.description, self.unit, self.quiet, self.plain = total, description, unit, quiet, plain
        self.done = 0
        self.work, self.work_done = work, 0.0
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
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            # the bar's own total is the work where there is one (its ETA then follows the work), the count is shown as text
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[count]}"),
                                 TextColumn(self.unit), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                 console=console)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=self.total if self.work is None else self.work,
                                            count=self._count())
        else:
            self._line()
        return self

    def advance(self, n: int = 1, work: float | None = None) -> None:
        """``n`` more units done; ``work``: their cost, required where the counter has a total work."""
        if (work is None) != (self.work is None):
            raise ValueError(f"Counter.advance(work={work!r}) on a counter with work={self.work!r}: give each advance's "
                             "cost exactly when the counter has a total work")
        with self._lock:
            self.done += n
            self.work_done += work or 0.0
            if self.quiet:
                return
            if self._host is not None:
                self._host(self._status())
            elif self._bar is not None:
                self._bar.update(self._task, completed=self.done if self.work is None else self.work_done,
                                 count=self._count())
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

    def _count(self) -> str:
        return f"{self.done}/{self.total}"

    def _status(self) -> str:
        return f"{self.description} {self._count()}{self._eta()}"

    def _eta(self) -> str:
        """``, eta 0:01:03`` from the pace so far (elapsed / done × left, in work where there is
        one); empty before the first unit."""
        if not 0 < self.done < self.total:
            return ""
        done, total = (self.done, self.total) if self.work is None else (self.work_done, self.work)
        if not 0 < done < total:
            return ""
        elapsed = time.monotonic() - self._started
        return f", eta {clock(elapsed / done * (total - done))}"

    def _line(self) -> None:
        """``scoring val: 64/400 items, 0:00:12 elapsed, eta 0:01:03``."""
        self._last_line, self._shown = time.monotonic(), self.done
        out = self._console.file if self._console is not None else sys.stderr
        print(f"{self.description}: {self._count()} {self.unit}, {clock(self._last_line - self._started)} "
              f"elapsed{self._eta()}", file=out, flush=True)

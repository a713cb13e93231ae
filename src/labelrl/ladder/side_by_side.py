"""Training runs of a ladder side by side: W worker processes, each with cores / W threads.

Why: a 135M-parameter model's products are too small to keep two threads of one process busy.
On a 2-core CPU two vader-movies RL runs took 38.4 s side by side, one thread each, against
55.2 s one after another with two threads (1.44×; ``benchmarks/side_by_side.py``,
docs/performance.md, "Runs side by side").

What runs side by side (recipe ``workers: W``, default 1: one process, as before):

* an arm's tuning candidates (``labelrl.ladder.tune``: every value of its grid);
* the arms whose runs can start now: replicate seeds (``ARM@sSEED``) once the run they follow
  has chosen its values and their parent is done, and any other SFT or RL arm whose
  dependencies are done.

The workers are started once per ladder and kept (a worker's imports cost seconds a run). With
W > 1 every SFT and RL run of the ladder trains in a worker with the same thread count, alone or
beside another, so a run's arithmetic does not depend on what it ran beside (a product summed by
one thread rounds differently from one split over two). A worker writes the run's files only;
the ladder then finds the run finished (``labelrl.ladder.arms.train_finished``). The worker also
scores the run it trained (``Job.evaluate``): a tuning candidate on val, any other run with every
evaluation that scores its model (``labelrl.ladder.evaluations.scored_evaluations``: val, the
holdout look, out-of-domain holdouts). Scoring, too, keeps two one-thread processes busier than
one two-thread process. Each evaluation writes its report, and the ladder's own evaluation reads
it back instead of scoring again, so the files, the ledger and the state are those of a ladder
without workers. A run whose worker fails leaves nothing the ladder uses: the ladder trains it
itself (an RL run resumes from its last checkpoint), scores what was not scored, and reports
its error as usual.
Each run's console output is kept beside it, in ``RUN.worker.log``. What a worker runs is in
``labelrl.ladder.worker``, which imports nothing heavy, so the thread count is set before torch
loads.

Each worker holds its own model, optimizer and activations: set W only where W runs' memory fits.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel
from rich.console import Console

from labelrl.ladder.arms import note_made, train_finished
from labelrl.ladder.worker import run_job, start_worker

LOG_SUFFIX = ".worker.log"
_POOLS: dict[tuple[int, int], ProcessPoolExecutor] = {}  # (workers, threads) → the ladder's workers


@dataclass
class Job:
    """One training run: the arm type, its final config, the task directory."""

    name: str  # shown on the console: ARM or ARM: VALUES
    arm_type: str
    cfg: BaseModel
    task_dir: Path
    evaluate: dict | None = None  # what the worker scores after training (labelrl.ladder.worker.run_job)

    @property
    def out(self) -> Path:
        return Path(self.cfg.out)

    def spec(self) -> dict:
        """What a worker rebuilds the job from (plain values: it crosses a process boundary)."""
        cls = type(self.cfg)
        return {"arm_type": self.arm_type, "config_class": f"{cls.__module__}:{cls.__qualname__}",
                "config": self.cfg.model_dump(mode="json"), "task_dir": str(self.task_dir), "evaluate": self.evaluate}


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_worker(workers: int) -> int:
    return max(1, cores() // workers)


def log_path(out: Path) -> Path:
    return out.with_name(out.name + LOG_SUFFIX)


# ------------------------------------------------------------------ in the ladder's process


def _pool(workers: int, threads: int) -> ProcessPoolExecutor:
    if (workers, threads) not in _POOLS:
        close_workers()
        _POOLS[(workers, threads)] = ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn"),  # no fork of a threaded parent
            initializer=start_worker, initargs=(threads, os.getpid()))  # a worker ends with the ladder
    return _POOLS[(workers, threads)]


def close_workers(kill: bool = False) -> None:
    """Stop the ladder's workers (the ladder calls this when it ends, however it ends); with
    ``kill``, a run in progress is stopped too rather than waited for (the ladder is failing)."""
    for pool in _POOLS.values():
        if kill:  # the executor has no public way to stop a busy worker before Python 3.14
            for process in list((getattr(pool, "_processes", None) or {}).values()):
                process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
    _POOLS.clear()


def _submit(pool: ProcessPoolExecutor, job: Job) -> Future:
    log = log_path(job.out)
    log.parent.mkdir(parents=True, exist_ok=True)
    return pool.submit(run_job, job.spec(), str(log))  # labelrl.ladder.worker, in the worker


def train_side_by_side(jobs: list[Job], workers: int, console: Console) -> dict[Path, dict[str, float]]:
    """Train (and score) every job not finished yet, ``workers`` at a time; returns by run dir
    each job's share of the wall time, ``{"train": s, "eval": s}`` (the batch's wall time split in
    proportion to the jobs' own times)."""
    todo = [j for j in jobs if not train_finished(j.arm_type, j.out)]
    if not todo:
        return {}
    threads = threads_per_worker(workers)
    n = min(workers, len(todo))
    console.print(f"training side by side ({n} process{'es' if n > 1 else ''} × {threads} thread"
                  f"{'s' if threads > 1 else ''}): {', '.join(j.name for j in todo)}")
    started, took = time.monotonic(), {}
    pool = _pool(workers, threads)
    futures = {_submit(pool, job): job for job in todo}
    try:
        for future in as_completed(futures):
            job = futures[future]
            try:
                took[job.out] = future.result()
            except BaseException as exc:  # the ladder trains it itself next, and reports its error as it always does
                if isinstance(exc, BrokenProcessPool):
                    close_workers()  # a worker died (e.g. killed for memory): the next batch starts new ones
                elif isinstance(exc, KeyboardInterrupt):
                    raise
                console.print(f"[yellow]  {job.name}: its worker failed ({type(exc).__name__}: {exc}; log: "
                              f"{log_path(job.out)}); it is trained in the ladder's process instead[/]")
                continue
            note_made(job.out)
            train, scoring = took[job.out]["train"], took[job.out]["eval"]
            console.print(f"  {job.name}: trained in {train:.0f} s" + (f", scored in {scoring:.0f} s" if scoring else ""))
    except BaseException:
        close_workers(kill=True)
        raise
    wall, total = time.monotonic() - started, sum(sum(t.values()) for t in took.values()) or 1.0
    return {out: {part: wall * s / total for part, s in t.items()} for out, t in took.items()}

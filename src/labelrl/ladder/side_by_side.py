"""Training runs of a ladder side by side: W worker processes, each with cores / W threads.

Why: a 135M-parameter model's products are too small to keep two threads of one process busy.
On a 2-core CPU, two one-thread processes trained two RL runs in 0.67× the time one two-thread
process took for them one after the other (docs/performance.md, "Runs side by side").

What runs side by side (recipe ``workers: W``, default 1: one process, as before):

* an arm's tuning candidates (``labelrl.ladder.tune``: every value of its grid);
* the arms whose runs can start now: replicate seeds (``ARM@sSEED``) once the run they follow
  has chosen its values and their parent is done, and any other SFT or RL arm whose
  dependencies are done.

With W > 1 every SFT and RL run of the ladder trains in a worker with the same thread count,
alone or beside another, so a run's arithmetic does not depend on what it ran beside (a product
summed by one thread rounds differently from one split over two). A worker writes the run's files
only; the ladder then finds the run finished (``labelrl.ladder.arms.train_finished``) and
evaluates it in its own process as before. A worker that fails leaves nothing the ladder uses: the
ladder runs that training itself and reports its error as usual (an RL run resumes from its last
checkpoint). Each worker's console output is kept beside its run, in ``RUN.worker.log``.

Each worker holds its own model, optimizer and activations: set W only where W runs' memory fits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel
from rich.console import Console

from labelrl.ladder.arms import train_finished

LOG_SUFFIX = ".worker.log"


@dataclass
class Job:
    """One training run: the arm type, its final config, the task directory."""

    name: str  # shown on the console: ARM or ARM: VALUES
    arm_type: str
    cfg: BaseModel
    task_dir: Path

    @property
    def out(self) -> Path:
        return Path(self.cfg.out)


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


def _spawn(job: Job, threads: int, spec_dir: Path) -> subprocess.Popen:
    spec = spec_dir / f"{len(list(spec_dir.iterdir()))}.json"
    cls = type(job.cfg)
    spec.write_text(json.dumps({"arm_type": job.arm_type, "config_class": f"{cls.__module__}:{cls.__qualname__}",
                                "config": job.cfg.model_dump(mode="json"), "task_dir": str(job.task_dir),
                                "threads": threads}), encoding="utf-8")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    log = log_path(job.out)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as handle:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "labelrl.ladder.worker", str(spec)], stdout=handle,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)


def train_side_by_side(jobs: list[Job], workers: int, console: Console) -> dict[Path, float]:
    """Train every job not finished yet, ``workers`` at a time; returns each job's share of the
    wall time (the batch's wall time split in proportion to the jobs' own times), by run dir."""
    todo = [j for j in jobs if not train_finished(j.arm_type, j.out)]
    if not todo:
        return {}
    threads = threads_per_worker(workers)
    n = min(workers, len(todo))
    console.print(f"training side by side ({n} process{'es' if n > 1 else ''} × {threads} thread"
                  f"{'s' if threads > 1 else ''}): {', '.join(j.name for j in todo)}")
    pending, running, took = list(todo), {}, {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="labelrl-workers-") as spec_dir:
        try:
            while pending or running:
                while pending and len(running) < workers:
                    job = pending.pop(0)
                    running[job.out] = (job, _spawn(job, threads, Path(spec_dir)), time.monotonic())
                time.sleep(0.2)
                for out, (job, proc, t0) in list(running.items()):
                    if proc.poll() is None:
                        continue
                    del running[out]
                    took[out] = time.monotonic() - t0
                    if proc.returncode == 0 and train_finished(job.arm_type, out):
                        console.print(f"  {job.name}: trained in {took[out]:.0f} s")
                    else:  # the ladder trains it itself next, and reports its error as it always does
                        console.print(f"[yellow]  {job.name}: its worker ended with exit code {proc.returncode} "
                                      f"(log: {log_path(out)}); it is trained in the ladder's process instead[/]")
        finally:
            for _, proc, _ in running.values():  # interrupted: no orphan keeps training
                proc.terminate()
                proc.wait()
    wall, total = time.monotonic() - started, sum(took.values()) or 1.0
    return {out: wall * t / total for out, t in took.items()}

"""What a side-by-side worker process runs (``labelrl.ladder.side_by_side``).

This module imports nothing heavy at import time: a spawned worker imports it first, and its
thread count must be in the environment before torch (and its OpenMP runtime) is imported.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import time
import traceback
from pathlib import Path


PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent ends


def end_with(parent: int) -> None:
    """On Linux, have the kernel send this worker SIGTERM when the ladder's process ``parent``
    ends, however it ends: a SIGKILL, or a SIGTERM it does not handle, runs none of its cleanup,
    and a worker left behind would train on for minutes with gigabytes of memory for a ladder
    that is gone. A parent already gone by now (the call came too late to be told) ends it at once.
    A worker training RL stops at the end of its step (``labelrl rl``'s own SIGTERM handling),
    others at once; the run resumes or restarts when the ladder runs again."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def start_worker(threads: int, parent: int | None = None) -> None:
    """The worker's initializer: ``threads`` threads for OpenMP, MKL and torch's products; with
    ``parent`` (the ladder's pid), the worker ends when that process does (``end_with``)."""
    if parent is not None:
        end_with(parent)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)


def run_job(spec: dict, log: str) -> dict[str, float]:
    """Train one run (``train_arm``, as the ladder would), then score it as ``spec["evaluate"]``
    asks (``evaluate``), with this process's output in ``log``; returns the seconds each took,
    ``{"train": s, "eval": s}``. An error is written to the log and raised to the ladder."""
    from rich.console import Console

    from labelrl.ladder.arms import train_arm

    started, took = time.monotonic(), {"train": 0.0, "eval": 0.0}
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "w", encoding="utf-8") as handle:
        os.dup2(handle.fileno(), 1)
        os.dup2(handle.fileno(), 2)
        try:
            module, name = spec["config_class"].split(":")
            cfg = getattr(importlib.import_module(module), name).model_validate(spec["config"])
            train_arm(spec["arm_type"], cfg, Path(spec["task_dir"]), Console(file=sys.stdout))
            took["train"] = time.monotonic() - started
            if spec.get("evaluate"):
                evaluate(spec["evaluate"], spec["arm_type"], cfg, Path(spec["task_dir"]))
                took["eval"] = time.monotonic() - started - took["train"]
        except BaseException:
            traceback.print_exc()
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
    gc.collect()  # the run's model and optimizer go before the next run loads its own
    return took


def evaluate(what: dict, arm_type: str, cfg, task_dir: Path) -> None:
    """Score the run just trained: ``{"kind": "candidate"}``, a tuning candidate on val
    (``labelrl.ladder.evaluations.evaluate_candidate``); ``{"kind": "final", "arm": NAME}``, every
    evaluation that scores an arm's model (``labelrl.ladder.evaluations.evaluate_ahead``). Both
    carry the task, the generation cap and the precision the ladder would score with."""
    from labelrl.ladder.spec import TaskSpec

    task = TaskSpec.model_validate(what["task"])
    if what["kind"] == "candidate":
        from labelrl.ladder.evaluations import evaluate_candidate

        evaluate_candidate(task, task_dir, Path(cfg.out), cfg.mode, what["cap"], cfg.precision)
    else:
        from labelrl.ladder.evaluations import evaluate_ahead

        evaluate_ahead(task, task_dir, what["arm"], arm_type, cfg.mode, what["cap"], cfg.precision)

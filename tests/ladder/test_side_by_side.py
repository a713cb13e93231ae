"""Training runs side by side (``labelrl.ladder.side_by_side``): a ladder with ``workers: 2``
trains its tuning candidates and replicate seeds in worker processes, and every model equals the
one a ladder training each run in its own process, at the same thread count, produces."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from rich.console import Console

from labelrl.ladder import side_by_side
from labelrl.ladder.recipe import Recipe
from labelrl.ladder.run import Ladder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from run_files import saved_weights as _weights  # noqa: E402

WORDS = ["grape", "mango", "apple", "chair", "table", "stone"]


def _recipe(data: Path, workers: int) -> Recipe:
    return Recipe.model_validate({
        "version": 1, "name": "side-by-side", "model": "tiny-random", "workers": workers,
        "defaults": {
            "sft": {"lora": False, "max_steps": 2, "batch_size": 4, "eval_every": 2, "eval_limit": 8, "quiet": True,
                    "tune": {"learning_rate": [1e-3, 3e-3]}},
            "rl": {"lora": False, "learning_rate": 1e-3, "steps": 2, "group_size": 2, "prompts_per_step": 2,
                   "max_new_tokens": 8, "checkpoint_every": 2, "eval_limit": 8, "quiet": True},
        },
        "tasks": {"toy": {"data": str(data), "limit": 16, "eval_limit": 12, "holdout_limit": 12, "n_boot": 50,
                          "seeds": [0, 1],
                          "arms": {"sft": {"type": "sft"}, "grpo": {"type": "rl", "from": "sft", "preset": "grpo"}}}},
    })


@pytest.fixture
def toy(tmp_path) -> Path:
    data = tmp_path / "toy.jsonl"
    rows = [{"id": f"t{i}", "text": f"item {i}: {WORDS[i % 6]}", "label": "yes" if i % 6 < 3 else "no"} for i in range(72)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return data


# scored by a worker (sft@s0's holdout is its tuned winner's, scored in the ladder's own process)
SCORED_IN_WORKERS = ["sft@s0-val", "sft@s1-val", "sft@s1-holdout", "grpo@s0-val", "grpo@s0-holdout", "grpo@s1-val",
                     "grpo@s1-holdout"]


def _ledger(task: Path) -> list[dict]:
    return [json.loads(line) for line in (task / "ledger.jsonl").read_text(encoding="utf-8").splitlines()]


RUNS = ["sft@s0/tune/learning_rate=0.001", "sft@s0/tune/learning_rate=0.003", "sft@s1", "grpo@s0", "grpo@s1"]


def test_side_by_side_trains_in_workers_and_changes_no_model(toy, tmp_path, monkeypatch):
    monkeypatch.setattr(side_by_side, "cores", lambda: 2)  # one thread a worker on any machine
    console = Console(record=True, width=300)
    state = Ladder(_recipe(toy, workers=2), tmp_path / "two", console).run()
    printed = console.export_text()
    arms = state["tasks"]["toy"]["arms"]
    assert {n: a["status"] for n, a in arms.items()} == {"sft@s0": "done", "sft@s1": "done", "grpo@s0": "done", "grpo@s1": "done"}
    task = tmp_path / "two" / "toy"
    for run in RUNS:  # each trained by a worker, whose console output is kept beside the run
        assert side_by_side.log_path(task / run).is_file(), run
    assert "training side by side (2 processes × 1 thread): sft@s0: learning_rate=0.001, sft@s0: learning_rate=0.003" in printed
    # sft@s1 follows sft@s0's choice, grpo@s0 starts from sft@s0: both can start once it is done
    assert "training side by side (2 processes × 1 thread): sft@s1, grpo@s0" in printed
    assert "training side by side (1 process × 1 thread): grpo@s1" in printed
    assert "trained in the ladder's process instead" not in printed
    # the ladder then reads what its workers trained, and says so: nothing had finished before this run
    assert "finished earlier" not in printed and f"{task / 'grpo@s1'}: trained above" in printed
    assert all(arms[n]["seconds_train"] > 0 for n in arms)  # a run trained ahead keeps its share of the time
    # each worker scored what it trained: the candidates on val, the other runs on val and the holdout
    assert "sft@s0: learning_rate=0.001: trained in" in printed and "scored in" in printed
    for run in ("sft@s1", "grpo@s0", "grpo@s1"):
        log = side_by_side.log_path(task / run).read_text()
        assert "scoring val of" in log and "holdout of" in log, run
        assert arms[run]["seconds_eval"] > 0, run  # its share of the time it was scored ahead
    looks = [r for r in _ledger(task) if r["split"] == "holdout"]
    assert sorted(Path(r["model_spec"]).parent.name for r in looks) == ["grpo@s0", "grpo@s1", "sft@s0", "sft@s1"]
    assert not any(r["repeat"] for r in looks)  # one look per model, in a worker or not

    # The same ladder, one run after another in this process, at the workers' thread count.
    threads = torch.get_num_threads()
    torch.set_num_threads(side_by_side.threads_per_worker(2))
    try:
        Ladder(_recipe(toy, workers=1), tmp_path / "one", Console(quiet=True)).run()
    finally:
        torch.set_num_threads(threads)
    for run in RUNS:
        a, b = _weights(task / run), _weights(tmp_path / "one" / "toy" / run)
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(a[name], b[name]), (run, name)
        assert not side_by_side.log_path(tmp_path / "one" / "toy" / run).exists()
    # a worker's scores are those the ladder's own process computes at its thread count
    for tag in SCORED_IN_WORKERS:
        a, b = (pd.read_parquet(root / "toy" / "eval" / f"{tag}.parquet") for root in (tmp_path / "two", tmp_path / "one"))
        assert a["id"].tolist() == b["id"].tolist() and a["prediction"].tolist() == b["prediction"].tolist(), tag
        assert np.array_equal(a["score"].to_numpy(), b["score"].to_numpy()), tag
    # each RL run's path on val starts from its parent's val scores, read in both ladders rather than scored again
    for root in (tmp_path / "two", tmp_path / "one"):
        for run in ("grpo@s0", "grpo@s1"):
            first = json.loads((root / "toy" / run / "val_path.jsonl").read_text(encoding="utf-8").splitlines()[0])
            parent_val = root.resolve() / "toy" / "eval" / f"sft@{run.split('@')[1]}-val.parquet"
            assert first["step"] == 0 and first["read_from"] == str(parent_val), (root, run)
            # and its last step from the run's own val scores, taken right after training
            last = json.loads((root / "toy" / run / "val_path.jsonl").read_text(encoding="utf-8").splitlines()[-1])
            own_val = root.resolve() / "toy" / "eval" / f"{run}-val.parquet"
            assert last["step"] == 2 and last["read_from"] == str(own_val), (root, run)
            summary = json.loads((root / "toy" / run / "rl_summary.json").read_text(encoding="utf-8"))
            assert "val_path_pending" not in summary and "val_path_end_missing" not in summary, (root, run)
    # and the runs did train: the tuned candidates differ from each other
    first, second = _weights(task / RUNS[0]), _weights(task / RUNS[1])
    assert any(not torch.equal(first[n], second[n]) for n in first)


def test_a_failed_worker_leaves_its_run_to_the_ladder(toy, tmp_path, monkeypatch):
    from concurrent.futures import Future

    real = side_by_side._submit

    def failing_for_replicates(pool, job):
        if job.name not in ("sft@s1", "grpo@s1"):
            return real(pool, job)
        failed = Future()
        failed.set_exception(RuntimeError("planted failure"))
        return failed

    monkeypatch.setattr(side_by_side, "_submit", failing_for_replicates)
    console = Console(record=True, width=300)
    state = Ladder(_recipe(toy, workers=2), tmp_path / "run", console).run()
    printed = console.export_text()
    assert "sft@s1: its worker failed (RuntimeError: planted failure" in printed
    assert "trained in the ladder's process instead" in printed
    assert all(a["status"] == "done" for a in state["tasks"]["toy"]["arms"].values())
    assert (tmp_path / "run" / "toy" / "sft@s1" / "sft_summary.json").is_file()


def test_a_worker_error_is_in_its_log_and_the_workers_stop_with_the_ladder(toy, tmp_path):
    # a config the command refuses: the worker writes the traceback to the run's log and the
    # ladder, training it itself, fails that arm with the same error
    recipe = _recipe(toy, workers=2)
    recipe.defaults["rl"]["max_new_tokens"] = 100_000  # past tiny-random's context: refused when the run starts
    console = Console(record=True, width=300)
    state = Ladder(recipe, tmp_path / "run", console).run()
    printed = console.export_text()
    arms = state["tasks"]["toy"]["arms"]
    assert arms["sft@s0"]["status"] == "done" and arms["grpo@s0"]["status"] == "failed"
    assert "--max-new-tokens 100000" in arms["grpo@s0"]["error"]
    log = side_by_side.log_path(tmp_path / "run" / "toy" / "grpo@s0").read_text()
    assert "Traceback" in log and "--max-new-tokens 100000" in log
    assert "its worker failed" in printed
    assert not side_by_side._POOLS  # the ladder stopped its workers when it ended


def test_an_interrupted_batch_stops_its_workers_without_waiting_for_their_runs(toy, tmp_path, monkeypatch):
    import time

    from labelrl.ladder.run import prepare_task
    from labelrl.ladder.tune_grid import with_values

    recipe = _recipe(toy, workers=2)
    ladder = Ladder(recipe, tmp_path / "run", Console(quiet=True))
    task_dir = tmp_path / "run" / "toy"
    prepare_task(recipe.tasks["toy"], task_dir, 0, run_seeds=[0])
    cfg = ladder.configs["toy"]["sft@s0"]
    jobs = [side_by_side.Job(f"long {i}", "sft", with_values(cfg, {"max_steps": 100_000, "eval_every": 100_000},
                                                             out=tmp_path / f"long{i}"), task_dir) for i in range(2)]
    seen = []

    def interrupt_once_both_train(futures, *args, **kwargs):  # as_completed, interrupted mid-run
        logs = [side_by_side.log_path(j.out) for j in jobs]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(p.is_file() and "sft step" in p.read_text() for p in logs):
            time.sleep(0.2)
        seen.append([p.is_file() and "sft step" in p.read_text() for p in logs])
        raise KeyboardInterrupt

    monkeypatch.setattr(side_by_side, "as_completed", interrupt_once_both_train)
    with pytest.raises(KeyboardInterrupt):
        side_by_side.train_side_by_side(jobs, 2, Console(quiet=True))
    stopped = time.monotonic()
    assert seen == [[True, True]]  # both were training when the ladder stopped
    assert not side_by_side._POOLS
    # neither run goes on: 100,000 steps would keep writing for hours
    sizes = [side_by_side.log_path(j.out).stat().st_size for j in jobs]
    time.sleep(2.0)
    assert [side_by_side.log_path(j.out).stat().st_size for j in jobs] == sizes
    assert time.monotonic() - stopped < 60


def test_the_worker_module_loads_without_torch_so_its_thread_count_comes_first():
    import subprocess
    import sys

    probe = "import sys, labelrl.ladder.worker; print('torch' in sys.modules, 'transformers' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "False"]


def _alive(pid: int) -> bool:
    """The process runs (a zombie, ended and not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's prctl")
def test_a_worker_ends_when_the_ladders_process_is_killed(tmp_path):
    # SIGKILL runs none of the ladder's cleanup: without the parent-death signal the worker
    # would go on with its job (here five minutes of sleep; in a ladder, a training run)
    import os
    import signal
    import subprocess
    import time

    ladder = ("import os, sys, time\n"
              "from labelrl.ladder import side_by_side\n"
              "pool = side_by_side._pool(1, 1)\n"
              "worker = pool.submit(os.getpid).result()\n"
              "pool.submit(time.sleep, 300)\n"
              "print(worker, flush=True)\n"
              "time.sleep(300)\n")
    process = subprocess.Popen([sys.executable, "-c", ladder], stdout=subprocess.PIPE, text=True)
    worker = -1
    try:
        worker = int(process.stdout.readline())
        time.sleep(0.5)  # the worker has taken the sleeping job
        assert _alive(worker)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker), "the worker outlived the ladder's process"
    finally:
        process.kill()
        if worker > 0 and _alive(worker):
            os.kill(worker, signal.SIGKILL)

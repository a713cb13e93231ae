"""A ladder killed (SIGKILL) while an RL arm trains, then re-run: finished arms are not redone,
the killed arm resumes from its checkpoint, and every arm finishes with one holdout look."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_ladder import toy_rows, write  # noqa: E402

from labelrl.fileio import read_jsonl  # noqa: E402


def _recipe(data: Path) -> dict:
    return {
        "version": 1, "name": "kill", "model": "tiny-random",
        "defaults": {"sft": {"lora": False, "learning_rate": 3e-3, "max_steps": 2, "batch_size": 4, "eval_every": 2, "eval_limit": 4},
                     "rl": {"lora": False, "learning_rate": 1e-3, "steps": 6, "group_size": 2, "prompts_per_step": 2,
                            "max_new_tokens": 8, "checkpoint_every": 1}},
        "tasks": {"toy": {"data": str(data), "limit": 12, "eval_limit": 4, "holdout_limit": 4, "n_boot": 20,
                          "arms": {"sft": {"type": "sft"}, "grpo": {"type": "rl", "from": "sft"},
                                   "corpo": {"type": "rl", "from": "sft", "preset": "corpo", "threshold": 0.5}}}},
    }


def _ladder(recipe: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "160", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "labelrl.cli.main", "ladder", str(recipe), "--out", str(out), "--no-report"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_killed_ladder_reruns_without_redoing_finished_arms(tmp_path):
    data = write(tmp_path / "toy.jsonl", toy_rows())
    recipe = write(tmp_path / "recipe.yaml", _recipe(data))
    out = tmp_path / "run"
    proc = _ladder(recipe, out)
    metrics = out / "toy" / "grpo" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and len(read_jsonl(metrics)) >= 2):  # the second arm is mid-training
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "grpo never started"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    state = json.loads((out / "ladder.json").read_text())
    assert state["tasks"]["toy"]["arms"]["sft"]["status"] == "done"
    assert state["tasks"]["toy"]["arms"]["grpo"]["status"] == "running"
    sft_files = {p: p.stat().st_mtime_ns for p in (out / "toy" / "sft").rglob("*") if p.is_file()}

    rerun = _ladder(recipe, out)
    output = rerun.communicate(timeout=600)[0]
    assert rerun.returncode == 0, output[-3000:]
    assert "toy/sft: done earlier, skipped" in output
    state = json.loads((out / "ladder.json").read_text())
    assert {n: a["status"] for n, a in state["tasks"]["toy"]["arms"].items()} == {"sft": "done", "grpo": "done", "corpo": "done"}
    assert {p: p.stat().st_mtime_ns for p in sft_files} == sft_files  # SFT was not redone
    steps = [r["step"] for r in read_jsonl(metrics)]
    assert steps == list(range(1, 7))  # resumed: each step logged once
    holdout = [r for r in read_jsonl(out / "toy" / "ledger.jsonl") if r["split"] == "holdout"]
    assert not any(r["repeat"] for r in holdout)

"""`labelrl demo --fast` runs the whole pipeline through the real CLI (tiny budgets)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_fast_demo_runs_every_stage_and_prints_the_comparison(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "labelrl.cli.main", "demo", "--fast", "--out", "demo", "--sft-steps", "2",
         "--rl-steps", "1", "--eval-limit", "8", "--limit", "16"],
        cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "160"},
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "demo" / "demo_summary.json").read_text())
    assert set(summary["arms"]) == {"sft", "grpo", "corpo"}
    assert summary["ceiling"] > 0.99  # sms-spam's duplicates never disagree
    for arm in summary["arms"].values():
        assert 0.0 <= arm["eval/balanced_accuracy"] <= 1.0
    for name in ("label ceiling", "sft", "grpo", "corpo"):
        assert name in result.stdout
    assert (tmp_path / "demo" / "audit.json").is_file()
    assert (tmp_path / "demo" / "rl_corpo" / "metrics.jsonl").is_file()


def test_rerunning_the_demo_reuses_finished_arms(tmp_path):
    args = [sys.executable, "-m", "labelrl.cli.main", "demo", "--fast", "--out", "demo", "--sft-steps", "2",
            "--rl-steps", "1", "--eval-limit", "8", "--limit", "16"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "160"}
    first = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    weights = sorted((tmp_path / "demo" / "rl_grpo" / "model").glob("*.safetensors"))[0]
    before = weights.stat().st_mtime_ns
    second = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "reusing the finished SFT run" in second.stdout and "reusing the finished grpo run" in second.stdout
    assert weights.stat().st_mtime_ns == before

"""`labelrl demo --fast` runs the demo recipe through the real CLI (tiny-random, a few steps):
both tasks, every arm, holdout metrics, the report, and a re-run that redoes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_fast_demo_runs_both_tasks_prints_the_table_and_reruns_for_free(tmp_path):
    args = [sys.executable, "-m", "labelrl.cli.main", "demo", "--fast", "--out", "demo", "--set", "tasks.spam.limit=16",
            "--set", "tasks.movies.limit=16"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "160"}
    first = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    state = json.loads((tmp_path / "demo" / "ladder.json").read_text())
    assert state["task_order"] == ["spam", "movies"]
    assert state["tasks"]["spam"]["ceiling"] > 0.99  # sms-spam's duplicates never disagree
    assert 0.5 < state["tasks"]["movies"]["ceiling"] < 0.95  # 5 grades from ~20 raters
    for task, arms in (("spam", {"sft", "grpo", "threshold"}), ("movies", {"sft", "grpo", "dr_grpo", "corpo", "threshold"})):
        got = state["tasks"][task]["arms"]
        assert set(got) == arms and {a["status"] for a in got.values()} == {"done"}
        for arm in got.values():
            assert 0.0 <= arm["holdout"]["balanced_accuracy"] <= 1.0
    assert set(state["tasks"]["movies"]["arms"]["corpo"]["ood"]) == {"vader-tweets"}
    assert state["tasks"]["movies"]["arms"]["corpo"]["config"]["threshold"] == 0.75
    for text in ("ceiling", "sft", "grpo", "dr_grpo", "corpo", "threshold", "report.html"):
        assert text in first.stdout
    # the verdict comes before the tables, one line per RL arm, paired against SFT and SFT + threshold
    start = first.stdout.index("─ verdict ─")
    verdict = first.stdout[start:first.stdout.index("spam: sms-spam", start)]
    for arm in ("grpo", "dr_grpo", "corpo"):
        assert f"• {arm}: vs sft:" in verdict
    assert "(SFT + threshold chosen on val)" in verdict
    assert (tmp_path / "demo" / "report" / "report.html").is_file()
    weights = sorted((tmp_path / "demo" / "spam" / "grpo" / "model").glob("*.safetensors"))[0]
    before = weights.stat().st_mtime_ns
    second = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "spam/sft: done earlier, skipped" in second.stdout and "movies/corpo: done earlier, skipped" in second.stdout
    assert weights.stat().st_mtime_ns == before


def test_demo_help_explains_the_recipe():
    out = subprocess.run([sys.executable, "-m", "labelrl.cli.main", "demo", "--help"], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0 and "--fast" in out.stdout and "--set" in out.stdout and "vader-movies" in out.stdout

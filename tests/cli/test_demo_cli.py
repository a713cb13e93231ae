"""`labelrl demo --fast` runs the demo recipe through the real CLI (tiny-random, a few steps):
both tasks, every arm, holdout metrics, the report, and a re-run that redoes nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from labelrl.evaluate.ledger import merge_readings, shared_ledger_dir
from labelrl.fileio import read_jsonl

TASKS = ("spam", "movies")
# The demo recipe reads its RL arms by label-token scores only (generate_eval: false: greedy
# generation costs CPU minutes on SmolLM2); on tiny-random the generations cost seconds, so here
# every direct RL arm is read both ways and the ledger must still hold one look per model.
READ_BOTH = [arg for task in TASKS for arg in ("--set", f"tasks.{task}.generate_eval=true")]


def looks_per_model(ledger: Path) -> Counter:
    """Holdout looks per model fingerprint in one ledger file (derived records and readings joined
    to a look are not looks)."""
    return Counter(r["model_fingerprint"] for r in read_jsonl(ledger)
                   if r["split"] == "holdout" and not r["derived"] and not r.get("reading_of"))


def assert_one_look_per_final_model(demo: Path, state: dict) -> None:
    for task in TASKS:
        arms = {n: a for n, a in state["tasks"][task]["arms"].items() if a["type"] != "threshold"}  # a rule, no model
        final = {n: json.loads((demo / task / "eval" / f"{n}-holdout.json").read_text())["info"]["model_fingerprint"]
                 for n in arms}
        looks = looks_per_model(demo / task / "ledger.jsonl")
        assert looks == Counter(set(final.values())), task  # every final model once (arms with equal weights share it)
        rows = {r["model_fingerprint"]: r for r in merge_readings(read_jsonl(demo / task / "ledger.jsonl"))
                if r["split"] == "holdout" and not r["derived"]}
        for name in (n for n, a in arms.items() if a["type"] == "rl"):  # the look holds both readings
            assert set(rows[final[name]]["readings"]) == {"scores", "generate"}, (task, name)
    shared = sorted(shared_ledger_dir().glob("*.jsonl"))  # the machine-wide ledgers, out of domain included
    assert len(shared) == 3 and all(set(looks_per_model(p).values()) == {1} for p in shared)


def test_fast_demo_runs_both_tasks_prints_the_table_and_reruns_for_free(tmp_path):
    args = [sys.executable, "-m", "labelrl.cli.main", "demo", "--fast", "--out", "demo", "--set", "tasks.spam.limit=16",
            "--set", "tasks.movies.limit=16", *READ_BOTH]
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
    # the verdict comes before the tables: per task its answer sentence and grid, the sentences
    # behind the cells one command away
    start = first.stdout.index("─ verdict ─")
    verdict = first.stdout[start:first.stdout.index("spam: sms-spam", start)]
    for task in TASKS:
        assert state["tasks"][task]["analysis"]["grid"]["sentence"].split()[0] in verdict, task
    assert "•" not in verdict and "labelrl report" in verdict and "--explain" in verdict
    explained = subprocess.run([sys.executable, "-m", "labelrl.cli.main", "report", "demo", "--explain"], cwd=tmp_path,
                               env=env, capture_output=True, text=True, timeout=600)
    assert explained.returncode == 0, explained.stderr[-3000:]
    prose = " ".join(explained.stdout.split())
    for arm in ("grpo", "dr_grpo", "corpo"):  # one line per RL arm, paired against SFT and SFT + threshold
        assert re.search(rf"• {arm}: [^•]*vs sft:", prose), arm
    assert "(SFT + threshold chosen on val)" in prose
    assert (tmp_path / "demo" / "report" / "report.html").is_file()
    assert_one_look_per_final_model(tmp_path / "demo", state)
    weights = sorted((tmp_path / "demo" / "spam" / "grpo" / "model").glob("*.safetensors"))[0]
    before = weights.stat().st_mtime_ns
    second = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "spam/sft: done earlier, skipped" in second.stdout and "movies/corpo: done earlier, skipped" in second.stdout
    assert weights.stat().st_mtime_ns == before
    assert_one_look_per_final_model(tmp_path / "demo", state)  # the re-run looked at nothing again


def test_demo_help_explains_the_recipe():
    out = subprocess.run([sys.executable, "-m", "labelrl.cli.main", "demo", "--help"], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0 and "--fast" in out.stdout and "--set" in out.stdout and "vader-movies" in out.stdout

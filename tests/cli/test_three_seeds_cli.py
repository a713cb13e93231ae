"""A ladder with 3 seeds through the real command line (tiny-random): every verdict line says how
many seeds agree, every decision is the Holm-corrected one, and every "no detectable difference"
states the smallest difference it could have detected."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import yaml

WORDS = ["grape", "mango", "apple", "chair", "table", "stone"]


def _recipe(data) -> dict:
    return {
        "version": 1, "name": "three-seeds", "model": "tiny-random",
        "defaults": {
            "sft": {"lora": False, "learning_rate": 3e-3, "max_steps": 2, "batch_size": 4, "eval_every": 2, "eval_limit": 8,
                    "quiet": True},
            "rl": {"lora": False, "learning_rate": 1e-3, "steps": 1, "group_size": 2, "prompts_per_step": 2,
                   "max_new_tokens": 8, "checkpoint_every": 1, "quiet": True},
        },
        "tasks": {"toy": {"data": str(data), "limit": 16, "eval_limit": 12, "holdout_limit": 24, "n_boot": 200,
                          "seeds": [0, 1, 2],
                          "arms": {"sft": {"type": "sft"}, "grpo": {"type": "rl", "from": "sft", "preset": "grpo"},
                                   "threshold": {"type": "threshold", "from": "sft"}}}},
    }


def test_three_seeds_print_the_seed_agreement_and_the_corrected_decision_on_every_verdict_line(tmp_path):
    data = tmp_path / "toy.jsonl"
    rows = [{"id": f"t{i}", "text": f"item {i}: {WORDS[i % 6]}", "label": "yes" if i % 6 < 3 else "no"} for i in range(90)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(_recipe(data)), encoding="utf-8")
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "labelrl.cli.main", "ladder", str(recipe), "--out", str(out)],
                            env={**os.environ, "COLUMNS": "400"}, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    explained = subprocess.run([sys.executable, "-m", "labelrl.cli.main", "report", str(out), "--explain"],
                               env={**os.environ, "COLUMNS": "400"}, capture_output=True, text=True, timeout=900)
    assert explained.returncode == 0, explained.stderr[-3000:]
    printed = " ".join(explained.stdout.split())  # the console wraps long lines
    state = json.loads((out / "ladder.json").read_text())
    task = state["tasks"]["toy"]
    lines = [v["text"] for v in task["verdict"]]
    assert lines
    for line in lines:  # printed as they are, each saying how many seeds agree in sign
        assert "• " + " ".join(line.split()) in printed, line[:200]
        assert re.search(r"\b[0-3]/3 seeds (higher|lower|no different)\b", line), line
    words = [c["words"] for c in task["analysis"]["paired"]["comparisons"]]
    assert len(words) >= 4
    for w in words:  # every comparison, not only the line
        assert re.search(r"\b[0-3]/3 seeds", w), w
    grpo = next(line for line in lines if line.startswith("grpo:"))
    # the decisions are the family's: Holm over every comparison of the task
    paired = json.loads((out / "toy" / "analysis" / "paired.json").read_text())
    tested = [c for c in paired if c["result"].get("family")]
    size = len(tested)
    assert size >= 4 and all(c["result"]["family"]["size"] == size for c in tested)
    assert f"Holm over {size}" in grpo
    for c in tested:
        m = c["result"]["family"]["metric"]
        assert len(c["result"]["metrics"][m]["pair_deltas"]) == 3, c["kind"]
    # every "no detectable difference" states what it could have detected
    for match in re.finditer(r"no detectable difference[^)]*\)", " ".join(lines)):
        assert "could detect" in match.group(0), match.group(0)
    assert task["analysis"]["grid"]["sentence"] in printed  # the answer sentence comes with the grid
    # on an 80-column terminal every run's row still names its seed ("grpo@s1", not "grpo@…")
    from rich.console import Console

    from labelrl.cli.ladder import comparison_tables

    console = Console(record=True, width=80)
    for table in comparison_tables(state):
        console.print(table)
    rows = {line.split("│")[1].strip() for line in console.export_text().splitlines() if line.startswith("│")}
    assert {f"{g}@s{s}" for g in ("sft", "grpo", "threshold") for s in range(3)} <= rows, rows
    assert {"sft", "grpo", "threshold"} <= rows  # the mean ± sd rows, one per replicated arm
    assert state["tasks"]["toy"]["verdict"][0]["runs"] == ["grpo@s0", "grpo@s1", "grpo@s2"]
    # the plan reads the same files: per comparison the items a difference would need at 1, 3, 5, 10 seeds
    plan_file = tmp_path / "plan.json"
    planned = subprocess.run([sys.executable, "-m", "labelrl.cli.main", "plan", str(out), "--delta", "0.05", "--json",
                              str(plan_file)], env={**os.environ, "COLUMNS": "300"}, capture_output=True, text=True, timeout=300)
    assert planned.returncode == 0, planned.stderr[-2000:]
    plans = json.loads(plan_file.read_text())["tasks"]["toy"]
    assert len(plans) == size and all(p["seeds"] == 3 and p["seeds_measured"] for p in plans)
    assert {str(s) for s in (1, 3, 5, 10)} == set(plans[0]["items_needed"])
    assert "items needed to detect |Δ| = 0.05" in planned.stdout

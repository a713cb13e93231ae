"""`labelrl ladder noise --fast`: four label-noise rates on sms-spam, and the report's ε plot."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys


def test_noise_ladder_runs_and_plots_balanced_accuracy_against_the_noise_rate(tmp_path):
    out = tmp_path / "noise"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "160"}
    done = subprocess.run([sys.executable, "-m", "labelrl.cli.main", "ladder", "noise", "--fast", "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "verdict" in done.stdout and "--explain" in done.stdout
    explained = subprocess.run([sys.executable, "-m", "labelrl.cli.main", "report", str(out), "--explain"], cwd=tmp_path,
                               env=env, capture_output=True, text=True, timeout=600)
    assert explained.returncode == 0, explained.stderr[-3000:]
    flat = " ".join(explained.stdout.split())  # the console wraps long lines
    assert "• grpo: " in flat and "vs sft: " in flat
    assert "RL's slope against SFT's" in done.stdout and "slope difference" in done.stdout  # labelrl.ladder.noise_slope
    state = json.loads((out / "ladder.json").read_text())
    assert {t: state["tasks"][t]["label_noise"] for t in state["task_order"]} == {"e00": 0.0, "e10": 0.1, "e20": 0.2, "e30": 0.3}
    assert {state["tasks"][t]["label_noise_seed"] for t in state["task_order"]} == {"run"}  # the recipe's setting
    train_ids = {t: json.loads((out / t / "samples.json").read_text())["train"]["ids"] for t in state["task_order"]}
    assert len({tuple(ids) for ids in train_ids.values()}) == 1  # drawn on the true labels: the same items at every rate
    for task, rate in (("e10", 0.1), ("e20", 0.2), ("e30", 0.3)):
        noise = json.loads((out / task / "label_noise.json").read_text())
        assert noise["label_noise_seed"] == "run" and set(noise["by_seed"]) == {"0"}  # one seed: the recipe's
        seeded = noise["by_seed"]["0"]
        se = math.sqrt(rate * (1 - rate) / seeded["n_train"])
        assert abs(seeded["flipped_share"] - rate) <= 2.5 * se, (task, seeded["flipped_share"])
        # the arms trained on the flipped labels of their seed: their own records equal the task's
        for arm_name in ("sft", "grpo"):
            arm = json.loads((out / task / arm_name / "label_noise.json").read_text())
            assert arm["flips"] == seeded["flips"] and arm["seed"] == 0
    assert not (out / "e00" / "label_noise.json").exists()
    md = (out / "report" / "report.md").read_text()
    assert "training labels flipped at rate 0.2; label_noise_seed: run, other flipped items for each run seed" in md
    assert "## 8. Label noise" in md and "figures/noise-sms-spam.png" in md
    assert (out / "report" / "figures" / "noise-sms-spam.png").stat().st_size > 10_000
    assert "holdout balanced accuracy by label-noise rate" in md and "ε=0.3" in md

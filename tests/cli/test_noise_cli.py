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
    assert "verdict" in done.stdout and "grpo: vs sft" in done.stdout
    state = json.loads((out / "ladder.json").read_text())
    assert {t: state["tasks"][t]["label_noise"] for t in state["task_order"]} == {"e00": 0.0, "e10": 0.1, "e20": 0.2, "e30": 0.3}
    for task, rate in (("e10", 0.1), ("e20", 0.2), ("e30", 0.3)):
        noise = json.loads((out / task / "label_noise.json").read_text())
        se = math.sqrt(rate * (1 - rate) / noise["n_train"])
        assert abs(noise["flipped_share"] - rate) <= 2 * se, (task, noise["flipped_share"])
        # the arms trained on the flipped labels: their own record equals the task's
        arm = json.loads((out / task / "sft" / "label_noise.json").read_text())
        assert arm["flips"] == noise["flips"]
    assert not (out / "e00" / "label_noise.json").exists()
    md = (out / "report" / "report.md").read_text()
    assert "## 8. Label noise" in md and "figures/noise-sms-spam.png" in md
    assert (out / "report" / "figures" / "noise-sms-spam.png").stat().st_size > 10_000
    assert "holdout balanced accuracy by label-noise rate" in md and "ε=0.3" in md

"""`labelrl rl --rollout-correction …` through the real CLI: the options reach the config and the
loop, and bad values give one clear line."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

from labelrl import metrics_keys as K
from labelrl.fileio import read_jsonl


def _labelrl(*args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "labelrl.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_correction_options_reach_the_config_and_the_metrics(toy_data, tmp_path):
    rl = _labelrl("rl", "--model", "tiny-random", "--data", str(toy_data), "--out", "rl", "--rollout-correction",
                  "sequence_mask", "--rollout-correction-max", "2.5", "--no-skip-uninformative", "--group-size", "2",
                  "--prompts-per-step", "2", "--max-new-tokens", "9", "--steps", "1", "--no-val-path", "--quiet",
                  cwd=tmp_path)
    assert rl.returncode == 0, rl.stderr
    saved = yaml.safe_load((tmp_path / "rl" / "rl_config.yaml").read_text())
    assert (saved["rollout_correction"], saved["rollout_correction_max"]) == ("sequence_mask", 2.5)
    (record,) = read_jsonl(tmp_path / "rl" / "metrics.jsonl")
    # one sampler and one trainer on the same weights: a small gap, no sequence past the bound
    assert 0 <= record[K.MISMATCH_KL] < 1e-2 and record[K.MISMATCH_MASKED_FRAC] == 0.0
    assert K.MISMATCH_CLIPPED_FRAC not in record and record[K.ENTROPY_MEAN] > 0


def test_bad_correction_options_give_one_clear_line(tmp_path):
    bound = _labelrl("rl", "--data", "sms-spam", "--out", "x", "--rollout-correction-max", "1", cwd=tmp_path)
    assert bound.returncode == 2 and "Traceback" not in bound.stderr
    assert "error: --rollout-correction-max: Input should be greater than 1 (got 1.0)" in " ".join(bound.stderr.split())
    mode = _labelrl("rl", "--data", "sms-spam", "--out", "x", "--rollout-correction", "token", cwd=tmp_path)
    assert mode.returncode == 2 and "Traceback" not in mode.stderr and "token_truncate" in mode.stderr

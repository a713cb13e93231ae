"""Smoke tests of `labelrl sft` and `labelrl rl` through the real CLI, as subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

from labelrl.fileio import read_jsonl


def _labelrl(*args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "labelrl.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_sft_then_rl_from_a_yaml_config(toy_data, tmp_path):
    sft = _labelrl("sft", "--model", "tiny-random", "--data", str(toy_data), "--out", "sft", "--max-steps", "2",
                   "--batch-size", "4", "--eval-every", "2", "--eval-limit", "4", "--quiet", cwd=tmp_path)
    assert sft.returncode == 0, sft.stderr
    assert "sft done" in sft.stdout and (tmp_path / "sft" / "model" / "adapter_config.json").is_file()

    config = {"model": "sft", "data": str(toy_data), "preset": "corpo", "threshold": 0.5, "group_size": 2,
              "prompts_per_step": 2, "max_new_tokens": 9, "steps": 3}
    (tmp_path / "rl.yaml").write_text(yaml.safe_dump(config))
    rl = _labelrl("rl", "--config", "rl.yaml", "--steps", "2", "--out", "rl", "--quiet", cwd=tmp_path)
    assert rl.returncode == 0, rl.stderr
    saved = yaml.safe_load((tmp_path / "rl" / "rl_config.yaml").read_text())
    assert saved["steps"] == 2 and saved["preset"] == "corpo" and saved["threshold"] == 0.5  # CLI beats YAML
    assert [r["step"] for r in read_jsonl(tmp_path / "rl" / "metrics.jsonl")] == [1, 2]
    summary = json.loads((tmp_path / "rl" / "rl_summary.json").read_text())
    assert summary["steps_done"] == 2 and (tmp_path / "rl" / "model").is_dir()


def test_bad_options_give_one_clear_line_and_exit_2(tmp_path):
    result = _labelrl("rl", "--data", "sms-spam", "--out", "x", "--group-size", "1", cwd=tmp_path)
    assert result.returncode == 2
    assert "error: group_size=1: group-relative RL needs at least 2 completions per prompt; set --group-size 2 or more" in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr
    result = _labelrl("sft", "--data", "no-such-file.jsonl", "--out", "x", "--model", "tiny-random", cwd=tmp_path)
    assert result.returncode == 2 and "no-such-file.jsonl" in result.stderr and "Traceback" not in result.stderr


def test_help_shows_every_config_field():
    from labelrl.train.config import RLConfig

    result = subprocess.run([sys.executable, "-m", "labelrl.cli.main", "rl", "--help"], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0
    for name in RLConfig.model_fields:
        assert "--" + name.replace("_", "-") in result.stdout, name


def test_gspo_with_batch_scale_runs_and_its_config_names_both(toy_data, tmp_path):
    # gspo through the real loop with two passes over the batch (its ratio is 1 on the first only);
    # the saved config records the scale in force, and CoRPO refuses a std division in one line
    rl = _labelrl("rl", "--model", "tiny-random", "--data", str(toy_data), "--out", "rl", "--preset", "gspo",
                  "--scale", "batch", "--ppo-epochs", "2", "--group-size", "2", "--prompts-per-step", "2",
                  "--max-new-tokens", "9", "--steps", "1", "--no-val-path", "--quiet", cwd=tmp_path)
    assert rl.returncode == 0, rl.stderr
    saved = yaml.safe_load((tmp_path / "rl" / "rl_config.yaml").read_text())
    assert (saved["preset"], saved["scale"], saved["ppo_epochs"]) == ("gspo", "batch", 2)
    assert [r["step"] for r in read_jsonl(tmp_path / "rl" / "metrics.jsonl")] == [1]
    bad = _labelrl("rl", "--data", "sms-spam", "--out", "x", "--preset", "corpo", "--threshold", "0.5",
                   "--scale", "group", cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "scale='group' with estimator corpo" in " ".join(bad.stderr.split())

"""Determinism on CPU: the same config and seed give the same run, record for record.

Two ``run_rl`` runs in one process with the same config must write identical metrics.jsonl
records (timing keys aside) and identical rollout tables; a different seed must not (else
the comparison could not fail).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reliability_support import assert_same_weights, deterministic, saved_weights  # noqa: E402

from labelrl.fileio import read_jsonl  # noqa: E402
from labelrl.rollout.log import read_rollouts  # noqa: E402
from labelrl.train.rl import run_rl  # noqa: E402

SMALL = dict(steps=2, prompts_per_step=2, group_size=4, max_new_tokens=8)


def records(run_dir: Path) -> list[dict]:
    return deterministic(read_jsonl(run_dir / "metrics.jsonl"))


@pytest.mark.parametrize("options", [
    dict(preset="grpo", lora=False),
    dict(preset="dapo", lora=True, temperature=0.8, top_k=20),  # dynamic sampling, LoRA, warped sampling
], ids=["grpo-full", "dapo-lora"])
def test_same_seed_and_config_give_identical_runs(options, warm_model, toy_data, rl_config, tmp_path,
                                                  weights_changed, adapter_trained):
    a, b = tmp_path / "a", tmp_path / "b"
    run_rl(rl_config(warm_model, toy_data, a, **SMALL, **options))
    # else equal weights below would prove nothing
    adapter_trained(a) if options["lora"] else weights_changed(warm_model, a)
    run_rl(rl_config(warm_model, toy_data, b, **SMALL, **options))
    first = records(a)
    assert [r["step"] for r in first] == [1, 2]
    assert first == records(b)
    rollouts = read_rollouts(a)
    assert rollouts.num_rows > 0 and rollouts.equals(read_rollouts(b))
    assert_same_weights(saved_weights(a / "model"), saved_weights(b / "model"))


def test_a_different_seed_gives_a_different_run(warm_model, toy_data, rl_config, tmp_path):
    options = {**SMALL, "steps": 1}
    run_rl(rl_config(warm_model, toy_data, tmp_path / "s0", seed=0, **options))
    run_rl(rl_config(warm_model, toy_data, tmp_path / "s1", seed=1, **options))
    completions = [read_rollouts(tmp_path / s).column("completion").to_pylist() for s in ("s0", "s1")]
    assert completions[0] != completions[1]
    assert records(tmp_path / "s0") != records(tmp_path / "s1")

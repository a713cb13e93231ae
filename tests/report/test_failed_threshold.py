"""The report recounts failed-positive rollouts with the threshold the trainer used.

With ``--class-reward spam=2,ham=0.5`` the trainer's success threshold is the lowest per-class
boundary, 0.5 (labelrl.rewards.grade.success_threshold), not ``correct_reward`` (1.0): a
correct ham answer (reward 0.5) is a success. The old report rule (task threshold, else the
arm's ``correct_reward``) counted those correct ham answers as failed with A > 0.
"""

from __future__ import annotations

from pathlib import Path

import torch

from labelrl import metrics_keys as K
from labelrl.advantages.diagnostics import advantage_diagnostics
from labelrl.fileio import atomic_write_json
from labelrl.report.collect import collect_run
from labelrl.rollout.log import write_step
from labelrl.train.config import RLConfig
from labelrl.train.rl_parts import resolve_algorithm
from labelrl.types import LabelSpace

SPAM = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
G = 4
# ham prompt: two correct (0.5), two wrong (0); mean 0.25 → A = [+0.25, +0.25, -0.25, -0.25]
# spam prompt: one correct (2), three wrong (0); mean 0.5 → A = [+1.5, -0.5, -0.5, -0.5]
GROUPS = (("ham", ["ham", "ham", "spam", "spam"], [0.5, 0.5, 0.0, 0.0]),
          ("spam", ["spam", "ham", "ham", "ham"], [2.0, 0.0, 0.0, 0.0]))


def _rows() -> dict[str, list]:
    rows: dict[str, list] = {k: [] for k in ("step", "prompt_id", "sample_index", "label", "completion", "completion_tokens",
                                             "truncated", "think_closed", "parse_status", "answer", "reward",
                                             "advantage", "group_uniform", "skipped")}
    for p, (label, answers, rewards) in enumerate(GROUPS):
        mean = sum(rewards) / G
        for i, (answer, reward) in enumerate(zip(answers, rewards)):
            for key, value in (("step", 1), ("prompt_id", f"p{p}"), ("sample_index", i), ("label", label),
                               ("completion", f"<answer>{answer}</answer>"), ("completion_tokens", 5), ("truncated", False),
                               ("think_closed", True), ("parse_status", "ok"), ("answer", answer), ("reward", reward),
                               ("advantage", reward - mean), ("group_uniform", False), ("skipped", False)):
                rows[key].append(value)
    rows["sampler_logprobs"] = [[-0.5] * 5 for _ in rows["step"]]  # one per token, as a sampler logs
    return rows


def _run(root: Path, summary: dict) -> Path:
    """A one-arm ladder run: the grpo arm trained with --class-reward spam=2,ham=0.5."""
    run = root / "run"
    cfg = RLConfig(model="tiny-random", data="x.jsonl", out=str(run / "spam" / "grpo"), class_reward="spam=2,ham=0.5")
    write_step(run / "spam" / "grpo", 1, _rows())
    atomic_write_json(run / "spam" / "grpo" / "rl_summary.json", summary)
    arm = {"type": "rl", "status": "done", "dir": "spam/grpo", "preset": "grpo", "config": cfg.model_dump(mode="json")}
    atomic_write_json(run / "ladder.json", {"format": 1, "recipe": "t", "run_dir": str(run), "task_order": ["spam"],
                                            "tasks": {"spam": {"kind": "binary", "labels": ["ham", "spam"],
                                                               "positive_label": "spam", "arms": {"grpo": arm}}}})
    return run


def test_recount_uses_the_threshold_the_trainer_recorded(tmp_path):
    cfg = RLConfig(model="tiny-random", data="x.jsonl", out="o", class_reward="spam=2,ham=0.5")
    threshold = resolve_algorithm(cfg, SPAM).success_threshold
    assert threshold == 0.5 and cfg.correct_reward == 1.0  # the case where the old rule differs
    rows = _rows()
    trainer = advantage_diagnostics(torch.tensor(rows["reward"]), torch.tensor(rows["advantage"]), G,
                                    success_threshold=threshold)
    run = _run(tmp_path, {"steps": 1, "success_threshold": threshold})
    failures = collect_run(run).tasks[0].arms[0].failures
    # failed = reward < 0.5: the five zeros, all with A < 0 → 0 of 5 positive (the trainer's 0.0).
    # The old rule (reward < correct_reward = 1.0) also counts the two correct ham answers, A = +0.25: 2 of 7.
    assert failures["threshold"] == 0.5
    assert (failures["overall"]["n_failed"], failures["overall"]["n_positive"]) == (5, 0)
    assert failures["overall"]["frac"] == trainer[K.FAILED_POSITIVE_FRAC] == 0.0
    assert trainer[K.FAILED_POSITIVE_COUNT] == failures["overall"]["n_positive"]


def test_a_run_without_the_recorded_threshold_keeps_the_old_rule(tmp_path):
    run = _run(tmp_path, {"steps": 1})  # written before rl_summary.json recorded it
    failures = collect_run(run).tasks[0].arms[0].failures
    # failed = reward < correct_reward 1.0: the five zeros and the two ham 0.5s (A = +0.25)
    assert failures["threshold"] == 1.0
    assert (failures["overall"]["n_failed"], failures["overall"]["n_positive"]) == (7, 2)

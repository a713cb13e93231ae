"""A task's ``success_threshold`` reaches every RL arm: the recipe key sets each RL arm's config,
``RLConfig`` carries it into the trainer's algorithm, and the failed-positive count (the trainer's
diagnostic, which the report recounts from the value the trainer recorded) splits at it."""

from __future__ import annotations

import torch

from labelrl import metrics_keys as K
from labelrl.advantages.diagnostics import advantage_diagnostics
from labelrl.ladder.arms import arm_config
from labelrl.ladder.kinds import FAMILY
from labelrl.ladder.recipe import load_recipe
from labelrl.train.config import RLConfig
from labelrl.train.rl_parts import resolve_algorithm
from labelrl.types import LabelSpace

GRADES = LabelSpace(("1", "2", "3", "4", "5"), kind="ordinal")


def test_a_task_threshold_reaches_every_rl_arm_of_that_task_and_no_other(tmp_path):
    recipe = load_recipe("demo", sets=["tasks.movies.success_threshold=0.5"])
    movies = [a for a, arm in recipe.tasks["movies"].arms.items() if FAMILY[arm.type] == "rl"]
    assert len(movies) >= 3  # grpo, dr_grpo and corpo, replicates included
    for arm in movies:
        assert arm_config(recipe, "movies", arm, tmp_path).success_threshold == 0.5, arm
    for arm, spec in recipe.tasks["spam"].arms.items():
        if FAMILY[spec.type] == "rl":
            assert arm_config(recipe, "spam", arm, tmp_path).success_threshold is None, arm  # full credit


def test_rl_config_carries_the_threshold_into_the_trainers_count_of_failures():
    default = resolve_algorithm(RLConfig(model="tiny-random", data="x.jsonl", out="o"), GRADES)
    half = resolve_algorithm(RLConfig(model="tiny-random", data="x.jsonl", out="o", success_threshold=0.5), GRADES)
    assert default.success_threshold == 1.0 and half.success_threshold == 0.5
    # One group of 4: rewards 1, 0.5, 0.5, 0 (mean 0.5); GRPO-style A = r − mean. Two answers half
    # right (0.5, A = 0) and one wrong (0, A = −0.5). At full credit the two halves are failures; at 0.5
    # only the zero is. A failure with A > 0 needs a group that failed worse: add one (0.25 vs 0, 0).
    rewards = torch.tensor([1.0, 0.5, 0.5, 0.0, 0.25, 0.0, 0.0, 0.0])
    advantages = torch.tensor([0.5, 0.0, 0.0, -0.5, 0.1875, -0.0625, -0.0625, -0.0625])
    at_full = advantage_diagnostics(rewards, advantages, 4, success_threshold=default.success_threshold)
    at_half = advantage_diagnostics(rewards, advantages, 4, success_threshold=half.success_threshold)
    # failed at 1.0: 0.5, 0.5, 0, 0.25, 0, 0, 0 → 7, of which 0.25 (A > 0) is positive
    assert (at_full[K.FAILED_POSITIVE_COUNT], at_full[K.FAILED_POSITIVE_FRAC]) == (1, 1 / 7)
    # failed at 0.5: 0, 0.25, 0, 0, 0 → 5, the same one positive
    assert (at_half[K.FAILED_POSITIVE_COUNT], at_half[K.FAILED_POSITIVE_FRAC]) == (1, 1 / 5)

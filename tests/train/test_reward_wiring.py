"""``--class-reward`` and ``--reward-table`` reach the trainer's reward.

The trainer grades every rollout with ``score_completions(..., config=run.algo.reward)``, and
``run.algo`` is ``resolve_algorithm(cfg, ...)``; these tests follow an RLConfig (built as the
command line builds it, ``labelrl.cli.options.load_config``) through that path. A wiring that
dropped either option would grade with the default 1 / 0 and fail every assertion below.
"""

from __future__ import annotations

import pytest
import yaml

from labelrl.cli.options import load_config
from labelrl.rewards.reward_fn import score_completions
from labelrl.train.config import RLConfig
from labelrl.train.rl_parts import resolve_algorithm
from labelrl.types import LabelSpace

LABELS = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
BASE = {"model": "tiny-random", "data": "sms-spam", "out": "unused"}


def trainer_rewards(cfg: RLConfig, answers_and_refs: list[tuple[str, str]]) -> list[float]:
    """The rewards the trainer would give these (answer text, reference label) rollouts."""
    algo = resolve_algorithm(cfg, LABELS, ["ham", "spam"])
    texts = [text for text, _ in answers_and_refs]
    refs = [ref for _, ref in answers_and_refs]
    return [item.reward for item in score_completions(texts, refs, config=algo.reward).items]


ROLLOUTS = [
    ("<answer>spam</answer>", "spam"),  # correct spam
    ("<answer>ham</answer>", "spam"),   # missed spam
    ("<answer>ham</answer>", "ham"),    # correct ham
    ("<answer>spam</answer>", "ham"),   # false alarm on ham
    ("no tag at all", "ham"),           # unparseable, reference ham
]


def test_class_reward_sets_each_reference_class_reward():
    cfg = load_config(RLConfig, None, {**BASE, "class_reward": "spam=2,ham=1/-0.5"})  # --class-reward spam=2,ham=1/-0.5
    # spam: correct 2, wrong the default incorrect 0; ham: correct 1, wrong -0.5;
    # an unparseable answer gets its reference class's incorrect value (ham → -0.5)
    assert trainer_rewards(cfg, ROLLOUTS) == [2.0, 0.0, 1.0, -0.5, -0.5]
    # the default, for contrast: what a dropped --class-reward would give
    assert trainer_rewards(load_config(RLConfig, None, BASE), ROLLOUTS) == [1.0, 0.0, 1.0, 0.0, 0.0]


def test_class_reward_from_a_config_file(tmp_path):
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump({"class-reward": "spam=2,ham=1/-0.5"}), encoding="utf-8")
    cfg = load_config(RLConfig, path, BASE)  # labelrl rl --config rl.yaml
    assert trainer_rewards(cfg, ROLLOUTS)[0] == 2.0 and trainer_rewards(cfg, ROLLOUTS)[3] == -0.5


def test_reward_table_replaces_the_rewards(tmp_path):
    table = tmp_path / "table.yaml"
    table.write_text(yaml.safe_dump({"spam": {"spam": 3, "ham": -1}, "ham": {"ham": 1, "spam": -0.25}}), encoding="utf-8")
    cfg = load_config(RLConfig, None, {**BASE, "reward_table": str(table)})  # --reward-table table.yaml
    # table[ref][pred]; an unparseable answer gets the lowest entry of its reference's row (ham → -0.25)
    assert trainer_rewards(cfg, ROLLOUTS) == [3.0, -1.0, 1.0, -0.25, -0.25]


def test_a_missing_reward_table_stops_before_training(tmp_path):
    cfg = load_config(RLConfig, None, {**BASE, "reward_table": str(tmp_path / "missing.yaml")})
    with pytest.raises(ValueError, match=r"--reward-table .*missing\.yaml: no such file"):
        resolve_algorithm(cfg, LABELS)

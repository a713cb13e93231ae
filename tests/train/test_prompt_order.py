"""The order of training prompts (``labelrl.train.setup``): the uniform stream and the
label-balanced one that ``--prompt-sampling balanced`` draws RL's prompts from."""

from __future__ import annotations

import json
from collections import Counter

from labelrl.rollout.log import read_rollouts
from labelrl.train import rl
from labelrl.train.setup import balanced_indices, ordered_indices

# 13% "spam", as sms-spam: a uniform draw gives the minority label one prompt in eight.
LABELS = ["ham"] * 87 + ["spam"] * 13


def test_every_run_of_k_positions_holds_one_item_of_each_label():
    idx = balanced_indices(LABELS, 0, 200, seed=3)
    for start in range(0, 200, 2):
        assert sorted(LABELS[i] for i in idx[start:start + 2]) == ["ham", "spam"]


def test_a_minority_label_comes_round_in_full_before_any_item_repeats():
    idx = balanced_indices(LABELS, 0, 26, seed=0)  # 13 turns: every spam item once
    spam = [i for i in idx if LABELS[i] == "spam"]
    assert sorted(spam) == [i for i, lab in enumerate(LABELS) if lab == "spam"]
    ham = [i for i in idx if LABELS[i] == "ham"]
    assert len(set(ham)) == len(ham) == 13


def test_the_stream_is_a_pure_function_of_seed_and_position():
    whole = balanced_indices(LABELS, 0, 40, seed=7)
    assert balanced_indices(LABELS, 0, 17, seed=7) + balanced_indices(LABELS, 17, 23, seed=7) == whole  # resume
    assert balanced_indices(LABELS, 0, 40, seed=8) != whole


def test_three_labels_are_drawn_equally_often_whatever_their_shares():
    labels = ["1"] * 50 + ["2"] * 5 + ["3"] * 2
    counts = Counter(labels[i] for i in balanced_indices(labels, 0, 300, seed=1))
    assert counts == {"1": 100, "2": 100, "3": 100}


def test_uniform_stream_keeps_the_label_mix():
    counts = Counter(LABELS[i] for i in ordered_indices(len(LABELS), 0, 100, seed=1))
    assert counts == {"ham": 87, "spam": 13}  # one epoch: every item once


def test_rl_run_with_balanced_sampling_draws_both_labels_each_step(warm_model, rl_config, tmp_path):
    # a file sorted by label and skewed 9:1, so a uniform draw would see few "yes" prompts
    data = tmp_path / "skewed.jsonl"
    rows = [("apple", "yes")] * 6 + [("stone", "no")] * 54
    data.write_text("".join(json.dumps({"id": f"r{i}", "text": " ".join([w] * 4), "label": lab}) + "\n"
                            for i, (w, lab) in enumerate(rows)), encoding="utf-8")
    out = tmp_path / "balanced"
    rl.run_rl(rl_config(warm_model, data, out, steps=3, prompts_per_step=4, group_size=2, prompt_sampling="balanced"))
    table = read_rollouts(out).to_pylist()
    for step in (1, 2, 3):
        prompts = {(r["prompt_id"], r["label"]) for r in table if r["step"] == step}
        assert Counter(label for _, label in prompts) == {"yes": 2, "no": 2}, step

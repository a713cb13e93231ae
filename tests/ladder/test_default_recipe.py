"""`labelrl ladder --data FILE`'s recipe: the cpu budget measured as the demo is, and RL's token
cap raised to hold the longest answer."""

from __future__ import annotations

import yaml

from labelrl.ladder.default_recipe import ANSWER_SPARE, answer_cap, default_recipe
from labelrl.ladder.recipe import recipe_from_dict, recipe_text


def _task(raw: dict) -> dict:
    return next(iter(raw["tasks"].values()))


def test_the_cpu_budget_is_measured_as_the_demo_is(tmp_path):
    demo = yaml.safe_load(recipe_text("demo")[0])
    spam, movies = demo["tasks"]["spam"], demo["tasks"]["movies"]
    raw = default_recipe("sms-spam", kind="binary", labels=["ham", "spam"], budget="cpu", answer_tokens=8)
    task = _task(raw)
    # three seeds, the demo's bootstrap, label-token scores, two runs side by side
    assert task["seeds"] == spam["seeds"] == [0, 1, 2]
    assert task["n_boot"] == spam["n_boot"] and task["generate_eval"] is spam["generate_eval"] is False
    assert raw["workers"] == demo["workers"] == 2
    # val and holdout samples of 512 (a split's whole when smaller), as the demo scores vader-movies
    assert task["eval_limit"] == task["holdout_limit"] == movies["eval_limit"] == movies["holdout_limit"] == 512
    assert task["limit"] == spam["limit"]
    assert task["train_sample"] == spam["train_sample"] == movies["train_sample"] == "balanced"
    # every training option the demo sets, its grid aside
    for family in ("sft", "rl"):
        ours = raw["defaults"][family]
        for key, value in demo["defaults"][family].items():
            if key != "tune":
                assert ours[key] == value, (family, key, ours[key], value)
    # the RL grid is the demo's, and the recipe validates with its seeds
    assert raw["defaults"]["rl"]["tune"] == demo["defaults"]["rl"]["tune"]
    recipe = recipe_from_dict(raw, "test", tmp_path)
    assert next(iter(recipe.tasks.values())).seeds == [0, 1, 2]


def test_more_than_two_labels_get_the_demos_faster_sft_rates():
    demo = yaml.safe_load(recipe_text("demo")[0])
    grades = [str(g) for g in range(1, 6)]
    five = default_recipe("vader-movies", kind="ordinal", labels=grades, budget="cpu", answer_tokens=7)
    two = default_recipe("sms-spam", kind="binary", labels=["ham", "spam"], budget="cpu", answer_tokens=8)
    assert five["defaults"]["sft"]["tune"] == demo["tasks"]["movies"]["defaults"]["sft"]["tune"]
    assert two["defaults"]["sft"]["tune"] == {"learning_rate": [1.0e-4, 3.0e-4]}
    assert five["defaults"]["rl"]["tune"] == two["defaults"]["rl"]["tune"]  # RL's rates do not move with the labels


def test_rls_token_cap_holds_the_longest_answer_its_end_token_and_a_spare():
    labels = ["Negative tone", "Neutral / mixed", "Positive tone"]
    # short answers keep each budget's cap (the demo's 12 for sms-spam's 7- and 8-token tags)
    for budget, cap in (("smoke", 12), ("cpu", 12), ("gpu", 16)):
        raw = default_recipe("x.csv", kind="categorical", labels=labels, budget=budget, model="tiny-random", answer_tokens=8)
        assert raw["defaults"]["rl"]["max_new_tokens"] == cap, budget
    # a longer one raises it: the tag, its end-of-text token and the spare
    raw = default_recipe("x.csv", kind="categorical", labels=labels, budget="cpu", answer_tokens=15)
    assert raw["defaults"]["rl"]["max_new_tokens"] == answer_cap(15) == 15 + 1 + ANSWER_SPARE
    assert default_recipe("x.csv", kind="categorical", labels=labels)["defaults"]["rl"]["max_new_tokens"] == 12


def test_long_texts_say_how_many_times_the_measured_token_positions_a_cpu_ladder_computes():
    from labelrl.ladder.default_recipe import length_note

    # the demo's texts (25 tokens), and texts under twice their positions: the 10–17 minutes stand
    assert length_note([25] * 100, "cpu") is None
    assert length_note([61] * 100, "cpu") is None  # (61 + 12) / 37 = 1.97×
    assert length_note([62] * 100, "cpu") is not None  # (62 + 12) / 37 = 2.0×
    assert length_note([2000] * 10, "smoke") is None and length_note([], "cpu") is None
    # half 100, half 2,000 tokens: training sees them cut to 412, (100 + 412) / 2 + 12 = 268 → 7.2×;
    # scoring whole, 1,050 + 12 = 1,062 → 28.7×; 2/3 · 7.24 + 1/3 · 28.70 = 14.4× of 10–17 minutes
    note = length_note([100] * 50 + [2000] * 50, "cpu")
    assert "they average 1,050 tokens, the demo's 25" in note
    assert "about 7.2× the demo's token positions per item" in note and "scoring about 28.7×" in note
    assert "roughly 14.4× the 10–17 minutes" in note and "2–4 hours on 2 cores" in note
    assert "--set tasks.NAME.eval_limit=N" in note
    # a few times longer: minutes, not hours ((100 + 12) / 37 = 3.03×: 30–51 minutes)
    assert "roughly 3.0× the 10–17 minutes --budget cpu took on texts of 25–65 tokens, 30–51 minutes on 2 cores." \
        in length_note([100] * 10, "cpu")

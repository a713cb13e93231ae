"""The report's four cells (trained on the data's or a relabel arm's labels × scored against
either) and its words on how label noise was seeded, on constructed task data."""

from __future__ import annotations

import json
from pathlib import Path

from labelrl.report.analyses import four_cells, label_source, noise_seed_words, trained_on_original
from labelrl.report.run_data import ArmData, TaskData


def arm(name: str, type_: str, *, parent: str | None = None, preset: str | None = None, seed: int | None = 0,
        source: str | None = None, ba: float = 0.6, ba_key: float = 0.7) -> ArmData:
    config = {"train_labels": f"/runs/x/toy/{source}/answer_key.json"} if source else {"train_labels": None}
    return ArmData(name=name, type=type_, status="done", dir=Path(name), preset=preset, parent=parent, seed=seed,
                   config=config, holdout={"balanced_accuracy": ba, "balanced_accuracy_ci": [ba - 0.1, ba + 0.1]},
                   answer_keys={"relabel": {"holdout": {"balanced_accuracy": ba_key}}})


def test_each_relabel_trained_run_is_set_against_its_twin_on_the_data_labels(tmp_path):
    arms = [arm("relabel", "relabel", seed=None),
            arm("sft@s0", "sft"), arm("sft@s1", "sft", seed=1),
            arm("grpo@s0", "rl", parent="sft@s0", preset="grpo"), arm("corpo@s0", "rl", parent="sft@s0", preset="corpo"),
            arm("clean@s0", "sft", source="relabel"), arm("clean@s1", "sft", seed=1, source="relabel"),
            arm("grpo_clean@s0", "rl", parent="clean@s0", preset="grpo", source="relabel"),
            arm("corpo_clean@s0", "rl", parent="sft@s0", preset="corpo", source="relabel"),
            arm("sft_other", "sft", seed=5, source="relabel")]
    task = TaskData(name="toy", dir=tmp_path, arms=arms)
    by = {a.name: a for a in arms}
    assert label_source(by["clean@s0"]) == "relabel" and label_source(by["sft@s0"]) is None
    twins = {n: (t.name if t else None) for n in ("clean@s0", "clean@s1", "grpo_clean@s0", "corpo_clean@s0", "sft_other")
             for t in [trained_on_original(task, by[n])]}
    # the same seed; an RL arm from a relabel-trained parent pairs with the RL arm from that parent's twin;
    # the same preset (corpo, not grpo, though both start from sft@s0); no twin when no seed matches
    assert twins == {"clean@s0": "sft@s0", "clean@s1": "sft@s1", "grpo_clean@s0": "grpo@s0",
                     "corpo_clean@s0": "corpo@s0", "sft_other": None}


def test_the_four_cells_hold_each_arms_holdout_ba_against_each_key(tmp_path):
    arms = [arm("sft", "sft", ba=0.61, ba_key=0.72), arm("clean", "sft", source="relabel", ba=0.58, ba_key=0.83)]
    (tmp_path / "clean").mkdir()
    (tmp_path / "clean" / "train_labels.json").write_text(json.dumps(
        {"n_train": 40, "n_replaced": 38, "n_changed": 9, "n_kept_original": 2}), encoding="utf-8")
    table = four_cells(TaskData(name="toy", dir=tmp_path, arms=arms), arms[1])
    assert table.rows == [["the data's own labels (\"noisy\")", "sft", "0.610 [0.510, 0.710]", "0.720"],
                          ["relabel's final labels (\"clean\")", "clean", "0.580 [0.480, 0.680]", "0.830"]]
    assert table.columns[2:] == ["scored against the data's labels", "scored against relabel's labels"]
    assert "38 of its 40 training labels taken from relabel (9 different from the original; 2 without" in table.caption
    assert "a second answer key, not ground truth" in table.caption
    lone = four_cells(TaskData(name="toy", dir=tmp_path, arms=arms[1:]), arms[1])
    assert lone.rows[0][1].startswith("none: no run of the same type and seed")


def test_the_noise_seed_words_say_which_seed_drew_the_flips(tmp_path):
    task = TaskData(name="e20", dir=tmp_path, label_noise=0.2)
    assert noise_seed_words(task) == ""  # no flips recorded: nothing to say
    (tmp_path / "label_noise.json").write_text(json.dumps({"label_noise": 0.2, "seed": 0, "flips": []}), encoding="utf-8")
    assert "label_noise_seed: split, the same flipped items for every run" in noise_seed_words(task)  # an older file
    (tmp_path / "label_noise.json").write_text(json.dumps({"label_noise": 0.2, "label_noise_seed": "run", "by_seed": {
        "0": {"n_flipped": 7, "n_train": 32}, "1": {"n_flipped": 5, "n_train": 32}}}), encoding="utf-8")
    words = noise_seed_words(task)
    assert "label_noise_seed: run, other flipped items for each run seed" in words
    assert "seed 0: 7 of 32 flipped, seed 1: 5 of 32 flipped" in words

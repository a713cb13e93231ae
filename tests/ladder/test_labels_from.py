"""``labels_from: RELABEL``: an arm trained on a relabel arm's final labels, on the same items.

The recipe checks (which arm types, which source, not with label noise), the wiring (the
relabel arm's answer key as ``train_labels``, run order, the answer key added to
``eval_label_cols``), and a tiny ladder on tiny-random whose retrained arm's training labels
are the relabel arm's output and whose report writes the four-cell table.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from labelrl.fileio import read_jsonl
from labelrl.ladder import Ladder, load_recipe
from labelrl.ladder.arms import arm_config
from labelrl.ladder.recipe import dependencies, recipe_from_dict, run_order

FRUIT, THINGS = ["grape", "mango", "apple"], ["chair", "table", "stone"]


def toy_rows(n: int = 60) -> list[dict]:
    words = FRUIT + THINGS
    return [{"id": f"t{i}", "text": f"item {i}: {words[i % 6]}", "label": "yes" if words[i % 6] in FRUIT else "no"}
            for i in range(n)]


def recipe(data: Path, arms: dict | None = None, **task) -> dict:
    arms = arms or {"sft": {"type": "sft"},
                    "relabel": {"type": "relabel", "judge": "tiny-random", "self_agreement_sample": 0},
                    "sft_clean": {"type": "sft", "labels_from": "relabel"}}
    return {
        "version": 1, "name": "clean", "model": "tiny-random", "seed": 0,
        "defaults": {
            "sft": {"lora": False, "learning_rate": 3e-3, "max_steps": 2, "batch_size": 4, "eval_every": 2, "eval_limit": 4, "quiet": True},
            "rl": {"lora": False, "steps": 1, "group_size": 2, "prompts_per_step": 2, "max_new_tokens": 8, "quiet": True},
        },
        "tasks": {"toy": {"data": str(data), "text_col": ["text"], "label_col": "label", "limit": 12, "eval_limit": 4,
                          "holdout_limit": 6, "n_boot": 20, "rubric": str(data.parent / "rubric.md"), "arms": arms} | task},
    }


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("clean")
    path = root / "toy.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in toy_rows()), encoding="utf-8")
    (root / "rubric.md").write_text("Answer yes when the item names a fruit, else no.\n", encoding="utf-8")
    return path


def load(raw: dict):
    return recipe_from_dict(raw, "test recipe", Path("."))


def test_labels_from_wires_the_relabel_arms_key_and_runs_after_it(data, tmp_path):
    arms = {"sft": {"type": "sft"}, "sft_clean": {"type": "sft", "labels_from": "relabel"},
            "grpo_clean": {"type": "rl", "from": "sft_clean", "labels_from": "relabel", "seeds": [0, 1]},
            "relabel": {"type": "relabel", "judge": "tiny-random"}}
    r = load(recipe(data, arms, seeds=[0, 1]))
    task = r.tasks["toy"]
    assert task.eval_label_cols == ["relabel"]  # the key it trains on is also scored against
    order = run_order(task)
    assert order.index("relabel") < order.index("sft_clean@s0") < order.index("grpo_clean@s0")
    assert "relabel" in dependencies(task, "grpo_clean@s1")
    key = tmp_path / "toy" / "relabel" / "answer_key.json"
    for run in ("sft_clean@s0", "grpo_clean@s1"):
        cfg = arm_config(r, "toy", run, tmp_path)
        assert cfg.train_labels == key and cfg.label_noise == 0
    assert arm_config(r, "toy", "sft@s0", tmp_path).train_labels is None  # the plain arm keeps the data's labels
    assert task.arms["grpo_clean@s1"].labels_from == "relabel"  # replicates keep it


@pytest.mark.parametrize("arms, task, message", [
    ({"sft": {"type": "sft", "labels_from": "sft2"}, "sft2": {"type": "sft"}}, {}, "'sft2' is a sft arm; name a relabel arm"),
    ({"sft": {"type": "sft", "labels_from": "nope"}}, {}, "'nope' is not an arm of the task"),
    ({"sft": {"type": "sft"}, "noise": {"type": "random_reward", "from": "sft", "labels_from": "relabel"},
      "relabel": {"type": "relabel", "judge": "tiny-random"}}, {}, "a random_reward arm does not train on the task's labels"),
    ({"sft": {"type": "sft", "labels_from": "relabel"}, "relabel": {"type": "relabel", "judge": "tiny-random"}},
     {"label_noise": 0.1}, "two controls"),
    ({"sft": {"type": "sft", "train_labels": "x.json"}}, {}, "train_labels set by the ladder"),
])
def test_a_bad_labels_from_is_refused_naming_the_arm_and_the_fix(data, tmp_path, arms, task, message):
    with pytest.raises(ValueError, match=message):
        r = load(recipe(data, arms, **task))
        arm_config(r, "toy", "sft", tmp_path)


@pytest.fixture(scope="module")
def ladder(data):
    path = data.parent / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe(data)), encoding="utf-8")
    run_dir = data.parent / "run"
    state = Ladder(load_recipe(path), run_dir, Console(quiet=True)).run()
    return run_dir, state


def test_the_retrained_arm_trains_on_the_relabel_arms_labels_on_the_same_items(ladder):
    from labelrl.data.prepare import prepare_data
    from labelrl.ladder.analysis import config_diff
    from labelrl.train.config import SFTConfig

    run_dir, state = ladder
    arms = state["tasks"]["toy"]["arms"]
    assert {n: a["status"] for n, a in arms.items()} == {"sft": "done", "relabel": "done", "sft_clean": "done"}
    key = json.loads((run_dir / "toy" / "relabel" / "answer_key.json").read_text())["labels"]
    samples = json.loads((run_dir / "toy" / "samples.json").read_text())
    trained = json.loads((run_dir / "toy" / "sft_clean" / "train_labels.json").read_text())
    assert sorted(trained["labels"]) == sorted(samples["train"]["ids"])  # the task's training items, no other
    assert trained["labels"] == {i: key[i] for i in samples["train"]["ids"]}  # each with the relabel arm's label
    originals = {r["id"]: r["label"] for r in toy_rows()}
    assert trained["n_changed"] == sum(key[i] != originals[i] for i in samples["train"]["ids"]) > 0
    # what the trainer is handed, from the arm's recorded config (not the record above)
    cfg = SFTConfig(**arms["sft_clean"]["config"])
    data = prepare_data(cfg, run_dir / "toy" / "sft_clean", write=False)
    assert {ex.id: ex.label for ex in data.train} == trained["labels"]
    plain = prepare_data(SFTConfig(**arms["sft"]["config"]), run_dir / "toy" / "sft", write=False)
    assert {ex.id: ex.label for ex in plain.train} == {i: originals[i] for i in samples["train"]["ids"]}
    assert [ex.label for ex in data.val] == [ex.label for ex in plain.val]  # val keeps the data's labels
    assert arms["sft_clean"]["labels_from"] == "relabel" and arms["sft"]["labels_from"] is None
    # the trainer saw other labels: the first step's gradient (same seed, same items, same batches) differs
    first = [read_jsonl(run_dir / "toy" / n / "sft_metrics.jsonl")[0] for n in ("sft", "sft_clean")]
    assert first[0]["train/grad_norm"] != pytest.approx(first[1]["train/grad_norm"], rel=1e-6)
    assert config_diff(arms["sft"], arms["sft_clean"]) == {"train_labels": [None, str(run_dir / "toy" / "relabel" / "answer_key.json")]}


def test_the_report_writes_the_four_cells_with_a_caption_that_says_what_clean_means(ladder, tmp_path):
    from labelrl.report import build_report

    run_dir, state = ladder
    arms = state["tasks"]["toy"]["arms"]
    md = build_report(run_dir, tmp_path / "report").markdown.read_text(encoding="utf-8")
    start = md.index("trained on noisy or clean labels × scored against a noisy or clean key")
    table = md[md.rfind("\n\n", 0, start):md.find("\n\n", md.find("| trained on", start))]
    judge = arms["relabel"]["relabel"]["judge"]
    assert f"\"Clean\" means the final labels of the relabel arm relabel (judge {judge}): a second answer key, not ground truth" in table
    trained = json.loads((run_dir / "toy" / "sft_clean" / "train_labels.json").read_text())
    assert f"{trained['n_replaced']} of its {trained['n_train']} training labels taken from relabel" in table
    for name, row_start in (("sft", "| the data's own labels"), ("sft_clean", "| relabel's final labels")):
        row = next(line for line in table.splitlines() if line.startswith(row_start))
        cells = [c.strip() for c in row.strip("|").split("|")]
        against_data, against_key = arms[name]["holdout"], arms[name]["answer_keys"]["relabel"]["holdout"]
        assert cells[1] == name
        assert cells[2].startswith(f"{against_data['balanced_accuracy']:.3f}")
        assert cells[3].startswith(f"{against_key['balanced_accuracy']:.3f}")
    assert "noisy vs clean" not in md  # the relabel summary's caption no longer calls the key "clean"

"""The GPU recipe's seed-faithful choices: a relabel arm with a stronger adjudicator, CoT-RL that
scores truncated rollouts zero (the mask variant as its own arm), DAPO with its overlong
penalty, and a --fast overlay whose teacher and adjudicator are local models; and a relabel arm
whose adjudicator decides the items its judge is unsure of, run through the ladder."""

from __future__ import annotations

import json

import yaml
from rich.console import Console

from labelrl.ladder import Ladder, load_recipe
from labelrl.ladder.arms import arm_config
from labelrl.models.load import BUILTIN_MODELS


def test_gpu_recipe_adjudicates_scores_truncation_zero_and_runs_dapo_with_its_overlong_penalty(tmp_path):
    full, fast = load_recipe("gpu"), load_recipe("gpu", fast=True)
    relabel = arm_config(full, "spam", "relabel", tmp_path)
    assert relabel.adjudicator.startswith("http") and relabel.adjudicator != relabel.judge and relabel.adjudicator_model
    assert arm_config(full, "spam", "cot_rl", tmp_path).truncation == "zero"
    assert arm_config(full, "spam", "cot_rl_mask", tmp_path).truncation == "mask"
    dapo = arm_config(full, "spam", "dapo", tmp_path)
    assert (dapo.preset, dapo.truncation) == ("dapo", "soft_penalty")
    # --fast: no endpoint anywhere; the adjudicator is a real pretrained model, stronger than the random judge
    quick = arm_config(fast, "spam", "relabel", tmp_path)
    assert (quick.judge, quick.adjudicator, quick.adjudicator_model) == ("tiny-qwen2", "smollm2-135m-instruct", None)
    distill = arm_config(fast, "spam", "distill", tmp_path)
    assert distill.teacher in BUILTIN_MODELS and distill.trace_format == "constrained" and distill.teacher_model is None
    assert not any(str(getattr(arm_config(fast, t, a, tmp_path), key, "") or "").startswith("http")
                   for t, task in fast.tasks.items() for a in task.arms for key in ("judge", "adjudicator", "teacher"))


def toy_rows(n: int = 40) -> list[dict]:
    words = ["grape", "mango", "apple", "chair", "table", "stone"]
    return [{"id": f"t{i}", "text": f"item {i}: {words[i % 6]}", "label": "yes" if i % 6 < 3 else "no"} for i in range(n)]


def test_the_relabel_arm_sends_the_items_its_judge_is_unsure_of_to_the_adjudicator(tmp_path):
    """Two relabel arms, one judge: below min_confidence 1.0 every item goes to the adjudicator
    (whose label is final), below 0.0 none does (the judge's label stands)."""
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in toy_rows()), encoding="utf-8")
    (tmp_path / "rubric.md").write_text("Answer yes when the item names a fruit, else no.\n", encoding="utf-8")
    relabel = {"type": "relabel", "judge": "tiny-random", "adjudicator": "tiny-qwen2", "self_agreement_sample": 4}
    recipe = {"version": 1, "name": "adj", "model": "tiny-random", "seed": 0,
              "tasks": {"toy": {"data": str(data), "text_col": ["text"], "label_col": "label", "limit": 12,
                                "eval_limit": 4, "holdout_limit": 6, "audit": False, "rubric": str(tmp_path / "rubric.md"),
                                "arms": {"all": relabel | {"min_confidence": 1.0},
                                         "none": relabel | {"min_confidence": 0.0}}}}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    state = Ladder(load_recipe(path), tmp_path / "run", Console(quiet=True)).run()
    arms = state["tasks"]["toy"]["arms"]
    assert {n: a["status"] for n, a in arms.items()} == {"all": "done", "none": "done"}
    every, no = arms["all"]["relabel"], arms["none"]["relabel"]
    assert every["adjudicator"] == no["adjudicator"] == "local:tiny-qwen2" and every["judge"] == "local:tiny-random"
    assert every["n_adjudicated"] == every["n_items"] > 0 and no["n_adjudicated"] == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "toy" / "all" / "relabelled.jsonl").read_text().splitlines()]
    assert all(r["adjudicated"] and r["final_source"] == "adjudicator" and r["label_final"] == r["label_adjudicator"]
               for r in rows)
    key = json.loads((tmp_path / "run" / "toy" / "all" / "answer_key.json").read_text())["labels"]
    assert key == {r["id"]: r["label_adjudicator"] for r in rows}  # the answer key other arms are scored against
    none_rows = (tmp_path / "run" / "toy" / "none" / "relabelled.jsonl").read_text().splitlines()
    assert all(json.loads(line)["final_source"] == "judge" for line in none_rows)

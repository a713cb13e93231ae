"""Recipes: validation names the key and the fix; overlays; dependency order; arm configs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from labelrl.ladder.arms import arm_config
from labelrl.ladder.recipe import apply_set, deep_merge, load_recipe, run_label, run_order
from labelrl.train.config import RLConfig, SFTConfig


def _write(tmp_path: Path, recipe: dict) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


def _recipe(**arms) -> dict:
    return {"version": 1, "name": "t", "model": "tiny-random",
            "tasks": {"toy": {"data": "sms-spam", "arms": arms or {"sft": {"type": "sft"}}}}}


def test_builtin_recipes_load_and_resolve_every_arm(tmp_path):
    has_vllm = importlib.util.find_spec("vllm") is not None
    for name, fast in (("demo", False), ("demo", True), ("gpu", False), ("gpu", True)):
        recipe = load_recipe(name, fast=fast)
        for task_name, task in recipe.tasks.items():
            for arm in task.arms:
                try:
                    arm_config(recipe, task_name, arm, tmp_path)  # raises on any bad option
                except ValidationError as exc:
                    # the GPU recipe samples through vLLM: without it, its RL arms say how to install it
                    assert name == "gpu" and not has_vllm and "needs the vllm package" in str(exc), exc
    # the GPU recipe's fast overlay: its model's architecture (Qwen2), its rollouts through vLLM
    gpu_fast = load_recipe("gpu", fast=True)
    assert load_recipe("gpu").model == "models/qwen2.5-0.5b-instruct" and gpu_fast.model == "tiny-qwen2"
    if has_vllm:
        assert arm_config(gpu_fast, "spam", "grpo", tmp_path).backend == "vllm"
    demo = load_recipe("demo")
    assert demo.model == "smollm2-135m-instruct" and load_recipe("demo", fast=True).model == "tiny-random"
    assert demo.tasks["movies"].rubric.is_file()  # relative to the recipe, not to the working directory
    corpo = arm_config(demo, "movies", "corpo@s1", tmp_path)  # the demo replicates every trained arm on 3 seeds
    assert isinstance(corpo, RLConfig) and corpo.preset == "corpo" and corpo.threshold == 0.75 and corpo.seed == 1
    assert corpo.model == str(tmp_path / "movies" / "sft@s1") and corpo.data == "vader-movies"


def test_arm_config_layers_defaults_task_and_arm(tmp_path):
    raw = _recipe(sft={"type": "sft", "max_steps": 3}, grpo={"type": "rl", "from": "sft", "steps": 7})
    raw["defaults"] = {"sft": {"max_steps": 1, "batch_size": 2}, "rl": {"steps": 5, "group_size": 8}}
    raw["tasks"]["toy"]["defaults"] = {"rl": {"group_size": 6}}
    raw["tasks"]["toy"]["limit"] = 10
    recipe = load_recipe(_write(tmp_path, raw))
    sft = arm_config(recipe, "toy", "sft", tmp_path)
    assert isinstance(sft, SFTConfig) and (sft.max_steps, sft.batch_size, sft.limit) == (3, 2, 10)
    rl = arm_config(recipe, "toy", "grpo", tmp_path)
    assert (rl.steps, rl.group_size, rl.random_reward) == (7, 6, False)


def test_recipe_precision_reaches_every_arm_unless_the_arm_sets_its_own(tmp_path):
    from labelrl.cli.ladder import precision_sets

    raw = _recipe(sft={"type": "sft"}, grpo={"type": "rl", "from": "sft", "precision": "fp32"})
    assert arm_config(load_recipe(_write(tmp_path, raw)), "toy", "sft", tmp_path).precision == "auto"
    recipe = load_recipe(_write(tmp_path, raw), sets=precision_sets("bf16", []))  # labelrl ladder --precision bf16
    assert recipe.precision == "bf16"
    assert arm_config(recipe, "toy", "sft", tmp_path).precision == "bf16"
    assert arm_config(recipe, "toy", "grpo", tmp_path).precision == "fp32"  # the arm's own wins
    with pytest.raises(ValueError, match="--precision fp16: not a precision; use auto, fp32 or bf16"):
        precision_sets("fp16", [])


@pytest.mark.parametrize("arms, message", [
    ({"grpo": {"type": "rl"}}, "needs `from:`"),
    ({"sft": {"type": "sft"}, "grpo": {"type": "rl", "from": "nope"}}, "is not an arm of task"),
    ({"d": {"type": "distill", "teacher": "tiny-random"}, "grpo": {"type": "rl", "from": "d"}}, "is a distill arm"),
    ({"cot": {"type": "cot_sft", "from": "sft"}, "sft": {"type": "sft"}}, "starts from a distill arm"),
    ({"d": {"type": "distill"}}, "needs `teacher:`"),
    ({"eval": {"type": "sft"}}, "not a usable arm name"),
    ({"sft": {"type": "sft", "from": "x"}}, "drop `from: x`"),
    ({"sft": {"type": "sideways"}}, "type"),
])
def test_bad_arms_are_named(tmp_path, arms, message):
    with pytest.raises(ValueError, match=message):
        load_recipe(_write(tmp_path, _recipe(**arms)))


def test_bad_options_fail_before_anything_runs(tmp_path):
    recipe = load_recipe(_write(tmp_path, _recipe(sft={"type": "sft", "max_stpes": 3})))
    with pytest.raises(ValueError, match=r"tasks\.toy\.arms\.sft: unknown option\(s\) \['max_stpes'\]"):
        arm_config(recipe, "toy", "sft", tmp_path)
    recipe = load_recipe(_write(tmp_path, _recipe(sft={"type": "sft", "out": "x"})))
    with pytest.raises(ValueError, match="out set by the ladder"):
        arm_config(recipe, "toy", "sft", tmp_path)
    recipe = load_recipe(_write(tmp_path, _recipe(sft={"type": "sft"}, c={"type": "rl", "from": "sft", "preset": "corpo"})))
    with pytest.raises(ValueError, match=r"tasks\.toy\.arms\.c: .*threshold"):
        arm_config(recipe, "toy", "c", tmp_path)


def test_run_order_puts_dependencies_first_and_keeps_recipe_order():
    recipe = load_recipe("demo")
    raw = _recipe(cot_rl={"type": "cot_rl", "from": "cot"}, cot={"type": "cot_sft", "from": "d"},
                  d={"type": "distill", "teacher": "sft"}, ctl={"type": "control", "from": "d"}, sft={"type": "sft"})
    from labelrl.ladder.recipe import Recipe

    order = run_order(Recipe.model_validate(raw).tasks["toy"])
    assert order == ["sft", "d", "cot", "cot_rl", "ctl"]
    # the threshold arm waits for the RL arms from its parent (their val recall picks its matched thresholds)
    assert run_order(recipe.tasks["movies"]) == [f"{arm}@s{k}" for arm in ("sft", "grpo", "dr_grpo", "corpo", "threshold")
                                                 for k in range(3)]


def test_overlays_and_set():
    assert deep_merge({"a": {"b": 1, "c": 2}}, {"a": {"b": 3}}) == {"a": {"b": 3, "c": 2}}
    assert apply_set({"a": {"b": 1}}, "a.c=[1, 2]") == {"a": {"b": 1, "c": [1, 2]}}
    with pytest.raises(ValueError, match="KEY.PATH=VALUE"):
        apply_set({}, "nothing")
    scaled = load_recipe("demo", sets=["tasks.spam.limit=2000", "defaults.rl.steps=50"])
    assert scaled.tasks["spam"].limit == 2000 and scaled.defaults["rl"]["steps"] == 50


def test_unknown_recipe_and_bad_yaml(tmp_path):
    with pytest.raises(ValueError, match="not a built-in recipe"):
        load_recipe("no-such-recipe")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_recipe(bad)
    with pytest.raises(ValueError, match="version"):
        load_recipe(_write(tmp_path, {**_recipe(), "version": 9}))
    with pytest.raises(ValueError, match="--fast needs a `fast:` section"):
        load_recipe(_write(tmp_path, _recipe()), fast=True)


def test_a_distill_arm_distills_the_training_sample_the_task_draws(tmp_path):
    """A distill arm draws its items with the task's limit and train_sample, so with a
    label-balanced sample it distills the items the SFT arms train on."""
    raw = _recipe(sft={"type": "sft"}, d={"type": "distill", "teacher": "sft"})
    raw["tasks"]["toy"].update(limit=40, train_sample="balanced")
    recipe = load_recipe(_write(tmp_path, raw))
    distill = arm_config(recipe, "toy", "d", tmp_path)
    sft = arm_config(recipe, "toy", "sft", tmp_path)
    assert (distill.limit, distill.train_sample) == (sft.limit, sft.train_sample) == (40, "balanced")


def test_a_runs_label_adds_its_kind_only_where_the_name_does_not_say_it():
    """One rule for the console's table and the report's legends."""
    assert run_label("grpo", "grpo") == "grpo"
    assert run_label("grpo@s1", "grpo", "grpo") == "grpo@s1"  # not "grpo@s1 (grpo)"
    assert run_label("arm2", "corpo") == "arm2 (corpo)"
    assert run_label("arm2@s1", "corpo", "arm2") == "arm2@s1 (corpo)"
    assert run_label("base", None) == "base"

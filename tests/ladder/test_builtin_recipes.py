"""The built-in ``reasoning`` and ``noise`` recipes load and resolve every arm's config, and give
every SFT and RL arm the same tuning budget (a learning-rate grid chosen on val, as the demo's).

``tests/ladder/test_recipe.py`` does this for ``demo`` and ``gpu``; a recipe that names an
option a command no longer has, or wires an arm to a missing parent, fails here before anyone
spends an hour of CPU finding out.
"""

from __future__ import annotations

import pytest

from labelrl.ladder.arms import arm_config
from labelrl.ladder.kinds import FAMILY
from labelrl.ladder.recipe import load_recipe
from labelrl.ladder.tune_grid import arm_grid


def resolve_all(recipe, tmp_path) -> dict[str, object]:
    """Every arm's resolved config, keyed TASK/ARM (raises on any bad option or wiring)."""
    return {f"{task_name}/{arm}": arm_config(recipe, task_name, arm, tmp_path)
            for task_name, task in recipe.tasks.items() for arm in task.arms}


@pytest.mark.parametrize("name, fast", [("reasoning", False), ("reasoning", True), ("noise", False), ("noise", True)])
def test_builtin_recipe_resolves_every_arm(tmp_path, name, fast):
    recipe = load_recipe(name, fast=fast)
    configs = resolve_all(recipe, tmp_path)
    assert configs, f"{name}: no arms"
    for key, cfg in configs.items():
        # each arm resolves to its family's config, writing into its own directory of the task
        out = getattr(cfg, "out", None)
        assert out is not None and str(tmp_path) in str(out), (key, out)


def tuning_budgets(recipe, tmp_path) -> dict[str, tuple[str, int]]:
    """TASK/ARM → (family, number of values its grid tries; 0 without a grid) for every SFT and RL run
    that chooses (a replicate run follows its first seed's choice: ``tuned_by``)."""
    out = {}
    for task_name, task in recipe.tasks.items():
        for arm_name, arm in task.arms.items():
            family = FAMILY[arm.type]
            if family in ("sft", "rl") and arm.tuned_by is None:
                grid = arm_grid(recipe, task_name, arm_name, arm_config(recipe, task_name, arm_name, tmp_path))
                out[f"{task_name}/{arm_name}"] = (family, len(grid.candidates) if grid else 0)
    return out


@pytest.mark.parametrize("name, fast", [("reasoning", False), ("reasoning", True), ("noise", False), ("noise", True),
                                        ("demo", False), ("demo", True)])
def test_every_sft_and_rl_arm_of_a_builtin_recipe_tries_the_same_number_of_values(tmp_path, name, fast):
    """DESIGN habit 13, as the demo does: every arm trained as carefully as the baseline. SFT and RL
    arms each tune over a grid on val (at least two values) and every one tries as many values, so
    RL is never run at one untuned rate against a tuned SFT (or the reverse), --fast included."""
    budgets = tuning_budgets(load_recipe(name, fast=fast), tmp_path)
    assert {family for family, _ in budgets.values()} == {"sft", "rl"}, budgets
    sizes = {n for _, n in budgets.values()}
    assert len(sizes) == 1 and min(sizes) >= 2, budgets


def test_the_budget_check_catches_a_recipe_whose_rl_arms_do_not_tune(tmp_path):
    """The check above fails on an arm without a grid: here noise.yaml with RL's grid removed."""
    budgets = tuning_budgets(load_recipe("noise", sets=["defaults.rl.tune=null"]), tmp_path)
    assert budgets["e10/grpo@s0"] == ("rl", 0) and budgets["e10/sft@s0"] == ("sft", 2)


def test_the_reasoning_recipe_runs_grpo_in_reasoning_mode_from_a_direct_sft_model(tmp_path):
    """What the recipe is for (its header): a direct SFT model, then GRPO that thinks first at a
    384-token cap with truncated rollouts scored zero; --fast keeps the mode at a 24-token cap."""
    recipe = load_recipe("reasoning")
    sft, rl = arm_config(recipe, "spam", "sft@s0", tmp_path), arm_config(recipe, "spam", "think_384@s0", tmp_path)
    assert sft.mode == "direct" and FAMILY[recipe.tasks["spam"].arms["think_384@s0"].type] == "rl"
    assert (rl.mode, rl.preset, rl.max_new_tokens, rl.truncation) == ("reasoning", "grpo", 384, "zero")
    assert str(tmp_path / "spam" / "sft@s0") in str(rl.model)  # trained from the SFT arm's model of its seed
    fast = arm_config(load_recipe("reasoning", fast=True), "spam", "think_384", tmp_path)
    assert (fast.mode, fast.max_new_tokens, fast.steps) == ("reasoning", 24, 2)


def test_the_noise_recipe_seeds_its_flips_by_run_so_replicates_train_on_other_wrong_labels(tmp_path):
    """noise.yaml sets label_noise_seed: run. With replicate seeds (here by --set), the task records
    each seed's flips, each run trains on its seed's flips (an RL run on its SFT parent's), and
    every run trains on the same items."""
    import json
    import shutil

    from labelrl.data.prepare import prepare_data
    from labelrl.ladder.run import prepare_task

    recipe = load_recipe("noise", fast=True, sets=["tasks.e20.seeds=[0,1]", "tasks.e20.audit=false"])
    assert {t.label_noise_seed for t in recipe.tasks.values()} == {"run"}
    task_dir = tmp_path / "e20"
    state = prepare_task(recipe.tasks["e20"], task_dir, recipe.seed, run_seeds=[0, 1])
    assert state["label_noise_seed"] == "run"
    by_seed = json.loads((task_dir / "label_noise.json").read_text())["by_seed"]
    samples = json.loads((task_dir / "samples.json").read_text())["train"]["ids"]
    flipped, items = {}, {}
    for run in ("sft@s0", "sft@s1", "grpo@s0"):
        cfg = arm_config(recipe, "e20", run, tmp_path)
        assert cfg.label_noise_seed == "run" and cfg.label_noise == 0.2
        cfg.out.mkdir(parents=True)
        shutil.copyfile(task_dir / "splits.json", cfg.out / "splits.json")  # as the ladder does
        data = prepare_data(cfg, cfg.out, write=False)
        original = {ex.id: ex.label for ex in data.dataset.examples}
        flipped[run] = {ex.id for ex in data.train if ex.label != original[ex.id]}
        items[run] = [ex.id for ex in data.train]
        assert flipped[run] == {f["id"] for f in by_seed[str(cfg.seed)]["flips"]}
    assert items["sft@s0"] == items["sft@s1"] == items["grpo@s0"] == samples
    assert flipped["sft@s0"] != flipped["sft@s1"] and flipped["sft@s0"] == flipped["grpo@s0"]
    assert all(flipped.values())


def test_the_demos_balanced_training_sample_is_every_arms_and_the_tasks_record(tmp_path):
    """The demo draws its 320 training items label-balanced: samples.json records the draw, and
    every SFT and RL run of a seed trains on those items (the runs draw their sample themselves,
    from the options the ladder hands them)."""
    import json
    import shutil
    from collections import Counter

    from labelrl.data.prepare import prepare_data
    from labelrl.ladder.run import prepare_task

    recipe = load_recipe("demo", sets=["tasks.spam.audit=false"])
    task_dir = tmp_path / "spam"
    prepare_task(recipe.tasks["spam"], task_dir, recipe.seed, run_seeds=[0, 1, 2])
    train = json.loads((task_dir / "samples.json").read_text())["train"]
    assert train["draw"] == "balanced" and train["label_counts"] == {"ham": 160, "spam": 160}
    assert train["split_label_counts"]["spam"] < train["split_label_counts"]["ham"] / 4
    for run in ("sft@s0", "sft@s2", "grpo@s1"):
        cfg = arm_config(recipe, "spam", run, tmp_path)
        assert cfg.train_sample == "balanced"
        cfg.out.mkdir(parents=True)
        shutil.copyfile(task_dir / "splits.json", cfg.out / "splits.json")  # as the ladder does
        data = prepare_data(cfg, cfg.out, write=False)
        assert [ex.id for ex in data.train] == train["ids"], run
        assert Counter(ex.label for ex in data.train) == {"ham": 160, "spam": 160}


@pytest.mark.parametrize("name", ["noise", "reasoning"])
def test_the_noise_and_reasoning_recipes_are_measured_as_the_demo_measures_sms_spam(tmp_path, name):
    """Issue-49 habit for every shipped recipe: each trained arm on 3 seeds, tuned and scored on the
    whole val and holdout splits, SFT drawing label-balanced items with no in-run evaluation, as
    the demo's sms-spam task; --fast keeps one seed so its plumbing run stays short."""
    demo, recipe = load_recipe("demo"), load_recipe(name)
    spam = demo.tasks["spam"]
    for task_name, task in recipe.tasks.items():
        assert task.data == spam.data == "sms-spam"
        assert (task.seeds, task.eval_limit, task.holdout_limit) == (spam.seeds, None, None), task_name
        assert (task.limit, task.train_sample) == (spam.limit, spam.train_sample) == (320, "balanced"), task_name
        sft = arm_config(recipe, task_name, "sft@s1", tmp_path)
        demo_sft = arm_config(demo, "spam", "sft@s1", tmp_path)
        assert (sft.prompt_sampling, sft.eval_every, sft.max_steps) == (demo_sft.prompt_sampling, 0, demo_sft.max_steps) == ("balanced", 0, 40)
    assert recipe.workers == demo.workers == 2
    assert {t.seeds[0] for t in load_recipe(name, fast=True).tasks.values()} == {0}
    assert all(len(t.seeds) == 1 for t in load_recipe(name, fast=True).tasks.values())

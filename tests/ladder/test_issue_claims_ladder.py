"""One small ladder on tiny-random (2 seeds, an OOD set, GRPO and CoRPO from one SFT parent) that
makes the verdict state what the papers claim: paired verdicts on the OOD set per RL arm, a direct
RL arm's greedy-generation operating point with its sweep result, and the stability figures over
seeds with CoRPO against GRPO paired by seed, in verdict.json, on the console and in the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from labelrl.evaluate.sweep_distance import verdict_word
from labelrl.ladder import Ladder, load_recipe
from labelrl.report import build_report

FRUIT, THINGS = ["grape", "mango", "apple"], ["chair", "table", "stone"]
OOD_FRUIT, OOD_THINGS = ["pear", "plum"], ["brick", "spoon"]
OOD = "toy_ood.jsonl"  # relative to the working directory, as a recipe names a dataset


def rows(fruit: list[str], things: list[str], n: int, prefix: str) -> list[dict]:
    words = fruit + things
    return [{"id": f"{prefix}{i}", "text": f"item {i}: {words[i % len(words)]}",
             "label": "yes" if words[i % len(words)] in fruit else "no"} for i in range(n)]


def recipe(data: Path) -> dict:
    return {
        "version": 1, "name": "claims", "model": "tiny-random",
        "defaults": {
            "sft": {"lora": False, "learning_rate": 3e-3, "max_steps": 2, "batch_size": 4, "eval_every": 2, "eval_limit": 8, "quiet": True},
            "rl": {"lora": False, "learning_rate": 1e-3, "steps": 2, "group_size": 2, "prompts_per_step": 2,
                   "max_new_tokens": 8, "checkpoint_every": 2, "quiet": True},
        },
        "tasks": {"toy": {"data": str(data), "limit": 16, "eval_limit": 8, "holdout_limit": 8, "n_boot": 50,
                          "ood": [OOD], "eval_max_new_tokens": 8,
                          # one SFT parent, two seeds of each RL arm from it: the least a paired-by-seed claim needs
                          "arms": {"sft": {"type": "sft"}, "grpo": {"type": "rl", "from": "sft", "preset": "grpo", "seeds": [0, 1]},
                                   "corpo": {"type": "rl", "from": "sft", "preset": "corpo", "threshold": 0.5, "seeds": [0, 1]},
                                   "threshold": {"type": "threshold", "from": "sft"}}}},
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    import labelrl.cli.ladder as cli

    root = tmp_path_factory.mktemp("claims")
    data = root / "toy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(FRUIT, THINGS, 80, "t")), encoding="utf-8")
    (root / OOD).write_text("".join(json.dumps(r) + "\n" for r in rows(OOD_FRUIT, OOD_THINGS, 60, "o")), encoding="utf-8")
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe(data)), encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        state = Ladder(load_recipe(root / "recipe.yaml"), root / "run", Console(quiet=True)).run()
        console = Console(record=True, width=100_000, force_terminal=False)
        mp.setattr(cli, "console", console)
        cli.print_verdicts(state, explain=True)  # what `labelrl report RUN --explain` prints
    return root / "run", state, console.export_text()


def verdicts(state) -> dict[str, dict]:
    return {v["arm"]: v for v in state["tasks"]["toy"]["verdict"]}


def test_the_arms_ran_and_were_scored_out_of_domain(run):
    _, state, _ = run
    arms = state["tasks"]["toy"]["arms"]
    assert all(a["status"] == "done" for a in arms.values()), {n: a.get("error") for n, a in arms.items()}
    assert set(arms) == {"sft", "threshold", "grpo@s0", "grpo@s1", "corpo@s0", "corpo@s1"}
    assert all(OOD in arm["ood"] for name, arm in arms.items() if name != "threshold")


def test_paired_ood_verdicts_per_rl_arm_on_the_console_and_in_paired_json(run):
    run_dir, state, printed = run
    paired = json.loads((run_dir / "toy" / "analysis" / "paired.json").read_text())
    ood = {(c["kind"], c["a"], c["b"]): c for c in paired if c["split"] == f"ood-{OOD}"}
    assert {("vs_sft", "sft", "grpo"), ("vs_sft", "sft", "corpo"), ("vs_threshold", "threshold", "grpo"),
            ("vs_threshold", "threshold", "corpo")} <= set(ood)
    (ablation,) = [(a, b) for kind, a, b in ood if kind == "ablation"]  # in run order
    assert set(ablation) == {"grpo", "corpo"} and ("vs_recall_matched", "threshold at grpo's val recall", "grpo") in ood
    c = ood[("vs_sft", "sft", "corpo")]
    assert c["a_runs"] == ["sft"] and c["b_runs"] == ["corpo@s0", "corpo@s1"] and c["result"]["n_runs"] == [1, 2]
    for arm in ("grpo", "corpo"):
        v = verdicts(state)[arm]
        assert v["ood"][OOD][0].startswith("vs sft: ") and f"on OOD {OOD}: vs sft: " in v["text"]
        line = next(line for line in printed.splitlines() if line.strip().startswith(f"• {arm}: "))
        assert f"on OOD {OOD}: vs sft: " in line and "(SFT + threshold chosen on val)" in line.split("on OOD")[1]
        assert f"ablation {ablation[1]} vs {ablation[0]} (same parent)" in line.split("on OOD")[1]


def test_direct_rl_verdicts_state_the_generation_point_and_its_sweep(run):
    run_dir, state, printed = run
    sweep = json.loads((run_dir / "toy" / "analysis" / "sweep.json").read_text())
    for arm in ("grpo", "corpo"):
        v = verdicts(state)[arm]
        points = v["generation"]["points"]
        assert set(points) == {f"{arm}@s0", f"{arm}@s1"}
        assert set(points[f"{arm}@s0"]["labels"]) == {"no", "yes"} and points[f"{arm}@s0"]["n"] == 8
        assert f"{arm}@s0 (greedy generation)" in sweep["arms"]["compared"]
        # two seeds: the sweep's verdicts on the generated points, counted ("on the curve in 1, … of 2 seeds")
        heads = [verdict_word(sweep["compared"][sweep["arms"]["compared"].index(f"{arm}@s{s} (greedy generation)")]["verdict"])
                 for s in (0, 1)]
        assert v["generation"]["sweep"].startswith("its val point against a threshold on the SFT model: ")
        assert all(f"{h} in {heads.count(h)}" in v["generation"]["sweep"] for h in heads)
        assert v["generation"]["sweep"].endswith(" of 2 seeds") and v["generation"]["sweep"] in v["text"]
        assert "greedy generation, no logits (holdout): recall no " in v["text"]
        assert any(line.strip().startswith(f"• {arm}: ") and "greedy generation" in line for line in printed.splitlines())


def test_two_seeds_give_the_stability_figures_and_corpo_against_grpo(run):
    run_dir, state, printed = run
    made = json.loads((run_dir / "toy" / "analysis" / "stability.json").read_text())
    corpo = made["arms"]["corpo"]
    assert set(corpo["per_run"]) == {"corpo@s0", "corpo@s1"}
    holdout = [state["tasks"]["toy"]["arms"][f"corpo@s{s}"]["holdout"]["balanced_accuracy"] for s in (0, 1)]
    assert corpo["holdout_balanced_accuracy_sd"] == pytest.approx(abs(holdout[0] - holdout[1]) / 2 ** 0.5)
    for r in corpo["per_run"].values():
        assert r["n_steps"] == 2 and r["n_val_points"] == 2  # steps 1, 2; val at steps 0 and 2
        assert r["reward_step_change"] is not None and r["val_step_change"] is not None
    (c,) = made["corpo_vs_grpo"]
    assert (c["a"], c["b"]) == ("corpo", "grpo") and set(c["reward_step_change"]["by_seed"]) == {"0", "1"}
    text = verdicts(state)["corpo"]["text"]
    assert "stability over 2 seeds: holdout BA sd " in text and "stability vs grpo (same parent, paired by seed)" in text
    assert "stability vs" not in verdicts(state)["grpo"]["text"]
    assert "stability vs grpo" in printed
    md = build_report(run_dir, run_dir / "report").markdown.read_text()
    assert "stability over seeds and over training steps" in md and "CoRPO against GRPO from the same parent" in md
    assert "the operating point without logit access" in md and f"OOD {OOD}" in md

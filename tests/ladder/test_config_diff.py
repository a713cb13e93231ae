"""``config_diff`` and the ablation pairing of ``labelrl.ladder.analysis``, on constructed state dicts.

A task's state holds, per finished arm, its resolved config (``config``) and, for RL arms, the
algorithm it resolves to (``algorithm``, as ``labelrl.ladder.run`` records it). An ablation is
two RL arms from the same parent, labelled with exactly the keys that differ.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from labelrl.ladder import analysis
from labelrl.ladder.analysis import UNCOMPARED_KEYS, config_diff


def rl_state(preset: str, *, parent: str = "sft", threshold: float | None = None, **config) -> dict:
    """A finished RL arm's state as the ladder records it (config + resolved algorithm)."""
    estimator = {"grpo": "grpo", "dr_grpo": "dr_grpo", "corpo": "corpo"}[preset]
    aggregation = "seq_mean_token_mean" if preset == "grpo" else "seq_mean_token_sum_norm"
    algorithm = {"estimator": estimator, "surrogate": "clip", "surrogate.eps_low": 0.2, "surrogate.eps_high": 0.2,
                 "aggregation": aggregation, "dynamic_sampling": False}
    if estimator == "corpo":
        algorithm["estimator.threshold"] = threshold
    base = {"model": f"runs/t/toy/{parent}/model", "preset": preset, "threshold": threshold, "lr": 1e-5,
            "group_size": 4, "out": "runs/t/toy/x", "seed": 0}
    return {"type": "rl", "from": parent, "status": "done", "config": base | config, "preset": preset,
            "algorithm": algorithm}


def test_dr_grpo_vs_corpo_differs_in_the_estimator_and_its_threshold_only():
    diff = config_diff(rl_state("dr_grpo"), rl_state("corpo", threshold=0.5))
    assert diff == {
        "preset": ["dr_grpo", "corpo"],
        "threshold": [None, 0.5],
        "algorithm.estimator": ["dr_grpo", "corpo"],
        "algorithm.estimator.threshold": [None, 0.5],  # only corpo has the key: None on the other side
    }


def test_grpo_vs_dr_grpo_names_the_estimator_and_the_aggregation():
    diff = config_diff(rl_state("grpo"), rl_state("dr_grpo"))
    assert set(diff) == {"preset", "algorithm.estimator", "algorithm.aggregation"}
    assert diff["algorithm.aggregation"] == ["seq_mean_token_mean", "seq_mean_token_sum_norm"]


def test_where_and_how_a_run_is_logged_and_its_model_path_are_not_differences():
    a = rl_state("grpo", out="runs/a", seed=1, quiet=True, resume=False, eval_limit=50)
    b = rl_state("grpo", parent="sft2", out="runs/b", seed=2, quiet=False, resume=True, eval_limit=80)
    assert {"out", "seed", "quiet", "resume", "eval_limit"} <= UNCOMPARED_KEYS
    assert config_diff(a, b) == {}  # the model path differs too (another parent) and is left out
    assert config_diff(a, rl_state("grpo", lr=3e-5)) == {"lr": [1e-5, 3e-5]}  # a real change still shows


def test_a_key_only_one_side_has_is_a_difference_and_equal_states_have_none():
    a = rl_state("grpo")
    b = rl_state("grpo", label_noise=0.2)
    assert config_diff(a, b) == {"label_noise": [None, 0.2]}
    assert config_diff(a, rl_state("grpo")) == {}
    assert config_diff({"type": "rl"}, {"type": "rl"}) == {}  # no config recorded: nothing to say


@pytest.fixture
def stubbed(monkeypatch):
    """paired_comparisons with the file reading and the statistics stubbed out: what is paired, only."""
    import labelrl.evaluate.io as io
    import labelrl.evaluate.paired as paired

    monkeypatch.setattr(io, "read_predictions", lambda path: Path(path).name)
    monkeypatch.setattr(paired, "paired_comparison", lambda a, b, names, n_boot, seeds_paired=False:
                        {"verdict": "tie", "a": a, "b": b})
    monkeypatch.setattr(paired, "verdict_words", lambda result: "")
    monkeypatch.setattr(analysis, "majority_comparisons", lambda *args: [])
    monkeypatch.setattr(analysis, "mark_collapsed", lambda comparisons, arms, task_dir=None: None)


def test_rl_arms_from_one_parent_get_one_ablation_naming_the_differing_keys(stubbed, tmp_path):
    import json

    arms = {
        "sft": {"type": "sft", "status": "done", "config": {}},
        "sft_b": {"type": "sft", "status": "done", "config": {}},
        "dr_grpo": rl_state("dr_grpo"),
        "corpo": rl_state("corpo", threshold=0.5),
        "other": rl_state("grpo", parent="sft_b"),  # another parent: compared with its own SFT only
    }
    analysis.paired_comparisons(tmp_path, arms, n_boot=0)
    comparisons = json.loads((tmp_path / "analysis" / "paired.json").read_text(encoding="utf-8"))
    ablations = [c for c in comparisons if c["kind"] == "ablation"]
    assert [(c["a"], c["b"]) for c in ablations] == [("dr_grpo", "corpo")]
    assert set(ablations[0]["config_diff"]) == {"preset", "threshold", "algorithm.estimator", "algorithm.estimator.threshold"}
    assert ablations[0]["result"]["a"] == ["dr_grpo-holdout.parquet"]  # each side's holdout predictions
    assert sorted((c["a"], c["b"]) for c in comparisons if c["kind"] == "vs_sft") == [
        ("sft", "corpo"), ("sft", "dr_grpo"), ("sft_b", "other")]


def test_replicates_pair_as_one_ablation_over_their_runs(stubbed, tmp_path):
    import json

    arms = {"sft": {"type": "sft", "status": "done", "config": {}}}
    for seed in (0, 1):
        arms[f"dr_grpo@s{seed}"] = rl_state("dr_grpo", seed=seed) | {"replicate_of": "dr_grpo"}
        arms[f"corpo@s{seed}"] = rl_state("corpo", threshold=0.5, seed=seed) | {"replicate_of": "corpo"}
    analysis.paired_comparisons(tmp_path, arms, n_boot=0)
    comparisons = json.loads((tmp_path / "analysis" / "paired.json").read_text(encoding="utf-8"))
    (ablation,) = [c for c in comparisons if c["kind"] == "ablation"]
    assert (ablation["a"], ablation["b"]) == ("dr_grpo", "corpo")
    assert ablation["a_runs"] == ["dr_grpo@s0", "dr_grpo@s1"] and ablation["b_runs"] == ["corpo@s0", "corpo@s1"]
    assert "seed" not in ablation["config_diff"]  # replicates differ in seed; the arms do not


def test_the_ladder_records_what_config_diff_reads(tmp_path):
    """The real resolved configs of a dr_grpo and a corpo arm (``arm_config``) differ only where expected."""
    from labelrl.ladder.arms import arm_config
    from labelrl.ladder.recipe import load_recipe

    raw = {"version": 1, "name": "t", "model": "tiny-random",
           "tasks": {"toy": {"data": "sms-spam", "arms": {
               "sft": {"type": "sft"}, "dr_grpo": {"type": "rl", "from": "sft", "preset": "dr_grpo"},
               "corpo": {"type": "rl", "from": "sft", "preset": "corpo", "threshold": 0.5}}}}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    recipe = load_recipe(path)
    a, b = (arm_config(recipe, "toy", name, tmp_path) for name in ("dr_grpo", "corpo"))
    diff = config_diff({"config": a.model_dump(mode="json")}, {"config": b.model_dump(mode="json")})
    assert diff == {"preset": ["dr_grpo", "corpo"], "threshold": [None, 0.5]}

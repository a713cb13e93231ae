"""Presets: named (estimator, surrogate, aggregation) tuples and their overrides."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from labelrl.train.presets import PRESETS, Preset, resolve_preset


def test_preset_names():
    assert sorted(PRESETS) == ["corpo", "dapo", "dr_grpo", "grpo", "rloo"]


@pytest.mark.parametrize(
    "name, estimator, aggregation",
    [
        ("grpo", "grpo", "seq_mean_token_mean"),
        ("dr_grpo", "dr_grpo", "seq_mean_token_sum_norm"),
        ("dapo", "grpo", "token_mean"),
        ("corpo", "corpo", "seq_mean_token_sum_norm"),
        ("rloo", "rloo", "seq_mean_token_sum_norm"),
    ],
)
def test_preset_knobs(name, estimator, aggregation):
    preset = resolve_preset(name)
    assert (preset.estimator, preset.surrogate, preset.aggregation) == (estimator, "clip", aggregation)
    assert preset.description


def test_dapo_uses_clip_higher_and_dynamic_sampling():
    dapo = resolve_preset("dapo")
    assert dict(dapo.surrogate_options) == {"eps_low": 0.2, "eps_high": 0.28}
    assert dapo.dynamic_sampling is True
    assert not any(PRESETS[n].dynamic_sampling for n in PRESETS if n != "dapo")


def test_every_preset_names_registered_entries_with_valid_options():
    import torch

    from labelrl.advantages import ESTIMATORS, compute_advantages
    from labelrl.losses import AGGREGATIONS, SURROGATES, policy_loss

    for name, preset in PRESETS.items():
        assert preset.estimator in ESTIMATORS and preset.surrogate in SURROGATES
        assert preset.aggregation in AGGREGATIONS
        options = dict(preset.estimator_options)
        if preset.estimator == "corpo":
            options["threshold"] = 0.5
        adv = compute_advantages(torch.tensor([0.0, 1.0, 1.0, 1.0]), 2, preset.estimator, **options)
        loss, _ = policy_loss(
            torch.zeros(4, 3), torch.zeros(4, 3), adv, torch.ones(4, 3, dtype=torch.bool),
            surrogate=preset.surrogate, aggregation=preset.aggregation, max_len=3, **preset.surrogate_options,
        )
        assert torch.isfinite(loss), name


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown preset 'ppo': choose one of corpo, dapo, dr_grpo, grpo, rloo"):
        resolve_preset("ppo")


def test_none_overrides_are_ignored():
    assert resolve_preset("grpo", estimator=None, surrogate=None, aggregation=None) == PRESETS["grpo"]


def test_override_one_knob():
    preset = resolve_preset("grpo", aggregation="token_mean")
    assert (preset.estimator, preset.aggregation) == ("grpo", "token_mean")
    assert dict(preset.surrogate_options) == {"eps_low": 0.2, "eps_high": 0.2}
    assert "aggregation='token_mean'" in preset.description


def test_switching_surrogate_drops_the_old_surrogate_options():
    # clip's eps options mean nothing to pg (and pg would refuse them)
    assert dict(resolve_preset("dapo", surrogate="pg").surrogate_options) == {}
    assert dict(resolve_preset("dapo", surrogate="pg", surrogate_options={}).surrogate_options) == {}


def test_switching_estimator_drops_options_unless_given():
    preset = resolve_preset("grpo", estimator="corpo", estimator_options={"scale_by_std": True})
    assert preset.estimator == "corpo" and dict(preset.estimator_options) == {"scale_by_std": True}


def test_unknown_override_is_refused():
    with pytest.raises(ValueError, match="'eps_high' is not a preset field"):
        resolve_preset("grpo", eps_high=0.3)


def test_presets_are_frozen():
    preset = PRESETS["dapo"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        preset.estimator = "rloo"  # type: ignore[misc]
    with pytest.raises(TypeError):
        preset.surrogate_options["eps_high"] = 1.0  # type: ignore[index]
    with pytest.raises(TypeError):
        PRESETS["new"] = Preset("grpo", "pg", "token_mean")  # type: ignore[index]
    resolved = resolve_preset("dapo", surrogate_options={"eps_low": 0.1})
    assert PRESETS["dapo"].surrogate_options["eps_low"] == 0.2 and resolved.surrogate_options["eps_low"] == 0.1


def test_presets_module_does_not_import_torch():
    code = "import sys, labelrl.train.presets; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_dapo_ships_with_the_soft_overlong_penalty_and_the_others_score_truncation_zero():
    """DAPO's preset names Eq. 13's soft overlong punishment as its truncation policy; an RL
    config without --truncation takes its preset's, with L_cache a fifth of the cap (DAPO's
    4,096 of 20,480); an explicit --truncation or --overlong-cache wins."""
    from labelrl.train.config import RLConfig

    assert PRESETS["dapo"].truncation == "soft_penalty"
    assert {n: p.truncation for n, p in PRESETS.items() if n != "dapo"} == dict.fromkeys(set(PRESETS) - {"dapo"}, "zero")
    base = dict(data="sms-spam", out="run")
    dapo = RLConfig(**base, preset="dapo", max_new_tokens=1024)
    assert (dapo.truncation, dapo.overlong_cache) == ("soft_penalty", 204)  # 1024 // 5
    assert RLConfig(**base, preset="dapo", max_new_tokens=4).overlong_cache == 1  # never below one token
    assert RLConfig(**base, preset="grpo").truncation == "zero"
    assert RLConfig(**base, preset="dapo", truncation="mask").truncation == "mask"
    assert RLConfig(**base, preset="dapo", overlong_cache=8).overlong_cache == 8
    assert resolve_preset("dapo", truncation="zero").truncation == "zero"


def test_a_dapo_run_adds_the_soft_penalty_to_its_rewards():
    """What the trainer builds from a dapo config: a reward that subtracts R_length near the cap.
    Cap 10, cache 10 // 5 = 2: a correct answer of 9 tokens earns 1 + (8 − 9) / 2 = 0.5, of 8
    tokens 1.0 (free up to L_max − L_cache = 8)."""
    from labelrl.rewards.reward_fn import score_completions
    from labelrl.train.config import RLConfig
    from labelrl.train.rl_parts import resolve_algorithm
    from labelrl.types import LabelSpace

    cfg = RLConfig(data="sms-spam", out="run", preset="dapo", max_new_tokens=10)
    algo = resolve_algorithm(cfg, LabelSpace(("ham", "spam"), kind="binary", positive="spam"))
    assert (algo.reward.truncation, algo.reward.cache_tokens) == ("soft_penalty", 2)
    out = score_completions(["<answer>spam</answer>"] * 2, ["spam"] * 2, lengths=[9, 8], config=algo.reward)
    assert [float(r) for r in out.rewards] == [0.5, 1.0]

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

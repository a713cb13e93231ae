"""Presets: named (estimator, surrogate, aggregation) tuples and their overrides."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from labelrl.train.presets import ESTIMATOR_SCALE, PRESETS, Preset, resolve_preset


def test_preset_names():
    assert sorted(PRESETS) == ["corpo", "dapo", "dr_grpo", "grpo", "gspo", "rloo"]


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


def test_gspo_preset_is_grpo_with_the_sequence_ratio_and_the_papers_clip_ranges():
    gspo = resolve_preset("gspo")
    assert (gspo.estimator, gspo.surrogate, gspo.aggregation, gspo.scale) == ("grpo", "gspo", "seq_mean_token_mean", "group")
    assert dict(gspo.surrogate_options) == {"eps_low": 3e-4, "eps_high": 4e-4}  # GSPO §5.1


def test_each_preset_divides_by_its_papers_std():
    # GRPO (and DAPO, GSPO on GRPO's advantage) by the group std; Dr. GRPO, RLOO, CoRPO by none
    assert {n: p.scale for n, p in PRESETS.items()} == {
        "grpo": "group", "dapo": "group", "gspo": "group", "dr_grpo": "none", "rloo": "none", "corpo": "none"}
    assert all(p.scale == ESTIMATOR_SCALE[p.estimator] for p in PRESETS.values())


def test_unset_scale_keeps_each_presets_advantages():
    # the scale's flags reproduce what each estimator does with no options at all
    import torch

    from labelrl.advantages import compute_advantages

    rewards = torch.tensor([0.2, 0.4, 0.4, 1.0, 0.0, 1.0, 1.0, 1.0])
    for name, preset in PRESETS.items():
        extra = {"threshold": 0.5} if preset.estimator == "corpo" else {}
        plain = compute_advantages(rewards, 4, preset.estimator, **extra)
        torch.testing.assert_close(compute_advantages(rewards, 4, preset.estimator, **preset.advantage_options(), **extra), plain)


def test_scale_override_and_estimator_switch():
    assert resolve_preset("grpo", scale="batch").advantage_options() == {"scale_by_std": False, "batch_std": True}
    assert resolve_preset("dr_grpo", scale="group").advantage_options() == {"scale_by_std": True, "batch_std": False}
    assert resolve_preset("grpo", estimator="dr_grpo").scale == "none"  # the new estimator's own
    assert resolve_preset("grpo", estimator="dr_grpo", scale="group").scale == "group"
    with pytest.raises(ValueError, match="scale='std': choose one of group, batch, none"):
        resolve_preset("grpo", scale="std")
    with pytest.raises(ValueError, match="scale='batch' and estimator option 'batch_std' both choose"):
        resolve_preset("grpo", scale="batch", estimator_options={"batch_std": True})


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
    with pytest.raises(ValueError, match="unknown preset 'ppo': choose one of corpo, dapo, dr_grpo, grpo, gspo, rloo"):
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
    assert preset.scale is None and preset.advantage_options() == {"scale_by_std": True}  # the options decide


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


def test_an_rl_config_resolves_and_records_its_scale():
    """Without --scale a config takes its preset's (or its overriding estimator's) scale, so the saved
    config names the division in force; a given --scale wins; CoRPO refuses a std division."""
    from labelrl.train.config import RLConfig

    base = dict(data="sms-spam", out="run")
    assert {p: RLConfig(**base, preset=p, threshold=0.5).scale for p in PRESETS} == {n: p.scale for n, p in PRESETS.items()}
    assert RLConfig(**base, preset="grpo", estimator="dr_grpo").scale == "none"
    assert RLConfig(**base, preset="dr_grpo", scale="batch").scale == "batch"
    saved = RLConfig(**base, preset="grpo", scale="batch").model_dump(mode="json")
    assert saved["scale"] == "batch" and RLConfig.model_validate(saved).scale == "batch"
    for scale in ("group", "batch"):
        with pytest.raises(ValueError, match=f"scale='{scale}' with estimator corpo: .*use --scale none"):
            RLConfig(**base, preset="corpo", threshold=0.5, scale=scale)
    with pytest.raises(ValueError, match="scale='batch' with estimator corpo"):
        RLConfig(**base, preset="grpo", estimator="corpo", threshold=0.5, scale="batch")
    assert RLConfig(**base, preset="corpo", threshold=0.5, scale="none").scale == "none"


def test_scale_reaches_the_trainers_advantages():
    """What the trainer builds from --scale: the estimator options that divide by the batch std."""
    import torch

    from labelrl.advantages import compute_advantages
    from labelrl.train.config import RLConfig
    from labelrl.train.rl_parts import resolve_algorithm
    from labelrl.types import LabelSpace

    rewards = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    labels = LabelSpace(("ham", "spam"), kind="binary")
    algos = {s: resolve_algorithm(RLConfig(data="sms-spam", out="run", preset="grpo", scale=s), labels)
             for s in ("group", "batch", "none")}
    adv = {s: compute_advantages(rewards, 4, a.estimator, **a.estimator_options) for s, a in algos.items()}
    # group means 0.75 and 0.25 → centred ±0.25 / ±0.75; group stds both 0.5, batch std 0.534522
    torch.testing.assert_close(adv["none"], torch.tensor([-0.75, 0.25, 0.25, 0.25, -0.25, -0.25, -0.25, 0.75]))
    torch.testing.assert_close(adv["group"], adv["none"] / (0.5 + 1e-6))
    torch.testing.assert_close(adv["batch"], adv["none"] / (0.534522 + 1e-6))

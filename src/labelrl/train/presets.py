"""Named algorithms: each preset is a choice of the three knobs (estimator, surrogate, aggregation).

"grpo", "dr_grpo", "dapo", "corpo" and "rloo" are not code paths: the trainer looks up the
three names in their registries (labelrl.advantages.ESTIMATORS, labelrl.losses.SURROGATES,
labelrl.losses.AGGREGATIONS), so any knob can be overridden and any mix is possible.
Pure Python (no torch), so configs and ``--help`` can use it cheaply.

Every preset uses the ``clip`` surrogate: with one on-policy pass the ratio is 1 and clip
equals ``pg`` in value and gradient, and with ``ppo_epochs > 1`` clipping is what keeps the
reused batch safe.

Every preset also names its truncation policy (``labelrl.rewards.truncation``), the default
when ``--truncation`` is not given: ``zero`` for all but ``dapo``, which ships with DAPO's soft
overlong punishment (Yu et al. 2025, §3.4 "Overlong Reward Shaping", Eq. 13) as DAPO does.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping


def _frozen(options: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    return MappingProxyType(dict(options or {}))


@dataclass(frozen=True)
class Preset:
    """One named (estimator, surrogate, aggregation) tuple with its options.

    ``estimator_options`` go to ``compute_advantages`` and ``surrogate_options`` to the
    surrogate (read-only mappings; copy with ``dict(...)``). ``dynamic_sampling`` asks the
    trainer to keep drawing prompts until the batch holds enough informative groups (DAPO).
    ``truncation`` is the policy for completions that hit the token cap when the run names none.
    """

    estimator: str
    surrogate: str
    aggregation: str
    estimator_options: Mapping[str, Any] = field(default_factory=_frozen)
    surrogate_options: Mapping[str, Any] = field(default_factory=_frozen)
    description: str = ""
    dynamic_sampling: bool = False
    truncation: str = "zero"


PPO_CLIP = _frozen({"eps_low": 0.2, "eps_high": 0.2})

PRESETS: Mapping[str, Preset] = MappingProxyType({
    "grpo": Preset(
        "grpo", "clip", "seq_mean_token_mean", surrogate_options=PPO_CLIP,
        description="GRPO (Shao et al. 2024): group-standardised advantage, per-sequence token mean.",
    ),
    "dr_grpo": Preset(
        "dr_grpo", "clip", "seq_mean_token_sum_norm", surrogate_options=PPO_CLIP,
        description="Dr. GRPO (Liu et al. 2025): no std division, token sum / (N · max length).",
    ),
    "dapo": Preset(
        "grpo", "clip", "token_mean", surrogate_options=_frozen({"eps_low": 0.2, "eps_high": 0.28}),
        # DAPO trains with all three of its length-and-sampling parts on: clip-higher, dynamic
        # sampling, and the soft overlong punishment of Eq. 13 added to every reward (§3.4).
        dynamic_sampling=True, truncation="soft_penalty",
        description="DAPO (Yu et al. 2025): clip-higher (0.2/0.28), token-level mean, dynamic sampling, "
                    "soft overlong punishment (Eq. 13).",
    ),
    # CoRPO shares Dr. GRPO's aggregation: its advantages are in reward units like Dr. GRPO's
    # and equal them whenever a group's mean reaches τ, so the corpo and dr_grpo presets differ
    # in the baseline only, a one-knob comparison; token_mean would also let a sequence's weight
    # depend on the lengths of the other completions in the batch.
    "corpo": Preset(
        "corpo", "clip", "seq_mean_token_sum_norm", surrogate_options=PPO_CLIP,
        description="CoRPO (Garg et al. 2025): baseline max(group mean, τ); needs --threshold τ.",
    ),
    # RLOO treats a completion as one action, loss −A · log π(y|x) = −A · Σ_t log π(y_t): a token
    # sum per sequence, which seq_mean_token_sum_norm gives up to the constant 1 / L_max.
    "rloo": Preset(
        "rloo", "clip", "seq_mean_token_sum_norm", surrogate_options=PPO_CLIP,
        description="RLOO (Ahmadian et al. 2024): leave-one-out baseline, sequence-level sum.",
    ),
})

_KNOBS = ("estimator", "surrogate", "aggregation")
_OVERRIDABLE = (*_KNOBS, "estimator_options", "surrogate_options", "dynamic_sampling", "truncation")


def resolve_preset(name: str, **overrides: Any) -> Preset:
    """The preset ``name`` with ``overrides`` applied; ``None`` values are ignored.

    Overridable: estimator, surrogate, aggregation, estimator_options, surrogate_options,
    dynamic_sampling, truncation. Switching the estimator (or surrogate) to another name drops the
    preset's options for it, since they belong to the old one; pass ``estimator_options``
    (``surrogate_options``) to set the new one's. Names are checked by the registries when
    the trainer looks them up.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}: choose one of {', '.join(sorted(PRESETS))}")
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(given) - set(_OVERRIDABLE))
    if unknown:
        raise ValueError(
            f"preset override {unknown[0]!r} is not a preset field: override one of {', '.join(_OVERRIDABLE)}"
        )
    preset = PRESETS[name]
    changes: dict[str, Any] = dict(given)
    for knob in ("estimator", "surrogate"):
        options = f"{knob}_options"
        if knob in given and given[knob] != getattr(preset, knob) and options not in given:
            changes[options] = _frozen()
    for options in ("estimator_options", "surrogate_options"):
        if options in changes:
            changes[options] = _frozen(changes[options])
    if changes:
        changes["description"] = f"{name} with " + ", ".join(f"{k}={given[k]!r}" for k in sorted(given))
    return replace(preset, **changes)

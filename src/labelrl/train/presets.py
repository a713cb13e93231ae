"""Named algorithms: each preset is a choice of the three knobs (estimator, surrogate, aggregation).

"grpo", "dr_grpo", "dapo", "gspo", "corpo" and "rloo" are not code paths: the trainer looks up the
three names in their registries (labelrl.advantages.ESTIMATORS, labelrl.losses.SURROGATES,
labelrl.losses.AGGREGATIONS), so any knob can be overridden and any mix is possible.
Pure Python (no torch), so configs and ``--help`` can use it cheaply.

Every preset but ``gspo`` uses the ``clip`` surrogate: with one on-policy pass the ratio is 1
and clip equals ``pg`` in value and gradient, and with ``ppo_epochs > 1`` clipping is what keeps
the reused batch safe. ``gspo`` clips one ratio per sequence instead (it equals ``clip`` on-policy).

Every preset also names its ``scale``, the std its advantages are divided by (TRL's
``scale_rewards``): "group", "batch" or "none", the estimator's own unless ``--scale`` says
otherwise. It reaches the estimator as the ``scale_by_std`` / ``batch_std`` options
(``Preset.advantage_options``), which every estimator takes.

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
    ``scale`` is the std the advantages are divided by (``SCALES``); ``None`` leaves the
    estimator's own default (for an estimator this module does not know).
    """

    estimator: str
    surrogate: str
    aggregation: str
    estimator_options: Mapping[str, Any] = field(default_factory=_frozen)
    surrogate_options: Mapping[str, Any] = field(default_factory=_frozen)
    description: str = ""
    dynamic_sampling: bool = False
    truncation: str = "zero"
    scale: str | None = None

    def advantage_options(self) -> dict[str, Any]:
        """The options for ``compute_advantages``: ``estimator_options`` with the scale's flags."""
        return {**self.estimator_options, **(SCALE_OPTIONS[self.scale] if self.scale else {})}


PPO_CLIP = _frozen({"eps_low": 0.2, "eps_high": 0.2})

# TRL's scale_rewards names for the divisor of the centred reward, as estimator options: the group
# std, the batch std (Lite PPO: Liu et al. 2025, arXiv:2508.08221), or none (Dr. GRPO).
SCALES = ("group", "batch", "none")
SCALE_OPTIONS: Mapping[str, Mapping[str, bool]] = MappingProxyType({
    "group": _frozen({"scale_by_std": True, "batch_std": False}),
    "batch": _frozen({"scale_by_std": False, "batch_std": True}),
    "none": _frozen({"scale_by_std": False, "batch_std": False}),
})
# Each estimator's scale as its paper defines it: the default when the run names no --scale.
ESTIMATOR_SCALE: Mapping[str, str] = MappingProxyType(
    {"grpo": "group", "dr_grpo": "none", "rloo": "none", "corpo": "none"}
)

PRESETS: Mapping[str, Preset] = MappingProxyType({
    "grpo": Preset(
        "grpo", "clip", "seq_mean_token_mean", surrogate_options=PPO_CLIP, scale="group",
        description="GRPO (Shao et al. 2024): group-standardised advantage, per-sequence token mean.",
    ),
    "dr_grpo": Preset(
        "dr_grpo", "clip", "seq_mean_token_sum_norm", surrogate_options=PPO_CLIP, scale="none",
        description="Dr. GRPO (Liu et al. 2025): no std division, token sum / (N · max length).",
    ),
    "dapo": Preset(
        "grpo", "clip", "token_mean", surrogate_options=_frozen({"eps_low": 0.2, "eps_high": 0.28}),
        # DAPO trains with all three of its length-and-sampling parts on: clip-higher, dynamic
        # sampling, and the soft overlong punishment of Eq. 13 added to every reward (§3.4).
        dynamic_sampling=True, truncation="soft_penalty", scale="group",
        description="DAPO (Yu et al. 2025): clip-higher (0.2/0.28), token-level mean, dynamic sampling, "
                    "soft overlong punishment (Eq. 13).",
    ),
    # GSPO (Zheng et al. 2025, arXiv:2507.18071): Eq. 5 averages the clipped sequence term over the
    # group's G responses, which seq_mean_token_mean gives for a value repeated on every token, with
    # GRPO's group-standardised advantage (Eq. 6) and the clip ranges of §5.1.
    "gspo": Preset(
        "grpo", "gspo", "seq_mean_token_mean", surrogate_options=_frozen({"eps_low": 3e-4, "eps_high": 4e-4}),
        scale="group",
        description="GSPO (Zheng et al. 2025): one length-normalised ratio per sequence, clipped to "
                    "[1 − 3e-4, 1 + 4e-4]; differs from GRPO only with --ppo-epochs > 1.",
    ),
    # CoRPO shares Dr. GRPO's aggregation: its advantages are in reward units like Dr. GRPO's
    # and equal them whenever a group's mean reaches τ, so the corpo and dr_grpo presets differ
    # in the baseline only, a one-knob comparison; token_mean would also let a sequence's weight
    # depend on the lengths of the other completions in the batch.
    "corpo": Preset(
        "corpo", "clip", "seq_mean_token_sum_norm", surrogate_options=PPO_CLIP, scale="none",
        description="CoRPO (Garg et al. 2025): baseline max(group mean, τ); needs --threshold τ.",
    ),
    # RLOO treats a completion as one action, loss −A · log π(y|x) = −A · Σ_t log π(y_t): a token
    # sum per sequence, which seq_mean_token_sum_norm gives up to the constant 1 / L_max.
    "rloo": Preset(
        "rloo", "clip", "seq_mean_token_sum_norm", surrogate_options=PPO_CLIP, scale="none",
        description="RLOO (Ahmadian et al. 2024): leave-one-out baseline, sequence-level sum.",
    ),
})

_KNOBS = ("estimator", "surrogate", "aggregation")
_OVERRIDABLE = (*_KNOBS, "estimator_options", "surrogate_options", "dynamic_sampling", "truncation", "scale")


def resolve_preset(name: str, **overrides: Any) -> Preset:
    """The preset ``name`` with ``overrides`` applied; ``None`` values are ignored.

    Overridable: estimator, surrogate, aggregation, estimator_options, surrogate_options,
    dynamic_sampling, truncation, scale. Switching the estimator (or surrogate) to another name drops the
    preset's options for it, since they belong to the old one; pass ``estimator_options``
    (``surrogate_options``) to set the new one's. Switching the estimator also takes its own scale
    (``ESTIMATOR_SCALE``) unless ``scale`` is given; estimator options that set ``scale_by_std`` or
    ``batch_std`` themselves leave ``scale`` None (and refuse a ``scale`` beside them). Names are
    checked by the registries when the trainer looks them up; the scale is checked here.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}: choose one of {', '.join(sorted(PRESETS))}")
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(given) - set(_OVERRIDABLE))
    if unknown:
        raise ValueError(
            f"preset override {unknown[0]!r} is not a preset field: override one of {', '.join(_OVERRIDABLE)}"
        )
    if given.get("scale", "group") not in SCALES:
        raise ValueError(f"scale={given['scale']!r}: choose one of {', '.join(SCALES)} (TRL's scale_rewards)")
    preset = PRESETS[name]
    changes: dict[str, Any] = dict(given)
    if "estimator" in given and given["estimator"] != preset.estimator and "scale" not in given:
        changes["scale"] = ESTIMATOR_SCALE.get(given["estimator"])
    for knob in ("estimator", "surrogate"):
        options = f"{knob}_options"
        if knob in given and given[knob] != getattr(preset, knob) and options not in given:
            changes[options] = _frozen()
    for options in ("estimator_options", "surrogate_options"):
        if options in changes:
            changes[options] = _frozen(changes[options])
    flags = sorted(set(changes.get("estimator_options", preset.estimator_options)) & {"scale_by_std", "batch_std"})
    if flags:  # the estimator options set the division themselves (the Python API's way)
        if "scale" in given:
            raise ValueError(
                f"scale={given['scale']!r} and estimator option {flags[0]!r} both choose the std division: pass one"
            )
        changes["scale"] = None
    if changes:
        changes["description"] = f"{name} with " + ", ".join(f"{k}={given[k]!r}" for k in sorted(given))
    return replace(preset, **changes)

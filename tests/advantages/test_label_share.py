"""The label share among informative groups counts the groups that carry a gradient: under CoRPO a
uniformly failing group is trained on (every advantage r − τ < 0), so it counts."""

from __future__ import annotations

import torch

from labelrl import metrics_keys as K
from labelrl.advantages import compute_advantages
from labelrl.advantages.diagnostics import advantage_diagnostics

G = 2
# group 0 (label a): rewards 1, 0 → mixed; group 1 (label b): 0, 0 → uniformly failing
REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)


def shares(estimator: str, **options) -> dict[str, float]:
    adv = compute_advantages(REWARDS, G, estimator, **options)
    out = advantage_diagnostics(REWARDS, adv, G, success_threshold=1.0, labels=["a", "b"], label_names=["a", "b"])
    return {label: out[K.per_label(K.LABEL_SHARE_INFORMATIVE, label)] for label in "ab"}


def test_corpo_counts_a_uniformly_failing_group_it_trains_on():
    # CoRPO τ = 0.5: group 1's advantages are 0 − 0.5 = −0.5 each → trained on → a and b count alike
    assert shares("corpo", threshold=0.5) == {"a": 0.5, "b": 0.5}


def test_grpo_skips_the_uniform_group_so_only_the_mixed_one_counts():
    assert shares("dr_grpo") == {"a": 1.0, "b": 0.0}

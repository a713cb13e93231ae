"""Per-token KL penalty against a reference policy, behind ``KL_ESTIMATORS``.

Schulman 2020, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html): with
samples from the current policy π and ``log ρ = log π_ref − log π`` per token,

- ``k1 = −log ρ``                  (unbiased, high variance, can be negative)
- ``k2 = ½ (log ρ)²``              (biased, low variance, ≥ 0)
- ``k3 = exp(log ρ) − log ρ − 1``  (unbiased, low variance, ≥ 0): the one GRPO uses
  (Shao et al. 2024, arXiv:2402.03300, Eq. 4) and labelrl's default.

The penalty is added per token, ``loss_t += beta · k_t``, before aggregation (as TRL does).
"""

from __future__ import annotations

from typing import Callable

import torch

from labelrl.registry import Registry

KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``log π − log π_ref`` per token ``[N,T]``."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``½ (log π_ref − log π)²`` per token ``[N,T]``."""
    return 0.5 * (ref_logprobs - logprobs) ** 2


@KL_ESTIMATORS.register("k3")
def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``exp(log π_ref − log π) − (log π_ref − log π) − 1`` per token ``[N,T]``; ≥ 0."""
    log_ratio = ref_logprobs - logprobs
    # expm1 keeps tiny ratios accurate: exp(x) − 1 − x rounds below 0 for |x| ≈ 1e-16.
    return torch.expm1(log_ratio) - log_ratio

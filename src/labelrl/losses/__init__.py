"""Policy losses: a surrogate, an aggregation and an optional KL penalty, composed by name.

Three registries (``SURROGATES``, ``AGGREGATIONS``, ``KL_ESTIMATORS``); ``policy_loss`` is
the only function the trainer calls. docs/algorithms.md gives each formula.
"""

from __future__ import annotations

from typing import Any

import torch

from labelrl.losses.aggregate import AGGREGATIONS
from labelrl.losses.kl import KL_ESTIMATORS
from labelrl.losses.surrogate import SURROGATES, check_surrogate_options, clipped_ratio, takes_mask

__all__ = ["AGGREGATIONS", "KL_ESTIMATORS", "SURROGATES", "policy_loss"]


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    surrogate: str,
    aggregation: str,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    max_len: int | None = None,
    group_size: int | None = None,
    kl_estimator: str = "k3",
    kl_ratio_correction: bool = False,
    n_sequences: int | None = None,
    n_tokens: int | None = None,
    token_weights: torch.Tensor | None = None,
    **surrogate_opts: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Scalar loss to minimise, and detached statistics.

    ``logprobs`` ``[N,T]`` (with gradient), ``old_logprobs`` ``[N,T]`` (sampling policy),
    ``advantages`` ``[N]``, ``mask`` ``[N,T]`` (True on completion tokens that count).
    Per token: ``surrogate(...) + beta · KL(π ‖ π_ref)``, then ``aggregation`` over the mask.
    ``beta > 0`` needs ``ref_logprobs`` ``[N,T]``. ``max_len`` and ``group_size`` go to the
    aggregation, and so do ``n_sequences`` / ``n_tokens`` (the full batch's counts when
    zero-advantage groups were dropped before the pass); ``surrogate_opts`` (e.g. ``eps_low``, ``eps_high``) to the surrogate.
    ``kl_ratio_correction`` multiplies the per-token KL by the ratio ``exp(logp − old_logp)``
    (1 in value on-policy, but differentiable), which makes the KL gradient the unbiased
    reverse-KL gradient (DeepSeek-AI 2025, "DeepSeek-V3.2", arXiv:2512.02556); TRL 1.16 turns
    it on by default (``use_bias_correction_kl``), labelrl keeps DeepSeekMath's plain k3.
    ``token_weights`` ``[N,T]`` (detached) multiply the surrogate's per-token loss, before the KL
    term is added: the rollout correction's importance weights (``labelrl.losses.rollout_correction``),
    applied where TRL 1.16 applies its ``importance_sampling_ratio``.

    Stats (masked token means): ``kl`` (0 when beta = 0), ``ratio_mean``, ``clip_low_frac``
    and ``clip_high_frac`` (tokens whose ratio is clipped on the side that binds for the sign
    of A: below 1 − eps_low with A < 0, above 1 + eps_high with A > 0; 0 for pg). Under gspo the
    ratio is the sequence's, counted on each of its tokens (the clipped-token share GSPO reports).
    A surrogate that declares ``mask`` (gspo) receives ``mask`` itself.
    """
    surrogate_fn = SURROGATES.get(surrogate)
    aggregate_fn = AGGREGATIONS.get(aggregation)
    check_surrogate_options(surrogate, surrogate_fn, surrogate_opts)
    if beta < 0:
        raise ValueError(f"beta={beta}: the KL coefficient must be ≥ 0 (0 turns the penalty off)")
    supplied = {"mask": mask.bool()} if takes_mask(surrogate_fn) else {}  # gspo averages over real tokens
    per_token = surrogate_fn(logprobs, old_logprobs, advantages, **supplied, **surrogate_opts)
    if token_weights is not None:  # importance weights of the sampler–trainer gap (losses.rollout_correction)
        per_token = per_token * token_weights.detach().to(per_token.dtype)
    kl = None
    if beta > 0:
        if ref_logprobs is None:
            raise ValueError(
                f"beta={beta} needs the reference log-probs: pass ref_logprobs [N, T], or set beta=0"
            )
        if ref_logprobs.shape != logprobs.shape:
            raise ValueError(
                f"ref_logprobs {tuple(ref_logprobs.shape)} for logprobs {tuple(logprobs.shape)}: shapes must match"
            )
        kl = KL_ESTIMATORS.get(kl_estimator)(logprobs, ref_logprobs)
        weight = torch.exp(logprobs - old_logprobs) if kl_ratio_correction else 1.0
        per_token = per_token + beta * kl * weight
    loss = aggregate_fn(per_token, mask, max_len=max_len, group_size=group_size, n_sequences=n_sequences, n_tokens=n_tokens)
    stats = _stats(logprobs, old_logprobs, advantages, mask, kl, surrogate, surrogate_opts)
    return loss, stats


def _stats(logprobs, old_logprobs, advantages, mask, kl, surrogate, opts) -> dict[str, float]:
    with torch.no_grad():
        keep = mask.bool()
        n = keep.sum().clamp(min=1)

        def token_mean(x: torch.Tensor) -> float:
            return float(torch.where(keep, x.to(logprobs.dtype), torch.zeros_like(logprobs)).sum() / n)

        ratio, bounds = clipped_ratio(surrogate, logprobs, old_logprobs, keep, opts)
        adv = advantages.to(logprobs.dtype).reshape(advantages.shape[0], -1)
        low = high = torch.zeros_like(ratio)
        if bounds is not None:
            lower, upper = bounds
            low = ((ratio < lower) & (adv < 0)).to(ratio.dtype)
            high = ((ratio > upper) & (adv > 0)).to(ratio.dtype)
        return {
            "kl": token_mean(kl) if kl is not None else 0.0,
            "ratio_mean": token_mean(ratio),
            "clip_low_frac": token_mean(low),
            "clip_high_frac": token_mean(high),
        }

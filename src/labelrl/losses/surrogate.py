"""Per-token surrogate objectives (as losses to minimise), behind ``SURROGATES``.

Signature: ``f(logprobs [N,T], old_logprobs [N,T], advantages [N], **opts) -> loss [N,T]``.
``logprobs`` carry the gradient; ``old_logprobs`` are those of the policy that sampled the
completions (detached). Padding is handled by the aggregation, not here, except by a surrogate
that declares a ``mask`` keyword (``[N,T]``, True on real completion tokens): ``policy_loss``
passes it the mask, because a sequence-level ratio (``gspo``) averages over the real tokens.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from labelrl.registry import Registry

Surrogate = Callable[..., torch.Tensor]
SURROGATES: Registry[Surrogate] = Registry("surrogate")

DEFAULT_EPS_LOW = 0.2
# GSPO's clip ranges (Zheng et al. 2025, arXiv:2507.18071, §5.1): a sequence ratio is a geometric
# mean of token ratios, so it strays from 1 by orders of magnitude less than a token ratio does.
GSPO_EPS_LOW = 3e-4
GSPO_EPS_HIGH = 4e-4
# Keywords policy_loss fills in itself for a surrogate that declares them: never user options.
SUPPLIED = ("mask",)


@SURROGATES.register("pg")
def pg_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """Plain policy gradient for one on-policy step: value ``−A``, gradient ``−A·∇log π``.

    Written as ``−A · exp(logp − logp.detach())``: the factor is 1 in value and has gradient
    ``∇logp`` (REINFORCE, Williams 1992). ``old_logprobs`` is ignored: pg assumes the
    completions were sampled by the current policy, so use ``clip`` for several passes.
    """
    _check_shapes(logprobs, old_logprobs)
    ratio = torch.exp(logprobs - logprobs.detach())
    return -_per_token(advantages, logprobs) * ratio


@SURROGATES.register("clip")
def clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_low: float = DEFAULT_EPS_LOW,
    eps_high: float | None = None,
) -> torch.Tensor:
    """PPO's clipped surrogate with separate lower and upper clip ranges.

    ``ratio = exp(logp − old_logp)``;
    ``loss = −min(ratio·A, clip(ratio, 1 − eps_low, 1 + eps_high)·A)`` per token.
    Schulman et al. 2017, "Proximal Policy Optimization Algorithms", arXiv:1707.06347,
    Eq. 7, with DAPO's "clip-higher" (Yu et al. 2025, arXiv:2503.14476): a larger
    ``eps_high`` (0.28) than ``eps_low`` (0.2) leaves room to raise unlikely tokens.
    ``eps_high=None`` uses ``eps_low`` (symmetric PPO clipping).
    """
    _check_shapes(logprobs, old_logprobs)
    return _clipped_objective(torch.exp(logprobs - old_logprobs), _per_token(advantages, logprobs), eps_low, eps_high)


@SURROGATES.register("gspo")
def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    mask: torch.Tensor,
    eps_low: float = GSPO_EPS_LOW,
    eps_high: float | None = GSPO_EPS_HIGH,
) -> torch.Tensor:
    """GSPO's clipped surrogate on the sequence-level ratio, one value repeated on a sequence's tokens.

    ``s_i = exp(1/|o_i| · Σ_t (logp − old_logp))`` over the real tokens of completion i (``mask``),
    ``loss_i = −min(s_i·A_i, clip(s_i, 1 − eps_low, 1 + eps_high)·A_i)``, returned as ``[N,T]``.
    Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071: the objective is
    Eq. 5 and ``s_i`` Eq. 7 (the length-normalised sequence likelihood ratio); the defaults 3e-4 /
    4e-4 are the clip ranges of §5.1. The gradient reaches every real token through ``s_i``:
    ``∇s_i = s_i · 1/|o_i| Σ_t ∇logp``. With ``seq_mean_token_mean`` the aggregate is Eq. 5's
    ``1/G Σ_i`` (over all N sequences); ``token_mean`` would weigh a sequence by its length.
    On-policy (``s_i = 1``) the value and gradient equal ``clip``'s under every aggregation, so GSPO
    differs from GRPO only with ``ppo_epochs > 1``. Same as TRL 1.16's clipped loss with
    ``importance_sampling_level="sequence"`` (whose ``epsilon`` still defaults to 0.2).
    Padded positions are left out with ``torch.where``, so a NaN there changes nothing; a sequence
    with no real token gets ``s = 1``.
    """
    _check_shapes(logprobs, old_logprobs)
    ratio = sequence_ratio(logprobs, old_logprobs, mask)
    return _clipped_objective(ratio, _per_token(advantages, logprobs), eps_low, eps_high).expand_as(logprobs)


def _clipped_objective(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float | None) -> torch.Tensor:
    """``−min(ratio·A, clip(ratio, 1 − eps_low, 1 + eps_high)·A)``: PPO's Eq. 7, whatever the ratio's level."""
    low, high = clip_range(eps_low, eps_high)
    return -torch.min(ratio * adv, torch.clamp(ratio, low, high) * adv)


def sequence_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[N,1]``: ``exp`` of the mean of ``logp − old_logp`` over each row's real tokens (GSPO Eq. 7)."""
    if mask.shape != logprobs.shape:
        raise ValueError(
            f"mask {tuple(mask.shape)} for logprobs {tuple(logprobs.shape)}: pass one bool per token, [N, T]"
        )
    keep = mask.bool()
    log_ratio = torch.where(keep, logprobs - old_logprobs, torch.zeros_like(logprobs))
    tokens = keep.sum(dim=1, keepdim=True).clamp(min=1).to(logprobs.dtype)
    return torch.exp(log_ratio.sum(dim=1, keepdim=True) / tokens)


def clipped_ratio(name: str, logprobs, old_logprobs, mask, options: dict[str, Any]):
    """The ratio surrogate ``name`` clips (``[N,T]``; gspo repeats a sequence's ratio on its tokens)
    and its ``(lower, upper)`` bounds, ``None`` for a surrogate that clips nothing (pg)."""
    if name == "gspo":
        ratio = sequence_ratio(logprobs, old_logprobs, mask).expand_as(logprobs)
        return ratio, clip_range(options.get("eps_low", GSPO_EPS_LOW), options.get("eps_high", GSPO_EPS_HIGH))
    ratio = torch.exp(logprobs - old_logprobs)
    return ratio, (clip_range(**options) if name == "clip" else None)


def takes_mask(fn: Surrogate) -> bool:
    """True when the surrogate declares the ``mask`` keyword, which ``policy_loss`` then fills in."""
    return "mask" in inspect.signature(fn).parameters


def clip_range(eps_low: float = DEFAULT_EPS_LOW, eps_high: float | None = None) -> tuple[float, float]:
    """``(1 − eps_low, 1 + eps_high)``, validated; ``eps_high=None`` means ``eps_low``."""
    eps_high = eps_low if eps_high is None else eps_high
    if not 0 < eps_low < 1:
        raise ValueError(f"eps_low={eps_low}: the lower clip range must lie in (0, 1); PPO uses 0.2")
    if not eps_high > 0:
        raise ValueError(f"eps_high={eps_high}: the upper clip range must be > 0; DAPO uses 0.28")
    return 1 - eps_low, 1 + eps_high


def check_surrogate_options(name: str, fn: Surrogate, options: dict[str, Any]) -> None:
    """Raise a ValueError naming an option the surrogate does not take, and the ones it does."""
    params = inspect.signature(fn).parameters
    accepted = [p for p, spec in params.items() if spec.kind is inspect.Parameter.KEYWORD_ONLY and p not in SUPPLIED]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"surrogate {name!r} has no option {unknown[0]!r}: its options are {', '.join(accepted) or '(none)'}"
        )


def _per_token(advantages: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    """Advantages ``[N]`` (or ``[N,1]``/``[N,T]``) broadcast to ``[N,T]``."""
    adv = advantages.to(logprobs.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(1)
    if adv.dim() != 2 or adv.shape[0] != logprobs.shape[0] or adv.shape[1] not in (1, logprobs.shape[1]):
        raise ValueError(
            f"advantages of shape {tuple(advantages.shape)} for log-probs {tuple(logprobs.shape)}: "
            "pass one advantage per sequence, [N]"
        )
    return adv


def _check_shapes(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> None:
    if logprobs.dim() != 2 or old_logprobs.shape != logprobs.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)} and old_logprobs {tuple(old_logprobs.shape)}: both must be "
            "[N, T] per-token log-probs of the same completions"
        )

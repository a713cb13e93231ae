"""Per-token surrogate objectives (as losses to minimise), behind ``SURROGATES``.

Signature: ``f(logprobs [N,T], old_logprobs [N,T], advantages [N], **opts) -> loss [N,T]``.
``logprobs`` carry the gradient; ``old_logprobs`` are those of the policy that sampled the
completions (detached). Padding is handled by the aggregation, not here.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from labelrl.registry import Registry

Surrogate = Callable[..., torch.Tensor]
SURROGATES: Registry[Surrogate] = Registry("surrogate")

DEFAULT_EPS_LOW = 0.2


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
    low, high = clip_range(eps_low, eps_high)
    adv = _per_token(advantages, logprobs)
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = torch.clamp(ratio, low, high)
    return -torch.min(ratio * adv, clipped * adv)


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
    accepted = [p for p, spec in params.items() if spec.kind is inspect.Parameter.KEYWORD_ONLY]
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

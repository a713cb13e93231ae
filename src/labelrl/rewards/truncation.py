"""What to do with completions that hit the token cap (``max_new_tokens``).

A truncated completion was cut off, so its parsed outcome says little about the answer the
model would have given. Three policies, behind the ``TRUNCATION_POLICIES`` registry:

* ``zero``: a truncated completion earns the failure reward, even when it parsed. It stays
  in the loss and in its group's baseline. Simple, and it teaches "finish within the cap".
* ``mask``: a truncated completion is left out of the loss (``loss_mask`` False), so it is
  neither pushed up nor down (DAPO's overlong filtering, Yu et al. 2025, §3.4). Its reward is
  its graded reward. ``mask_in_baseline`` (default False) decides whether that reward still
  counts in its group's baseline. Default False because "masked" means "outcome unknown": a
  cut-off completion's failure reward in the baseline would lower the baseline and hand its
  finished siblings a larger advantage, which is the length pressure the mask was chosen to
  remove. It also matches what TRL 1.16 does with a ``None`` reward (dropped from the group
  mean, advantage 0). Set True to reproduce verl's / TRL's ``mask_truncated_completions``,
  which mask the loss only.
* ``soft_penalty``: DAPO's overlong reward shaping (Yu et al. 2025, "DAPO", Eq. 13), added to
  every completion's reward, truncated or not::

      R_length(y) = 0                              if |y| ≤ L_max − L_cache
                  = ((L_max − L_cache) − |y|) / L_cache   if L_max − L_cache < |y| ≤ L_max
                  = −1                             if |y| > L_max

  with L_max = ``max_new_tokens`` and L_cache = ``cache_tokens``. As in DAPO (generation
  cap 20,480 = L_max, L_cache = 4,096), L_max is the cap itself, so the −1 branch is reached
  at |y| = L_max by the middle formula and beyond it only by lengths counted with extra
  tokens; it is kept so the function is total.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from labelrl.registry import Registry


@dataclass(frozen=True)
class TruncationResult:
    """Rewards after the policy, and which completions enter the loss and the baseline.

    rewards        # [N] reward per completion
    loss_mask      # [N] True: the completion's tokens enter the policy loss
    baseline_mask  # [N] True: the completion's reward enters its group's baseline
    """

    rewards: list[float]
    loss_mask: list[bool]
    baseline_mask: list[bool]


Policy = Callable[..., TruncationResult]
TRUNCATION_POLICIES: Registry[Policy] = Registry("truncation policy")


def overlong_penalty(length: int, max_new_tokens: int, cache_tokens: int) -> float:
    """DAPO Eq. 13 soft overlong punishment R_length(y) for a completion of ``length`` tokens."""
    _check_soft(max_new_tokens, cache_tokens)
    free = max_new_tokens - cache_tokens  # L_max − L_cache: lengths up to here are not penalised
    if length <= free:
        return 0.0
    if length <= max_new_tokens:
        return (free - length) / cache_tokens
    return -1.0


@TRUNCATION_POLICIES.register("zero")
def _zero(rewards, lengths, truncated, *, failure_rewards, **_options) -> TruncationResult:
    """Truncated → failure reward; every completion in loss and baseline."""
    out = [fail if cut else r for r, cut, fail in zip(rewards, truncated, failure_rewards)]
    n = len(out)
    return TruncationResult(out, [True] * n, [True] * n)


@TRUNCATION_POLICIES.register("mask")
def _mask(rewards, lengths, truncated, *, mask_in_baseline: bool = False, **_options) -> TruncationResult:
    """Truncated → out of the loss; in the baseline only when ``mask_in_baseline``."""
    loss_mask = [not cut for cut in truncated]
    baseline_mask = [True] * len(loss_mask) if mask_in_baseline else list(loss_mask)
    return TruncationResult([float(r) for r in rewards], loss_mask, baseline_mask)


@TRUNCATION_POLICIES.register("soft_penalty")
def _soft_penalty(rewards, lengths, truncated, *, max_new_tokens=None, cache_tokens=None, **_options) -> TruncationResult:
    """reward + R_length(|y|) (DAPO Eq. 13) for every completion; all in loss and baseline."""
    if lengths is None:
        raise ValueError("truncation policy 'soft_penalty' needs each completion's length in tokens; pass lengths")
    out = [float(r) + overlong_penalty(int(n), max_new_tokens, cache_tokens) for r, n in zip(rewards, lengths)]
    n = len(out)
    return TruncationResult(out, [True] * n, [True] * n)


def apply_truncation(
    rewards: Sequence[float],
    lengths: Sequence[int] | None,
    truncated: Sequence[bool],
    *,
    policy: str,
    failure_reward: float | Sequence[float],
    max_new_tokens: int | None = None,
    cache_tokens: int | None = None,
    mask_in_baseline: bool = False,
) -> TruncationResult:
    """Apply the named truncation policy to a batch of graded completions.

    rewards         # [N] graded rewards
    lengths         # [N] completion lengths in tokens (required by soft_penalty only)
    truncated       # [N] True when the completion hit the cap
    failure_reward  one value, or one per completion (per-class failure rewards)
    """
    fn = TRUNCATION_POLICIES.get(policy)
    n = len(rewards)
    if isinstance(failure_reward, (int, float)):
        failure_rewards = [float(failure_reward)] * n
    else:
        failure_rewards = [float(x) for x in failure_reward]
    sizes = {"rewards": n, "truncated": len(truncated), "failure_reward": len(failure_rewards)}
    if lengths is not None:
        sizes["lengths"] = len(lengths)
    if len(set(sizes.values())) != 1:
        raise ValueError(f"batch sizes differ {sizes}: pass one value per completion for each")
    return fn(
        list(rewards), None if lengths is None else list(lengths), [bool(t) for t in truncated],
        failure_rewards=failure_rewards, max_new_tokens=max_new_tokens,
        cache_tokens=cache_tokens, mask_in_baseline=mask_in_baseline,
    )


def _check_soft(max_new_tokens: int | None, cache_tokens: int | None) -> None:
    if max_new_tokens is None or max_new_tokens < 1:
        raise ValueError(
            f"max_new_tokens={max_new_tokens}: soft_penalty measures lengths against the token cap; pass a cap of 1 or more"
        )
    if cache_tokens is None or not 1 <= cache_tokens <= max_new_tokens:
        raise ValueError(
            f"cache_tokens={cache_tokens}: the soft-penalty ramp must span 1..max_new_tokens={max_new_tokens} tokens; "
            f"set --overlong-cache between 1 and {max_new_tokens}"
        )

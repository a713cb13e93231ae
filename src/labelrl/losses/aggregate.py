"""Reduce a per-token loss ``[N,T]`` to a scalar, behind ``AGGREGATIONS``.

Signature: ``f(per_token_loss [N,T], mask [N,T], *, max_len=None, group_size=None,
n_sequences=None, n_tokens=None) -> scalar``. ``mask`` is True (or 1) on real completion tokens.
``n_sequences`` / ``n_tokens`` override the batch's own counts in the denominators: the
trainer's skip rule drops groups whose advantages are all 0 before the forward pass, and
passes the full batch's counts so the loss equals the one over the whole batch. Padded positions are ignored even when
their loss is NaN or inf (``torch.where``, not multiplication), so padding never changes the
result. How each maps to TRL 1.16's ``GRPOTrainer._compute_loss`` ``loss_type``:

- ``seq_mean_token_mean`` = TRL ``grpo`` (per micro-batch, then ÷ gradient-accumulation steps).
- ``token_mean`` = TRL ``bnpo`` (tokens of the micro-batch) and TRL ``dapo`` (tokens of the whole
  generation batch across processes); the two agree when one micro-batch holds the whole
  generation batch, as in labelrl's trainer, which takes one loss over all kept groups.
- ``seq_mean_token_sum_norm`` = TRL ``dr_grpo`` with ``max_len = max_completion_length``.
"""

from __future__ import annotations

from typing import Callable

import torch

from labelrl.registry import Registry

Aggregation = Callable[..., torch.Tensor]
AGGREGATIONS: Registry[Aggregation] = Registry("aggregation")


@AGGREGATIONS.register("token_mean")
def token_mean(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    *,
    max_len: int | None = None,
    group_size: int | None = None,
    n_sequences: int | None = None,
    n_tokens: int | None = None,
) -> torch.Tensor:
    """``Σ_i Σ_t loss_it / Σ_i |o_i|``: every token of the batch weighs the same.

    DAPO's token-level policy-gradient loss (Yu et al. 2025, arXiv:2503.14476): long
    completions are not down-weighted per token, so their patterns are learned too. A
    sequence's weight still depends on the other sequences' lengths in the batch.
    """
    masked, mask = _masked(per_token_loss, mask, group_size)
    total = mask.sum() if n_tokens is None else torch.tensor(float(n_tokens))
    return masked.sum() / total.clamp(min=1)


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    *,
    max_len: int | None = None,
    group_size: int | None = None,
    n_sequences: int | None = None,
    n_tokens: int | None = None,
) -> torch.Tensor:
    """``1/N Σ_i (1/|o_i| Σ_t loss_it)``: the original GRPO objective.

    Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, Eq. 3. Dividing by |o_i| makes a
    token of a short correct answer weigh more than one of a long one, and a token of a long
    wrong answer weigh less (the "length bias" of Liu et al. 2025, arXiv:2503.20783). A
    sequence with no unmasked token adds 0 and still counts in N (as in TRL).
    """
    masked, mask = _masked(per_token_loss, mask, group_size)
    per_seq = masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return per_seq.sum() / (per_seq.shape[0] if n_sequences is None else n_sequences)


@AGGREGATIONS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    *,
    max_len: int | None = None,
    group_size: int | None = None,
    n_sequences: int | None = None,
    n_tokens: int | None = None,
) -> torch.Tensor:
    """``Σ_i Σ_t loss_it / (N · L_max)``: Dr. GRPO's length-unbiased sum.

    Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783: the
    normaliser is a constant, so no completion's tokens are re-weighted by its length.
    ``L_max = max_len`` (the generation cap, e.g. ``max_new_tokens``), else the mask width;
    pass ``max_len`` so the scale does not change with the longest completion of each batch.
    """
    masked, mask = _masked(per_token_loss, mask, group_size)
    width = mask.shape[1]
    if max_len is not None:
        longest = int(mask.sum(dim=1).max()) if mask.numel() else 0
        if max_len < 1 or longest > max_len:
            raise ValueError(
                f"max_len={max_len}: it must be ≥ 1 and ≥ the longest completion ({longest} tokens); "
                "pass the generation cap (max_new_tokens)"
            )
        width = max_len
    return masked.sum() / ((mask.shape[0] if n_sequences is None else n_sequences) * width)


def _masked(per_token_loss: torch.Tensor, mask: torch.Tensor, group_size: int | None):
    """Loss with padded positions set to 0, and the mask as the loss dtype."""
    if per_token_loss.dim() != 2 or mask.shape != per_token_loss.shape:
        raise ValueError(
            f"per_token_loss {tuple(per_token_loss.shape)} and mask {tuple(mask.shape)}: both must be [N, T]"
        )
    if group_size is not None and (group_size < 1 or per_token_loss.shape[0] % group_size):
        raise ValueError(
            f"{per_token_loss.shape[0]} sequences with group_size={group_size}: the sequences must be "
            "whole groups of group_size completions"
        )
    keep = mask.bool()
    masked = torch.where(keep, per_token_loss, torch.zeros_like(per_token_loss))
    return masked, keep.to(per_token_loss.dtype)

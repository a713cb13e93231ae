"""The SFT loss checks the packing tests share (imported as ``sft_checks`` by tests under tests/train)."""

from __future__ import annotations

import torch

from labelrl.train.packing import packed_layout
from labelrl.train.sft import sft_loss
from numerics import (
    assert_gradients_within, assert_values_within, gradient_bounds, gradient_chain_length, gradient_magnitudes,
    mean_logprob_bound,
)


def sft_loss_and_grads(model, items, *, pad: int, pack: bool, share_prefix: bool = False):
    """The loss, its gradients and their magnitudes (tests/numerics.py)."""
    model.zero_grad()
    with gradient_magnitudes(model) as magnitudes:
        loss = sft_loss(model, items, pad=pad, pack=pack, share_prefix=share_prefix)
        loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, magnitudes


def assert_packed_equals_padded_and_alone(model, items, *, pad: int) -> None:
    """Packed and padded layouts run other kernels: the loss agrees to the rounding bound of a
    mean of log-probs, each gradient tensor to γ_K·(‖M_packed‖ + ‖M_padded‖) (Frobenius), K the
    forward and backward chain over the longest item plus the padded layout's positions; and the
    packed loss equals the token-weighted mean of every item's loss alone (no padding, no
    neighbour) to the same loss bound. ``items`` must pack into fewer rows than items."""
    assert len(packed_layout([i.input_ids for i in items], [i.n_prompt for i in items], pad).input_ids) < len(items)
    packed, packed_grads, packed_magnitudes = sft_loss_and_grads(model, items, pad=pad, pack=True)
    padded, padded_grads, padded_magnitudes = sft_loss_and_grads(model, items, pad=pad, pack=False)
    longest, targets = max(len(it.input_ids) for it in items), [len(it.input_ids) - it.n_prompt for it in items]
    loss_bound = mean_logprob_bound(model, longest, sum(targets), float(padded))
    assert_values_within(packed, padded, loss_bound, "loss")
    chain = gradient_chain_length(model, longest, len(items) * longest)
    assert_gradients_within(packed_grads, padded_grads,
                            gradient_bounds([packed_magnitudes, padded_magnitudes], padded_grads, chain))
    with torch.no_grad():
        alone = [sft_loss(model, [item], pad=pad).item() for item in items]
    expected = sum(a * t for a, t in zip(alone, targets)) / sum(targets)
    assert abs(packed.item() - expected) <= loss_bound, (packed.item(), expected, loss_bound)

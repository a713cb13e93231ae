"""Packed SFT batches: first-fit decreasing rows, attention kept within each item (the packed
loss and gradients equal the padded layout's and each item's own forward), little padding."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from labelrl.train.packing import IGNORE, first_fit_decreasing, kept_positions, packed_layout, padded_layout
from labelrl.train.sft import SFTItem, sft_loss

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sft_checks import assert_packed_equals_padded_and_alone, sft_loss_and_grads  # noqa: E402
from numerics import (  # noqa: E402
    assert_gradients_within, assert_values_within, gradient_bounds, gradient_chain_length, mean_logprob_bound,
)


def test_first_fit_decreasing_reference_case():
    # longest first: 9 → row 0 (room 1); 6 → row 1 (room 4); 5 → row 2 (room 5);
    # 4 → row 1 (room 0); 3 → row 2 (room 2); 1 → row 0 (room 0); 2 → row 2 (room 0)
    assert first_fit_decreasing([3, 9, 1, 6, 5, 4, 2], 10) == [[1, 2], [3, 5], [4, 0, 6]]
    with pytest.raises(ValueError, match="item of 11 tokens does not fit rows of 10"):
        first_fit_decreasing([3, 11], 10)


def test_packed_layout_restarts_positions_and_labels_each_item():
    seqs, prompts = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10]], [3, 2, 1]
    layout = packed_layout(seqs, prompts, pad=0)
    # width 5: row 0 holds item 0; row 1 holds item 1 then item 2 (3 + 2 = 5 tokens)
    assert layout.input_ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]
    assert layout.attention_mask is None
    # position t predicts token t+1, for the target tokens only: item 0's 4 and 5 (from
    # positions 2, 3), item 1's 8 (position 1), item 2's 10 (position 3 of row 1)
    assert layout.labels.tolist() == [[IGNORE, IGNORE, 4, 5, IGNORE], [IGNORE, 8, IGNORE, 10, IGNORE]]
    assert layout.padding_share == 0.0 and kept_positions(layout.labels).tolist() == [1, 2, 3]
    padded = padded_layout(seqs, prompts, pad=0)
    assert padded.input_ids.shape == (3, 5) and padded.padding_share == pytest.approx(1 - 10 / 15)


def tiny_llama():
    """Weights large enough (init 0.2) that attention moves the loss, so a leak would show;
    tiny-random's small init leaves its predictions nearly uniform."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256, initializer_range=0.2)
    return LlamaForCausalLM(config)


def _items(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [SFTItem(torch.randint(3, 1000, (n,), generator=g).tolist(), n - t) for n, t in lengths]


def _loss_and_grads(model, items, pack):
    return sft_loss_and_grads(model, items, pad=0, pack=pack)


@pytest.mark.numerics
def test_packed_loss_and_gradients_equal_the_padded_layout_and_per_item_forwards():
    """Packed and padded layouts run other kernels: the loss agrees to the rounding bound of a
    mean of log-probs and each gradient tensor to γ_K·(‖M_packed‖ + ‖M_padded‖) (Frobenius),
    K the forward and backward chain over the longest item plus the padded layout's positions
    (tests/numerics.py)."""
    model = tiny_llama().train()
    # long-tailed: one long item, several short ones that share rows
    items = _items([(60, 4), (9, 3), (12, 5), (7, 2), (20, 6), (15, 3)])
    assert_packed_equals_padded_and_alone(model, items, pad=0)


@pytest.mark.numerics
def test_a_leak_across_packed_items_would_change_the_loss():
    # Guard for the test above: the same tokens packed as ONE item (positions not restarted,
    # so items attend to each other) give another loss, by more than the rounding bound that
    # test allows, so equality there is no accident.
    model = tiny_llama().eval()
    items = _items([(12, 3), (5, 2), (6, 3)], seed=1)  # width 12: the short two share a row
    layout = packed_layout([i.input_ids for i in items], [i.n_prompt for i in items], 0)
    leaked = packed_layout([i.input_ids for i in items], [i.n_prompt for i in items], 0)
    leaked.position_ids = torch.arange(leaked.input_ids.shape[1]).expand_as(leaked.input_ids).clone()
    with torch.no_grad():
        kept, mixed = sft_loss(model, layout, 0).item(), sft_loss(model, leaked, 0).item()
    bound = mean_logprob_bound(model, 12, sum(len(i.input_ids) - i.n_prompt for i in items), kept)
    assert abs(kept - mixed) > bound, (kept, mixed, bound)


# --- a prefix every item starts with, run once ----------------------------------------------

SYSTEM = list(range(500, 530))  # 30 tokens every prompt starts with


def _prefixed_items(seed=2):
    # prompts = SYSTEM + a few tokens of their own; targets of 2–5 tokens
    return [SFTItem(SYSTEM + it.input_ids, len(SYSTEM) + it.n_prompt)
            for it in _items([(9, 3), (4, 2), (14, 5), (6, 2), (11, 4)], seed=seed)]


def test_prefix_layout_runs_the_prefix_once_and_continues_positions():
    from labelrl.train.packing import prefix_layout

    seqs, prompts = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 7, 8]], [4, 4]
    layout = prefix_layout(seqs, prompts, pad=0, shared=3)
    assert layout.prefix == [1, 2, 3]
    assert layout.input_ids.tolist() == [[4, 5, 6], [0, 7, 8]]  # remainders, left-padded
    assert layout.attention_mask.tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 1, 1]]  # prefix, then row
    assert layout.position_ids.tolist() == [[3, 4, 5], [0, 3, 4]]
    assert layout.labels.tolist() == [[5, 6, IGNORE], [IGNORE, 8, IGNORE]]  # targets 5 6 and 8
    assert layout.slots == 3 + 6 and layout.real_tokens == 3 + 5
    with pytest.raises(ValueError, match="keep at least its last prompt token"):
        prefix_layout(seqs, prompts, pad=0, shared=4)


def test_batch_layout_shares_a_prefix_only_when_it_computes_less():
    from labelrl.train.sft import batch_layout

    items = _prefixed_items()
    shared = batch_layout(items, 0, pack=True, share_prefix=True)
    assert shared.prefix == SYSTEM and shared.slots < batch_layout(items, 0, pack=True).slots
    assert batch_layout(items, 0, pack=True, share_prefix=False).prefix is None
    # one long item among short ones: its padded remainder row would cost more than packing
    long_tail = items + [SFTItem(SYSTEM + list(range(3, 400)), len(SYSTEM) + 390)]
    assert batch_layout(long_tail, 0, pack=True, share_prefix=True).prefix is None


@pytest.mark.numerics
def test_prefix_layout_loss_and_gradients_equal_the_padded_layout():
    """The prefix pass with its cache kept for the rows against one padded row per item: the
    same rounding bounds as packed against padded (tests/sft_checks.py)."""
    model = tiny_llama().train()
    items = _prefixed_items()
    layout = batch_layout_of(items)
    assert layout.prefix == SYSTEM  # the route under test ran
    shared, shared_grads, shared_magnitudes = sft_loss_and_grads(model, items, pad=0, pack=True, share_prefix=True)
    padded, padded_grads, padded_magnitudes = _loss_and_grads(model, items, pack=False)
    longest, targets = max(len(it.input_ids) for it in items), [len(it.input_ids) - it.n_prompt for it in items]
    assert_values_within(shared, padded, mean_logprob_bound(model, longest, sum(targets), float(padded)), "loss")
    chain = gradient_chain_length(model, longest, len(items) * longest)
    assert_gradients_within(shared_grads, padded_grads,
                            gradient_bounds([shared_magnitudes, padded_magnitudes], padded_grads, chain))
    # the prefix's tokens get gradient (through the one prefix pass)
    assert shared_grads["model.embed_tokens.weight"][SYSTEM[0]].abs().sum() > 0


def batch_layout_of(items):
    from labelrl.train.sft import batch_layout

    return batch_layout(items, 0, pack=True, share_prefix=True)

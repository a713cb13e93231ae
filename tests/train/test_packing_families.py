"""SFT batches on the built-in Qwen2, Qwen3 and Gemma 3 models: the packed layout (items side by
side in a row, told apart by restarting positions) gives the padded layout's loss and gradients
and each item's own loss; Gemma 3's sliding layer (window 4) must keep its window within an
item. In bf16 the loss stays close to fp32."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from labelrl.models import load_model
from labelrl.train.packing import packed_layout
from labelrl.train.sft import SFTItem, sft_loss

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sft_checks import assert_packed_equals_padded_and_alone, sft_loss_and_grads  # noqa: E402
from numerics import assert_gradients_within, gradient_bounds, gradient_chain_length  # noqa: E402

PAD = 2  # the SmolLM2 tokenizer's pad (= eos) id


@pytest.fixture(scope="module", params=["tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def family(request):
    return load_model(request.param)[0]


def _items(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [SFTItem(torch.randint(3, 40000, (n,), generator=g).tolist(), n - t) for n, t in lengths]


def _loss_and_grads(model, items, pack):
    return sft_loss_and_grads(model, items, pad=PAD, pack=pack)


@pytest.mark.numerics
def test_family_packed_loss_and_gradients_equal_padded_and_per_item(family):
    """Tolerances derived in tests/numerics.py, as for Llama in tests/train/test_packing.py:
    the mean of log-probs' rounding bound for the losses, γ_K·(‖M_packed‖ + ‖M_padded‖) per
    gradient tensor (the bound counts the 49k-token vocabulary twice)."""
    model = family.train()
    items = _items([(30, 4), (9, 3), (12, 5), (7, 2), (20, 6), (15, 3)])
    assert_packed_equals_padded_and_alone(model, items, pad=PAD)


@pytest.mark.numerics
def test_family_packed_items_do_not_see_each_other(family):
    # Guard for the test above, as tests/train/test_packing.py does for Llama: the same rows with
    # positions not restarted (one long item per row) give another loss, and gradients farther
    # apart than the rounding bound that test allows. The loss alone would not show it: these
    # near-random models move it by less than its bound (Qwen2: 7e-4 against 7e-3, the
    # 49k-term logsumexp's worst case), so the gradients are what catch a leak.
    items = _items([(12, 3), (5, 2), (6, 3)], seed=1)
    layout = packed_layout([i.input_ids for i in items], [i.n_prompt for i in items], PAD)
    leaked = packed_layout([i.input_ids for i in items], [i.n_prompt for i in items], PAD)
    leaked.position_ids = torch.arange(leaked.input_ids.shape[1]).expand_as(leaked.input_ids).clone()
    model = family.train()
    kept, kept_grads, kept_magnitudes = _loss_and_grads(model, layout, pack=True)
    mixed, mixed_grads, mixed_magnitudes = _loss_and_grads(model, leaked, pack=True)
    assert abs(kept.item() - mixed.item()) > 1e-4
    chain = gradient_chain_length(model, 12, len(items) * 12)
    with pytest.raises(AssertionError, match="rounding bound"):
        assert_gradients_within(mixed_grads, kept_grads,
                                gradient_bounds([kept_magnitudes, mixed_magnitudes], kept_grads, chain))


def test_family_sft_loss_in_bf16_is_close_to_fp32_and_not_equal(family):
    items = _items([(12, 3), (20, 5), (7, 2)], seed=2)
    with torch.no_grad():
        fp32 = sft_loss(family.eval(), items, PAD, torch.float32).item()
        bf16 = sft_loss(family, items, PAD, torch.bfloat16).item()
    assert bf16 != fp32 and abs(bf16 - fp32) < 0.02 * fp32

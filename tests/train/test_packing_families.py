"""SFT batches on the built-in Qwen2, Qwen3 and Gemma 3 models: the packed layout (items side by
side in a row, told apart by restarting positions) gives the padded layout's loss and gradients
and each item's own loss; Gemma 3's sliding layer (window 4) must keep its window within an
item. In bf16 the loss stays close to fp32."""

from __future__ import annotations

import pytest
import torch

from labelrl.models import load_model
from labelrl.train.packing import packed_layout
from labelrl.train.sft import SFTItem, sft_loss

PAD = 2  # the SmolLM2 tokenizer's pad (= eos) id


@pytest.fixture(scope="module", params=["tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def family(request):
    return load_model(request.param)[0]


def _items(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [SFTItem(torch.randint(3, 40000, (n,), generator=g).tolist(), n - t) for n, t in lengths]


def _loss_and_grads(model, items, pack):
    model.zero_grad()
    loss = sft_loss(model, items, pad=PAD, pack=pack)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_family_packed_loss_and_gradients_equal_padded_and_per_item(family):
    model = family.train()
    items = _items([(30, 4), (9, 3), (12, 5), (7, 2), (20, 6), (15, 3)])
    assert len(packed_layout([i.input_ids for i in items], [i.n_prompt for i in items], PAD).input_ids) < len(items)
    packed, packed_grads = _loss_and_grads(model, items, pack=True)
    padded, padded_grads = _loss_and_grads(model, items, pack=False)
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)
    assert packed_grads.keys() == padded_grads.keys()
    for name in padded_grads:  # relative to each tensor's largest entry: 49k-token sums round differently
        scale = padded_grads[name].abs().max().clamp(min=1e-12)
        assert (packed_grads[name] - padded_grads[name]).abs().max() / scale < 1e-4, name
    with torch.no_grad():
        alone = [sft_loss(model, [item], pad=PAD).item() for item in items]
    targets = [len(item.input_ids) - item.n_prompt for item in items]
    assert packed.item() == pytest.approx(sum(a * t for a, t in zip(alone, targets)) / sum(targets), abs=1e-5)


def test_family_packed_items_do_not_see_each_other(family):
    # Guard for the test above, as tests/train/test_packing.py does for Llama: the same rows with
    # positions not restarted (one long item per row) give another loss.
    items = _items([(12, 3), (5, 2), (6, 3)], seed=1)
    layout = packed_layout([i.input_ids for i in items], [i.n_prompt for i in items], PAD)
    leaked = packed_layout([i.input_ids for i in items], [i.n_prompt for i in items], PAD)
    leaked.position_ids = torch.arange(leaked.input_ids.shape[1]).expand_as(leaked.input_ids).clone()
    with torch.no_grad():
        assert abs(sft_loss(family.eval(), layout, PAD).item() - sft_loss(family, leaked, PAD).item()) > 1e-4


def test_family_sft_loss_in_bf16_is_close_to_fp32_and_not_equal(family):
    items = _items([(12, 3), (20, 5), (7, 2)], seed=2)
    with torch.no_grad():
        fp32 = sft_loss(family.eval(), items, PAD, torch.float32).item()
        bf16 = sft_loss(family, items, PAD, torch.bfloat16).item()
    assert bf16 != fp32 and abs(bf16 - fp32) < 0.02 * fp32

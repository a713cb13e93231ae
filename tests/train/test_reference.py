"""The KL reference is the model the RL run started from: with an SFT adapter, that adapter."""

from __future__ import annotations

import pytest
import torch

from labelrl import metrics_keys as K
from labelrl.fileio import read_jsonl
from labelrl.models.prepare import prepare_model
from labelrl.train import rl
from labelrl.train.reference import ReferenceWeights


@pytest.fixture(scope="module")
def sft_adapter(tmp_path_factory, toy_data, warm_model):
    """An SFT LoRA adapter on the warm-started tiny model (which answers in the format, so RL's
    groups get mixed rewards): its lora_B is no longer zero."""
    from labelrl.train.config import SFTConfig
    from labelrl.train.sft import run_sft

    out = tmp_path_factory.mktemp("sft_lora") / "run"
    run_sft(SFTConfig(model=str(warm_model), data=str(toy_data), out=out, lora=True, learning_rate=1e-2, max_steps=6,
                      batch_size=8, eval_every=6, quiet=True))
    return out


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_the_reference_is_the_sft_adapter_not_the_base_and_training_weights_come_back(sft_adapter, rl_config, toy_data, tmp_path):
    cfg = rl_config(sft_adapter, toy_data, tmp_path / "rl", lora=True, beta=0.1)
    model, _ = prepare_model(cfg)
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    start = _logits(model, ids)
    with model.disable_adapter():
        base = _logits(model, ids)
    assert (start - base).abs().max() > 1e-3  # the SFT adapter changes the model, else nothing below is shown
    reference = ReferenceWeights(model)
    with torch.no_grad():  # a training step moves the adapter
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    moved = _logits(model, ids)
    assert (moved - start).abs().max() > 1e-3
    with reference.active(model):
        # the starting model exactly (the same weights, the same kernels): the SFT adapter, not the base
        assert torch.equal(_logits(model, ids), start)
    assert torch.equal(_logits(model, ids), moved)  # the trained weights are back, bit for bit


def test_kl_is_zero_before_the_first_update_and_positive_after(sft_adapter, rl_config, toy_data, tmp_path):
    # Step 1's loss is computed before any update, so π_θ = π_ref and k3 = 0 on every token; a
    # reference taken with the adapter switched off (the model before SFT) gives KL > 0 here.
    cfg = rl_config(sft_adapter, toy_data, tmp_path / "rl", lora=True, beta=0.1, steps=2, prompts_per_step=2,
                    group_size=4, learning_rate=5e-2)
    rl.run_rl(cfg)
    records = read_jsonl(tmp_path / "rl" / "metrics.jsonl")
    assert [r[K.STEP] for r in records] == [1, 2]
    assert records[0][K.KL] == 0.0
    assert records[1][K.KL] > 0.0  # after one update the policy has left its reference


def test_beta_without_lora_names_the_fix(tmp_path):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="--beta > 0 needs a reference model.*add --lora, or set --beta 0"):
        ReferenceWeights(model)

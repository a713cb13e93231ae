"""bf16 in the trainers: the on-policy importance ratio stays exactly 1, the resolved precision
reaches the sampler and the training pass and is recorded, and SFT's loss in bf16 stays
close to fp32."""

from __future__ import annotations

import pytest
import torch

from labelrl.train import rl
from labelrl.train import rl_parts as parts


@pytest.fixture
def bf16_run(toy_data, rl_config, tmp_path):
    # the raw tiny-random model: its next-token distributions are spread out, so bf16 rounding
    # shows in its log-probs (a warm-started model answers with log-probs ≈ 0)
    cfg = rl_config("tiny-random", toy_data, tmp_path / "run", precision="bf16", prompts_per_step=4, group_size=4,
                    max_new_tokens=8, lora=True, skip_uninformative=False)
    run = rl.start_run(cfg)
    yield run
    run.accelerator.end_training()


def test_on_policy_single_epoch_ratio_is_exactly_one_in_bf16(bf16_run, monkeypatch):
    run = bf16_run
    assert run.dtype == torch.bfloat16
    seen = {}
    sampler = run.sampler

    def recording_sampler(*args, **kwargs):
        seen["sampler_dtype"] = kwargs["dtype"]
        seen["rollout"] = sampler(*args, **kwargs)
        return seen["rollout"]

    run.sampler = recording_sampler
    batch = rl.sample_groups_for_step(run)
    assert seen["sampler_dtype"] == torch.bfloat16

    def recording_loss(logprobs, old, *args, **kwargs):
        seen["logprobs"], seen["old"] = logprobs.detach(), old
        return real_loss(logprobs, old, *args, **kwargs)

    real_loss = parts.policy_loss
    monkeypatch.setattr(parts, "policy_loss", recording_loss)
    keep = list(range(len(batch.prompt_ids)))
    normaliser = parts.loss_normaliser(batch, None, run.cfg.group_size)
    parts.policy_loss_for_groups(run, batch, keep, None, normaliser)
    mask = seen["logprobs"] != 0
    ratio = torch.exp(seen["logprobs"] - seen["old"])
    assert torch.equal(ratio[mask], torch.ones_like(ratio[mask]))  # exactly, not to a tolerance
    # The sampler's own bf16 log-probs differ from the training pass's (other kernels, other
    # rounding orders; about 1e-4 here, both adding the adapter's update in fp32): a ratio
    # taken against them would not be exactly 1, which is why the trainer never uses them.
    sampled = torch.zeros_like(seen["logprobs"])
    for row, values in enumerate(seen["rollout"].logprobs):
        sampled[row, : len(values)] = torch.tensor(values)
    assert (sampled - seen["logprobs"])[mask].abs().max() > 0


def test_rl_run_records_its_resolved_precision(warm_model, toy_data, rl_config, tmp_path):
    summary = rl.run_rl(rl_config(warm_model, toy_data, tmp_path / "run", steps=1, prompts_per_step=2, group_size=2,
                                  precision="fp32"))
    assert summary["precision"] == "fp32"


def test_sft_loss_in_bf16_is_close_to_fp32_and_not_equal():
    from labelrl.models import load_model
    from labelrl.train.sft import SFTItem, sft_loss

    model, tokenizer = load_model("tiny-random")
    torch.manual_seed(0)
    items = [SFTItem(torch.randint(3, 1000, (n,)).tolist(), n - 3) for n in (12, 20, 7)]
    pad = tokenizer.pad_token_id
    with torch.no_grad():
        fp32 = sft_loss(model, items, pad, torch.float32).item()
        bf16 = sft_loss(model, items, pad, torch.bfloat16).item()
    assert bf16 != fp32 and abs(bf16 - fp32) < 0.02 * fp32

"""Named steps of the RL loop that can be pinned without a model."""

from __future__ import annotations

import torch

from labelrl.train import rl_parts as parts


def _batch(informative: list[bool], offset: int) -> parts.StepBatch:
    B, G = len(informative), 2
    return parts.StepBatch(
        example_index=list(range(offset, offset + B)), group_labels=["yes"] * B, prompt_ids=[[1, 2]] * B,
        completion_ids=[[3]] * (B * G), texts=["x"] * (B * G), truncated=[False] * (B * G), graded=[None] * (B * G),
        rewards=torch.zeros(B * G, dtype=torch.float64), loss_mask=torch.ones(B * G, dtype=torch.bool),
        advantages=torch.zeros(B * G, dtype=torch.float64), informative=torch.tensor(informative),
        uniform=~torch.tensor(informative), new_tokens=B * G, sample_seconds=1.0,
    )


def test_dynamic_sampling_keeps_the_first_b_informative_groups_across_rounds():
    # round 1: one informative group of 2; round 2: two more; B = 2 → the second round's
    # last informative group is sampled and logged but not trained on.
    joined = parts.concat_batches([_batch([True, False], 0), _batch([True, True], 2)], limit_informative=2)
    assert joined.informative.tolist() == [True, False, True, False]
    assert joined.example_index == [0, 1, 2, 3] and len(joined.completion_ids) == 8
    assert joined.new_tokens == 8 and joined.sample_seconds == 2.0


def test_loss_normaliser_counts_unmasked_tokens_of_the_chosen_groups():
    batch = _batch([True, False, True], 0)
    batch.completion_ids = [[1, 2, 3], [4], [5, 6], [7], [8, 9], [1]]
    batch.loss_mask = torch.tensor([True, True, True, True, False, True])
    assert parts.loss_normaliser(batch, None, 2) == {"n_sequences": 6, "n_tokens": 3 + 1 + 2 + 1 + 1}
    assert parts.loss_normaliser(batch, [0, 2], 2) == {"n_sequences": 4, "n_tokens": 3 + 1 + 1}


def test_step_seed_is_a_fixed_formula_of_seed_step_and_round():
    # Pinned by hand, so a resumed run (another process, another day) draws the same seed:
    # (seed·1 000 003 + step·1 009 + round) mod (2³¹ − 1)
    assert parts.step_seed(0, 5, 1) == 5 * 1_009 + 1 == 5046
    assert parts.step_seed(3, 2, 0) == 3 * 1_000_003 + 2 * 1_009 == 3_002_027
    # 5000·1 000 003 = 5 000 015 000 = 2·2 147 483 647 + 705 047 706: the modulus wraps it
    assert parts.step_seed(5000, 0, 0) == 705_047_706
    assert len({parts.step_seed(s, t, r) for s in range(3) for t in range(50) for r in range(3)}) == 450

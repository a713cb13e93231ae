"""Dynamic sampling (DAPO): groups found beyond the B the step needs are logged, never trained on,
whatever the skip rule and β."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from labelrl import metrics_keys as K
from labelrl.train import rl
from labelrl.train import rl_parts as parts

G = 2


def batch(advantages: list[float], offset: int) -> parts.StepBatch:
    B = len(advantages) // G
    adv = torch.tensor(advantages, dtype=torch.float64)
    return parts.StepBatch(
        example_index=list(range(offset, offset + B)), group_labels=["yes"] * B, prompt_ids=[[1, 2]] * B,
        completion_ids=[[3, 4]] * (B * G), texts=["x"] * (B * G), truncated=[False] * (B * G), graded=[None] * (B * G),
        rewards=adv.clone(), loss_mask=torch.ones(B * G, dtype=torch.bool), advantages=adv,
        informative=(adv.view(-1, G) != 0).any(dim=1), uniform=(adv.view(-1, G) == 0).all(dim=1),
        new_tokens=B * G * 2, sample_seconds=1.0,
    )


def joined() -> parts.StepBatch:
    # round 1: groups 0 (informative) and 1 (uniform); round 2: groups 2 and 3 (both informative).
    # B = 2: groups 0 and 2 are the step's batch; group 3 is a leftover.
    return parts.concat_batches([batch([0.5, -0.5, 0.0, 0.0], 0), batch([1.0, -1.0, 0.25, -0.25], 2)], limit_informative=2)


def test_leftover_groups_get_zero_advantage():
    out = joined()
    assert out.informative.tolist() == [True, False, True, False]
    # the leftover's advantages were ±0.25: now 0, so no loss term can train on it
    assert out.advantages.tolist() == [0.5, -0.5, 0.0, 0.0, 1.0, -1.0, 0.0, 0.0]


def fake_run(*, skip: bool, beta: float, dynamic: bool) -> SimpleNamespace:
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    return SimpleNamespace(
        cfg=SimpleNamespace(skip_uninformative=skip, beta=beta, group_size=G, max_nonfinite=3),
        algo=SimpleNamespace(dynamic_sampling=dynamic), accelerator=SimpleNamespace(num_processes=1, process_index=0),
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0), nonfinite_in_row=0, step=0)


def trained_groups(monkeypatch, run, step_batch) -> tuple[list[int], dict]:
    seen = {}

    def fake_optimise(run, batch, groups, normaliser, weight):
        seen.update(groups=groups, normaliser=normaliser)
        return {K.LOSS: 0.0, K.GRAD_NORM: 0.0, K.KL: 0.0, K.NONFINITE_SKIPPED: 0}

    monkeypatch.setattr(rl, "optimise", fake_optimise)
    rl.update_policy(run, step_batch)
    return seen["groups"], seen["normaliser"]


def test_with_beta_and_the_skip_rule_off_only_the_step_batch_is_trained(monkeypatch):
    for skip, beta in ((False, 0.0), (True, 0.1), (False, 0.1)):
        groups, normaliser = trained_groups(monkeypatch, fake_run(skip=skip, beta=beta, dynamic=True), joined())
        assert groups == [0, 2], (skip, beta)
        # the loss divides by the step batch's counts: 2 groups × G completions of 2 tokens
        assert normaliser == {"n_sequences": 4, "n_tokens": 8}


def test_without_dynamic_sampling_beta_still_trains_every_group(monkeypatch):
    # uniform groups carry the KL term when β > 0, so nothing is skipped
    single = batch([0.5, -0.5, 0.0, 0.0], 0)
    groups, normaliser = trained_groups(monkeypatch, fake_run(skip=True, beta=0.1, dynamic=False), single)
    assert groups == [0, 1] and normaliser == {"n_sequences": 4, "n_tokens": 8}
    groups, _ = trained_groups(monkeypatch, fake_run(skip=True, beta=0.0, dynamic=False), single)
    assert groups == [0]

"""The optimizer every trainer builds (``labelrl.train.setup.make_optimizer``)."""

from __future__ import annotations

import pytest
import torch

from labelrl.train.config import ModelOptions
from labelrl.train.setup import make_optimizer

STEPS, LR = 5, 1e-3


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))


def run_adamw(fused: bool | None, tmp_path) -> list[torch.Tensor]:
    model = small_model()
    if fused is None:  # labelrl's choice
        optimizer, _ = make_optimizer(model, ModelOptions(out=tmp_path, learning_rate=LR), 1)  # 1 step: no warm-up
        assert optimizer.param_groups[0]["fused"] is True  # on CPU, torch's fused kernel
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, fused=fused, foreach=False)
    data = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    for _ in range(STEPS):
        optimizer.zero_grad()
        model(data).square().mean().backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def test_the_fused_adamw_gives_the_per_tensor_update_up_to_rounding(tmp_path):
    # Both compute p ← p − lr·(m̂/(√v̂ + ε) + λp) (Loshchilov & Hutter 2019, Alg. 2) with the
    # same moments; only the order of about ten fp32 operations per element differs, so each
    # step may move an element by a few units of rounding of |p| + lr (an Adam step is at most
    # about lr), and the steps add up: |Δ| ≤ steps · 16 · u · (|p| + lr), u = 2⁻²⁴.
    ours, reference = run_adamw(None, tmp_path), run_adamw(False, tmp_path)
    unit = 2.0 ** -24
    for a, b in zip(ours, reference):
        assert (a - b).abs().le(STEPS * 16 * unit * (b.abs() + LR)).all()
    assert all(not torch.equal(a, p0) for a, p0 in zip(ours, small_model().parameters()))  # it did train


def test_parameters_on_a_device_without_the_fused_kernel_get_torchs_default(monkeypatch, tmp_path):
    import labelrl.train.setup as setup

    monkeypatch.setattr(setup, "FUSED_ADAMW_DEVICES", ("cuda",))  # as if this CPU had none
    model = torch.nn.Linear(4, 2)
    optimizer, _ = make_optimizer(model, ModelOptions(out=tmp_path), 10)
    assert not optimizer.param_groups[0]["fused"]


def rates(schedule: str, total: int, tmp_path) -> list[float]:
    optimizer, scheduler = make_optimizer(torch.nn.Linear(4, 2), ModelOptions(out=tmp_path, learning_rate=LR, lr_schedule=schedule), total)
    seen = []
    for _ in range(total):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return seen


def test_the_constant_schedule_holds_the_rate_after_its_warm_up(tmp_path):
    # 40 steps: a warm-up of ceil(0.05 · 40) = 2 steps, LR/2 then LR, then LR to the end.
    assert rates("constant", 40, tmp_path) == pytest.approx([LR / 2] + [LR] * 39)


def test_the_linear_schedule_decays_to_one_step_short_of_zero(tmp_path):
    # 40 steps, warm-up 2: LR/2, LR, then LR·(40 − s)/39 for s = 2..39, so the last step takes
    # LR/39 and each step after the warm-up takes LR/39 less than the one before.
    seen = rates("linear", 40, tmp_path)
    assert seen[:2] == pytest.approx([LR / 2, LR])
    assert seen[2:] == pytest.approx([LR * (40 - s) / 39 for s in range(2, 40)])
    assert seen[-1] == pytest.approx(LR / 39) and min(seen) > 0


def test_a_resumed_linear_schedule_continues_where_it_stopped(tmp_path):
    optimizer, scheduler = make_optimizer(torch.nn.Linear(4, 2), ModelOptions(out=tmp_path, learning_rate=LR, lr_schedule="linear"), 40)
    for _ in range(17):
        optimizer.step()
        scheduler.step()
    # What a checkpoint keeps (labelrl.train.checkpoint): both states, loaded into a fresh pair.
    optimizer2, scheduler2 = make_optimizer(torch.nn.Linear(4, 2), ModelOptions(out=tmp_path, learning_rate=LR, lr_schedule="linear"), 40)
    optimizer2.load_state_dict(optimizer.state_dict())
    scheduler2.load_state_dict(scheduler.state_dict())
    assert optimizer2.param_groups[0]["lr"] == pytest.approx(LR * (40 - 17) / 39)
    optimizer2.step()
    scheduler2.step()
    assert optimizer2.param_groups[0]["lr"] == pytest.approx(LR * (40 - 18) / 39)


if __name__ == "__main__":
    pytest.main([__file__])

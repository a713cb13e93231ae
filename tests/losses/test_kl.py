"""KL estimators k1, k2, k3 (Schulman 2020)."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labelrl.losses import KL_ESTIMATORS
from labelrl.losses.kl import k1, k2, k3


def test_k3_reference_value():
    # log ρ = ref − logp = ln 2 → k3 = 2 − ln 2 − 1 = 0.306853
    logp = torch.tensor([[-math.log(2.0)]])
    ref = torch.tensor([[0.0]])
    torch.testing.assert_close(k3(logp, ref), torch.tensor([[1.0 - math.log(2.0)]]))
    # k1 = logp − ref = −ln 2; k2 = ½ (ln 2)² = 0.240227
    torch.testing.assert_close(k1(logp, ref), torch.tensor([[-math.log(2.0)]]))
    torch.testing.assert_close(k2(logp, ref), torch.tensor([[0.5 * math.log(2.0) ** 2]]))


def test_k3_is_zero_when_policies_agree():
    logp = torch.tensor([[-0.3, -2.0]])
    assert torch.equal(k3(logp, logp), torch.zeros(1, 2))


@settings(max_examples=100, deadline=None)
@given(st.floats(-20, 0), st.floats(-20, 0))
def test_property_k3_is_non_negative(logp, ref):
    assert k3(torch.tensor([[logp]], dtype=torch.float64), torch.tensor([[ref]], dtype=torch.float64)).item() >= 0


def test_k1_and_k3_are_unbiased_for_kl():
    # samples x ~ p; E_p[k(x)] = KL(p ‖ q) for k1 and k3 (Schulman 2020)
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    exact = float((p * (p / q).log()).sum())  # 0.274887
    gen = torch.Generator().manual_seed(0)
    x = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    logp, logq = p.log()[x].unsqueeze(0), q.log()[x].unsqueeze(0)
    assert abs(float(k3(logp, logq).mean()) - exact) < 0.005
    assert abs(float(k1(logp, logq).mean()) - exact) < 0.01


def test_registry_names():
    assert KL_ESTIMATORS.names() == ["k1", "k2", "k3"]

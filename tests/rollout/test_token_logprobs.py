"""Log-probs from the hidden states read through the vocabulary in slices
(``labelrl.rollout.token_logprobs``): the log-softmax's values and gradients, against fp64, for
any slice width; nothing vocabulary-wide saved for backward.

Bounds (tests/numerics.py's rule, first order in u): a logit z_v = h·w_v + b_v is a dot
product of H terms, off by at most γ_H·L with L = max_v (|h|·|w_v| + |b_v|); an exponent's
argument z_v − m by twice that plus u·2L; the normaliser Σ exp(z_v − m) adds V positive terms
and rescales twice per slice, a relative error of γ_{V+2S} more (S slices); the log and the
two subtractions round u·(log V + 2L + 1). So a log-prob is within
3·γ_H·L + 4·u·L + γ_{V+2S} + u·(2·log V + 1) of the exact one. Its gradient w_t − Σ_v p_v·w_v
carries p's relative error and the same V-term accumulation: entrywise within
(2·γ_H·L + 2·u·L + 2·γ_{V+2S} + 4u)·(|w_t| + Σ_v p_v·|w_v|) times the incoming gradient.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from labelrl.rollout import token_logprobs as module
from labelrl.rollout.token_logprobs import token_logprobs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numerics import gamma, unit_roundoff  # noqa: E402

ROWS, HIDDEN, VOCAB = 37, 24, 3001


def inputs(seed: int = 0, bias: bool = True):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(ROWS, HIDDEN, generator=generator) * 2
    weight = torch.randn(VOCAB, HIDDEN, generator=generator) * 0.7
    b = torch.randn(VOCAB, generator=generator) if bias else None
    targets = torch.randint(0, VOCAB, (ROWS,), generator=generator)
    targets[:3] = torch.tensor([0, VOCAB - 1, VOCAB // 2])  # the first and last slice, and the middle
    return hidden, weight, b, targets


def exact(hidden, weight, bias, targets, incoming):
    """fp64 log-probs and their gradient with respect to the hidden states."""
    h = hidden.double().requires_grad_()
    logits = h @ weight.double().t() + (0 if bias is None else bias.double())
    values = torch.log_softmax(logits, dim=-1).gather(1, targets[:, None]).squeeze(1)
    values.backward(incoming.double())
    return values.detach(), h.grad, torch.softmax(logits.detach(), dim=-1)


@pytest.mark.parametrize("width", [1, 100, 1024, VOCAB])
@pytest.mark.parametrize("bias", [True, False])
def test_values_and_gradients_are_the_log_softmax_at_any_slice_width(width, bias, monkeypatch):
    monkeypatch.setattr(module, "MIN_SLICE", 1)
    monkeypatch.setattr(module, "SLICE_BYTES", 4 * ROWS * width)  # slices of `width` columns
    assert module._slice_width(ROWS, VOCAB) == min(width, VOCAB)
    hidden, weight, b, targets = inputs(bias=bias)
    incoming = torch.randn(ROWS, generator=torch.Generator().manual_seed(1))
    h = hidden.clone().requires_grad_()
    values = token_logprobs(h, weight, b, targets)
    values.backward(incoming)
    expected, expected_grad, probs = exact(hidden, weight, b, targets, incoming)

    slices = math.ceil(VOCAB / min(width, VOCAB))
    magnitude = float((hidden.abs().double() @ weight.abs().double().t() + (0 if b is None else b.abs().double())).max())
    u, dot, normaliser = unit_roundoff(torch.float32), gamma(HIDDEN, torch.float32), gamma(VOCAB + 2 * slices, torch.float32)
    value_bound = 3 * dot * magnitude + 4 * u * magnitude + normaliser + u * (2 * math.log(VOCAB) + 1)
    assert values.dtype == torch.float32 and values.shape == (ROWS,)
    assert (values.double() - expected).abs().max() <= value_bound
    direction = weight.abs().double()[targets] + probs @ weight.abs().double()
    gradient_bound = (2 * dot * magnitude + 2 * u * magnitude + 2 * normaliser + 4 * u) * direction
    assert ((h.grad.double() - expected_grad).abs() <= gradient_bound * incoming.abs().double()[:, None]).all()
    # tight enough that a slice lost or a running maximum not rescaled (errors of order width/V) shows
    assert value_bound < 1e-3


def test_only_a_hidden_wide_vector_per_row_is_saved_for_backward():
    hidden, weight, b, targets = inputs()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        token_logprobs(hidden.clone().requires_grad_(), weight, b, targets)
    assert saved == [torch.Size([ROWS, HIDDEN])]


def test_a_projection_that_trains_is_refused():
    hidden, weight, b, targets = inputs()
    with pytest.raises(ValueError, match="no gradient"):
        token_logprobs(hidden, weight.requires_grad_(), b, targets)


@pytest.mark.parametrize("width", [1, 100, VOCAB])
@pytest.mark.parametrize("bias", [True, False])
def test_the_entropy_is_the_softmax_s_at_any_slice_width_and_carries_no_gradient(width, bias, monkeypatch):
    monkeypatch.setattr(module, "MIN_SLICE", 1)
    monkeypatch.setattr(module, "SLICE_BYTES", 4 * ROWS * width)
    hidden, weight, b, targets = inputs(bias=bias)
    h = hidden.clone().requires_grad_()
    values, entropy = token_logprobs(h, weight, b, targets, with_entropy=True)
    logits = hidden.double() @ weight.double().t() + (0 if b is None else b.double())
    exact = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)  # −Σ p log p, fp64
    # H = normaliser − h·E_p[w] − E_p[b]: the normaliser's bound, and the expected row and bias
    # (V-term sums with the normaliser's rescalings, relative error γ_{V+2S} of E_p[|h|·|w_v| + |b_v|])
    # dotted with h (γ_H of the same); L bounds every logit, as in the log-probs' bound above
    terms = hidden.abs().double() @ weight.abs().double().t() + (0 if b is None else b.abs().double())
    magnitude, expected_terms = float(terms.max()), float((torch.softmax(logits, -1) * terms).sum(-1).max())
    slices = math.ceil(VOCAB / min(width, VOCAB))
    u, accumulate = unit_roundoff(torch.float32), gamma(VOCAB + 2 * slices, torch.float32)
    bound = (3 * gamma(HIDDEN, torch.float32) * magnitude + 4 * u * magnitude + accumulate * (1 + 2 * expected_terms)
             + u * (2 * math.log(VOCAB) + 1))
    # tight enough that a slice lost or a rescaling missed (errors of 0.1 nats and more) shows
    assert (entropy.double() - exact).abs().max() <= bound and bound < 0.1
    assert not entropy.requires_grad and float(exact.max()) > 1  # spread-out rows among them, not a trivial 0
    # the log-probs are those without the entropy, bit for bit
    assert torch.equal(values.detach(), token_logprobs(hidden, weight, b, targets))

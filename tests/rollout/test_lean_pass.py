"""The lean training pass (``labelrl.rollout.lean_pass``): the same log-probs and LoRA gradients
as the module pass, on Llama (with a shared prefix), Qwen2 (q/k/v biases) and Qwen3 (q/k
norms); the same roundings in bf16; taken only where it computes what the modules compute.

Two routes, other kernels: fp32 values and gradients are compared to the bounds of
tests/numerics.py; bf16 values to a bound measured at run time (``bf16_pass_bound``: the worst
case is looser than the adapter's whole effect). Each comparison has a planted-bug twin
(``test_planted_*``): the adapter dropped from the lean pass must fail it. The lean route runs
no modules, so it records no gradient magnitudes; the module route's stand for both (the same
exact quantity, to first order in u)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from labelrl.rollout import completion_logprobs_shared  # noqa: E402
from labelrl.rollout import lean_pass, logprobs as logprobs_module  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numerics import (  # noqa: E402
    assert_gradients_within, assert_values_within, bf16_rounding_logprob_bound, gradient_bounds,
    gamma, gradient_chain_length, logprob_bound, product_bound, unit_roundoff,
)
from rollout.test_logprobs import (  # noqa: E402
    COMPLETIONS, G, PREFIXED, PREFIXED_LONGEST, module_pass, tiny_llama, weighted_loss_grads,
)  # noqa: E402


def lora(model, **options):
    from peft import LoraConfig, get_peft_model

    config = dict(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False) | options
    return get_peft_model(model, LoraConfig(**config)).train()


def family(name: str):
    if name == "llama":
        return tiny_llama()
    from labelrl.models import load_model

    return load_model(name)[0]


def lean_calls(monkeypatch) -> list[int]:
    """A spy on the lean route: one entry per pass it ran."""
    seen, real = [], lean_pass.lean_logprobs
    monkeypatch.setattr(logprobs_module, "lean_logprobs", lambda *a, **k: seen.append(1) or real(*a, **k))
    return seen


def shared(model, dtype=torch.float32, pad: int = 0):
    return completion_logprobs_shared(model, PREFIXED, COMPLETIONS, G, pad_token_id=pad, dtype=dtype)


@pytest.mark.numerics
@pytest.mark.parametrize("name", ["llama", "tiny-qwen2", "tiny-qwen3"])
def test_the_lean_pass_gives_the_module_pass_values_and_lora_gradients(name, monkeypatch):
    model = lora(family(name))
    pad = 0 if name == "llama" else 2
    ran = lean_calls(monkeypatch)
    with module_pass():
        reference = weighted_loss_grads(model, lambda: shared(model, pad=pad))
    assert ran == []
    lean = weighted_loss_grads(model, lambda: shared(model, pad=pad))
    assert ran == [1]
    assert lean[0] and all("lora_" in n for n in lean[0]) and lean[0].keys() == reference[0].keys()
    # every factor gets a gradient: B's block-diagonal stacking hands each adapter its own block
    assert all(g.abs().max() > 0 for g in lean[0].values())
    with torch.no_grad(), module_pass():
        expected, mask = shared(model, pad=pad)
    with torch.no_grad():
        values, lean_mask = shared(model, pad=pad)
    assert torch.equal(mask, lean_mask)
    # The smallest plausible bug this must catch: the adapter dropped inside the lean pass (its
    # update moves these log-probs by 1.92, 0.40, 0.33 nats on llama, qwen2, qwen3 against worst-case
    # bounds of 0.0031, 0.0068, 0.0067; measured differences ≤ 1.9e-6 on AMX and AVX2 kernels):
    # test_planted_a_lean_pass_that_drops_the_adapter_fails_the_fp32_comparison.
    assert_values_within(values, expected, logprob_bound(model, PREFIXED_LONGEST))
    chain = gradient_chain_length(model, PREFIXED_LONGEST, len(COMPLETIONS) * PREFIXED_LONGEST)
    assert_gradients_within(lean[0], reference[0], gradient_bounds([reference[1], reference[1]], reference[0], chain))


def drop_adapter_in_lean_pass(monkeypatch) -> None:
    """The planted bug: every B factor zero inside the lean pass only (the model's own LoRA
    modules, and so the module pass, keep theirs): the lean pass then computes the base model."""
    real = lean_pass._projection

    def without_update(group, dtype):
        projection = real(group, dtype)
        projection.b = torch.zeros_like(projection.b)
        return projection

    monkeypatch.setattr(lean_pass, "_projection", without_update)


@pytest.mark.numerics
@pytest.mark.parametrize("name", ["llama", "tiny-qwen2", "tiny-qwen3"])
def test_planted_a_lean_pass_that_drops_the_adapter_fails_the_fp32_comparison(name, monkeypatch):
    """The twin of the first test's value comparison: the same bound, a lean pass without the
    adapter's update. Measured, fp32: it moves the log-probs by 1.92, 0.40, 0.33 nats (llama,
    qwen2, qwen3) against bounds of 0.0031, 0.0068, 0.0067: 630×, 60×, 49× (asserted ≥ 10×)."""
    model = lora(family(name))
    pad = 0 if name == "llama" else 2
    bound = logprob_bound(model, PREFIXED_LONGEST)
    with torch.no_grad():
        with module_pass():
            expected, mask = shared(model, pad=pad)
        with model.disable_adapter():  # the module pass of the base model alone
            base_only, _ = shared(model, pad=pad)
        assert float((expected - base_only)[mask].abs().max()) > 10 * bound  # the adapter's effect, far over the bound
        drop_adapter_in_lean_pass(monkeypatch)
        dropped, _ = shared(model, pad=pad)
    # B kept in the model: the bug is the lean pass's alone
    assert any(float(p.detach().abs().max()) > 0 for n, p in model.named_parameters() if ".lora_B." in n)
    with pytest.raises(AssertionError, match="rounding bound"):
        assert_values_within(dropped, expected, bound)
    # what the bug computes is the base model's log-probs: the patch removed the adapter and nothing else
    assert_values_within(dropped, base_only, bound, "log-probs without the adapter")


@pytest.mark.numerics
def test_without_a_shared_prefix_the_ragged_prompts_give_the_module_pass_values(monkeypatch):
    """Prompts run whole (``share_prefix=False``, as several processes run them), left-padded to
    unequal lengths: the padding left out of the pass changes nothing."""
    model = lora(tiny_llama())
    ran = lean_calls(monkeypatch)
    whole = lambda: completion_logprobs_shared(model, PREFIXED, COMPLETIONS, G, pad_token_id=0, share_prefix=False)
    with torch.no_grad():
        with module_pass():
            expected, mask = whole()
        values, lean_mask = whole()
    assert ran == [1]
    assert torch.equal(mask, lean_mask)
    assert_values_within(values, expected, logprob_bound(model, PREFIXED_LONGEST))


def bf16_pass_bound(model, module_bf16: torch.Tensor, module_fp32: torch.Tensor, mask: torch.Tensor) -> float:
    """How far the lean pass's bf16 log-probs may be from the module pass's: a measured bound.

    The worst case (``bf16_rounding_logprob_bound``: each of the 16 bf16 rounding sites of
    tiny_llama moving every logit by u_bf16·L, coherently) allows 2.17 nats on tiny_llama, more
    than the adapter's whole effect (1.92), so a lean pass that dropped the adapter would pass
    it. A √n rounding model (Higham & Mary 2019, γ̃_n = λ·√n·u) does not rescue it: with n = 16
    sites, λ√16 ≥ 16 for any λ ≥ 4 that gives a useful probability (2·exp(−λ²/2) ≤ 7e-4).

    Instead: E (the exact log-probs) is within ``logprob_error`` of the module pass in fp32 M₃₂;
    the module pass in bf16 M₁₆ is then within |M₁₆ − M₃₂| + ``logprob_error`` of E, and that
    difference is measured here, on the CPU at hand (its worst token e_M: 0.0119, 0.0010,
    0.0013 nats on llama, qwen2, qwen3, on AMX and on AVX2 kernels alike). The lean pass rounds
    the same values at the same sites (``labelrl.models.precision``), so its own bf16 error is the
    module pass's, but for the roundings that flip where the two routes' fp32 sums straddle a
    bf16 step; that it is no larger than the module pass's worst token is the assumption (not
    derived). The two routes then differ by at most 2·e_M + ``logprob_bound``: 0.027, 0.0088,
    0.0093 nats. Measured |lean − module|: ≤ 8.9e-5 on AMX (bf16 products in hardware) and ≤
    2.3e-3 on AVX2 kernels (llama; other blockings flip more roundings): 12× under the bound at
    the closest. The smallest plausible bug this must catch, the adapter dropped in the lean pass
    (1.92, 0.40, 0.33 nats), is 71×, 45×, 36× over it
    (test_planted_a_lean_pass_that_drops_the_adapter_fails_the_bf16_comparison); bf16 and fp32
    swapped (the lean pass ignoring ``dtype``) is caught by ``not torch.equal(values, exact)``."""
    return logprob_bound(model, PREFIXED_LONGEST) + 2 * float((module_bf16 - module_fp32)[mask].abs().max())


def bf16_module_pass(model, pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The module pass's bf16 log-probs, its fp32 log-probs and the mask."""
    with torch.no_grad(), module_pass():
        module_bf16, mask = shared(model, torch.bfloat16, pad)
        module_fp32, _ = shared(model, torch.float32, pad)
    return module_bf16, module_fp32, mask


@pytest.mark.numerics
@pytest.mark.parametrize("name", ["llama", "tiny-qwen2", "tiny-qwen3"])
def test_in_bf16_the_whole_pass_stays_within_the_rounding_of_the_module_pass(name):
    model = lora(family(name))
    pad = 0 if name == "llama" else 2
    expected, module_fp32, mask = bf16_module_pass(model, pad)
    with torch.no_grad():
        values, _ = shared(model, torch.bfloat16, pad)
        exact, _ = shared(model, torch.float32, pad)
    assert_values_within(values, expected, bf16_pass_bound(model, expected, module_fp32, mask))
    assert not torch.equal(values, exact)  # bf16 products really ran


@pytest.mark.numerics
@pytest.mark.parametrize("name", ["llama", "tiny-qwen2", "tiny-qwen3"])
def test_planted_a_lean_pass_that_drops_the_adapter_fails_the_bf16_comparison(name, monkeypatch):
    """The twin of the bf16 comparison above, the same bound (``bf16_pass_bound``) and a lean pass
    without the adapter's update: 1.92, 0.40, 0.33 nats off (llama, qwen2, qwen3) against 0.027,
    0.0088, 0.0093 allowed (asserted ≥ 10×). The worst-case bound this replaces
    (``bf16_rounding_logprob_bound``: 2.17, 0.61, 0.55) passed it on all three."""
    model = lora(family(name))
    pad = 0 if name == "llama" else 2
    expected, module_fp32, mask = bf16_module_pass(model, pad)
    bound = bf16_pass_bound(model, expected, module_fp32, mask)
    with torch.no_grad():
        with module_pass(), model.disable_adapter():
            base_only, _ = shared(model, torch.bfloat16, pad)
        assert float((expected - base_only)[mask].abs().max()) > 10 * bound
        # the bound it replaces could not tell the bug
        assert float((expected - base_only)[mask].abs().max()) < bf16_rounding_logprob_bound(model, PREFIXED_LONGEST)
        drop_adapter_in_lean_pass(monkeypatch)
        dropped, _ = shared(model, torch.bfloat16, pad)
    with pytest.raises(AssertionError, match="rounding bound"):
        assert_values_within(dropped, expected, bound)
    assert_values_within(dropped, base_only, bound, "bf16 log-probs without the adapter")  # the base model, as planted


@pytest.mark.numerics
def test_in_bf16_a_fused_projection_rounds_its_base_product_and_adds_the_update_in_fp32():
    from labelrl.models.precision import compute
    from labelrl.rollout.lean_pass import lean_weights

    model = lora(tiny_llama())
    attn = model.get_base_model().model.layers[0].self_attn
    members = [attn.q_proj, attn.k_proj, attn.v_proj]
    x = torch.randn(5, 64)
    with torch.no_grad():
        with compute(model, torch.bfloat16):
            expected = torch.cat([m(x) for m in members], dim=-1)
        got = lean_weights(model, torch.bfloat16).layers[0].qkv(x)
        assert got.dtype == torch.float32
        weight = torch.cat([m.base_layer.weight for m in members]).bfloat16().float()
        base = x.bfloat16().float() @ weight.t()
        # each route rounds an fp32 accumulation of the same bf16 products to bf16 (at most one
        # bf16 rounding apart, 2u|y|, with the accumulations' own difference) and adds the same
        # fp32 update (its two products' bounds)
        bound = (2 * unit_roundoff(torch.bfloat16) * base.abs() + product_bound(x.bfloat16().float(), weight.t())
                 + 2 * gamma(64 + 4 + 2, torch.float32) * torch.cat([
                     (x.abs() @ m.lora_A["default"].weight.abs().t()) @ m.lora_B["default"].weight.abs().t()
                     * m.scaling["default"] for m in members], dim=-1))
        assert_values_within(got, expected, bound)
        # an update far below a bf16 step of the base output survives: the sum is fp32. The smallest
        # plausible bug here, the update added in bf16 (or to the rounded product), is the one the
        # bound above cannot see (it moves y by under one bf16 step) and this check catches
        for m in members:
            m.lora_B["default"].weight.mul_(1e-6)
        small = lean_weights(model, torch.bfloat16).layers[0].qkv(x)
        for m in members:
            m.lora_B["default"].weight.zero_()
        none = lean_weights(model, torch.bfloat16).layers[0].qkv(x)
    assert (small - none).abs().max() > 0
    assert (small - none).abs().max() < unit_roundoff(torch.bfloat16) * none.abs().max()


def test_lean_reason_names_what_keeps_the_module_pass():
    from labelrl.rollout.lean_pass import lean_reason

    assert lean_reason(lora(tiny_llama())) is None
    assert "not a LoRA layer" in lean_reason(tiny_llama())
    assert "not a LoRA layer" in lean_reason(lora(tiny_llama(), target_modules=["q_proj", "v_proj"]))
    assert "variant" in lean_reason(lora(tiny_llama(), use_dora=True))
    dropout = lora(tiny_llama(), lora_dropout=0.1)
    assert "dropout" in lean_reason(dropout)
    assert lean_reason(dropout.eval()) is None  # no dropout outside training
    assert "Gemma 3" in lean_reason(lora(family("tiny-gemma3")))

    class Wrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.module = inner

    assert "several processes" in lean_reason(Wrapper(lora(tiny_llama())))
    adapted = lora(tiny_llama())
    with adapted.disable_adapter():  # the reference model's log-probs: the base alone
        assert "no active unmerged adapter" in lean_reason(adapted)


def test_the_shared_pass_takes_the_lean_route_only_where_it_applies(monkeypatch):
    ran = lean_calls(monkeypatch)
    partial = lora(tiny_llama(), target_modules=["q_proj", "v_proj"])
    adapted = lora(tiny_llama())
    with torch.no_grad():
        shared(partial)
        assert ran == []
        with adapted.disable_adapter():
            base_only, _ = shared(adapted)
        assert ran == []
        with_adapter, _ = shared(adapted)
        assert ran == [1]
    assert not torch.equal(base_only, with_adapter)


def test_one_pass_runs_each_real_token_once_prompts_and_completions_together(monkeypatch):
    """Each layer runs once, on the prefix the prompts share, each prompt's real tokens after it
    (not its left padding) and the completions' inputs that predict a real token (Σ (length − 1),
    not the padded [N, T − 1] slots); the log-probs are the module pass's (the first test)."""
    from labelrl.rollout.prefix import shared_prefix_length

    model = lora(tiny_llama())
    seen, real = [], lean_pass._layer
    monkeypatch.setattr(lean_pass, "_layer", lambda w, layer, x, *rest: seen.append(x.shape[0]) or real(w, layer, x, *rest))
    with torch.no_grad():
        values, mask = shared(model)
    n_layers = len(model.get_base_model().model.layers)
    prefix = shared_prefix_length(PREFIXED)
    assert prefix > 0 and len(set(map(len, PREFIXED))) > 1  # a shared prefix, remainders of unequal length
    padded = len(COMPLETIONS) * (max(map(len, COMPLETIONS)) - 1)
    inputs = sum(len(c) - 1 for c in COMPLETIONS)
    assert inputs < padded
    assert seen == [prefix + sum(len(p) - prefix for p in PREFIXED) + inputs] * n_layers
    assert bool((values[mask] < 0).all()) and bool((values[~mask] == 0).all())


def test_nothing_vocabulary_wide_is_saved_for_backward():
    model = lora(tiny_llama())
    vocab = model.get_base_model().config.vocab_size
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        shared(model)
    assert saved and not any(vocab in shape for shape in saved)
    with module_pass(), torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        shared(model)
    assert any(vocab in shape for shape in saved)  # the module pass saves its logits


def integer_valued(model, seed: int = 0):
    """Every weight of ``model`` set to a small integer: products and sums of a few thousand such
    terms stay integers below 2²⁴, exact in fp32 whatever the kernel's order of summation."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randint(-2, 3, parameter.shape, generator=generator).float())
    return model


def test_adapter_blocks_give_the_block_diagonal_products_values_and_gradients(monkeypatch):
    """q/k/v (widths 64, 32, 32: blocks of 32, q's update columns read by two) and gate/up (two
    blocks of 128) run their B factors as blocks, o and down as one product. On integer-valued
    weights and inputs every sum is exact, so the blocks must give the block-diagonal product's
    values and gradients bit for bit, and the float64 dense formula's."""
    model = integer_valued(lora(tiny_llama()))
    attn, mlp = model.get_base_model().model.layers[0].self_attn, model.get_base_model().model.layers[0].mlp
    x = torch.randint(-2, 3, (6, 64), generator=torch.Generator().manual_seed(1)).float()
    results = {}
    for form in ("blocks", "block-diagonal"):
        if form == "block-diagonal":
            monkeypatch.setattr(lean_pass, "block_layout", lambda outs, ranks: None)
        layer = lean_pass.lean_weights(model, torch.float32).layers[0]
        shapes = [tuple(p.b.shape) for p in (layer.qkv, layer.gate_up, layer.o, layer.down)]
        if form == "blocks":
            assert shapes == [(4, 4, 32), (2, 4, 128), (64, 4), (64, 4)]
            assert layer.qkv.reads.tolist() == [0, 0, 1, 2] and layer.gate_up.reads is None
        else:
            assert shapes == [(128, 12), (256, 8), (64, 4), (64, 4)]
        model.zero_grad(set_to_none=True)
        given = x.clone().requires_grad_(True)
        out = torch.cat([layer.qkv(given), layer.gate_up(given)], dim=-1)
        (out * torch.arange(out.shape[-1]).remainder(5).sub(2)).sum().backward()
        results[form] = [out.detach(), given.grad] + [
            p.grad.clone() for p in model.parameters() if p.requires_grad and p.grad is not None]
    assert len(results["blocks"]) == 2 + 2 * 5  # x, and A and B of q, k, v, gate and up
    for a, b in zip(results["blocks"], results["block-diagonal"]):
        assert torch.equal(a, b)
    # the dense formula in float64: y = x·Wᵀ + scale·(x·Aᵀ)·Bᵀ per member
    dense = torch.cat([
        x.double() @ m.base_layer.weight.double().t()
        + (x.double() @ m.lora_A["default"].weight.double().t()) @ m.lora_B["default"].weight.double().t()
        * m.scaling["default"]
        for m in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj)], dim=-1)
    assert torch.equal(results["blocks"][0].double(), dense)


def full_logits_entropy(model, prompts, completions, group_size):
    """Per completion, the entropy −Σ p log p (fp64) of the full logits of one plain forward over
    its prompt and completion, at the positions that predict its tokens; and the largest
    E_p|z − E_p z| over them (how far a logit error moves H: dH = −Σ_v p_v (z_v − E_p z) dz_v)."""
    rows, spread = [], 0.0
    for r, completion in enumerate(completions):
        prompt = prompts[r // group_size]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + completion[:-1]])).logits[0].double()
        z = logits[len(prompt) - 1 : len(prompt) - 1 + len(completion)]
        p = torch.softmax(z, -1)
        rows.append(-(p * torch.log_softmax(z, -1)).sum(-1))
        spread = max(spread, float((p * (z - (p * z).sum(-1, keepdim=True)).abs()).sum(-1).max()))
    return rows, spread


@pytest.mark.numerics
@pytest.mark.parametrize("route", ["lean", "module"])
def test_the_entropy_of_either_pass_is_the_full_logits_entropy(route, monkeypatch):
    """Both passes' entropy at every completion position against the full logits of a plain
    forward; detached while the log-probs keep their gradient; the log-probs unchanged by asking."""
    import contextlib

    model = lora(tiny_llama())
    ran = lean_calls(monkeypatch)
    with module_pass() if route == "module" else contextlib.nullcontext():
        values, mask, entropy = completion_logprobs_shared(model, PREFIXED, COMPLETIONS, G, pad_token_id=0,
                                                           with_entropy=True)
        with torch.no_grad():
            plain, _ = shared(model)
    assert ran == ([1, 1] if route == "lean" else [])
    assert values.requires_grad and not entropy.requires_grad
    assert torch.equal(values.detach(), plain)  # asking for the entropy changes no log-prob
    exact, spread = full_logits_entropy(model, PREFIXED, COMPLETIONS, G)
    tolerance = logprob_bound(model, PREFIXED_LONGEST) * (1 + spread)
    for r, completion in enumerate(COMPLETIONS):
        assert_values_within(entropy[r, : len(completion)], exact[r].float(), tolerance, f"entropy of row {r}")
    assert torch.equal(entropy[~mask], torch.zeros(int((~mask).sum())))  # nothing past a completion's end
    # a random tiny model spreads its mass: the entropies are far from 0 and differ by position
    flat = torch.cat(exact)
    assert float(flat.min()) > 1.0 and float(flat.max() - flat.min()) > 10 * tolerance

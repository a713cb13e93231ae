"""SFT through the lean training pass (``sft_loss_lean``): the module pass's loss and LoRA
gradients on Llama, Qwen2 (q/k/v biases) and Qwen3 (q/k norms), with and without the shared
prompt prefix, each item's prompt and answer as one segment or two; in bf16 the same roundings;
a dropped adapter caught in fp32 and in bf16; the module pass kept, and said why, wherever the
lean one does not apply (``sft_lean_reason``, ``sft_summary.json``).

The two routes run other kernels (packed module rows against real tokens only), so fp32 values
and gradients are compared to the rounding bounds of tests/numerics.py, not to measured
constants; bf16 values to a bound measured at run time (``bf16_loss_bound``), the worst case
being looser than the adapter's whole effect.
The lean route runs no modules and records no gradient magnitudes; the module route's stand
for both, as in tests/rollout/test_lean_pass.py."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from labelrl.rollout import completion_logprobs_shared, lean_pass  # noqa: E402
from labelrl.rollout.prefix import MIN_SHARED, shared_prefix_length  # noqa: E402
from labelrl.train import sft as sft_module  # noqa: E402
from labelrl.train.config import SFTConfig  # noqa: E402
from labelrl.train.memory import set_checkpointing  # noqa: E402
from labelrl.train.sft import SFTItem, batch_layout, run_sft, sft_lean_reason, sft_loss, sft_loss_lean  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numerics import (  # noqa: E402
    assert_gradients_within, assert_values_within, gradient_bounds, gradient_chain_length, gradient_magnitudes,
    mean_logprob_bound,
)
from rollout.test_lean_pass import drop_adapter_in_lean_pass, family, lora  # noqa: E402
from rollout.test_logprobs import module_pass, tiny_llama  # noqa: E402

FAMILIES = ["llama", "tiny-qwen2", "tiny-qwen3"]
PREFIX = [1, *range(100, 124)]  # 25 tokens every prompt starts with (a template's header)
# Prompts of 27, 30 and 28 tokens, answers of 4, 1 and 34 (``answered``): the packed module
# layout puts the first two in one row (31 + 31 = the longest item's 62), so packing really runs.
PROMPTS = [PREFIX + [30, 31], PREFIX + [50, 51, 52, 53, 54], PREFIX + [70, 71, 72]]
ANSWER_LENGTHS = [4, 1, 34]
LONGEST = max(len(p) + n for p, n in zip(PROMPTS, ANSWER_LENGTHS))  # the most keys any query attends to
TARGETS = sum(ANSWER_LENGTHS)  # the tokens the loss averages


def adapted(name: str, **options):
    """``name`` with LoRA on every linear layer, B not zero (``init_lora_weights=False``), the
    factors drawn from a fixed seed: the planted-bug margin below is then one fixed number."""
    model = family(name)
    torch.manual_seed(0)
    return lora(model, **options)


@functools.cache
def answered(name: str) -> tuple[SFTItem, ...]:
    """The items, each answered by the adapted model's own greedy tokens. On fixed answer tokens
    the adapter moves a random model's log-probs up and down and their mean over 39 tokens can
    nearly cancel (measured on qwen2: 0.026 with lora_alpha=8, 0.0063 with 32, against an fp32
    bound of 0.0069); on its own greedy answers the adapter's share of the loss is large (2.27,
    0.217, 0.068 on llama, qwen2, qwen3). A near-tie argmax may pick another token on another
    CPU: the bounds are derived for whatever items result, and the margin is ≥ 10×."""
    model = adapted(name)
    items = []
    with torch.no_grad():
        for prompt, n in zip(PROMPTS, ANSWER_LENGTHS):
            ids = list(prompt)
            for _ in range(n):
                ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
            items.append(SFTItem(ids, n_prompt=len(prompt)))
    return tuple(items)


def pad_of(name: str) -> int:
    return 0 if name == "llama" else 2  # any id for tiny_llama; the SmolLM2 tokenizer's pad for the others


def loss_and_grads(model, route):
    """The loss, every parameter's gradient and (for the module route) their magnitudes."""
    model.zero_grad(set_to_none=True)
    with gradient_magnitudes(model) as magnitudes:
        loss = route()
        loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, magnitudes


def loss_bound(model, value: float) -> float:
    """Two routes' mean of TARGETS log-probs over sequences of at most LONGEST tokens."""
    return mean_logprob_bound(model, LONGEST, TARGETS, value)


def shared_spy(monkeypatch) -> list[int]:
    """The ``shared`` prefix length of every lean pass ``sft_loss_lean`` runs."""
    seen, real = [], sft_module.lean_logprobs
    monkeypatch.setattr(sft_module, "lean_logprobs",
                        lambda model, prompts, targets, mask, g, shared, *rest: seen.append(shared)
                        or real(model, prompts, targets, mask, g, shared, *rest))
    return seen


@pytest.mark.numerics
@pytest.mark.parametrize("name", FAMILIES)
def test_the_lean_sft_loss_gives_the_module_loss_and_lora_gradients(name, monkeypatch):
    model, pad, items = adapted(name), pad_of(name), list(answered(name))
    layout = batch_layout(items, pad, pack=True)
    assert layout.input_ids.shape[0] < len(items)  # two items share a packed row
    assert shared_prefix_length(PROMPTS) == len(PREFIX) >= MIN_SHARED
    assert len(set(map(len, PROMPTS))) == len(set(ANSWER_LENGTHS)) == len(items)

    reference, ref_grads, magnitudes = loss_and_grads(model, lambda: sft_loss(model, layout, pad))
    factors = {n for n, p in model.named_parameters() if p.requires_grad}
    assert factors and all(".lora_A." in n or ".lora_B." in n for n in factors)
    assert ref_grads.keys() == factors
    # at most one row of LONGEST per item: the weight gradients' sum over forwarded positions
    chain = gradient_chain_length(model, LONGEST, len(items) * LONGEST)
    bounds = gradient_bounds([magnitudes, magnitudes], ref_grads, chain)
    seen = shared_spy(monkeypatch)
    for share in (True, False):
        loss, grads, _ = loss_and_grads(model, lambda: sft_loss_lean(model, items, pad, share_prefix=share))
        assert seen.pop() == (len(PREFIX) if share else 0)  # the prefix ran once, or not on its own
        assert_values_within(loss, reference, loss_bound(model, float(reference)), f"loss (share_prefix={share})")
        assert grads.keys() == factors  # every factor gets a gradient, and nothing else does
        assert all(g.abs().max() > 0 for g in grads.values())
        assert_gradients_within(grads, ref_grads, bounds)


def segment_spy(monkeypatch) -> tuple[list[list[tuple[int, int]]], dict]:
    """The [n, s] layout of each lean pass's segments, and the ``join`` (``choice["join"]``) with
    which ``sft_loss_lean`` runs them."""
    layouts, choice, real_forward, real_logprobs = [], {"join": None}, lean_pass._forward, sft_module.lean_logprobs
    monkeypatch.setattr(lean_pass, "_forward", lambda w, segments, *rest: layouts.append(
        [tuple(segment.ids.shape) for segment in segments]) or real_forward(w, segments, *rest))
    monkeypatch.setattr(sft_module, "lean_logprobs", lambda *args: real_logprobs(*args, join=choice["join"]))
    return layouts, choice


@pytest.mark.numerics
@pytest.mark.parametrize("name", FAMILIES)
def test_each_prompt_and_its_answer_run_as_one_segment_with_the_two_segments_values(name, monkeypatch):
    """With one answer per prompt (G = 1) the lean pass runs each item as one row, prompt and
    answer inputs together (``lean_logprobs(join=...)``): one attention call and one layout a
    layer fewer than the prompts and the answers apart, with the same loss and LoRA gradients
    within the fp32 rounding bounds of the first test (both routes' queries see the same keys in
    the same order; only the kernels' shapes differ). The items' answers of 4, 1 and 34 tokens put
    right padding after two of them and no input at all after the one-token answer."""
    model, pad, items = adapted(name), pad_of(name), list(answered(name))
    _, ref_grads, magnitudes = loss_and_grads(model, lambda: sft_loss(model, items, pad))
    bounds = gradient_bounds([magnitudes, magnitudes], ref_grads, gradient_chain_length(model, LONGEST, len(items) * LONGEST))
    widest = max(ANSWER_LENGTHS)
    layouts, choice = segment_spy(monkeypatch)
    for share in (True, False):
        results = {}
        for join in (False, True):
            layouts.clear()
            choice["join"] = join
            results[join] = loss_and_grads(model, lambda: sft_loss_lean(model, items, pad, share_prefix=share))
            prompts = max(map(len, PROMPTS)) - (len(PREFIX) if share else 0)
            expected = [(1, len(PREFIX))] if share else []
            expected += [(len(items), prompts + widest - 1)] if join else [(len(items), prompts), (len(items), widest - 1)]
            assert layouts == [expected], (share, join)
        (apart, apart_grads, _), (joined, joined_grads, _) = results[False], results[True]
        assert_values_within(joined, apart, loss_bound(model, float(apart)), f"loss (share_prefix={share})")
        assert joined_grads.keys() == apart_grads.keys() == ref_grads.keys()
        assert_gradients_within(joined_grads, apart_grads, bounds)


def test_only_a_single_completion_can_join_its_prompts_row():
    model = lora(tiny_llama())
    targets, mask = torch.tensor([[5, 6, 7]] * 2), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="group_size=2"):
        lean_pass.lean_logprobs(model, [[1, 2, 3]], targets, mask, 2, 0, 0, torch.float32, join=True)


@pytest.mark.numerics
@pytest.mark.parametrize("name", FAMILIES)
def test_planted_a_lean_sft_pass_that_drops_the_adapter_falls_outside_the_bound(name, monkeypatch):
    """The fp32 bound of the first test is far below the adapter's own effect on the loss
    (measured: 2.27, 0.217, 0.0685 against bounds 0.0033, 0.0069, 0.0068 on llama, qwen2,
    qwen3: 690×, 32×, 10×; asserted ≥ 4×), so a lean pass that lost the adapter's update fails it."""
    model, pad, items = adapted(name), pad_of(name), list(answered(name))
    with torch.no_grad():
        reference = sft_loss(model, items, pad)
        with model.disable_adapter():
            base_only = sft_loss(model, items, pad)
        bound = loss_bound(model, float(reference))
        assert abs(float(reference - base_only)) > 4 * bound

        real = lean_pass._projection

        def without_update(group, dtype):  # the bug: every B factor zero, inside the lean pass only
            projection = real(group, dtype)
            projection.b = torch.zeros_like(projection.b)
            return projection

        monkeypatch.setattr(lean_pass, "_projection", without_update)
        dropped = sft_loss_lean(model, items, pad, share_prefix=True)
        assert any(float(p.abs().max()) > 0 for n, p in model.named_parameters() if ".lora_B." in n)  # B kept
    with pytest.raises(AssertionError, match="rounding bound"):
        assert_values_within(dropped, reference, bound, "loss")
    # what the bug computes is the base model's loss: the patch removed the adapter and nothing else
    assert_values_within(dropped, base_only, loss_bound(model, float(base_only)), "loss without the adapter")


def bf16_loss_bound(model, items: list[SFTItem], pad: int, value: float) -> float:
    """How far the lean pass's bf16 loss may be from the module pass's: a measured bound, as
    ``bf16_pass_bound`` in tests/rollout/test_lean_pass.py.

    The worst case (the fp32 mean's bound plus ``bf16_rounding_logprob_bound``'s bf16 term,
    4·γ_16(bf16)·L) allows 2.17, 0.61, 0.55 on llama, qwen2, qwen3: more than the adapter's
    whole effect on the loss (2.26, 0.216, 0.068), so it could not tell a lean pass that dropped
    the adapter. Instead each route's bf16 error is taken as no larger than the module pass's
    largest per-token one, e_M = max_t |log p₁₆ − log p₃₂| over these items' target tokens (the
    module pass's per-token log-probs, ``completion_logprobs_shared`` under ``module_pass``;
    measured on AMX and AVX2 kernels alike: 0.0137, 0.0030, 0.0020): a mean of per-token errors
    is no larger than the largest, and the lean pass rounds the same values at the same sites
    (the assumption, not derived). Bound: the fp32 mean's bound + 2·e_M = 0.031, 0.013, 0.011.
    Measured |lean − module|: ≤ 3.6e-5 (AMX and AVX2); the adapter dropped from the lean pass
    is 73×, 17×, 6.3× over the bound
    (test_planted_a_lean_sft_pass_that_drops_the_adapter_fails_the_bf16_comparison)."""
    prompts = [item.input_ids[: item.n_prompt] for item in items]
    targets = [item.input_ids[item.n_prompt:] for item in items]
    with torch.no_grad(), module_pass():
        low, mask = completion_logprobs_shared(model, prompts, targets, 1, pad_token_id=pad, dtype=torch.bfloat16)
        high, _ = completion_logprobs_shared(model, prompts, targets, 1, pad_token_id=pad, dtype=torch.float32)
    return loss_bound(model, value) + 2 * float((low - high)[mask].abs().max())


@pytest.mark.numerics
@pytest.mark.parametrize("name", FAMILIES)
def test_in_bf16_the_lean_sft_loss_stays_within_the_rounding_of_the_module_loss(name):
    """Both routes round the same values to bf16 (``labelrl.models.precision``); compared within
    ``bf16_loss_bound``."""
    model, pad, items = adapted(name), pad_of(name), list(answered(name))
    with torch.no_grad():
        exact = sft_loss(model, items, pad)
        reference = sft_loss(model, items, pad, torch.bfloat16)
        bound = bf16_loss_bound(model, items, pad, float(reference))
        for share in (True, False):
            lean = sft_loss_lean(model, items, pad, torch.bfloat16, share_prefix=share)
            assert_values_within(lean, reference, bound, f"bf16 loss (share_prefix={share})")
    assert not torch.equal(reference, exact)  # bf16 products really ran


@pytest.mark.numerics
@pytest.mark.parametrize("name", FAMILIES)
def test_planted_a_lean_sft_pass_that_drops_the_adapter_fails_the_bf16_comparison(name, monkeypatch):
    """The twin of the bf16 comparison above: the same bound, a lean pass without the adapter's
    update (asserted ≥ 4× over the bound; measured 73×, 17×, 6.3×)."""
    model, pad, items = adapted(name), pad_of(name), list(answered(name))
    with torch.no_grad():
        reference = sft_loss(model, items, pad, torch.bfloat16)
        with model.disable_adapter():
            base_only = sft_loss(model, items, pad, torch.bfloat16)
        bound = bf16_loss_bound(model, items, pad, float(reference))
        assert abs(float(reference - base_only)) > 4 * bound
        drop_adapter_in_lean_pass(monkeypatch)
        dropped = sft_loss_lean(model, items, pad, torch.bfloat16, share_prefix=True)
    with pytest.raises(AssertionError, match="rounding bound"):
        assert_values_within(dropped, reference, bound, "bf16 loss")
    assert_values_within(dropped, base_only, bound, "bf16 loss without the adapter")  # the base model, as planted


def test_the_module_pass_is_kept_where_the_lean_pass_does_not_apply_and_said_why():
    plain = lora(tiny_llama())
    assert sft_lean_reason(plain) is None
    set_checkpointing(plain, True)
    assert "activation checkpointing" in sft_lean_reason(plain)
    set_checkpointing(plain, False)
    assert sft_lean_reason(plain) is None
    assert "not a LoRA layer" in sft_lean_reason(tiny_llama())  # full fine-tuning
    # q_proj alone: the first projection without an adapter is named
    partial = sft_lean_reason(lora(tiny_llama(), target_modules=["q_proj"]))
    assert "k_proj" in partial and "not a LoRA layer" in partial
    assert "DoRA" in sft_lean_reason(lora(tiny_llama(), use_dora=True))


def test_run_sft_trains_through_the_lean_pass_with_lora_and_says_which_pass_ran(tmp_path, monkeypatch):
    # Steps only: a step's batch holds batch_size items (the memory plan also prices the lean pass
    # on the worst batch's 2 and 3 longest items: labelrl.train.sft.lean_sft_growth_bytes).
    calls = {"lean": 0, "module": 0}
    lean, module = sft_module.sft_loss_lean, sft_module.sft_loss

    def counted(kind, real):
        def call(model, batch, *a, **k):
            size = len(batch) if isinstance(batch, list) else batch.input_ids.shape[0]
            calls[kind] += kind == "module" or size == 4
            return real(model, batch, *a, **k)
        return call

    monkeypatch.setattr(sft_module, "sft_loss_lean", counted("lean", lean))
    monkeypatch.setattr(sft_module, "sft_loss", counted("module", module))
    common = dict(model="tiny-random", data="sms-spam", limit=120, max_steps=2, batch_size=4, eval_every=2,
                  eval_limit=8, quiet=True)
    summary = run_sft(SFTConfig(**common, lora=True, out=tmp_path / "lora"))
    assert summary["training_pass"] == "lean" and calls == {"lean": 2, "module": 0}
    full = run_sft(SFTConfig(**common, lora=False, out=tmp_path / "full"))
    assert full["training_pass"].startswith("module (") and "not a LoRA layer" in full["training_pass"]
    assert calls == {"lean": 2, "module": 2}
    for run, expected in (("lora", summary), ("full", full)):
        assert json.loads((tmp_path / run / "sft_summary.json").read_text())["training_pass"] == expected["training_pass"]

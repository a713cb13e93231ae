"""The training pass: per-token log-probs equal a one-sequence-at-a-time reference, and the
shared-prompt route gives the same values and the same parameter gradients; on Llama and on
the built-in Qwen2, Qwen3 and Gemma 3 models (the shared route's second forward runs on a
cache whose Gemma 3 sliding layer keeps only its last 3 keys).

The routes pad and batch differently, so they run other kernels: values and gradients are
compared to bounds derived from the arithmetic (tests/numerics.py), not to measured constants."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach a model hub

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from labelrl.rollout import completion_logprobs, completion_logprobs_shared  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numerics import (  # noqa: E402
    assert_gradients_within, assert_values_within, gradient_bounds, gradient_chain_length, gradient_magnitudes,
    logprob_bound,
)


PROMPTS = [[1, 5, 6, 7, 8, 9, 10], [1, 20, 21], [1, 30, 31, 32, 33]]  # lengths 7, 3, 5
G = 3
# Nine completions, grouped by prompt, of lengths 1 … 6 (ragged within a group).
COMPLETIONS = [
    [40, 41, 42], [43], [44, 45, 46, 47, 48, 2],
    [50, 51], [52, 53, 54, 55], [56, 57, 58],
    [60, 61, 62, 63, 64], [65], [66, 67],
]
# The longest prompt + completion: the keys one query attends to, at most.
LONGEST = max(map(len, PROMPTS)) + max(map(len, COMPLETIONS))


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512, max_position_embeddings=256, initializer_range=0.1,
    )
    return LlamaForCausalLM(config)


@pytest.fixture()
def model():
    return tiny_llama().train()


def repeated_prompts() -> list[list[int]]:
    return [p for p in PROMPTS for _ in range(G)]


def reference_logprobs(model, prompt, completion) -> torch.Tensor:
    """One unpadded sequence: log_softmax over the whole vocabulary at every position."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids, use_cache=False).logits[0].float()
    steps = torch.log_softmax(logits[len(prompt) - 1: -1], dim=-1)
    return steps.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


@pytest.mark.numerics
def test_plain_pass_matches_one_sequence_at_a_time(model):
    logprobs, mask = completion_logprobs(model, repeated_prompts(), COMPLETIONS, pad_token_id=0)
    assert logprobs.shape == (9, 6) and mask.dtype == torch.bool
    assert mask.sum(1).tolist() == [len(c) for c in COMPLETIONS]
    for n, (prompt, completion) in enumerate(zip(repeated_prompts(), COMPLETIONS)):
        assert_values_within(logprobs[n, : len(completion)], reference_logprobs(model, prompt, completion),
                             logprob_bound(model, LONGEST), f"row {n}")
        assert torch.all(logprobs[n, len(completion):] == 0)


@pytest.mark.numerics
def test_shared_pass_matches_plain_pass_values(model):
    plain, plain_mask = completion_logprobs(model, repeated_prompts(), COMPLETIONS, pad_token_id=0)
    shared, shared_mask = completion_logprobs_shared(model, PROMPTS, COMPLETIONS, G, pad_token_id=0)
    assert torch.equal(plain_mask, shared_mask)
    assert_values_within(shared, plain, logprob_bound(model, LONGEST))


def weighted_loss_grads(model, route) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Gradients of Σ w·logprob, a stand-in for the policy loss (any weights will do), and
    their magnitudes (tests/numerics.py)."""
    model.zero_grad(set_to_none=True)
    with gradient_magnitudes(model) as magnitudes:
        logprobs, mask = route()
        weights = torch.linspace(-1.0, 2.0, logprobs.numel()).view_as(logprobs)
        (weights * logprobs * mask).sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}, magnitudes


def assert_same_grads(model, a: tuple[dict, dict], b: tuple[dict, dict]) -> None:
    """Each gradient tensor of route a within the rounding bound of route b's: γ_K·(‖M_a‖ +
    ‖M_b‖) in the Frobenius norm, K the forward and backward chain over the longest sequence
    plus the weight gradients' sum over the plain pass's positions (the larger pass)."""
    (grads_a, magnitudes_a), (grads_b, magnitudes_b) = a, b
    chain = gradient_chain_length(model, LONGEST, len(COMPLETIONS) * LONGEST)
    assert_gradients_within(grads_a, grads_b, gradient_bounds([magnitudes_a, magnitudes_b], grads_b, chain))


@pytest.mark.numerics
def test_shared_pass_matches_plain_pass_gradients(model):
    plain = weighted_loss_grads(model, lambda: completion_logprobs(model, repeated_prompts(), COMPLETIONS, pad_token_id=0))
    shared = weighted_loss_grads(model, lambda: completion_logprobs_shared(model, PROMPTS, COMPLETIONS, G, pad_token_id=0))
    # the prompt tokens' embeddings get gradient only through the (shared) prompt pass
    assert shared[0]["model.embed_tokens.weight"][5].abs().sum() > 0
    assert_same_grads(model, plain, shared)


@pytest.mark.numerics
def test_shared_pass_with_gradient_checkpointing_matches_the_pass_without(model):
    # Two fresh models with the same weights, checkpointing on in one only.
    checkpointed = tiny_llama().train()
    enable = getattr(checkpointed, "activation_checkpointing_enable", None) or checkpointed.gradient_checkpointing_enable
    enable()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), checkpointed.parameters()))

    values, grads, calls, in_forward = {}, {}, {}, {}
    for name, m in (("plain", model), ("checkpointed", checkpointed)):
        calls[name] = []
        m.model.layers[0].mlp.register_forward_pre_hook(lambda module, args, seen=calls[name]: seen.append(1))

        def route(m=m, name=name):
            values[name] = completion_logprobs_shared(m, PROMPTS, COMPLETIONS, G, pad_token_id=0)
            in_forward[name] = len(calls[name])
            return values[name]

        grads[name] = weighted_loss_grads(m, route)

    # checkpointing really ran: the checkpointed layer's MLP ran again in the backward pass
    assert len(calls["checkpointed"]) > in_forward["checkpointed"]
    assert len(calls["plain"]) == in_forward["plain"]
    assert torch.equal(values["plain"][1], values["checkpointed"][1])
    assert_values_within(values["checkpointed"][0], values["plain"][0], logprob_bound(model, LONGEST))
    assert_same_grads(model, grads["plain"], grads["checkpointed"])


@contextlib.contextmanager
def module_pass():
    """``completion_logprobs_shared`` through the model's modules even where the lean pass
    applies (a LoRA adapter on every projection: tests/rollout/test_lean_pass.py)."""
    import labelrl.rollout.logprobs as logprobs_module

    kept = logprobs_module.lean_reason
    logprobs_module.lean_reason = lambda model: "module pass requested"
    try:
        yield
    finally:
        logprobs_module.lean_reason = kept


@pytest.mark.numerics
def test_shared_pass_on_a_lora_model():
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(tiny_llama(), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    lora.train()
    with module_pass():
        shared = weighted_loss_grads(lora, lambda: completion_logprobs_shared(lora, PROMPTS, COMPLETIONS, G, pad_token_id=0))
    plain = weighted_loss_grads(lora, lambda: completion_logprobs(lora, repeated_prompts(), COMPLETIONS, pad_token_id=0))
    assert plain[0] and all("lora_" in name for name in plain[0])
    assert_same_grads(lora, plain, shared)


@pytest.mark.numerics
@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def test_family_plain_and_shared_passes_match_the_reference_in_values_and_gradients(name):
    from labelrl.models import load_model

    family = load_model(name)[0].train()
    plain, _ = completion_logprobs(family, repeated_prompts(), COMPLETIONS, pad_token_id=2)
    for n, (prompt, completion) in enumerate(zip(repeated_prompts(), COMPLETIONS)):
        assert_values_within(plain[n, : len(completion)], reference_logprobs(family, prompt, completion),
                             logprob_bound(family, LONGEST), f"row {n}")
    shared, _ = completion_logprobs_shared(family, PROMPTS, COMPLETIONS, G, pad_token_id=2)
    assert_values_within(shared, plain, logprob_bound(family, LONGEST))
    plain_grads = weighted_loss_grads(
        family, lambda: completion_logprobs(family, repeated_prompts(), COMPLETIONS, pad_token_id=2))
    shared_grads = weighted_loss_grads(
        family, lambda: completion_logprobs_shared(family, PROMPTS, COMPLETIONS, G, pad_token_id=2))
    norms = [n for n in plain_grads[0] if "norm" in n or n.endswith(".bias")]
    assert norms and all(plain_grads[0][n].abs().max() > 0 for n in norms)  # the family's own parts get gradient
    # the bound counts the 49k-token vocabulary twice (logsumexp, Wᵀ·∂logits); a prompt
    # counted G times or a lost cache gradient is off by O(‖gradient‖)
    assert_same_grads(family, plain_grads, shared_grads)


@pytest.mark.numerics
def test_single_token_completions_and_no_grad(model):
    ones = [[40 + n] for n in range(len(PROMPTS) * 2)]
    with torch.no_grad():
        shared, mask = completion_logprobs_shared(model, PROMPTS, ones, 2, pad_token_id=0)
        plain, _ = completion_logprobs(model, [p for p in PROMPTS for _ in range(2)], ones, pad_token_id=0)
    assert shared.shape == (6, 1) and mask.all() and not shared.requires_grad
    assert_values_within(shared, plain, logprob_bound(model, LONGEST))


@pytest.mark.numerics
def test_padding_width_does_not_change_a_row(model):
    # The same sample alone and next to a much longer prompt and completion.
    prompts, completions = [PROMPTS[1], list(range(3, 40))], [COMPLETIONS[4], list(range(100, 130))]
    alone, _ = completion_logprobs(model, prompts[:1], completions[:1], pad_token_id=0)
    batch, _ = completion_logprobs(model, prompts, completions, pad_token_id=0)
    longest = max(map(len, prompts)) + max(map(len, completions))  # the keys any query of the batch sees
    assert_values_within(batch[0, :4], alone[0], logprob_bound(model, longest))


def test_mismatched_counts_say_how_to_fix(model):
    with pytest.raises(ValueError, match="one prompt per completion"):
        completion_logprobs(model, PROMPTS, COMPLETIONS, pad_token_id=0)
    with pytest.raises(ValueError, match="group_size=2"):
        completion_logprobs_shared(model, PROMPTS, COMPLETIONS, 2, pad_token_id=0)
    with pytest.raises(ValueError, match=r"prompt_ids\[0\] is empty"):
        completion_logprobs(model, [[]], [[1]], pad_token_id=0)


# --- a prefix all prompts share (a template's header and system message) ---------------------

SYSTEM = list(range(100, 124))  # 24 tokens every prompt starts with, after the leading 1
PREFIXED = [[1, *SYSTEM, *p[1:]] for p in PROMPTS]
PREFIXED_LONGEST = max(map(len, PREFIXED)) + max(map(len, COMPLETIONS))


def counted_prefix_passes(monkeypatch) -> list[int]:
    """The lengths of the shared prefixes ``completion_logprobs_shared`` runs (a spy), so a test
    knows the prefix route ran rather than the plain one."""
    import labelrl.rollout.prefix as prefix_module

    seen, real = [], prefix_module.prefix_cache
    monkeypatch.setattr(prefix_module, "prefix_cache",
                        lambda model, prefix, *a, **k: seen.append(len(prefix)) or real(model, prefix, *a, **k))
    return seen


def prefixed_grads(model, monkeypatch, pad: int = 0):
    """Values and gradients of the plain pass and of the shared pass with its prefix run once."""
    seen = counted_prefix_passes(monkeypatch)
    repeated = [p for p in PREFIXED for _ in range(G)]
    plain = weighted_loss_grads(model, lambda: completion_logprobs(model, repeated, COMPLETIONS, pad_token_id=pad))
    shared = weighted_loss_grads(model, lambda: completion_logprobs_shared(model, PREFIXED, COMPLETIONS, G, pad_token_id=pad))
    assert seen == [1 + len(SYSTEM)]  # the prefix ran once, as one pass
    with torch.no_grad():
        values = (completion_logprobs(model, repeated, COMPLETIONS, pad_token_id=pad)[0],
                  completion_logprobs_shared(model, PREFIXED, COMPLETIONS, G, pad_token_id=pad)[0])
    return plain, shared, values


def assert_prefixed_routes_agree(model, plain, shared, values) -> None:
    assert_values_within(values[1], values[0], logprob_bound(model, PREFIXED_LONGEST))
    chain = gradient_chain_length(model, PREFIXED_LONGEST, len(COMPLETIONS) * PREFIXED_LONGEST)
    assert_gradients_within(shared[0], plain[0], gradient_bounds([plain[1], shared[1]], plain[0], chain))


@pytest.mark.numerics
def test_a_shared_prefix_runs_once_with_the_same_values_and_gradients(model, monkeypatch):
    plain, shared, values = prefixed_grads(model, monkeypatch)
    # the prefix's embeddings get gradient through the one prefix pass, summed over every row
    assert shared[0]["model.embed_tokens.weight"][SYSTEM[0]].abs().sum() > 0
    assert_prefixed_routes_agree(model, plain, shared, values)
    # turned off (several processes), the prefix is not run on its own
    seen = counted_prefix_passes(monkeypatch)
    with torch.no_grad():
        off, _ = completion_logprobs_shared(model, PREFIXED, COMPLETIONS, G, pad_token_id=0, share_prefix=False)
    assert seen == [] and torch.equal(off == 0, values[0] == 0)


@pytest.mark.numerics
def test_a_shared_prefix_on_a_lora_model(monkeypatch):
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(tiny_llama(), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    with module_pass():
        plain, shared, values = prefixed_grads(lora.train(), monkeypatch)
    assert plain[0] and all("lora_" in name for name in plain[0])
    assert_prefixed_routes_agree(lora, plain, shared, values)


@pytest.mark.numerics
def test_a_shared_prefix_on_qwen2(monkeypatch):
    from labelrl.models import load_model

    family = load_model("tiny-qwen2")[0].train()
    plain, shared, values = prefixed_grads(family, monkeypatch, pad=2)
    assert_prefixed_routes_agree(family, plain, shared, values)


@pytest.mark.numerics
def test_a_sliding_window_model_keeps_the_plain_pass(monkeypatch):
    # Gemma 3's sliding layer counts its window (4 keys) in cache columns: padding between the
    # prefix and a remainder would push the prefix's last keys out of it. The shared pass
    # leaves the prefix alone there, and still matches the plain pass.
    from labelrl.models import load_model
    from labelrl.rollout.prefix import prefix_supported

    family = load_model("tiny-gemma3")[0].train()
    assert not prefix_supported(family) and prefix_supported(tiny_llama())
    seen = counted_prefix_passes(monkeypatch)
    repeated = [p for p in PREFIXED for _ in range(G)]
    with torch.no_grad():
        plain, _ = completion_logprobs(family, repeated, COMPLETIONS, pad_token_id=2)
        shared, _ = completion_logprobs_shared(family, PREFIXED, COMPLETIONS, G, pad_token_id=2)
    assert seen == []
    assert_values_within(shared, plain, logprob_bound(family, PREFIXED_LONGEST))

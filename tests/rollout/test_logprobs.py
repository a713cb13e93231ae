"""The training pass: per-token log-probs equal a one-sequence-at-a-time reference, and the
shared-prompt route gives the same values and the same parameter gradients; on Llama and on
the built-in Qwen2, Qwen3 and Gemma 3 models (the shared route's second forward runs on a
cache whose Gemma 3 sliding layer keeps only its last 3 keys)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach a model hub

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from labelrl.rollout import completion_logprobs, completion_logprobs_shared  # noqa: E402

PROMPTS = [[1, 5, 6, 7, 8, 9, 10], [1, 20, 21], [1, 30, 31, 32, 33]]  # lengths 7, 3, 5
G = 3
# Nine completions, grouped by prompt, of lengths 1 … 6 (ragged within a group).
COMPLETIONS = [
    [40, 41, 42], [43], [44, 45, 46, 47, 48, 2],
    [50, 51], [52, 53, 54, 55], [56, 57, 58],
    [60, 61, 62, 63, 64], [65], [66, 67],
]


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


def test_plain_pass_matches_one_sequence_at_a_time(model):
    logprobs, mask = completion_logprobs(model, repeated_prompts(), COMPLETIONS, pad_token_id=0)
    assert logprobs.shape == (9, 6) and mask.dtype == torch.bool
    assert mask.sum(1).tolist() == [len(c) for c in COMPLETIONS]
    for n, (prompt, completion) in enumerate(zip(repeated_prompts(), COMPLETIONS)):
        torch.testing.assert_close(logprobs[n, : len(completion)], reference_logprobs(model, prompt, completion),
                                   rtol=0, atol=1e-5)
        assert torch.all(logprobs[n, len(completion):] == 0)


def test_shared_pass_matches_plain_pass_values(model):
    plain, plain_mask = completion_logprobs(model, repeated_prompts(), COMPLETIONS, pad_token_id=0)
    shared, shared_mask = completion_logprobs_shared(model, PROMPTS, COMPLETIONS, G, pad_token_id=0)
    assert torch.equal(plain_mask, shared_mask)
    torch.testing.assert_close(shared, plain, rtol=0, atol=1e-5)


def weighted_loss_grads(model, route) -> dict[str, torch.Tensor]:
    """Gradients of Σ w·logprob, a stand-in for the policy loss (any weights will do)."""
    model.zero_grad(set_to_none=True)
    logprobs, mask = route()
    weights = torch.linspace(-1.0, 2.0, logprobs.numel()).view_as(logprobs)
    (weights * logprobs * mask).sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(a: dict, b: dict, rtol: float = 1e-5) -> None:
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        scale = a[name].abs().max().clamp(min=1e-12)
        assert ((a[name] - b[name]).abs().max() / scale) < rtol, name


def test_shared_pass_matches_plain_pass_gradients(model):
    plain = weighted_loss_grads(model, lambda: completion_logprobs(model, repeated_prompts(), COMPLETIONS, pad_token_id=0))
    shared = weighted_loss_grads(model, lambda: completion_logprobs_shared(model, PROMPTS, COMPLETIONS, G, pad_token_id=0))
    # the prompt tokens' embeddings get gradient only through the (shared) prompt pass
    assert shared["model.embed_tokens.weight"][5].abs().sum() > 0
    assert_same_grads(plain, shared)


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
    torch.testing.assert_close(values["checkpointed"][0], values["plain"][0], rtol=0, atol=1e-5)
    assert_same_grads(grads["plain"], grads["checkpointed"])


def test_shared_pass_on_a_lora_model():
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(tiny_llama(), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    lora.train()
    plain = weighted_loss_grads(lora, lambda: completion_logprobs(lora, repeated_prompts(), COMPLETIONS, pad_token_id=0))
    shared = weighted_loss_grads(lora, lambda: completion_logprobs_shared(lora, PROMPTS, COMPLETIONS, G, pad_token_id=0))
    assert plain and all("lora_" in name for name in plain)
    assert_same_grads(plain, shared)


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def test_family_plain_and_shared_passes_match_the_reference_in_values_and_gradients(name):
    from labelrl.models import load_model

    family = load_model(name)[0].train()
    plain, _ = completion_logprobs(family, repeated_prompts(), COMPLETIONS, pad_token_id=2)
    for n, (prompt, completion) in enumerate(zip(repeated_prompts(), COMPLETIONS)):
        torch.testing.assert_close(plain[n, : len(completion)], reference_logprobs(family, prompt, completion),
                                   rtol=0, atol=1e-5)
    shared, _ = completion_logprobs_shared(family, PROMPTS, COMPLETIONS, G, pad_token_id=2)
    torch.testing.assert_close(shared, plain, rtol=0, atol=1e-5)
    plain_grads = weighted_loss_grads(
        family, lambda: completion_logprobs(family, repeated_prompts(), COMPLETIONS, pad_token_id=2))
    shared_grads = weighted_loss_grads(
        family, lambda: completion_logprobs_shared(family, PROMPTS, COMPLETIONS, G, pad_token_id=2))
    norms = [n for n in plain_grads if "norm" in n or n.endswith(".bias")]
    assert norms and all(plain_grads[n].abs().max() > 0 for n in norms)  # the family's own parts get gradient
    # 1e-4: the summation order differs and these gradients sum over a 49k-token vocabulary
    # (measured up to 1.1e-5); a prompt counted G times or a lost cache gradient is off by O(1)
    assert_same_grads(plain_grads, shared_grads, rtol=1e-4)


def test_single_token_completions_and_no_grad(model):
    ones = [[40 + n] for n in range(len(PROMPTS) * 2)]
    with torch.no_grad():
        shared, mask = completion_logprobs_shared(model, PROMPTS, ones, 2, pad_token_id=0)
        plain, _ = completion_logprobs(model, [p for p in PROMPTS for _ in range(2)], ones, pad_token_id=0)
    assert shared.shape == (6, 1) and mask.all() and not shared.requires_grad
    torch.testing.assert_close(shared, plain, rtol=0, atol=1e-5)


def test_padding_width_does_not_change_a_row(model):
    # The same sample alone and next to a much longer prompt and completion.
    alone, _ = completion_logprobs(model, [PROMPTS[1]], [COMPLETIONS[4]], pad_token_id=0)
    batch, _ = completion_logprobs(model, [PROMPTS[1], list(range(3, 40))], [COMPLETIONS[4], list(range(100, 130))],
                                   pad_token_id=0)
    torch.testing.assert_close(batch[0, :4], alone[0], rtol=0, atol=1e-5)


def test_mismatched_counts_say_how_to_fix(model):
    with pytest.raises(ValueError, match="one prompt per completion"):
        completion_logprobs(model, PROMPTS, COMPLETIONS, pad_token_id=0)
    with pytest.raises(ValueError, match="group_size=2"):
        completion_logprobs_shared(model, PROMPTS, COMPLETIONS, 2, pad_token_id=0)
    with pytest.raises(ValueError, match=r"prompt_ids\[0\] is empty"):
        completion_logprobs(model, [[]], [[1]], pad_token_id=0)

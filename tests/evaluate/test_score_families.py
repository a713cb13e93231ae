"""Label-token scoring on the built-in Qwen2, Qwen3 and Gemma 3 models: the probabilities equal
a full-vocabulary forward of each prompt alone, with batches that mix lengths (left padding,
and prompts far longer than Gemma 3's 4-token sliding window), in fp32 and close in bf16."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from labelrl.evaluate.score import score_labels
from labelrl.models import load_model
from labelrl.types import LabelSpace

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the tiny-random test's reference and its bound
from test_predict import assert_scores_match_reference, full_vocab_probs, prompts  # noqa: E402

TEXTS = ["Free entry to win!", "ok see you soon", "URGENT call now", "hi"]


@pytest.fixture(scope="module", params=["tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def family(request):
    return load_model(request.param)


@pytest.mark.numerics
@pytest.mark.parametrize("labels", [
    LabelSpace(("ham", "spam"), kind="binary"),  # distinct first tokens: one forward pass
    LabelSpace(("spam", "spammy")),  # shared first token: whole sequences are scored
])
def test_family_label_scores_agree_with_full_vocabulary_forward(family, labels):
    model, tokenizer = family
    ids = prompts(tokenizer, labels, TEXTS)
    assert min(len(i) for i in ids) > 4 * 4  # every prompt spans several sliding windows
    expected = full_vocab_probs(model, tokenizer, ids, labels)
    got = score_labels(model, tokenizer, ids, labels, batch_size=3).double().numpy()  # batches mix lengths: padding
    bound = assert_scores_match_reference(model, tokenizer, ids, labels, got, expected)
    # the scores depend on the prompt, by more than the bound: a uniform fallback would fail above
    assert (np.abs(expected - 1 / labels.k) > bound).any()


def test_family_label_scores_in_bf16_are_close_and_not_equal(family):
    model, tokenizer = family
    labels = LabelSpace(("ham", "spam"), kind="binary")
    ids = prompts(tokenizer, labels, TEXTS)
    fp32 = score_labels(model, tokenizer, ids, labels, dtype=torch.float32)
    bf16 = score_labels(model, tokenizer, ids, labels, dtype=torch.bfloat16)
    assert bf16.dtype == torch.float32 and torch.allclose(bf16.sum(-1), torch.ones(len(ids)))
    difference = (bf16 - fp32).abs().max().item()
    assert 0 < difference < 1e-2

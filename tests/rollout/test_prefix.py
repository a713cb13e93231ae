"""A prefix every sequence of a batch shares, run once: its length, the remainders' layout,
and logits equal to the plain pass's (label-token scoring rests on them)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from labelrl.rollout.prefix import MIN_SHARED, remainder_inputs, shared_prefix_length, tail_logits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numerics import assert_values_within, logit_bound  # noqa: E402

HEAD = list(range(100, 100 + MIN_SHARED + 4))


def test_shared_prefix_length_leaves_each_sequence_its_tail():
    seqs = [HEAD + [1, 2, 3], HEAD + [1, 9], HEAD + [4]]
    assert shared_prefix_length(seqs) == len(HEAD)  # the third leaves [4]; its last token is kept
    assert shared_prefix_length(seqs[:2]) == len(HEAD) + 1  # [1] shared too, one token left each
    assert shared_prefix_length(seqs[:2], keep=[3, 1]) == len(HEAD)  # the first keeps its last 3 tokens
    assert shared_prefix_length(seqs[:1]) == 0  # nothing to share with
    assert shared_prefix_length([HEAD[:MIN_SHARED - 1] + [1], HEAD[:MIN_SHARED - 1] + [2]]) == 0  # too short to pay


def test_remainders_are_left_padded_after_the_prefix_and_positions_continue():
    ids, mask, positions = remainder_inputs([[7, 8, 1, 2, 3], [7, 8, 4]], 2, pad=0, device="cpu")
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 1]]
    assert positions.tolist() == [[2, 3, 4], [0, 0, 2]]


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                        max_position_embeddings=256, initializer_range=0.2)).eval()


@pytest.mark.numerics
@pytest.mark.parametrize("keep", [1, 3])
def test_tail_logits_with_the_prefix_run_once_equal_each_sequence_alone(keep, monkeypatch):
    import labelrl.rollout.prefix as prefix_module

    model = tiny_llama()
    seqs = [HEAD + [1, 2, 3, 4, 5, 6], HEAD + [7, 8, 9], HEAD + [10, 11, 12, 13]]
    ran, real = [], prefix_module.prefix_cache
    monkeypatch.setattr(prefix_module, "prefix_cache", lambda m, p, *a: ran.append(len(p)) or real(m, p, *a))
    with torch.no_grad():
        batch = tail_logits(model, seqs, 0, torch.float32, keep, "cpu")
        alone = [tail_logits(model, [s], 0, torch.float32, keep, "cpu")[0] for s in seqs]
    assert ran == [len(HEAD)]  # the batch ran its prefix once; each sequence alone ran plainly
    assert batch.shape == (3, keep, 512)
    bound = logit_bound(model, max(map(len, seqs)))
    for row, expected in zip(batch, alone):
        assert_values_within(row, expected, bound, "logits")


@pytest.mark.numerics
def test_label_token_scoring_of_chat_prompts_runs_their_system_message_once(monkeypatch):
    # score_labels on prompts rendered from one template: the prefix route ran, and the scores
    # equal each prompt scored alone (tests/evaluate/test_predict.py's bound).
    import labelrl.rollout.prefix as prefix_module
    from labelrl.evaluate.score import score_labels
    from labelrl.models import load_model
    from labelrl.types import LabelSpace

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "evaluate"))
    from test_predict import assert_scores_match_reference, prompts

    model, tokenizer = load_model("tiny-random")
    labels = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
    ids = prompts(tokenizer, labels, ["free prize, call now", "see you at noon", "ok", "URGENT reply to win a car"])
    ran, real = [], prefix_module.prefix_cache
    monkeypatch.setattr(prefix_module, "prefix_cache", lambda m, p, *a: ran.append(len(p)) or real(m, p, *a))
    batched = score_labels(model, tokenizer, ids, labels).numpy()
    assert len(ran) == 1 and ran[0] >= MIN_SHARED
    alone = np.array([score_labels(model, tokenizer, [p], labels).numpy()[0] for p in ids])
    assert len(ran) == 1
    assert_scores_match_reference(model, tokenizer, ids, labels, batched, alone)

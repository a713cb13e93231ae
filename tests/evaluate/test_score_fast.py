"""Label-token scoring on the packed weights (``score_labels(fast=scoring_weights(...))``,
``fast_decode.last_logits``): the probabilities of a full-vocabulary forward of each prompt
alone, on Llama (tiny-random), Qwen2, Qwen3 and Gemma 3 (sliding windows, no shared prefix),
with a trained LoRA adapter folded in; a pass that drops the adapter fails the same comparison;
``score_counted`` takes it wherever the model allows and keeps the modules elsewhere, and runs the
prefix every prompt of the split shares once (``split_prefix``)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from labelrl.evaluate import predict
from labelrl.evaluate.score import SplitPrefix, score_labels, scoring_weights, split_prefix
from labelrl.models import load_model
from labelrl.rollout import fast_decode, fused
from labelrl.rollout.prefix import MIN_SHARED, shared_prefix_length
from labelrl.types import LabelSpace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_predict import assert_scores_match_reference, full_vocab_probs, prompts  # noqa: E402

TEXTS = ["Free entry to win!", "ok see you soon", "URGENT call now", "hi", "Call 0800 now to claim your prize"]
BINARY = LabelSpace(("ham", "spam"), kind="binary")
GRADES = LabelSpace(("1", "2", "3", "4", "5"), kind="ordinal")


def with_lora(model):
    """A LoRA on every linear layer whose B is not zero: a trained adapter's effect."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=32, target_modules="all-linear", init_lora_weights=False)).eval()


@pytest.fixture(scope="module", params=["tiny-random", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def family(request):
    return load_model(request.param)


@pytest.mark.numerics
@pytest.mark.parametrize("labels", [BINARY, GRADES], ids=["binary", "grades"])
def test_the_packed_pass_gives_each_prompt_alone_its_full_vocabulary_probabilities(family, labels):
    model, tokenizer = family
    ids = prompts(tokenizer, labels, TEXTS)
    sliding = model.config.get_text_config().model_type.startswith("gemma3")
    assert sliding or shared_prefix_length(ids) >= MIN_SHARED  # the prefix runs once: that path is tested
    expected = full_vocab_probs(model, tokenizer, ids, labels)
    fast = scoring_weights(model, torch.float32)
    assert fast is not None
    got = score_labels(model, tokenizer, ids, labels, batch_size=3, fast=fast).double().numpy()  # batches mix lengths
    bound = assert_scores_match_reference(model, tokenizer, ids, labels, got, expected)
    assert (np.abs(expected - 1 / labels.k) > bound).any()  # a uniform answer would fail


@pytest.mark.numerics
@pytest.mark.parametrize("labels", [BINARY, GRADES], ids=["binary", "grades"])
def test_the_split_prefix_run_once_gives_each_prompt_alone_its_full_vocabulary_probabilities(family, labels):
    model, tokenizer = family
    model = with_lora(copy.deepcopy(model))  # peft wraps the module it is given: the fixture's stays bare
    ids = prompts(tokenizer, labels, TEXTS)
    fast = scoring_weights(model, torch.float32)
    past = split_prefix(model, ids, fast)
    if model.config.get_text_config().model_type.startswith("gemma3"):
        assert past is None  # sliding windows count columns: each batch keeps its own prefix
        return
    assert past.length == shared_prefix_length(ids) >= MIN_SHARED
    expected = full_vocab_probs(model, tokenizer, ids, labels)
    got = score_labels(model, tokenizer, ids, labels, batch_size=2, fast=fast, past=past).double().numpy()
    bound = assert_scores_match_reference(model, tokenizer, ids, labels, got, expected)
    # planted: the prefix's keys and values of another prefix (its first token changed) must fail
    other = torch.tensor([[ids[0][1]] + list(ids[0][1 : past.length])])
    wrong = SplitPrefix(past.length, fast_decode.prefix_kv(fast, other))
    moved = score_labels(model, tokenizer, ids, labels, batch_size=2, fast=fast, past=wrong).double().numpy()
    assert (np.abs(moved - expected) > bound).any()


@pytest.mark.numerics
def test_planted_a_packed_pass_that_drops_the_trained_adapter_fails_the_comparison(monkeypatch):
    model, tokenizer = load_model("tiny-random")
    model = with_lora(model)
    ids = prompts(tokenizer, GRADES, TEXTS)
    expected = full_vocab_probs(model, tokenizer, ids, GRADES)
    got = score_labels(model, tokenizer, ids, GRADES, fast=scoring_weights(model, torch.float32)).double().numpy()
    bound = assert_scores_match_reference(model, tokenizer, ids, GRADES, got, expected)
    # The adapter moves the probabilities by far more than the rounding bound ...
    with model.disable_adapter():
        without = full_vocab_probs(model, tokenizer, ids, GRADES)
    assert (np.abs(without - expected) > 10 * bound).any()
    # ... so a packing that leaves it out (the base weight alone) must fail the comparison.
    monkeypatch.setattr(fused, "effective_weight", lambda module, fold_all=False: fused.frozen_weight(module))
    dropped = score_labels(model, tokenizer, ids, GRADES, fast=scoring_weights(model, torch.float32)).double().numpy()
    np.testing.assert_allclose(dropped, without, atol=1e-5)  # what the bug computes: the base model
    with pytest.raises(AssertionError):
        assert_scores_match_reference(model, tokenizer, ids, GRADES, dropped, expected)


def test_in_bf16_the_packed_pass_stays_as_close_to_fp32_as_the_module_pass(family):
    model, tokenizer = family
    ids = prompts(tokenizer, BINARY, TEXTS)
    fp32 = score_labels(model, tokenizer, ids, BINARY, dtype=torch.float32)
    module = score_labels(model, tokenizer, ids, BINARY, dtype=torch.bfloat16)
    fast = score_labels(model, tokenizer, ids, BINARY, dtype=torch.bfloat16,
                        fast=scoring_weights(model, torch.bfloat16))
    assert torch.allclose(fast.sum(-1), torch.ones(len(ids)))
    # bf16 keeps 8 bits: both routes round, neither by more than the module pass's own bf16 test allows
    assert 0 < (fast - fp32).abs().max().item() < 1e-2
    assert (module - fp32).abs().max().item() < 1e-2


def test_score_counted_runs_the_packed_pass_once_packed_where_the_model_allows(monkeypatch):
    model, tokenizer = load_model("tiny-random")
    ids = prompts(tokenizer, BINARY, TEXTS * 10)
    packs, passes, module_passes, prefixes = [], [], [], []
    real_fuse, real_last, real_prefix = fast_decode.fuse_llama, fast_decode.last_logits, fast_decode.prefix_kv
    monkeypatch.setattr(fast_decode, "fuse_llama", lambda *a, **k: packs.append(1) or real_fuse(*a, **k))
    monkeypatch.setattr(fast_decode, "last_logits", lambda *a, **k: passes.append(k.get("past")) or real_last(*a, **k))
    monkeypatch.setattr(fast_decode, "prefix_kv", lambda *a, **k: prefixes.append(1) or real_prefix(*a, **k))
    import labelrl.evaluate.score as score_module

    real_tail = score_module.tail_logits
    monkeypatch.setattr(score_module, "tail_logits", lambda *a, **k: module_passes.append(1) or real_tail(*a, **k))
    fast = predict.score_counted(model, tokenizer, ids, BINARY, batch_size=8, description="scoring", plain=True)
    # one pack and one prefix for the whole split; batches of at least FAST_SCORE_ROWS prompts, each on that prefix
    assert packs == [1] and len(passes) == -(-len(ids) // predict.FAST_SCORE_ROWS) and not module_passes
    assert prefixes == [1] and all(past is not None for past in passes)
    monkeypatch.setattr(score_module, "scoring_weights", lambda model, dtype: None)  # a model the packed pass refuses
    module = predict.score_counted(model, tokenizer, ids, BINARY, batch_size=8, description="scoring", plain=True)
    assert len(module_passes) == -(-len(ids) // 8) and len(passes) == -(-len(ids) // predict.FAST_SCORE_ROWS)
    assert torch.allclose(fast, module, atol=1e-5)


def test_scoring_weights_refuse_what_the_packed_pass_cannot_compute():
    from peft import LoraConfig, get_peft_model

    model, _ = load_model("tiny-random")
    dora = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", use_dora=True))
    assert fast_decode.unsupported_reason(dora) is not None and scoring_weights(dora, torch.float32) is None

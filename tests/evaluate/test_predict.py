import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from labelrl.data import load_dataset
from labelrl.data.options import DataOptions
from labelrl.data.prompts import ANSWER_PREFIX, render_messages, render_prompt
from labelrl.data.split import load_splits
from labelrl.evaluate import predict as predict_module
from labelrl.evaluate.ledger import read_ledger
from labelrl.evaluate.predict import evaluate_split, predict, run_predictions
from labelrl.evaluate.score import label_token_ids, score_labels
from labelrl.evaluate.setup import prepare
from labelrl.rollout.sampler import RolloutBatch
from labelrl.types import Example, LabelSpace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numerics import assert_values_within, label_probability_bound  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    from labelrl.models import load_model

    return load_model("tiny-random")


def write_data(path, n=60, extra=None):
    rows = []
    for i in range(n):
        spam = i % 3 == 0
        row = {"id": f"r{i}", "text": (f"WIN a free prize {i} now" if spam else f"lunch at {i} ok?"),
               "label": "spam" if spam else "ham", "relabel": "ham" if i % 6 == 0 else ("spam" if spam else "ham")}
        rows.append({**row, **(extra or {})})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def make_run_dir(tmp_path, tiny, mode="direct"):
    """A run directory as `labelrl sft` leaves it: model/, sft_config.yaml (splits come on first eval)."""
    run = tmp_path / "run"
    model, tokenizer = tiny
    model.save_pretrained(run / "model")
    tokenizer.save_pretrained(run / "model")
    data = write_data(tmp_path / "data.jsonl")
    config = {"data": str(data), "label_col": "label", "mode": mode, "split_seed": 0, "model": "tiny-random", "out": str(run)}
    (run / "sft_config.yaml").write_text(yaml.safe_dump(config))
    return run


def full_vocab_probs(model, tokenizer, prompt_ids, labels):
    """Label probabilities from plain, unpadded forwards with a softmax over the whole
    vocabulary after ``<answer>``, renormalised over the labels: of each label's first token
    when those differ (score.py's documented rule), else of its whole token sequence."""
    prefix = tokenizer(ANSWER_PREFIX, add_special_tokens=False)["input_ids"]
    label_ids = [tokenizer(ANSWER_PREFIX + x, add_special_tokens=False)["input_ids"][len(prefix):] for x in labels.labels]
    if len({ids[0] for ids in label_ids}) == len(label_ids):
        label_ids = [ids[:1] for ids in label_ids]
    rows = []
    for ids in prompt_ids:
        probs = []
        for tokens in label_ids:
            full = prefix + tokens
            seq = torch.tensor([list(ids) + full])
            start = len(ids) + len(prefix)
            with torch.no_grad():  # rows start−1 … : the distributions of the label's tokens
                p = torch.softmax(model(input_ids=seq).logits[0, start - 1 :].double(), dim=-1)
            probs.append(float(np.prod([p[t, tok].item() for t, tok in enumerate(tokens)])))
        rows.append(np.array(probs) / sum(probs))
    return np.stack(rows)


def assert_scores_match_reference(model, tokenizer, prompt_ids, labels, got, expected,
                                  bound: float | None = None) -> np.ndarray:
    """``got`` (batched, padded) within the rounding bound of ``expected`` (each prompt alone):
    tests/numerics.py's ``label_probability_bound``, with one token per label when the first
    tokens differ, else the longest label's tokens; or ``bound`` where a test states a tighter
    one and its justification. Returns the bound."""
    if bound is None:
        label_ids = label_token_ids(tokenizer, labels)
        tokens = 1 if len({ids[0] for ids in label_ids}) == len(label_ids) else max(map(len, label_ids))
        prefix = tokenizer(ANSWER_PREFIX, add_special_tokens=False)["input_ids"]
        longest = max(map(len, prompt_ids)) + len(prefix) + max(map(len, label_ids))
        bound = label_probability_bound(model, longest, torch.as_tensor(expected), tokens)
    bound = torch.as_tensor(bound, dtype=torch.float64).expand(torch.as_tensor(expected).shape)
    assert_values_within(torch.as_tensor(got), torch.as_tensor(expected), bound, "label probabilities")
    return bound.numpy()


def prompts(tokenizer, labels, texts):
    out = []
    for i, text in enumerate(texts):
        messages = render_messages(Example(str(i), text, labels.labels[0]), labels=labels, mode="direct")
        out.append(tokenizer(render_prompt(tokenizer, messages), add_special_tokens=False)["input_ids"])
    return out


@pytest.mark.numerics
@pytest.mark.parametrize("labels", [
    LabelSpace(("ham", "spam"), kind="binary"),  # distinct first tokens: one forward pass
    LabelSpace(("1", "2", "3", "4", "5"), kind="ordinal"),
    LabelSpace(("spam", "spammy")),  # shared first token: whole sequences are scored
])
def test_label_token_scoring_agrees_with_full_vocabulary_forward(tiny, labels):
    model, tokenizer = tiny
    ids = prompts(tokenizer, labels, ["Free entry to win!", "ok see you soon", "URGENT call now", "hi"])
    expected = full_vocab_probs(model, tokenizer, ids, labels)
    got = score_labels(model, tokenizer, ids, labels, batch_size=3).double().numpy()  # batches mix lengths: padding
    assert_scores_match_reference(model, tokenizer, ids, labels, got, expected)


# SmolLM2 in fp32: the batched, padded module pass's label probabilities (the prompts' shared prefix
# run once) against each prompt alone with the full vocabulary (``full_vocab_probs``). A measured
# bound, in the style of the vLLM engine test's TOLERANCE (tests/rollout/test_vllm_engine_slow.py).
#
# The derived bound (``label_probability_bound``: γ_K·L with K ≈ 1.8·10⁵ roundings and L = 601,
# about 25·p per probability p) passes any probability of 0.04 or more whatever its value. The
# √n model does not rescue it: γ̃_K = λ·√K·u (numerics.ROUNDING_LAMBDA) still allows 0.42·p, while
# the smallest plausible bugs move these probabilities by far less: the model run in bf16 where
# fp32 was asked (0.0090), one of the 30 layers skipped (layer 26, the least visible: 0.011; the
# others 0.032 to 0.83), the label read one position early (0.21), the prompt without the answer
# prefix (0.59) (test_planted_smollm2_label_scoring_…).
#
# Measured |difference|: 2.3e-6 on an AMX Xeon, 5.8e-7 on AVX2 kernels (MKL, oneDNN and ATen held to
# AVX2; the label log-odds differ by ≤ 2.1e-5). 1e-4 is 43× the larger, and the smallest bug is
# 90× over it. Which layer's absence shows least is the model's, not the CPU's: measured once.
SMOLLM2_PROBABILITY_TOLERANCE = 1e-4
SMOLLM2_LABELS = LabelSpace(("ham", "spam"), kind="binary")


@pytest.fixture(scope="module")
def smollm2_reference():
    """SmolLM2, its tokenizer, three prompts and their full-vocabulary label probabilities."""
    from labelrl.models import load_model

    model, tokenizer = load_model("smollm2-135m-instruct")
    ids = prompts(tokenizer, SMOLLM2_LABELS,
                  ["Free entry to win a prize, text WIN now!", "ok see you at lunch", "Call 0800 now"])
    return model, tokenizer, ids, full_vocab_probs(model, tokenizer, ids, SMOLLM2_LABELS)


def assert_smollm2_scores_match(smollm2_reference, got) -> None:
    model, tokenizer, ids, expected = smollm2_reference
    assert_scores_match_reference(model, tokenizer, ids, SMOLLM2_LABELS, got, expected,
                                  bound=SMOLLM2_PROBABILITY_TOLERANCE)


def smollm2_scores(smollm2_reference) -> np.ndarray:
    model, tokenizer, ids, _ = smollm2_reference
    return score_labels(model, tokenizer, ids, SMOLLM2_LABELS, batch_size=2).double().numpy()


@pytest.mark.slow
@pytest.mark.numerics
def test_label_token_scoring_agrees_with_full_vocabulary_forward_on_smollm2(smollm2_reference):
    expected = smollm2_reference[3]
    assert (np.abs(expected - 0.5) > 100 * SMOLLM2_PROBABILITY_TOLERANCE).all()  # a uniform answer would fail
    assert_smollm2_scores_match(smollm2_reference, smollm2_scores(smollm2_reference))


def _in_bf16(monkeypatch, reference):
    """The module pass run in bf16 whatever ``dtype`` the caller asked for."""
    import labelrl.evaluate.score as score_module

    real = score_module.tail_logits
    monkeypatch.setattr(score_module, "tail_logits", lambda model, seqs, pad, dtype, keep, device:
                        real(model, seqs, pad, torch.bfloat16, keep, device))


def _one_position_early(monkeypatch, reference):
    """The labels' scores read from the logits one position early (those that predict ``>``)."""
    import labelrl.evaluate.score as score_module

    real = score_module.tail_logits
    monkeypatch.setattr(score_module, "tail_logits", lambda model, seqs, pad, dtype, keep, device:
                        real(model, seqs, pad, dtype, keep + 1, device)[:, :-1])


def _without_answer_prefix(monkeypatch, reference):
    """The prompts scored without the ``<answer>`` tokens the labels follow."""
    import labelrl.evaluate.score as score_module

    tokenizer = reference[1]
    real, n = score_module._last_logprobs, len(tokenizer(ANSWER_PREFIX, add_special_tokens=False)["input_ids"])
    monkeypatch.setattr(score_module, "_last_logprobs", lambda model, seqs, pad, dtype, fast=None, past=None:
                        real(model, [s[:-n] for s in seqs], pad, dtype, fast, past))


def _layer_26_skipped(monkeypatch, reference):
    """Decoder layer 26 of 30 passes its input on unchanged: of the 30 layers, the one whose absence
    moves these probabilities least (0.011; each of the others by 0.032 to 0.83, measured)."""
    monkeypatch.setattr(reference[0].model.layers[26], "forward", lambda hidden_states, *args, **kwargs: hidden_states)


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("plant", [_in_bf16, _layer_26_skipped, _one_position_early, _without_answer_prefix],
                         ids=["bf16-for-fp32", "layer-26-skipped", "one-position-early", "without-answer-prefix"])
def test_planted_smollm2_label_scoring_bugs_fail_the_comparison(smollm2_reference, plant, monkeypatch):
    """The twins of the comparison above: each bug planted in the scored route only (the
    reference's forwards are already taken), the same tolerance."""
    with monkeypatch.context() as patch:
        plant(patch, smollm2_reference)
        got = smollm2_scores(smollm2_reference)
    with pytest.raises(AssertionError, match="rounding bound"):
        assert_smollm2_scores_match(smollm2_reference, got)


def test_predict_scores_on_a_run_dir(tmp_path, tiny):
    run = make_run_dir(tmp_path, tiny)
    pred = predict(str(run), None, "val")
    splits = load_splits(run)  # made on first use, from the run's data config
    assert pred.ids == list(splits.ids["val"])
    assert pred.table.column_names == ["id", "label", "prediction", "parse_status", "score"]
    probs = pred.scores()
    assert np.allclose(probs.sum(axis=1), 1) and pred.labels.positive_label == "spam"
    assert pred.y_pred == [pred.labels.labels[i] for i in probs.argmax(axis=1)]
    assert set(pred.table.column("parse_status").to_pylist()) == {"ok"}
    assert pred.info["model_spec"] == str(run / "model") and pred.info["split_fingerprint"] == splits.fingerprint


def test_label_col_swaps_the_answer_key_only(tmp_path, tiny):
    run = make_run_dir(tmp_path, tiny)
    original = predict(str(run), None, "holdout")
    relabelled = predict(str(run), None, "holdout", label_col="relabel")
    assert relabelled.ids == original.ids and relabelled.y_pred == original.y_pred
    key = {ex.id: ex.label for ex in load_dataset(str(tmp_path / "data.jsonl"), label_col="relabel").examples}
    assert relabelled.y_true == [key[i] for i in relabelled.ids]
    assert relabelled.y_true != original.y_true  # r0, r6, … are relabelled ham


def test_splits_from_other_data_are_refused(tmp_path, tiny):
    run = make_run_dir(tmp_path, tiny)
    predict(str(run), None, "val", limit=2)
    write_data(tmp_path / "data.jsonl", extra={"text": "changed"})
    with pytest.raises(ValueError, match="made from other data"):
        predict(str(run), None, "val")


def test_bad_requests_name_the_fix(tmp_path, tiny):
    run = make_run_dir(tmp_path, tiny, mode="reasoning")
    with pytest.raises(ValueError, match="--method generate"):
        predict(str(run), None, "val", method="scores")
    with pytest.raises(ValueError, match="evaluate on 'val' or 'holdout'"):
        predict(str(run), None, "test")
    with pytest.raises(ValueError, match="--splits DIR"):
        predict("tiny-random", DataOptions(data=str(tmp_path / "data.jsonl")), "val")


def test_generate_parses_strictly_and_counts_failures(tmp_path, tiny, monkeypatch):
    run = make_run_dir(tmp_path, tiny)
    setup = prepare(str(run), None, "val", limit=4)
    tokenizer = setup.tokenizer
    scripted = ["<answer>spam</answer>", "The answer is <answer>ham</answer>", "<answer>eggs</answer>", "<answer>ha"]

    def fake_sampler(model, prompt_ids, *, group_size, max_new_tokens, temperature, **kwargs):
        assert group_size == 1 and temperature == 0.0  # greedy, one answer per prompt
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + ([] if t.endswith("ha") else [tokenizer.eos_token_id])
               for t in scripted[: len(prompt_ids)]]
        scripted[: len(prompt_ids)] = []
        return RolloutBatch(ids, [[0.0] * len(i) for i in ids], [t.endswith("ha") for t in [tokenizer.decode(i) for i in ids]],
                            [len(i) for i in ids], list(range(len(ids))), 1)

    monkeypatch.setattr("labelrl.rollout.BACKENDS.get", lambda name: fake_sampler)
    pred = run_predictions(setup, method="generate", batch_size=3)
    assert pred.y_pred == ["spam", None, None, None]
    assert pred.table.column("parse_status").to_pylist() == ["ok", "no_answer", "unknown_label", "truncated"]
    assert "score" not in pred.table.column_names and pred.scores() is None


def test_holdout_ledger_refuses_before_predicting_then_records_a_repeat(tmp_path, tiny, monkeypatch):
    run = make_run_dir(tmp_path, tiny)
    setup = prepare(str(run), None, "holdout")
    first = evaluate_split(setup, n_boot=20)
    assert first.repeat is False and first.record["split"] == "holdout"
    calls = []
    original = predict_module.run_predictions
    monkeypatch.setattr(predict_module, "run_predictions", lambda *a, **k: calls.append(1) or original(*a, **k))
    with pytest.raises(ValueError, match="touched twice"):
        evaluate_split(setup, n_boot=20)
    assert calls == []  # refused before the holdout was looked at
    again = evaluate_split(setup, n_boot=20, allow_repeat_holdout=True)
    assert again.repeat is True and calls == [1]
    ledger = read_ledger(run)
    assert [r["repeat"] for r in ledger] == [False, True]
    assert ledger[1]["metrics"]["accuracy"] == pytest.approx(first.metrics["accuracy"])

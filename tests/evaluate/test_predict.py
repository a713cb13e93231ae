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
from labelrl.evaluate.predict import evaluate_split, predict, prepare, run_predictions
from labelrl.evaluate.score import label_token_ids, score_labels
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


def assert_scores_match_reference(model, tokenizer, prompt_ids, labels, got, expected) -> np.ndarray:
    """``got`` (batched, padded) within the rounding bound of ``expected`` (each prompt alone):
    tests/numerics.py's ``label_probability_bound``, with one token per label when the first
    tokens differ, else the longest label's tokens. Returns the bound."""
    label_ids = label_token_ids(tokenizer, labels)
    tokens = 1 if len({ids[0] for ids in label_ids}) == len(label_ids) else max(map(len, label_ids))
    prefix = tokenizer(ANSWER_PREFIX, add_special_tokens=False)["input_ids"]
    longest = max(map(len, prompt_ids)) + len(prefix) + max(map(len, label_ids))
    bound = label_probability_bound(model, longest, torch.as_tensor(expected), tokens)
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


@pytest.mark.slow
@pytest.mark.numerics
def test_label_token_scoring_agrees_with_full_vocabulary_forward_on_smollm2():
    from labelrl.models import load_model

    model, tokenizer = load_model("smollm2-135m-instruct")
    labels = LabelSpace(("ham", "spam"), kind="binary")
    ids = prompts(tokenizer, labels, ["Free entry to win a prize, text WIN now!", "ok see you at lunch", "Call 0800 now"])
    expected = full_vocab_probs(model, tokenizer, ids, labels)
    got = score_labels(model, tokenizer, ids, labels, batch_size=2).double().numpy()
    assert_scores_match_reference(model, tokenizer, ids, labels, got, expected)


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

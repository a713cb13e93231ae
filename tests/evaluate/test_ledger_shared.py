"""The holdout ledger survives torn writes, refuses corruption, and follows the holdout's content
across splits directories."""

from __future__ import annotations

import json

import pytest

from labelrl.data.options import DataOptions
from labelrl.evaluate.ledger import check_holdout, ledger_path, read_ledger, record_evaluation, shared_ledger_path
from labelrl.evaluate.setup import load_eval_data

METRICS = {"n": 10, "accuracy": 0.9, "balanced_accuracy": 0.85}


def look(splits_dir, model="fp-model", holdout_fp="hold-1", **kw) -> dict:
    return record_evaluation(splits_dir, split="holdout", model_spec="m", model_fingerprint=model,
                             split_fingerprint="splits-1", metrics=METRICS, holdout_fp=holdout_fp, **kw)


def test_a_torn_last_line_is_ignored_then_repaired_and_later_looks_stay_visible(tmp_path):
    look(tmp_path, model="first")
    with open(ledger_path(tmp_path), "a", encoding="utf-8") as handle:
        handle.write('{"time": "2026-12-01T00:00:00+00:00", "split": "hol')  # a kill mid-append
    assert [r["model_fingerprint"] for r in read_ledger(tmp_path)] == ["first"]
    with pytest.raises(ValueError, match="already evaluated"):
        check_holdout(tmp_path, "first", "splits-1", holdout_fp="hold-1")
    look(tmp_path, model="second")  # appending cuts the fragment first
    lines = ledger_path(tmp_path).read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line) for line in lines)
    assert [r["model_fingerprint"] for r in read_ledger(tmp_path)] == ["first", "second"]
    with pytest.raises(ValueError, match="already evaluated"):  # the look after the torn line is not hidden
        check_holdout(tmp_path, "second", "splits-1", holdout_fp="hold-1")


def test_corruption_before_the_last_line_is_refused_with_the_line(tmp_path):
    look(tmp_path, model="first")
    look(tmp_path, model="second")
    lines = ledger_path(tmp_path).read_text().splitlines()
    ledger_path(tmp_path).write_text(lines[0][:20] + "\n" + lines[1] + "\n")
    with pytest.raises(ValueError, match="line 1 is not JSON"):
        read_ledger(tmp_path)
    with pytest.raises(ValueError, match="line 1"):  # a holdout check never passes on a damaged ledger
        check_holdout(tmp_path, "third", "splits-1", holdout_fp="hold-1")


def test_a_second_splits_directory_for_the_same_holdout_sees_the_first_look(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "text": f"text number {i}", "label": "ab"[i % 2]}) + "\n"
                            for i in range(60)), encoding="utf-8")
    options = DataOptions(data=str(data))
    first = load_eval_data(options, tmp_path / "splits_a", "holdout")
    second = load_eval_data(options, tmp_path / "splits_b", "holdout")  # rebuilt: the same holdout
    assert first.holdout_fingerprint == second.holdout_fingerprint
    look(first.splits_dir, holdout_fp=first.holdout_fingerprint)
    assert not ledger_path(second.splits_dir).exists()  # the directory's own ledger is empty …
    with pytest.raises(ValueError, match="splits_a"):  # … but the holdout's shared ledger names the first look
        check_holdout(second.splits_dir, "fp-model", "another-splits-fingerprint", holdout_fp=second.holdout_fingerprint)
    # another holdout (another split seed) is another ledger
    other = load_eval_data(options.model_copy(update={"split_seed": 1}), tmp_path / "splits_c", "holdout")
    assert other.holdout_fingerprint != first.holdout_fingerprint
    assert check_holdout(other.splits_dir, "fp-model", "x", holdout_fp=other.holdout_fingerprint) is False


def test_derived_records_are_never_looks(tmp_path):
    look(tmp_path, model="sft", derived=True)
    assert check_holdout(tmp_path, "sft", "splits-1", holdout_fp="hold-1") is False
    assert json.loads(shared_ledger_path("hold-1").read_text().splitlines()[0])["derived"] is True


def test_a_reading_in_another_splits_directory_joins_the_look_made_in_the_first(tmp_path):
    from labelrl.evaluate.ledger import plan_holdout

    first, second = tmp_path / "a", tmp_path / "b"
    original = look(first, extra={"method": "scores"})
    repeat, joined = plan_holdout(second, "fp-model", "other-splits", holdout_fp="hold-1", method="generate")
    assert not repeat and joined == original  # found through the holdout's shared ledger
    look(second, extra={"method": "generate"}, reading_of=joined)
    with pytest.raises(ValueError, match="read by generate"):  # and that reading is now taken for both directories
        check_holdout(first, "fp-model", "splits-1", holdout_fp="hold-1", method="generate")
    assert [r.get("reading_of", {}).get("splits_dir") for r in read_ledger(second)] == [str(first.resolve())]

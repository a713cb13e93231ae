"""The report's rollout analyses on constructed rollout tables, checked by hand."""

from __future__ import annotations

import pyarrow as pa
import pytest

from labelrl.report.rollout_stats import recall_per_step, residue_drift, think_length_tax


def table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows)


def test_think_length_tax_counts_finished_rollouts_only_by_window():
    # 4 steps; window 0.25 → early = step 1, late = step 4. Think lengths 10 or 100 characters.
    rows = []
    for step, items in {1: [(10, False, True, 1.0), (10, False, True, 0.0), (100, False, True, 1.0), (300, True, False, 0.0)],
                        2: [(10, False, True, 1.0)] * 4, 3: [(10, False, True, 1.0)] * 4,
                        4: [(10, False, True, 1.0), (100, False, False, 0.0), (100, False, True, 0.0), (300, True, True, 0.0)]}.items():
        for chars, truncated, closed, reward in items:
            text = "x" * chars + ("</think><answer>a</answer>" if closed else "")
            rows.append({"step": step, "completion": text, "truncated": truncated, "think_closed": closed, "reward": reward})
    tax = think_length_tax(table(rows), n_buckets=2, window=0.25)
    early, late = tax["windows"]["early"], tax["windows"]["late"]
    assert early["steps"] == [1, 1] and late["steps"] == [4, 4]
    # finished rollouts only: the truncated 300-character ones never enter a bucket
    assert early["n_finished"] == 3 and early["n_capped"] == 1 and early["capped_think_closed_rate"] == 0.0
    assert late["n_capped"] == 1 and late["capped_think_closed_rate"] == 1.0
    # bucket edges are quantiles of all finished lengths (mostly 10, some 100): the median is 10, so
    # the unique edges are 10 and 100 → one bucket holding every finished rollout of the window
    by = {(name, b["lo"], b["hi"]): b for name, w in tax["windows"].items() for b in w["buckets"]}
    early_bucket = next(b for (name, lo, hi), b in by.items() if name == "early")
    assert early_bucket["n"] == 3 and early_bucket["mean_reward"] == pytest.approx(2 / 3)
    late_bucket = next(b for (name, lo, hi), b in by.items() if name == "late")
    assert late_bucket["n"] == 3 and late_bucket["mean_reward"] == pytest.approx(1 / 3)
    assert late_bucket["think_closed_rate"] == pytest.approx(2 / 3)


def test_recall_per_step_counts_unparsed_as_wrong():
    rows = [{"step": 1, "label": "a", "answer": "a"}, {"step": 1, "label": "a", "answer": None},
            {"step": 1, "label": "b", "answer": "a"}, {"step": 2, "label": "b", "answer": "b"}]
    out = recall_per_step(table(rows), ["a", "b"])
    assert out == [{"step": 1, "recall": {"a": 0.5, "b": 0.0}}, {"step": 2, "recall": {"a": None, "b": 1.0}}]


def test_residue_drift_is_the_ambiguous_share_of_groups_trained_on():
    # step 1: groups x1 (ambiguous, trained), x2 (trained), x3 (skipped); step 2: x1 skipped, x4 trained
    rows = []
    for step, item, skipped in ((1, "x1", False), (1, "x2", False), (1, "x3", True), (2, "x1", True), (2, "x4", False)):
        for j in range(2):
            rows.append({"step": step, "prompt_id": item, "sample_index": j, "skipped": skipped})
    out = residue_drift(table(rows), {"conflicting duplicates": {"x1", "x3"}, "empty": set()},
                        train_ids=["x1", "x2", "x3", "x4"])
    kind = out["kinds"]["conflicting duplicates"]
    assert out["steps"] == [1, 2] and kind["per_step"] == [0.5, 0.0]
    assert kind["data_share"] == 0.5 and "empty" not in out["kinds"]
    assert residue_drift(table(rows), {}, ["x1"]) is None

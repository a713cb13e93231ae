"""Survival statistics from constructed traces records: every number worked out by hand."""

from __future__ import annotations

import pytest

from labelrl.distill.reject import (
    band_name, confidence_band, item_confidence, length_stats, survival_counts, survival_summary,
)


def rec(i, label, kept, used, trace=None):
    return {"id": i, "label": label, "trace": trace, "attempts_used": used, "kept": kept}


RECORDS = [
    rec("a", "spam", True, 1, "x" * 10),
    rec("b", "spam", False, 3),
    rec("c", "ham", True, 2, "x" * 30),
    rec("d", "ham", True, 1, "x" * 20),
    rec("e", "ham", False, 3),
]


def test_counts_overall_and_per_label():
    s = survival_summary(RECORDS)
    # 3 of 5 survive; attempts 1+3+2+1+3 = 10 → mean 2.0
    assert s["overall"] == {"n_items": 5, "n_survived": 3, "survival_rate": 0.6, "mean_attempts_used": 2.0,
                            "n_kept_traces": 3}
    # spam: a kept, b not → 1/2, attempts (1+3)/2 = 2; ham: c, d kept, e not → 2/3, attempts 6/3 = 2
    assert s["per_label"]["spam"]["survival_rate"] == 0.5
    assert s["per_label"]["ham"]["survival_rate"] == pytest.approx(2 / 3)
    assert s["per_label"]["ham"]["mean_attempts_used"] == 2.0
    assert "by_confidence" not in s


def test_several_kept_traces_of_one_item_count_once():
    records = [rec("a", "spam", True, 3, "t1"), rec("a", "spam", True, 3, "t22"), rec("b", "ham", False, 3)]
    c = survival_counts(records)
    assert (c["n_items"], c["n_survived"], c["n_kept_traces"]) == (2, 1, 2)


def test_trace_lengths_in_characters_of_kept_traces_only():
    s = survival_summary(RECORDS)
    # kept lengths 10, 30, 20 → mean 20, median 20, p90 = 20 + 0.8 * (30 − 20) = 28
    assert s["trace_chars"] == {"n": 3, "mean": 20.0, "min": 10, "p50": 20.0, "p90": 28.0, "max": 30}
    assert length_stats([])["n"] == 0 and length_stats([])["mean"] is None


def test_confidence_bands_edges():
    assert confidence_band(0.5) == "[0.00, 0.60)"
    assert confidence_band(0.6) == "[0.60, 0.70)"  # an edge belongs to the band it opens
    assert confidence_band(0.95) == confidence_band(1.0) == "[0.90, 1.00]"
    assert band_name(2) == "[0.70, 0.80)"


def test_item_confidence_is_max_probability():
    import numpy as np

    conf = item_confidence(["a", "b"], np.array([[0.2, 0.8], [0.55, 0.45]]))
    assert conf == {"a": 0.8, "b": 0.55}
    assert item_confidence(["a"], None) == {}


def test_survival_by_direct_model_confidence():
    # a 0.95 (kept), b 0.97 (lost) → top band 1/2; c 0.65 kept, d 0.62 kept → 2/2; e unscored, lost
    confidence = {"a": 0.95, "b": 0.97, "c": 0.65, "d": 0.62}
    s = survival_summary(RECORDS, confidence=confidence)
    bands = s["by_confidence"]
    assert list(bands) == ["[0.60, 0.70)", "[0.90, 1.00]", "unscored"]
    assert bands["[0.90, 1.00]"]["survival_rate"] == 0.5
    assert bands["[0.60, 0.70)"]["survival_rate"] == 1.0
    assert bands["unscored"]["n_items"] == 1 and bands["unscored"]["n_survived"] == 0


def test_attempt_status_counts():
    attempts = [{"status": "ok", "matched": True}, {"status": "ok", "matched": False},
                {"status": "no_answer", "matched": False}, {"status": "unclosed_think", "matched": False}]
    s = survival_summary(RECORDS, attempts=attempts)
    assert s["attempt_status"] == {"no_answer": 1, "ok": 2, "unclosed_think": 1}
    assert (s["attempts_matched"], s["attempts_total"]) == (1, 4)

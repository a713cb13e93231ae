import json

import pytest

from labelrl.evaluate.ledger import (
    LEDGER_FILE,
    check_holdout,
    drop_table,
    earlier_looks,
    merge_readings,
    plan_holdout,
    read_ledger,
    record_evaluation,
    summary_metrics,
)

METRICS = {"n": 50, "n_unparsed": 1, "accuracy": 0.8, "accuracy_ci": [0.7, 0.9], "balanced_accuracy": 0.75,
           "balanced_accuracy_ci": [0.6, 0.85], "confusion_matrix": {"counts": [[1]]}}


def record(tmp_path, split="holdout", model="m1", split_fp="s1", repeat=False, ba=0.75, spec="run/model"):
    metrics = dict(METRICS, balanced_accuracy=ba)
    return record_evaluation(tmp_path, split=split, model_spec=spec, model_fingerprint=model,
                             split_fingerprint=split_fp, metrics=metrics, repeat=repeat)


def test_first_holdout_evaluation_is_allowed_and_recorded(tmp_path):
    assert check_holdout(tmp_path, "m1", "s1") is False
    rec = record(tmp_path)
    assert (tmp_path / LEDGER_FILE).is_file()
    assert read_ledger(tmp_path) == [rec]
    assert rec["repeat"] is False and rec["metrics"]["balanced_accuracy"] == 0.75
    assert "confusion_matrix" not in rec["metrics"]  # only scalars and their intervals


def test_second_holdout_evaluation_of_the_same_model_is_refused(tmp_path):
    record(tmp_path)
    with pytest.raises(ValueError, match="touched twice stops being a holdout") as err:
        check_holdout(tmp_path, "m1", "s1")
    assert "--allow-repeat-holdout" in str(err.value) and "0.750" in str(err.value)
    assert check_holdout(tmp_path, "m1", "s1", allow_repeat=True) is True


def test_other_model_other_split_and_val_are_not_repeats(tmp_path):
    record(tmp_path)
    record(tmp_path, split="val", model="m2")
    assert check_holdout(tmp_path, "m2", "s1") is False  # val evaluations never count
    assert check_holdout(tmp_path, "m1", "s2") is False  # another holdout


def test_drop_table_uses_ledger_val_then_run_files(tmp_path):
    # m1: val 0.80 (ledger) → holdout 0.75: drop 0.05. m2: val from its sft_summary 0.90 → 0.70: drop 0.20.
    run = tmp_path / "run2"
    (run / "model").mkdir(parents=True)
    (run / "sft_summary.json").write_text(json.dumps({"best": {"eval/balanced_accuracy": 0.9, "eval/accuracy": 0.92}}))
    record(tmp_path, split="val", ba=0.80)
    record(tmp_path, ba=0.75)
    record(tmp_path, model="m2", ba=0.70, spec=str(run / "model"))
    record(tmp_path, model="m2", ba=0.71, spec=str(run / "model"), repeat=True)  # ignored: first number counts
    record(tmp_path, model="m3", ba=0.60, spec="elsewhere")  # no val anywhere: no row
    rows = drop_table(read_ledger(tmp_path))
    assert [r["model_fingerprint"] for r in rows] == ["m2", "m1"]
    assert rows[0]["drop_balanced_accuracy"] == pytest.approx(0.20) and rows[0]["val_source"] == "run files"
    assert rows[0]["drop_accuracy"] == pytest.approx(0.92 - 0.8)
    assert rows[1]["drop_balanced_accuracy"] == pytest.approx(0.05) and rows[1]["val_source"] == "ledger"


def test_summary_metrics_keeps_intervals():
    out = summary_metrics(METRICS)
    assert out["accuracy_ci"] == [0.7, 0.9] and out["n"] == 50 and "roc_auc" not in out


def reading_record(tmp_path, method, ba, split="holdout", model="m1", look=None, repeat=False):
    return record_evaluation(tmp_path, split=split, model_spec="run/model", model_fingerprint=model, split_fingerprint="s1",
                             metrics=dict(METRICS, balanced_accuracy=ba), repeat=repeat, reading_of=look,
                             extra={"method": method})


def test_a_second_method_joins_the_look_and_reading_a_method_again_is_a_repeat(tmp_path):
    look = reading_record(tmp_path, "scores", 0.75)
    assert plan_holdout(tmp_path, "m1", "s1", method="generate") == (False, look)  # joins the look, not refused
    reading = reading_record(tmp_path, "generate", 0.60, look=look)
    assert reading["reading_of"] == {"time": look["time"], "splits_dir": look["splits_dir"], "model_spec": "run/model"}
    assert earlier_looks(tmp_path, "m1", "s1") == [look]  # the reading is not a second look
    assert earlier_looks(tmp_path, "m1", "s1", method="generate") == [reading]
    for method in ("scores", "generate", None):  # each reading once; without a method, any look counts
        with pytest.raises(ValueError, match="touched twice stops being a holdout"):
            plan_holdout(tmp_path, "m1", "s1", method=method)
    with pytest.raises(ValueError, match="read by generate"):
        check_holdout(tmp_path, "m1", "s1", method="generate")
    assert plan_holdout(tmp_path, "m1", "s1", method="generate", allow_repeat=True) == (True, None)
    assert plan_holdout(tmp_path, "m2", "s1", method="generate") == (False, None)  # another model: a look of its own


def test_a_reading_joins_the_first_look_not_a_repeat(tmp_path):
    first = reading_record(tmp_path, "scores", 0.75)
    reading_record(tmp_path, "scores", 0.74, repeat=True)
    assert plan_holdout(tmp_path, "m1", "s1", method="generate")[1] == first


def test_the_listing_shows_a_look_and_its_readings_as_one_row(tmp_path):
    # val: scores 0.80, generate 0.70; holdout look: scores 0.75, its generate reading 0.60.
    # drops: scores 0.80 − 0.75 = 0.05; generate 0.70 − 0.60 = 0.10
    reading_record(tmp_path, "scores", 0.80, split="val")
    reading_record(tmp_path, "generate", 0.70, split="val")
    look = reading_record(tmp_path, "scores", 0.75)
    reading_record(tmp_path, "generate", 0.60, look=look)
    rows = merge_readings(read_ledger(tmp_path))
    holdout = [r for r in rows if r["split"] == "holdout"]
    assert len(rows) == 3 and len(holdout) == 1
    assert {m: v["balanced_accuracy"] for m, v in holdout[0]["readings"].items()} == {"scores": 0.75, "generate": 0.60}
    assert list(holdout[0]["readings"]) == ["scores", "generate"]  # the look's own reading first
    [row] = drop_table(read_ledger(tmp_path))
    assert row["method"] == "scores" and row["drop_balanced_accuracy"] == pytest.approx(0.05)
    assert row["readings"]["generate"]["drop_balanced_accuracy"] == pytest.approx(0.10)
    assert row["readings"]["generate"]["val_source"] == "ledger"


def test_a_reading_whose_look_is_elsewhere_keeps_its_own_row(tmp_path):
    elsewhere = {"time": "2020-01-01T00:00:00+00:00", "splits_dir": "/other", "model_spec": "other/model"}
    reading_record(tmp_path, "generate", 0.60, look=elsewhere)
    [row] = merge_readings(read_ledger(tmp_path))
    assert row["readings"] == {"generate": row["metrics"]} and row["reading_of"] == elsewhere

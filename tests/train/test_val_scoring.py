"""labelrl.train.val_scoring: RUN_DIR/val_path.jsonl, the RL policy scored on val while it trains."""

from __future__ import annotations

import json

import pytest
import yaml

from labelrl import metrics_keys as K
from labelrl.evaluate.io import write_predictions
from labelrl.evaluate.predict import predict
from labelrl.evaluate.setup import run_data_options
from labelrl.evaluate.val_path import val_point
from labelrl.fileio import append_jsonl, read_jsonl
from labelrl.ladder.arms import arm_config
from labelrl.ladder.recipe import load_recipe
from labelrl.train import rl
from labelrl.train.config import RLConfig
from labelrl.train.val_scoring import PENDING, complete_val_path, due, enabled, path_items, scored_here

BINARY_FIELDS = {"step", "n", "seconds", "accuracy", "balanced_accuracy", "recall", "label_share", "positive_label",
                 "fpr", "tpr", "roc_auc"}
# tiny-random from scratch answers nothing parseable, so every group would be uniform and skipped; random
# rewards make the policy move. fp32: the scores are compared bit for bit with `labelrl eval`'s.
OPTIONS = dict(prompts_per_step=4, group_size=4, max_new_tokens=9, eval_limit=24, precision="fp32", random_reward=True)


@pytest.fixture(scope="module")
def distinct_data(tmp_path_factory):
    """300 items with distinct texts (the toy task's four repeated texts split by group, which leaves
    its val split one label), so the val sample holds both labels."""
    path = tmp_path_factory.mktemp("val_path") / "items.jsonl"
    words = ["grape", "mango", "chair", "table", "plum", "brick"]
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(300):
            word = words[i % len(words)]
            label = "yes" if word in ("grape", "mango", "plum") else "no"
            handle.write(json.dumps({"id": f"r{i}", "text": f"{word} number {i}", "label": label}) + "\n")
    return path


def _scored(model: str, run_dir, limit: int) -> dict:
    """val_point of `labelrl eval`'s scores of ``model`` on the run's val sample."""
    pred = predict(model, run_data_options(run_dir), "val", limit=limit, splits_dir=run_dir, precision="fp32")
    assert len(set(pred.y_true)) == 2  # both labels in the sample: the ROC fields are defined
    return val_point(pred.labels, pred.y_true, pred.scores())


def _without_seconds(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in records]


def test_written_at_step_0_every_checkpoint_and_the_end_as_labelrl_eval_scores(distinct_data, rl_config, tmp_path):
    out = tmp_path / "run"
    rl.run_rl(rl_config("tiny-random", distinct_data, out, steps=3, checkpoint_every=2, **OPTIONS))
    records = read_jsonl(out / "val_path.jsonl")
    assert [r["step"] for r in records] == [0, 2, 3]  # step 0, the checkpoint at 2, the last step
    for r in records:
        assert set(r) == BINARY_FIELDS and r["n"] == 24 and r["roc_auc"] is not None
        assert sum(r["label_share"].values()) == pytest.approx(1.0)
    # the seconds reach metrics.jsonl on the scored steps only
    assert [K.VAL_SECONDS in r for r in read_jsonl(out / "metrics.jsonl")] == [False, True, True]
    # The same sample and scorer as `labelrl eval --limit 12`: step 0 is the starting model's scores and the
    # last step the final model's (a wrong sample, a second scorer, or a point taken before the step's
    # update would differ).
    start, final = _scored("tiny-random", out, 24), _scored(str(out), out, 24)
    assert start != final  # the policy moved, else the two checks below could not tell its points apart
    assert _without_seconds(records)[0] == {"step": 0, **start}
    assert _without_seconds(records)[-1] == {"step": 3, **final}


def test_a_resumed_run_neither_duplicates_nor_keeps_lines_after_its_checkpoint(distinct_data, rl_config, tmp_path):
    options = dict(steps=4, checkpoint_every=2, **OPTIONS)
    rl.run_rl(rl_config("tiny-random", distinct_data, tmp_path / "straight", **options))
    resumed = tmp_path / "resumed"
    rl.run_rl(rl_config("tiny-random", distinct_data, resumed, stop_after=2, **options))
    assert [r["step"] for r in read_jsonl(resumed / "val_path.jsonl")] == [0, 2]
    # a line written after the last checkpoint, as a kill between a step's line and its checkpoint leaves it
    append_jsonl(resumed / "val_path.jsonl", {"step": 4, "n": -1})
    rl.run_rl(rl_config("tiny-random", distinct_data, resumed, resume=True, **options))
    records = read_jsonl(resumed / "val_path.jsonl")
    assert [r["step"] for r in records] == [0, 2, 4]  # step 2 not scored twice, the stale step 4 replaced
    assert _without_seconds(records) == _without_seconds(read_jsonl(tmp_path / "straight" / "val_path.jsonl"))


def test_switch_defaults_and_the_steps_scored(tmp_path):
    direct = RLConfig(model="tiny-random", data="sms-spam", out=tmp_path, steps=25, checkpoint_every=10)
    assert enabled(direct) and not enabled(direct.model_copy(update={"val_path": False}))
    assert [s for s in range(26) if due(s, direct)] == [0, 10, 20, 25]
    reasoning = RLConfig(model="tiny-random", data="sms-spam", out=tmp_path, mode="reasoning")
    assert not enabled(reasoning)  # label-token scoring cannot read a reasoning model's answer
    with pytest.raises(ValueError, match="val_path=True with mode='reasoning'.*drop --val-path"):
        RLConfig(model="tiny-random", data="sms-spam", out=tmp_path, mode="reasoning", val_path=True)


def test_the_ladder_scores_rl_arms_on_its_val_sample(tmp_path):
    raw = {"version": 1, "name": "t", "model": "tiny-random",
           "tasks": {"toy": {"data": "sms-spam", "eval_limit": 48,
                             "arms": {"sft": {"type": "sft"}, "grpo": {"type": "rl", "from": "sft"},
                                      "own": {"type": "rl", "from": "sft", "eval_limit": 8}}}}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    recipe = load_recipe(path)
    assert arm_config(recipe, "toy", "grpo", tmp_path).eval_limit == 48  # the task's, not RLConfig's 200
    assert arm_config(recipe, "toy", "own", tmp_path).eval_limit == 8  # an arm may still set its own
    # its own 8 are drawn within the task's 48, so step 0 can be read from the parent's val scores
    own = arm_config(recipe, "toy", "own", tmp_path)
    assert own.val_path_within == 48 and own.val_path_start == tmp_path / "toy" / "eval" / "sft-val.parquet"
    assert own.val_path_end == tmp_path / "toy" / "eval" / "own-val.parquet"  # and ends at its own val scores
    raw["tasks"]["toy"].pop("eval_limit")
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    assert arm_config(load_recipe(path), "toy", "grpo", tmp_path).eval_limit is None  # the whole val split, as the ladder


def _start_file(model: str, run_dir, limit: int, path, precision: str = "fp32"):
    """`labelrl eval`'s val predictions of ``model`` on ``limit`` items of the run's val split."""
    pred = predict(model, run_data_options(run_dir), "val", limit=limit, splits_dir=run_dir, precision=precision)
    return write_predictions(pred, path)


def test_step_0_is_read_from_the_starting_models_val_predictions(distinct_data, rl_config, tmp_path, capfd):
    options = dict(OPTIONS, steps=1, checkpoint_every=1, eval_limit=12, val_path_within=20)
    scored = tmp_path / "scored"
    rl.run_rl(rl_config("tiny-random", distinct_data, scored, **options))
    start = _start_file("tiny-random", scored, 20, tmp_path / "start-val.parquet")
    read = tmp_path / "read"
    rl.run_rl(rl_config("tiny-random", distinct_data, read, val_path_start=start, **options))
    first_scored, first_read = read_jsonl(scored / "val_path.jsonl")[0], read_jsonl(read / "val_path.jsonl")[0]
    assert "read_from" not in first_scored and first_read["read_from"] == str(start)
    # the same point as scoring the starting model: its 12 items drawn within the file's 20, the same probabilities
    assert _without_seconds([first_read])[0] == {**_without_seconds([first_scored])[0], "read_from": str(start)}
    assert "step 0 scored" not in capfd.readouterr().err
    # later steps are scored as always
    assert [("read_from" in r) for r in read_jsonl(read / "val_path.jsonl")] == [True, False]


def test_the_path_items_lie_within_the_val_sample_it_is_told(distinct_data, rl_config, tmp_path):
    cfg = rl_config("tiny-random", distinct_data, tmp_path / "run", eval_limit=6, val_path_within=20)
    from labelrl.data.prepare import prepare_data, val_sample

    data = prepare_data(cfg, tmp_path / "run")
    within = {ex.id for ex in val_sample(data, 20)}
    items = path_items(data, cfg)
    assert len(items) == 6 and {ex.id for ex in items} <= within
    # unset: drawn from the whole split, as --eval-limit alone draws them
    whole = path_items(data, cfg.model_copy(update={"val_path_within": None}))
    assert [ex.id for ex in whole] == [ex.id for ex in val_sample(data, 6)]


@pytest.mark.parametrize("case", ["another model", "items missing", "other precision", "no file"])
def test_step_0_is_scored_when_the_file_cannot_stand_for_the_starting_model(distinct_data, rl_config, tmp_path, capfd,
                                                                            case):
    options = dict(OPTIONS, steps=1, checkpoint_every=1, eval_limit=12, val_path_within=20)
    first = tmp_path / "first"
    rl.run_rl(rl_config("tiny-random", distinct_data, first, **options))
    start, why = {
        "another model": (lambda p: _start_file(str(first), first, 20, p), "its model's weights are not the starting model's"),
        "items missing": (lambda p: _start_file("tiny-random", first, 8, p), "items are not in it"),
        "other precision": (lambda p: _start_file("tiny-random", first, 20, p, precision="bf16"),
                            "precision 'bf16', not 'fp32'"),
        "no file": (lambda p: p, "no such file"),
    }[case]
    path = start(tmp_path / "start-val.parquet")
    capfd.readouterr()
    run = tmp_path / "run"
    rl.run_rl(rl_config("tiny-random", distinct_data, run, val_path_start=path, **options))
    assert "read_from" not in read_jsonl(run / "val_path.jsonl")[0]
    err = " ".join(capfd.readouterr().err.split())
    assert f"val path: step 0 scored, not read from {path}" in err and why in err


def _end_options(**more) -> dict:
    return dict(OPTIONS, steps=2, checkpoint_every=1, eval_limit=12, val_path_within=20, **more)


def test_the_last_step_is_read_from_the_final_models_val_predictions(distinct_data, rl_config, tmp_path, monkeypatch):
    scored = tmp_path / "scored"
    rl.run_rl(rl_config("tiny-random", distinct_data, scored, **_end_options()))
    run, end = tmp_path / "run", tmp_path / "run-val.parquet"
    summary = rl.run_rl(rl_config("tiny-random", distinct_data, run, val_path_end=end, **_end_options()))
    # the run stops short of its last point and says what it waits for
    assert [r["step"] for r in read_jsonl(run / "val_path.jsonl")] == [0, 1]
    pending = summary[PENDING]
    assert pending["step"] == 2 and pending["predictions"] == str(end) and len(pending["ids"]) == 12
    assert not complete_val_path(run)  # the predictions are not written yet: nothing to read
    _start_file(str(run), run, 20, end)  # `labelrl eval` of the final model on the 20-item val sample
    from labelrl.train import collapse

    seen, real = [], collapse.detect_collapse
    monkeypatch.setattr(collapse, "detect_collapse",
                        lambda run_dir, **k: seen.append([r["step"] for r in read_jsonl(run_dir / "val_path.jsonl")])
                        or {**(real(run_dir, **k) or {}), "label": "planted"})
    assert complete_val_path(run)
    records = read_jsonl(run / "val_path.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2] and records[-1]["read_from"] == str(end)
    # the point a run that scores its last step itself writes: the same items, the same probabilities
    assert _without_seconds(records)[-1] == {**_without_seconds(read_jsonl(scored / "val_path.jsonl"))[-1],
                                             "read_from": str(end)}
    after = json.loads((run / "rl_summary.json").read_text(encoding="utf-8"))
    assert PENDING not in after and seen == [[0, 1, 2]]  # the collapse flag made again, with the last point
    assert after["collapse"]["label"] == "planted"
    assert not complete_val_path(run)  # done once
    # a kill after the line but before the summary leaves it pending: the line is written again, not twice
    (run / "rl_summary.json").write_text(json.dumps({**after, PENDING: pending}), encoding="utf-8")
    assert complete_val_path(run)
    assert [r["step"] for r in read_jsonl(run / "val_path.jsonl")] == [0, 1, 2]


def test_the_last_step_is_left_out_when_the_file_cannot_stand_for_the_final_model(distinct_data, rl_config, tmp_path,
                                                                                 capfd):
    run, end = tmp_path / "run", tmp_path / "run-val.parquet"
    rl.run_rl(rl_config("tiny-random", distinct_data, run, val_path_end=end, **_end_options()))
    _start_file("tiny-random", run, 20, end)  # the starting model's scores, not the final model's
    assert complete_val_path(run)
    assert [r["step"] for r in read_jsonl(run / "val_path.jsonl")] == [0, 1]
    summary = json.loads((run / "rl_summary.json").read_text(encoding="utf-8"))
    assert PENDING not in summary
    assert "its model's weights are not the final model's" in summary["val_path_end_missing"]
    assert f"step 2 not read from {end}" in " ".join(capfd.readouterr().err.split())


def test_only_the_last_step_waits_for_the_val_predictions(tmp_path):
    cfg = RLConfig(model="tiny-random", data="sms-spam", out=tmp_path, steps=25, checkpoint_every=10,
                   val_path_end=tmp_path / "val.parquet")
    assert [s for s in range(26) if due(s, cfg)] == [0, 10, 20, 25]
    assert [s for s in range(26) if scored_here(s, cfg)] == [0, 10, 20]
    off = cfg.model_copy(update={"val_path": False})
    assert not any(scored_here(s, off) for s in range(26))
    assert [s for s in range(26) if scored_here(s, cfg.model_copy(update={"val_path_end": None}))] == [0, 10, 20, 25]

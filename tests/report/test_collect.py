"""labelrl.report.collect: the run directory read into plain data, tolerant of missing pieces."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pytest

from labelrl import metrics_keys as K
from labelrl.report.collect import collect_run, length_buckets, rollout_step_stats


def rollouts(**columns) -> pa.Table:
    n = len(columns["step"])
    base = {"label": ["a"] * n, "answer": ["a"] * n, "reward": [1.0] * n, "completion_tokens": [5] * n,
            "truncated": [False] * n, "think_closed": [True] * n}
    return pa.table({**base, **columns})


def test_rollout_balanced_accuracy_is_the_mean_per_label_recall():
    table = rollouts(step=[1, 1, 1, 1, 2, 2],
                     label=["spam", "spam", "spam", "ham", " Spam", "ham"],
                     answer=["spam", "ham", None, "ham", "spam", "spam"])
    one, two = rollout_step_stats(table)
    # step 1: spam 1 of 3 right, ham 1 of 1 → accuracy 2/4 = 0.5, BA = (1/3 + 1)/2 = 2/3
    assert one == {"step": 1, "n": 4, "accuracy": 0.5, "balanced_accuracy": pytest.approx(2 / 3)}
    # step 2: " Spam" vs "spam" match after trimming and case-folding; ham wrong → BA = (1 + 0)/2
    assert two["accuracy"] == 0.5 and two["balanced_accuracy"] == 0.5


def test_length_buckets_split_tokens_into_equal_integer_ranges():
    table = rollouts(step=[1, 1, 1, 1], completion_tokens=[0, 1, 2, 3], think_closed=[True, False, True, True],
                     reward=[1.0, 0.0, 1.0, 0.0], truncated=[False, False, False, True])
    # tokens 0..3 → edges 0, 2, 4: [0, 2) holds 0 and 1, [2, 4) holds 2 and 3
    low, high = length_buckets(table, n_buckets=2)
    assert (low["lo"], low["hi"], low["n"], high["lo"], high["hi"], high["n"]) == (0, 2, 2, 2, 4, 2)
    assert (low["think_closed_rate"], high["think_closed_rate"]) == (0.5, 1.0)
    assert (low["truncated_rate"], high["truncated_rate"]) == (0.0, 0.5)
    assert low["mean_reward"] == high["mean_reward"] == 0.5
    same = length_buckets(rollouts(step=[1, 1], completion_tokens=[7, 7]))
    assert [(b["lo"], b["hi"], b["n"]) for b in same] == [(7, 8, 2)]
    assert length_buckets(rollouts(step=[])) == [] and rollout_step_stats(rollouts(step=[])) == []


def test_collect_reads_every_part_of_the_ladder_run(ladder_run):
    from labelrl.rollout.log import read_rollouts

    run = collect_run(ladder_run)
    assert run.recipe == "synthetic" and run.problems == []
    tasks = {t.name: t for t in run.tasks}
    spam = tasks["spam"]
    arms = {a.name: a for a in spam.arms}
    assert [t.name for t in run.tasks] == ["spam", "movies", "spam_noisy"]  # task_order, not the sorted keys
    assert [a.name for a in spam.arms] == ["relabel", "sft", "grpo", "corpo", "random", "distill", "control", "cot_sft", "cot_rl", "threshold"]
    assert (arms["random"].status, arms["random"].error.splitlines()[0]) == ("failed", "ValueError: reward <script>alert(1)</script> broke")
    assert arms["random"].traceback.splitlines() == ["Traceback (most recent call last):", '  File "rl.py", line 3, in step',
                                                     "ValueError: reward <script>alert(1)</script> broke"]
    assert (arms["cot_rl"].status, arms["cot_rl"].error) == ("skipped", "depends on arm 'random', which failed")
    assert arms["corpo"].holdout_repeat and not arms["grpo"].holdout_repeat
    assert (spam.ceiling, spam.ceiling_ci, spam.ceiling_source) == (0.96, [0.93, 0.99], "duplicates")
    grpo = arms["grpo"]
    assert len(grpo.steps) == 5 and all(K.REWARD_MEAN in s for s in grpo.steps)
    assert [r["accuracy"] for r in grpo.rollout_steps] == pytest.approx([s[K.ACCURACY] for s in grpo.steps])
    table = read_rollouts(ladder_run / "spam" / "grpo")
    assert sum(b["n"] for b in grpo.length_buckets) == table.num_rows
    assert arms["sft"].sft_records and not arms["sft"].is_rl and grpo.is_rl and arms["random"].is_rl
    assert arms["distill"].distill_summary["overall"]["n_items"] == 12
    assert spam.sweep["compared"] and set(spam.routes) == {"grpo"} and spam.compare["n"] == 40  # holdout items
    movies = {a.name: a for a in tasks["movies"].arms}
    assert set(movies["grpo"].ood) == {"vader-tweets"} and "mean_abs_grade_error" in movies["grpo"].val
    assert movies["corpo"].same_model_as == "grpo" and movies["grpo"].same_model_as is None
    assert tasks["movies"].ceiling_source.startswith("rater split-half") and tasks["movies"].ceiling_ci == [0.6, 0.8]
    assert tasks["movies"].analysis_notes == {"sweep": "ordinal labels: the threshold sweep is for binary tasks",
                                              "compare": "needs finished control and cot_sft arms"}


def test_metrics_fall_back_to_the_eval_files(make_ladder_run, tmp_path):
    run_dir = make_ladder_run(tmp_path, sweep=False, distill=False, ood=True)
    ladder = json.loads((run_dir / "ladder.json").read_text())
    for arm in ("corpo", "grpo"):
        entry = ladder["tasks"]["spam"]["arms"][arm]
        entry.update(val=None, holdout=None)
        entry.pop("holdout_repeat")
    ladder["tasks"]["movies"]["arms"]["sft"]["ood"] = {}
    (run_dir / "ladder.json").write_text(json.dumps(ladder))
    run = collect_run(run_dir)
    spam = {a.name: a for a in next(t for t in run.tasks if t.name == "spam").arms}
    report = json.loads((run_dir / "spam" / "eval" / "corpo-val.json").read_text())
    assert spam["corpo"].val["balanced_accuracy"] == report["metrics"]["balanced_accuracy"]
    assert spam["corpo"].holdout_repeat is True and spam["grpo"].holdout_repeat is False  # from the ledger records
    movies = next(t for t in run.tasks if t.name == "movies")
    assert "vader-tweets" in movies.arms[0].ood


def test_missing_and_damaged_files_leave_gaps_not_errors(make_ladder_run, tmp_path):
    run_dir = make_ladder_run(tmp_path, distill=False)
    shutil.rmtree(run_dir / "spam" / "grpo")
    (run_dir / "spam" / "analysis" / "sweep.json").write_text("{not json")
    (run_dir / "spam" / "corpo" / "rollouts" / "step_000002.parquet").write_bytes(b"garbage")
    (run_dir / "movies" / "audit.json").unlink()
    (run_dir / "movies" / "grpo" / "metrics.jsonl").write_bytes(b"\xff\xfe binary")
    run = collect_run(run_dir)
    spam = next(t for t in run.tasks if t.name == "spam")
    arms = {a.name: a for a in spam.arms}
    assert arms["grpo"].steps == [] and arms["grpo"].rollout_steps == [] and arms["grpo"].val is not None
    assert spam.sweep is None and set(spam.routes) == {"grpo"}
    assert [r["step"] for r in arms["corpo"].rollout_steps] == [1, 3, 4, 5]
    assert any("sweep.json" in p for p in run.problems) and any("step_000002" in p for p in run.problems)
    movies = next(t for t in run.tasks if t.name == "movies")
    assert movies.audit is None and (movies.ceiling, movies.ceiling_ci) == (0.7, [0.6, 0.8])  # ladder.json's values
    assert next(a for a in movies.arms if a.name == "grpo").steps == []
    assert any("movies/grpo/metrics.jsonl" in p for p in run.problems)


def test_not_a_ladder_run_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"ladder\.json does not exist.*labelrl ladder"):
        collect_run(tmp_path)
    with pytest.raises(ValueError, match="is not a directory"):
        collect_run(tmp_path / "nowhere")
    (tmp_path / "ladder.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        collect_run(tmp_path)
    (tmp_path / "ladder.json").write_text(json.dumps({"tasks": {"t": {"arms": {"a": {"type": "sft", "status": "pending"}}}}}))
    run = collect_run(tmp_path)
    # a pending arm without any file is read, not refused
    assert run.tasks[0].arms[0].status == "pending" and run.tasks[0].arms[0].val is None


def test_without_the_ladder_fields_the_audit_gives_the_ceiling_and_types_give_the_order(make_ladder_run, tmp_path):
    run_dir = make_ladder_run(tmp_path, sweep=False, distill=False, ood=False, movies_rl=False)
    ladder = json.loads((run_dir / "ladder.json").read_text())
    del ladder["task_order"]
    for task in ladder["tasks"].values():
        for key in ("ceiling", "ceiling_ci", "ceiling_source", "arm_order", "analysis"):
            task.pop(key, None)
    ladder["tasks"]["movies"]["analysis"] = {"note": "no finished direct SFT arm: nothing to compare against"}
    (run_dir / "ladder.json").write_text(json.dumps(ladder))
    run = collect_run(run_dir)
    spam = next(t for t in run.tasks if t.name == "spam")
    assert (spam.ceiling, spam.ceiling_ci, spam.ceiling_source) == (0.96, [0.93, 0.99], "duplicates")  # audit.json
    # relabel, sft, then rl by name, then controls
    assert [a.name for a in spam.arms] == ["relabel", "sft", "corpo", "grpo", "random"]
    movies = next(t for t in run.tasks if t.name == "movies")
    assert set(movies.analysis_notes) == {"sweep", "route", "compare"}

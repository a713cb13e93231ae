"""An RL arm collapsed to one answer in the ladder: its verdict names the collapse and never says
"worse", the majority-class row and its paired verdicts, ``on_collapse: stop``, and the tables of
the console and the report. Evaluation files are written directly (no training), except for the
ladder run, whose arms are finished on disk before it starts."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from rich.console import Console

from labelrl import metrics_keys as K
from labelrl.evaluate.io import Predictions, predictions_table, write_predictions
from labelrl.fileio import atomic_write_json, read_jsonl
from labelrl.ladder.analysis import analyse_task
from labelrl.types import LabelSpace

SPAM = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
N = 60
TRUTH = ["ham"] * 36 + ["spam"] * 24  # 60% ham on val and on the holdout
FLAG = {"label": "ham", "step": 5, "share": 0.97, "series": "rollouts"}


def predictions(answers: list[str], scores: bool = False) -> Predictions:
    probs = None
    if scores:  # the answer's label gets 0.8 (a scored model, so the sweep has a curve)
        probs = np.array([[0.8, 0.2] if a == "ham" else [0.2, 0.8] for a in answers])
    table = predictions_table([f"i{i}" for i in range(N)], TRUTH, answers, ["ok"] * N, SPAM, probs)
    return Predictions(table, SPAM, {"method": "scores" if scores else "generate"})


def answers(right: int) -> list[str]:
    """Right on the first ``right`` items of each label (in proportion), wrong on the rest."""
    out = []
    for label, n in (("ham", 36), ("spam", 24)):
        k = round(right * n / N)
        out += [label] * k + [{"ham": "spam", "spam": "ham"}[label]] * (n - k)
    return out


@pytest.fixture
def task(tmp_path) -> tuple[Path, dict]:
    """sft (51 of 60 right), grpo collapsed to ham (flagged), dr_grpo not collapsed but worse than
    sft (30 of 60 right), with val and holdout evaluations; the training sample is 30 ham, 20 spam."""
    task_dir = tmp_path / "spam"
    runs = {"sft": predictions(answers(51), scores=True), "grpo": predictions(["ham"] * N),
            "dr_grpo": predictions(answers(30))}
    for name, pred in runs.items():
        for split in ("val", "holdout"):
            write_predictions(pred, task_dir / "eval" / f"{name}-{split}.parquet")
    atomic_write_json(task_dir / "samples.json", {"train": {"n": 50, "label_counts": {"ham": 30, "spam": 20}, "ids": []}})
    rl = {"type": "rl", "status": "done", "from": "sft", "seed": 0, "config": {}}
    arms = {"sft": {"type": "sft", "status": "done", "seed": 0, "config": {}},
            "grpo": {**rl, "preset": "grpo", "train": {"failed_positive_frac": 0.1, "collapse": FLAG}},
            "dr_grpo": {**rl, "preset": "dr_grpo", "train": {"failed_positive_frac": 0.2, "collapse": None}}}
    tstate = {"kind": "binary", "labels": ["ham", "spam"], "positive_label": "spam", "success_threshold": None,
              "arms": arms, "arm_order": list(arms), "data": "toy", "ood": []}
    tstate["analysis"] = analyse_task(SimpleNamespace(n_boot=200), task_dir, tstate)
    tstate["verdict"] = tstate["analysis"]["verdict"]
    return task_dir, tstate


def test_a_collapsed_arm_is_named_collapsed_never_worse(task):
    _, tstate = task
    verdict = {v["arm"]: v for v in tstate["verdict"]}
    grpo = verdict["grpo"]
    assert grpo["collapsed"] == {"text": "collapsed to ham at step 5", "runs": {"grpo": FLAG}}
    # the constant "ham" loses to sft (BA 0.5 against 0.85): the numbers stay, the words name the collapse
    assert grpo["vs_sft"].startswith("vs sft: collapsed to ham at step 5 (ΔBA -")
    assert grpo["vs_sft"].endswith(": the collapse, not the method)")
    assert grpo["text"].startswith("grpo: collapsed to ham at step 5; vs sft: collapsed to ham at step 5 (ΔBA -")
    assert "worse" not in grpo["text"]
    # an arm that is worse without collapsing keeps its "worse": catches rewording every comparison
    dr = verdict["dr_grpo"]
    assert dr["collapsed"] is None and dr["vs_sft"].startswith("vs sft: worse (ΔBA -")
    assert "collapsed" not in dr["text"]


def test_paired_json_marks_the_collapsed_side(task):
    task_dir, _ = task
    paired = json.loads((task_dir / "analysis" / "paired.json").read_text())
    vs_sft = next(c for c in paired if c["kind"] == "vs_sft" and c["b"] == "grpo")
    assert vs_sft["result"]["verdict"].startswith("grpo vs sft: worse (")  # the measurement itself is kept as made
    assert vs_sft["collapsed"] == {"b": "collapsed to ham at step 5"}
    assert vs_sft["words"].startswith("collapsed to ham at step 5 (ΔBA")
    ablation = next(c for c in paired if c["kind"] == "ablation")
    assert ablation["collapsed"] == {"a": "collapsed to ham at step 5"}  # grpo is side A there
    assert "collapsed" not in next(c for c in paired if c["kind"] == "vs_sft" and c["b"] == "dr_grpo")


def test_the_majority_class_row_and_every_trained_arm_against_it(task):
    task_dir, tstate = task
    majority = tstate["analysis"]["majority"]
    # 30 ham of 50 training items → ham on every item; holdout: 36 of 60 right → accuracy 0.6,
    # recall ham 1 and spam 0 → balanced accuracy 0.5
    assert majority["label"] == "ham" and majority["from"] == "sft"
    for split in ("val", "holdout"):
        assert majority[split]["accuracy"] == pytest.approx(0.6) and majority[split]["balanced_accuracy"] == pytest.approx(0.5)
        assert majority[split]["n"] == N
    paired = [c for c in json.loads((task_dir / "analysis" / "paired.json").read_text()) if c["kind"] == "vs_majority"]
    assert [c["b"] for c in paired] == ["sft", "grpo", "dr_grpo"] and {c["a"] for c in paired} == {"majority class (ham)"}
    by_arm = {c["b"]: c["result"]["metrics"]["balanced_accuracy"] for c in paired}
    # sft: (51/60-ish right) recall ham 31/36, spam 20/24 → BA 0.847, Δ = +0.347 over the constant
    assert by_arm["sft"]["delta"] == pytest.approx((31 / 36 + 20 / 24) / 2 - 0.5)
    assert by_arm["grpo"]["delta"] == 0.0  # the collapsed arm is the constant predictor itself
    verdict = {v["arm"]: v for v in tstate["verdict"]}
    assert verdict["grpo"]["vs_majority"].startswith("vs majority class (ham): no detectable difference (ΔBA +0.000")
    assert verdict["grpo"]["text"].endswith(verdict["grpo"]["vs_majority"])
    # no ledger look: the baseline is built from the sft arm's files
    assert not (task_dir / "ledger.jsonl").exists()


def test_the_console_table_and_the_report_show_both(task, tmp_path):
    from labelrl.cli.ladder import comparison_tables
    from labelrl.report import build_report

    task_dir, tstate = task
    state = {"format": 1, "recipe": "toy", "run_dir": str(task_dir.parent), "tasks": {"spam": tstate}, "task_order": ["spam"]}
    console = Console(record=True, width=250)
    for table in comparison_tables(state):
        console.print(table)
    text = console.export_text()
    assert "majority class (ham)" in text and "0.600" in text
    assert "done, collapsed" in text and "grpo: collapsed to ham at step 5 (0.97 of the parsed rollout answers)" in text
    atomic_write_json(task_dir.parent / "ladder.json", state)
    report = build_report(task_dir.parent, tmp_path / "report").markdown.read_text(encoding="utf-8")
    assert "majority class (ham)" in report and "against the majority class" in report
    grpo_rows = [line for line in report.splitlines() if line.startswith("| grpo |")]
    assert grpo_rows and "collapsed to ham at step 5" in grpo_rows[0]
    vs_sft_row = next(line for line in report.splitlines() if line.startswith("| grpo vs sft |"))
    assert "the collapse, not the method" in vs_sft_row and "worse" not in vs_sft_row


# ---------------------------------------------------------------- on_collapse: stop


def toy_rows(n: int = 40) -> list[dict]:
    words = ["grape", "mango", "chair", "table"]
    return [{"id": f"t{i}", "text": f"item {i}: {words[i % 4]}", "label": "yes" if i % 4 < 2 else "no"} for i in range(n)]


def finish_rl_arm(arm_dir: Path, flag: dict | None) -> None:
    """What a finished `labelrl rl` leaves that the ladder reads (no model weights are needed)."""
    (arm_dir / "model").mkdir(parents=True)
    (arm_dir / "metrics.jsonl").write_text(json.dumps({K.STEP: 1, K.REWARD_MEAN: 0.5, K.FAILED_POSITIVE_FRAC: 0.0}) + "\n")
    atomic_write_json(arm_dir / "rl_summary.json", {"steps_done": 1, "steps": 1, "stopped_early": False, "collapse": flag})


def test_on_collapse_stop_spends_no_look_and_skips_the_dependants(tmp_path):
    from labelrl.ladder import Ladder, load_recipe

    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in toy_rows()), encoding="utf-8")
    recipe = {"version": 1, "name": "stop", "model": "tiny-random", "seed": 0, "defaults": {"rl": {"lora": False, "quiet": True}},
              "tasks": {"toy": {"data": str(data), "text_col": ["text"], "label_col": "label", "audit": False, "n_boot": 20,
                                "on_collapse": "stop",
                                "arms": {"sft": {"type": "sft"}, "grpo": {"type": "rl", "from": "sft"},
                                         "dr_grpo": {"type": "rl", "from": "sft", "preset": "dr_grpo"},
                                         "teach": {"type": "distill", "teacher": "grpo"}}}}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    run_dir = tmp_path / "run"
    flag = {"label": "yes", "step": 3, "share": 1.0, "series": "val"}
    finish_rl_arm(run_dir / "toy" / "grpo", flag)
    finish_rl_arm(run_dir / "toy" / "dr_grpo", flag)
    ladder = Ladder(load_recipe(path), run_dir, Console(quiet=True))
    sft = ladder.configs["toy"]["sft"].model_dump(mode="json")  # finished earlier: the ladder skips it
    ladder.state["tasks"]["toy"] = {"arms": {"sft": {"type": "sft", "status": "done", "config": sft}}}
    state = ladder.run()
    arms = state["tasks"]["toy"]["arms"]
    assert arms["grpo"]["status"] == "collapsed" and arms["grpo"]["train"]["collapse"] == flag
    assert arms["teach"]["status"] == "skipped" and arms["teach"]["error"] == "depends on arm 'grpo', which collapsed"
    # no evaluation at all, so no holdout look for either collapsed arm
    assert not list((run_dir / "toy" / "eval").glob("*grpo*"))
    assert not any("grpo" in str(r.get("model_spec")) for r in read_jsonl(run_dir / "toy" / "ledger.jsonl"))
    verdict = {v["arm"]: v["text"] for v in state["tasks"]["toy"]["verdict"]}
    assert verdict["grpo"] == ("grpo: collapsed to yes at step 3 (1.00 of the greedy val answers); on_collapse: stop, "
                               "so not evaluated (no holdout look)")
    assert "dr_grpo" in verdict

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


def build_task(task_dir: Path, grpo_flag: dict = FLAG, extra: dict[str, list[str]] | None = None) -> dict:
    """The task of the ``task`` fixture (below) in ``task_dir``, with ``grpo_flag`` as grpo's
    collapse flag and ``extra`` RL arms (from sft, not collapsed) answering as given on val and
    holdout; returns its analysed state."""
    runs = {"sft": predictions(answers(51), scores=True), "grpo": predictions(["ham"] * N),
            "dr_grpo": predictions(answers(30)), **{k: predictions(v) for k, v in (extra or {}).items()}}
    for name, pred in runs.items():
        for split in ("val", "holdout"):
            write_predictions(pred, task_dir / "eval" / f"{name}-{split}.parquet")
    atomic_write_json(task_dir / "samples.json", {"train": {"n": 50, "label_counts": {"ham": 30, "spam": 20}, "ids": []}})
    rl = {"type": "rl", "status": "done", "from": "sft", "seed": 0, "config": {}}
    arms = {"sft": {"type": "sft", "status": "done", "seed": 0, "config": {}},
            "grpo": {**rl, "preset": "grpo", "train": {"failed_positive_frac": 0.1, "collapse": grpo_flag}},
            "dr_grpo": {**rl, "preset": "dr_grpo", "train": {"failed_positive_frac": 0.2, "collapse": None}},
            **{k: {**rl, "preset": "grpo", "train": {"failed_positive_frac": 0.1, "collapse": None}} for k in extra or {}}}
    tstate = {"kind": "binary", "labels": ["ham", "spam"], "positive_label": "spam", "success_threshold": None,
              "arms": arms, "arm_order": list(arms), "data": "toy", "ood": []}
    tstate["analysis"] = analyse_task(SimpleNamespace(n_boot=200), task_dir, tstate)
    tstate["verdict"] = tstate["analysis"]["verdict"]
    return tstate


@pytest.fixture
def task(tmp_path) -> tuple[Path, dict]:
    """sft (51 of 60 right), grpo collapsed to ham (flagged), dr_grpo not collapsed but worse than
    sft (30 of 60 right), with val and holdout evaluations; the training sample is 30 ham, 20 spam."""
    task_dir = tmp_path / "spam"
    return task_dir, build_task(task_dir)


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
    grpo_rows = [line for line in report.splitlines() if line.startswith(("| grpo |", "| grpo (collapsed) |"))]
    # the verdict grid comes first (labelrl.ladder.grid), the collapse in its row's name and its cell
    assert grpo_rows[0].startswith("| grpo (collapsed) | collapsed |")
    assert any("collapsed to ham at step 5" in row for row in grpo_rows[1:])
    vs_sft_row = next(line for line in report.splitlines() if line.startswith("| grpo vs sft |"))
    assert "the collapse, not the method" in vs_sft_row and "worse" not in vs_sft_row


def test_every_verdict_entry_says_whether_it_is_a_method_result(task):
    _, tstate = task
    # no run here has a metrics file or answers equal to its parent's: the keys are there, None
    assert all(v["no_signal"] is None and v["unmoved"] is None for v in tstate["verdict"])


# ---------------------------------------------------------------- inherited collapse


def test_an_inherited_collapse_is_named_with_the_parent(tmp_path):
    # grpo's start (its parent sft) was already collapsed to ham: still named, never silently, with the parent
    tstate = build_task(tmp_path / "spam", grpo_flag={**FLAG, "inherited": True})
    grpo = {v["arm"]: v for v in tstate["verdict"]}["grpo"]
    assert grpo["collapsed"]["text"] == "collapsed to ham (inherited from sft)"
    # the comparison it loses is worded as the collapse, like any other (catches a plain "worse")
    assert grpo["text"].startswith("grpo: collapsed to ham (inherited from sft); vs sft: collapsed to ham "
                                   "(inherited from sft) (ΔBA -")
    assert grpo["vs_sft"].endswith(": the collapse, not the method)") and "worse" not in grpo["text"]
    assert "at step" not in grpo["collapsed"]["text"]  # the run did not cause it at step 5


def test_an_arm_stopped_on_an_inherited_collapse_names_the_parent():
    from labelrl.ladder.collapse import stopped_entries

    flag = {"label": "yes", "step": 2, "share": 1.0, "series": "val", "inherited": True}
    tstate = {"arms": {"sft": {"type": "sft", "status": "done"},
                       "grpo": {"type": "rl", "status": "collapsed", "from": "sft", "train": {"collapse": flag}}}}
    (entry,) = stopped_entries(tstate)
    assert entry["text"] == ("grpo: collapsed to yes (inherited from sft) (1.00 of the greedy val answers); "
                             "on_collapse: stop, so not evaluated (no holdout look)")
    assert entry["no_signal"] is None and entry["unmoved"] is None


# ---------------------------------------------------------------- no learning signal


def write_uniform(run_dir: Path, fracs: list[float]) -> None:
    """metrics.jsonl with ``groups/uniform_frac`` per step."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({K.STEP: i + 1, K.UNIFORM_FRAC: f}) + "\n"
                                                   for i, f in enumerate(fracs)), encoding="utf-8")


def test_no_learning_signal_is_more_than_half_the_steps_uniform():
    from labelrl.ladder.collapse import no_signal_text

    # 4 of 6 steps with every group uniform (1.0): 4 > 6 / 2
    assert no_signal_text([1.0, 1.0, 0.5, 1.0, 1.0, 0.0]) == "no learning signal (4 of 6 steps uniform)"
    # 3 of 6 is half, not more than half (catches ≥); 0.99 is not a uniform step (catches a rounded test)
    assert no_signal_text([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]) is None
    assert no_signal_text([0.99] * 6) is None
    # steps without the metric are left out of n: 2 of 3 logged
    assert no_signal_text([1.0, None, 1.0, 0.0]) == "no learning signal (2 of 3 steps uniform)"
    assert no_signal_text([]) is None


def test_no_learning_signal_is_read_from_the_run_files_per_seed(tmp_path):
    from labelrl.ladder.collapse import group_no_signal

    arms = {"a": {"type": "rl", "from": "sft"}, "a-s1": {"type": "rl", "from": "sft"}, "sft": {"type": "sft"}}
    write_uniform(tmp_path / "a", [1.0] * 5 + [0.0])  # 5 of 6
    write_uniform(tmp_path / "a-s1", [0.0] * 6)
    write_uniform(tmp_path / "sft", [1.0] * 6)  # not an RL run: never judged
    assert group_no_signal(arms, ["a"], tmp_path) == "no learning signal (5 of 6 steps uniform)"
    assert group_no_signal(arms, ["a", "a-s1"], tmp_path) == "no learning signal in 1 of 2 seeds (a (5 of 6 steps uniform))"
    assert group_no_signal(arms, ["a-s1"], tmp_path) is None and group_no_signal(arms, ["sft"], tmp_path) is None
    assert group_no_signal(arms, ["a"], None) is None


def test_a_run_without_learning_signal_is_not_a_result(tmp_path):
    from labelrl.evaluate.paired import verdict_words
    from labelrl.ladder.collapse import mark_collapsed

    task_dir = tmp_path / "spam"
    write_uniform(task_dir / "dr_grpo", [1.0, 1.0, 1.0, 1.0, 1.0, 0.25])  # 5 of 6 steps uniform
    tstate = build_task(task_dir)
    dr = {v["arm"]: v for v in tstate["verdict"]}["dr_grpo"]
    assert dr["no_signal"] == "no learning signal (5 of 6 steps uniform)" and dr["unmoved"] is None
    assert dr["text"].startswith("dr_grpo: no learning signal (5 of 6 steps uniform); vs sft: ")
    # its paired comparisons, marked with the task directory: "not a result" in front of the same numbers
    comparisons = json.loads((task_dir / "analysis" / "paired.json").read_text())
    mark_collapsed(comparisons, tstate["arms"], task_dir)
    vs_sft = next(c for c in comparisons if c["kind"] == "vs_sft" and c["b"] == "dr_grpo")
    assert vs_sft["not_a_result"] == {"b": "no learning signal (5 of 6 steps uniform)"}
    numbers = verdict_words(vs_sft["result"]).partition(" (")[2]  # "ΔBA -… over 60 items …)"
    # the comparison names it short ("no learning signal"): the arm's line above gives the counts
    assert vs_sft["words"] == f"no learning signal: not a result ({numbers}"
    assert numbers.startswith("ΔBA -") and "worse" not in vs_sft["words"]
    # without the task directory nothing is read (backward compatible): no mark
    again = [{k: v for k, v in c.items() if k not in ("not_a_result", "words")}  # as the ladder wrote them, unmarked
             for c in json.loads((task_dir / "analysis" / "paired.json").read_text())]
    mark_collapsed(again, tstate["arms"])
    assert all("not_a_result" not in c for c in again)


# ---------------------------------------------------------------- did not move its parent


def test_identical_answers_are_counted_on_the_shared_items_by_id():
    from labelrl.ladder.collapse import identical_share, unmoved_text

    ids = [f"i{i}" for i in range(250)]
    parent = ["ham"] * 250
    one_off = ["spam"] + ["ham"] * 249
    # 249 of 250 equal: 0.996 ≥ 0.99
    assert unmoved_text(identical_share(ids, one_off, ids, parent)) == ("did not move its parent "
                                                                        "(answers identical on 99.6% of items)")
    # 247 of 250: 0.988 < 0.99
    assert unmoved_text(identical_share(ids, ["spam"] * 3 + ["ham"] * 247, ids, parent)) is None
    # matched by id, not by row: the parent's file in reverse order with the odd answer last → still 249 of 250
    assert identical_share(ids, one_off, ids[::-1], one_off[::-1]) == 1.0
    assert identical_share(ids, one_off, ids[::-1], parent) == pytest.approx(0.996)
    # two unparsed answers are equal; only shared ids count; none shared: None
    assert identical_share(["a", "b", "c"], [None, "ham", "x"], ["a", "b"], [None, "ham"]) == 1.0
    assert identical_share(["a"], ["ham"], ["b"], ["ham"]) is None


def test_an_arm_that_did_not_move_its_parent_is_not_a_result(tmp_path):
    from labelrl.ladder.collapse import comparison_words, mark_collapsed

    task_dir = tmp_path / "spam"
    # corpo answers exactly as sft on all 60 holdout items (100%); moved differs on one (59/60 = 98.3% < 99%)
    moved = answers(51)
    moved[0] = "spam" if moved[0] == "ham" else "ham"
    tstate = build_task(task_dir, extra={"corpo": answers(51), "moved": moved})
    verdict = {v["arm"]: v for v in tstate["verdict"]}
    text = "did not move its parent (answers identical on 100.0% of items)"
    assert verdict["corpo"]["unmoved"] == text and verdict["corpo"]["no_signal"] is None
    assert verdict["corpo"]["text"].startswith(f"corpo: {text}; vs sft: did not move its parent: not a result (ΔBA +0.000")
    assert verdict["moved"]["unmoved"] is None and not verdict["moved"]["text"].startswith("moved: did not")
    # grpo (constant ham) agrees with sft on 35 of 60 items: moved, and still named collapsed
    assert verdict["grpo"]["unmoved"] is None and verdict["grpo"]["collapsed"] is not None
    comparisons = json.loads((task_dir / "analysis" / "paired.json").read_text())
    mark_collapsed(comparisons, tstate["arms"], task_dir)
    vs_sft = next(c for c in comparisons if c["kind"] == "vs_sft" and c["b"] == "corpo")
    assert vs_sft["not_a_result"] == {"b": text}
    assert vs_sft["words"].startswith("did not move its parent: not a result (ΔBA +0.000")
    # on side A the arm is named: "corpo did not move its parent (…): not a result (…)"
    assert comparison_words({**vs_sft, "not_a_result": {"a": text}}, tstate["arms"]).startswith(
        f"{vs_sft['a']} did not move its parent: not a result (ΔBA +0.000")
    # both sides (an ablation of two arms that learned nothing): each named, its reasons joined by "and"
    both = {"a": "no learning signal (3 of 3 steps uniform); " + text, "b": text}
    assert comparison_words({**vs_sft, "not_a_result": both}, tstate["arms"]).startswith(
        f"{vs_sft['a']} no learning signal and did not move its parent; corpo did not move its parent: "
        "not a result (ΔBA +0.000")


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

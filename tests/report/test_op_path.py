"""labelrl.report.op_path: the RL checkpoints' path on val, drawn from constructed run files."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from sklearn.metrics import roc_curve

from labelrl.evaluate.io import read_predictions
from labelrl.fileio import append_jsonl
from labelrl.report import build_report
from labelrl.report import op_path as P
from labelrl.report.collect import collect_run
from labelrl.report.render import FigureSink, Image, Para, TableBlock

# spam: recall per label at each evaluated step, drifting towards answering ham (TPR falls, FPR falls)
SPAM_PATH = [(0, {"ham": 0.80, "spam": 0.70}), (2, {"ham": 0.90, "spam": 0.50}), (4, {"ham": 1.00, "spam": 0.20})]
MOVIES_PATH = [(0, {"1": 0.5, "2": 0.4, "3": 0.3, "4": 0.4, "5": 0.5}),
               (3, {"1": 0.1, "2": 0.2, "3": 0.9, "4": 0.2, "5": 0.0})]


def write_path(arm_dir, steps, n: int) -> None:
    for step, recall in steps:
        share = {label: 1 / len(recall) for label in recall}
        append_jsonl(arm_dir / "val_path.jsonl", {"step": step, "n": n, "recall": recall, "label_share": share,
                                                  "balanced_accuracy": float(np.mean(list(recall.values())))})


@pytest.fixture(scope="module")
def run_dir(ladder_run, tmp_path_factory):
    """The synthetic run (conftest) copied, with val paths added: spam's sft curve is on its 60 val items."""
    run = tmp_path_factory.mktemp("op_path") / "run"
    shutil.copytree(ladder_run, run)
    write_path(run / "spam" / "grpo", SPAM_PATH, 60)
    write_path(run / "spam" / "corpo", SPAM_PATH[:2], 30)  # scored on another sample than sft's curve
    write_path(run / "movies" / "grpo", MOVIES_PATH, 60)
    return run


def _task(run_dir, name):
    return next(t for t in collect_run(run_dir).tasks if t.name == name)


def test_the_one_curve_is_the_parents_val_roc_with_each_arms_path_on_it(run_dir):
    task = _task(run_dir, "spam")
    paths = P.val_paths(task)
    assert set(paths) == {"grpo", "corpo"}  # RL arms with a val_path.jsonl only
    roc = P.parent_roc(task, "sft")
    points = P.path_points(paths["grpo"], "spam", task.labels)
    fig = P.one_curve_figure("spam", "sft", roc, [("grpo", points)], "spam")
    ax = fig.axes[0]
    curve, path = ax.lines[0], ax.lines[2]  # [0] the parent's ROC, [1] chance, [2] grpo's path
    sft = read_predictions(run_dir / "spam" / "eval" / "sft-val.parquet")
    fpr, tpr, _ = roc_curve(np.array(sft.y_true) == "spam", sft.scores()[:, 1])
    np.testing.assert_allclose(curve.get_xdata(), fpr)
    np.testing.assert_allclose(curve.get_ydata(), tpr)
    # TPR = recall of spam, FPR = 1 − recall of ham (the task's positive label; swapped axes would fail)
    np.testing.assert_allclose(path.get_xdata(), [0.2, 0.1, 0.0], atol=1e-12)
    np.testing.assert_allclose(path.get_ydata(), [0.7, 0.5, 0.2])
    assert [t.get_text() for t in ax.texts] == ["0", "2", "4"]  # numbered by step
    star = ax.collections[-1]  # the last step emphasised
    np.testing.assert_allclose(star.get_offsets(), [[0.0, 0.2]], atol=1e-12)
    assert "grpo: step 4 (last)" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert ax.get_title() and "recall of 'spam'" in ax.get_ylabel() and "0–1" in ax.get_xlabel()


def test_blocks_say_when_the_arms_were_scored_on_another_sample(run_dir, tmp_path):
    blocks = P.path_blocks(_task(run_dir, "spam"), FigureSink(tmp_path))
    assert isinstance(blocks[0], Image) and "the one curve" in blocks[0].caption
    notes = [b.text for b in blocks if isinstance(b, Para)]
    assert any("scored on 30 val items and sft's curve on 60" in n for n in notes)  # corpo's sample
    table = next(b for b in blocks if isinstance(b, TableBlock))
    grpo = next(r for r in table.rows if r[0] == "grpo")
    assert grpo[1] == "0, 2, 4" and grpo[4] == "(0.200, 0.700) → (0.000, 0.200)"


def test_other_label_kinds_get_recall_per_label_per_checkpoint(run_dir):
    task = _task(run_dir, "movies")
    paths = P.val_paths(task)
    fig = P.recall_path_figure("movies", [("grpo", paths["grpo"])], task.labels)
    ax = fig.axes[0]
    assert len(ax.lines) == 5  # a line per label
    three = next(line for line in ax.lines if line.get_label() == "label 3")
    assert list(three.get_xdata()) == [0, 3] and list(three.get_ydata()) == [0.3, 0.9]


def test_the_report_embeds_the_figures(run_dir, tmp_path):
    result = build_report(run_dir, tmp_path / "report")
    names = {p.name for p in result.figures}
    assert {"spam-one-curve-sft.png", "movies-val-recall-path.png"} <= names
    md = result.markdown.read_text(encoding="utf-8")
    assert "figures/spam-one-curve-sft.png" in md and "val_path.jsonl" in md
    assert "data:image/png;base64" in result.html.read_text(encoding="utf-8")


def test_no_val_path_no_blocks(ladder_run, tmp_path):
    assert P.path_blocks(_task(ladder_run, "spam"), FigureSink(tmp_path)) == []

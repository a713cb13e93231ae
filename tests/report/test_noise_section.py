"""Section 8 (label noise): the ladder's slope verdict, read from ``analysis/noise_slope.json``,
stands under the figure of holdout balanced accuracy against ε."""

from __future__ import annotations

import json

from labelrl.evaluate.io import Predictions, predictions_table, read_predictions, write_predictions
from labelrl.evaluate.ledger import summary_metrics
from labelrl.evaluate.metrics import classification_metrics
from labelrl.fileio import atomic_write_json
from labelrl.ladder.noise_slope import noise_slope_analysis
from labelrl.report import build_report
from labelrl.report.analyses import noise_slope_lines
from labelrl.report.collect import collect_run
from labelrl.report.conclusions import noise
from labelrl.report.render import FigureSink, Image, Para, TableBlock
from labelrl.types import LabelSpace

SPAM = LabelSpace(("ham", "spam"), kind="binary", positive="spam")


def _run(right: int, n: int = 20) -> Predictions:
    """n ham then n spam items, the first ``right`` of each answered right: BA = right / n."""
    answers = ["ham"] * right + ["spam"] * (n - right) + ["spam"] * right + ["ham"] * (n - right)
    table = predictions_table([f"i{i}" for i in range(2 * n)], ["ham"] * n + ["spam"] * n, answers, ["ok"] * 2 * n, SPAM)
    return Predictions(table, SPAM)


def _noise_run(root, with_slope: bool = True):
    """Three rates of sms-spam, sft and grpo (from sft) each: BA sft 0.9, 0.9, 0.85; grpo 0.9, 0.75, 0.5."""
    run, tasks = root / "run", {}
    for name, eps, sft, grpo in (("e00", 0.0, 18, 18), ("e10", 0.1, 18, 15), ("e30", 0.3, 17, 10)):
        arms = {}
        for arm, right in (("sft", sft), ("grpo", grpo)):
            path = write_predictions(_run(right), run / name / "eval" / f"{arm}-holdout.parquet")
            pred = read_predictions(path)
            metrics = classification_metrics(pred.y_true, pred.y_pred, pred.labels, n_boot=20, seed=0)
            arms[arm] = {"type": "sft" if arm == "sft" else "rl", "status": "done", "dir": f"{name}/{arm}",
                         "holdout": summary_metrics(metrics), **({"from": "sft"} if arm == "grpo" else {})}
        tasks[name] = {"data": "sms-spam", "kind": "binary", "labels": ["ham", "spam"], "positive_label": "spam",
                       "label_noise": eps, "arm_order": ["sft", "grpo"], "arms": arms}
    state = {"format": 1, "recipe": "noise", "run_dir": str(run), "tasks": tasks, "task_order": list(tasks)}
    atomic_write_json(run / "ladder.json", state)
    if with_slope:
        noise_slope_analysis(run, state, n_boot=200, seed=0)
    return run


def test_the_slope_sentence_stands_under_the_noise_figure(tmp_path):
    run = _noise_run(tmp_path)
    (line,) = noise_slope_lines(run, "sms-spam")
    words = json.loads((run / "analysis" / "noise_slope.json").read_text())["comparisons"][0]["words"]
    assert line == f"grpo vs sft, holdout balanced accuracy on ε: {words}"
    assert words.startswith("RL loses more than SFT as noise rises (slope difference ")
    assert noise_slope_lines(run, "vader-movies") == []  # another dataset's section gets none
    blocks = noise(collect_run(run), FigureSink(tmp_path / "report"))
    kinds = [type(b) for b in blocks]
    assert kinds == [Image, Para, TableBlock]  # figure, then the verdict under it, then the table
    assert blocks[1].text == line
    md = build_report(run).markdown.read_text(encoding="utf-8")
    assert md.index("figures/noise-sms-spam.png") < md.index("RL loses more than SFT as noise rises") < md.index(
        "holdout balanced accuracy by label-noise rate")


def test_without_the_slope_file_the_section_keeps_its_figure_and_table_only(tmp_path):
    run = _noise_run(tmp_path, with_slope=False)
    assert noise_slope_lines(run, "sms-spam") == []
    blocks = noise(collect_run(run), FigureSink(tmp_path / "report"))
    assert [type(b) for b in blocks] == [Image, TableBlock]

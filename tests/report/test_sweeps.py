"""Every SFT parent's threshold sweep reaches the report, its parent named.

The ladder writes ``analysis/sweep.json`` for the first SFT parent of an RL arm and
``sweep-PARENT.json`` for the others (labelrl.ladder.analysis._sweeps). A report that reads
``sweep.json`` only shows one ROC and drops the other parent's verdicts.
"""

from __future__ import annotations

import json

import pytest

from labelrl.fileio import atomic_write_json
from labelrl.report import build_report
from labelrl.report.collect import collect_run


def _second_parent(run_dir, listed: bool):
    """Add a sweep of a second SFT parent ``sft_b`` (its arms ``grpo_b``, ``corpo_b``) to the spam task;
    ``listed``: name both files in ladder.json's analysis as the ladder does, by paths under the
    directory the run was made in (not this one)."""
    analysis = run_dir / "spam" / "analysis"
    first = json.loads((analysis / "sweep.json").read_text(encoding="utf-8"))
    second = {**first, "roc_auc": 0.123456, "arms": {"base": "sft_b", "compared": ["grpo_b", "corpo_b"]}}
    atomic_write_json(analysis / "sweep-sft_b.json", second)
    if listed:
        state = json.loads((run_dir / "ladder.json").read_text(encoding="utf-8"))
        elsewhere = "/elsewhere/run/spam/analysis"
        state["tasks"]["spam"]["analysis"] = {"sweep": {"files": {"sft": f"{elsewhere}/sweep.json",
                                                                  "sft_b": f"{elsewhere}/sweep-sft_b.json"}}}
        atomic_write_json(run_dir / "ladder.json", state)
    return first


@pytest.mark.parametrize("listed", [True, False], ids=["listed-in-ladder-json", "globbed"])
def test_both_sweeps_are_collected_and_rendered_with_their_parent(make_ladder_run, tmp_path, listed):
    run_dir = make_ladder_run(tmp_path, distill=False, ood=False, movies_rl=False, noise=False)
    first = _second_parent(run_dir, listed)
    spam = collect_run(run_dir).tasks[0]
    assert list(spam.sweeps) == ["sft", "sft_b"]  # the first parent first
    assert spam.sweep == first and spam.sweeps["sft"] == first  # sweep stays the first parent's
    assert spam.sweeps["sft_b"]["roc_auc"] == 0.123456
    md = build_report(run_dir, tmp_path / "report").markdown.read_text(encoding="utf-8")
    assert "SFT model (sft): ROC-AUC" in md and "SFT model (sft_b): ROC-AUC 0.123" in md
    assert "| grpo_b |" in md and "| corpo_b |" in md and "| grpo |" in md  # each parent's verdict rows
    assert (tmp_path / "report" / "figures" / "spam-roc.png").is_file()
    assert (tmp_path / "report" / "figures" / "spam-roc-sft_b.png").is_file()

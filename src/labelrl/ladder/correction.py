"""A task's paired comparisons as one family, Holm-corrected (``labelrl.evaluate.family``).

Every comparison in ``analysis/paired.json`` that the verdict reports is one test of the family:
balanced accuracy for the kinds ``vs_sft``, ``vs_threshold``, ``vs_recall_matched``, ``ablation``
and ``vs_majority`` (holdout and every out-of-domain set), ROC-AUC for ``curve_vs_sft`` (the
ranking). The point of a binary arm (its recall and precision) describes where its answers sit
and is not tested. Each tested comparison's result gets ``family`` (the family entry plus the
``metric`` tested); its words and ``verdict`` are rewritten from the corrected decision, and the
collapse wording (``labelrl.ladder.collapse.mark_collapsed``) is applied again on top.
"""

from __future__ import annotations

import json
from pathlib import Path

from labelrl.evaluate.family import ALPHA, METHOD, correct
from labelrl.fileio import atomic_write_json

CURVE_KIND = "curve_vs_sft"
TESTED_KINDS = ("vs_sft", "vs_threshold", "vs_recall_matched", "ablation", "vs_majority", CURVE_KIND)


def tested_metric(c: dict) -> str | None:
    """The metric a comparison is tested on, or None when it is not part of the family."""
    if c.get("kind") not in TESTED_KINDS or "result" not in c:
        return None
    metric = "roc_auc" if c["kind"] == CURVE_KIND else "balanced_accuracy"
    m = (c["result"].get("metrics") or {}).get(metric)
    return metric if m and m.get("delta") is not None else None


def correct_comparisons(comparisons: list[dict]) -> dict:
    """Give every tested comparison its ``family`` and corrected words, in place; a summary back."""
    from labelrl.evaluate.curve_point import curve_words
    from labelrl.evaluate.paired import verdict

    tested = [(c, metric) for c in comparisons if (metric := tested_metric(c))]
    entries = correct([(c["result"]["metrics"][m]["delta"], c["result"]["metrics"][m].get("se")) for c, m in tested])
    for (c, metric), entry in zip(tested, entries):
        result = c["result"]
        result["family"] = {**entry, "metric": metric}
        if c["kind"] == CURVE_KIND:
            result["curve"] = curve_words(result)
            a, b = result["names"]
            result["verdict"] = f"{b} vs {a}: {result['curve']}; {result['point']}"
        else:
            result["verdict"] = verdict(result)
        c.pop("words", None)  # the collapse wording is rebuilt from the corrected decision
    return {"method": METHOD, "alpha": ALPHA, "size": len(tested), "rejected": sum(e["reject"] for e in entries)}


def correct_task(task_dir: Path, arms: dict[str, dict]) -> dict:
    """Correct ``analysis/paired.json`` of a task as one family and write it back (module docstring)."""
    from labelrl.ladder.collapse import mark_collapsed

    path = task_dir / "analysis" / "paired.json"
    if not path.is_file():
        return {"note": "no paired comparisons to correct"}
    comparisons = json.loads(path.read_text(encoding="utf-8"))
    summary = correct_comparisons(comparisons)
    mark_collapsed([c for c in comparisons if c.get("kind") != CURVE_KIND], arms, task_dir)  # the curve is worded apart
    atomic_write_json(path, comparisons)
    return {"file": str(path), **summary}

"""The curve and the point of every RL arm against its SFT parent (binary tasks), on the holdout.

RL can move a model's answers along the ROC curve its SFT parent's scores fixed (a threshold)
without changing the ranking: a run that collapsed to one answer may still rank the items as well
as its parent. So each RL arm's verdict states both, paired on the same holdout items and seeds
(``labelrl.evaluate.curve_point.paired_curve_point``): the curve (ΔROC-AUC of the label-token
scores) and the point (recall and precision of its own answers against the parent's).

The comparisons are added to ``analysis/paired.json`` as kind ``curve_vs_sft`` (after the
``paired`` step has written it; an earlier run's entries of this kind are replaced), and each
verdict gets ``curve`` and ``point`` fields, appended to its ``text``.
"""

from __future__ import annotations

import json
from pathlib import Path

from labelrl.fileio import atomic_write_json
from labelrl.ladder.kinds import RL_TYPES, groups
from labelrl.ladder.layout import eval_paths

KIND = "curve_vs_sft"


def curve_point_comparisons(task_dir: Path, arms: dict[str, dict], tstate: dict, n_boot: int) -> dict:
    """Every RL arm (its runs) against its SFT parent's runs (module docstring); returns the file and,
    per arm, the words of the curve and the point, or why an arm was left out."""
    from labelrl.evaluate.curve_point import paired_curve_point
    from labelrl.evaluate.io import read_predictions
    from labelrl.ladder.paired_arms import seeds_paired

    if tstate.get("kind") != "binary":
        return {"note": f"{tstate.get('kind')} labels: the curve (ROC-AUC) and the point are for binary tasks"}
    positive = tstate.get("positive_label")

    def preds(names: list[str]) -> list:
        return [read_predictions(eval_paths(task_dir, n, "holdout")[0], positive_label=positive) for n in names]

    made, left_out = [], {}
    grouped = groups(arms)
    for g, runs in grouped.items():
        if arms[runs[0]]["type"] not in RL_TYPES:
            continue
        parent_runs = list(dict.fromkeys(arms[r]["from"] for r in runs))
        parent = arms[parent_runs[0]].get("replicate_of") or parent_runs[0]
        a, b = preds(parent_runs), preds(runs)
        if any(p.scores() is None for p in [*a, *b]):
            left_out[g] = f"{g} or {parent} has no label-token scores (scored by generation), so no ROC curve"
            continue
        result = paired_curve_point(a, b, names=(parent, g), n_boot=max(n_boot, 1),
                                    seeds_paired=seeds_paired(arms, parent_runs, runs))
        made.append({"kind": KIND, "split": "holdout", "a": parent, "b": g, "a_runs": parent_runs, "b_runs": runs, "result": result})
    path = task_dir / "analysis" / "paired.json"
    earlier = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    atomic_write_json(path, [c for c in earlier if c.get("kind") != KIND] + made)
    return {"file": str(path), "left_out": left_out,
            "comparisons": [{"kind": KIND, "a": c["a"], "b": c["b"], "curve": c["result"]["curve"],
                             "point": c["result"]["point"]} for c in made]}


def add_curve_point(verdicts: list[dict], made: dict | None) -> None:
    """Give each RL arm's verdict its ``curve`` and ``point`` (None when not made) and append them to
    its ``text``."""
    by_arm = {c["b"]: c for c in (made or {}).get("comparisons", [])}
    for v in verdicts:
        c = by_arm.get(v["arm"])
        v["curve"], v["point"] = (c["curve"], c["point"]) if c else (None, None)
        if c:
            v["text"] += f"; {c['curve']}; {c['point']}"

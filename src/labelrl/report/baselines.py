"""The comparison table's reference rows and marks: the majority-class constant predictor
(``analysis/majority.json``, labelrl.ladder.majority) and RL arms collapsed to one answer (their
``train.collapse`` flag in ladder.json, labelrl.train.collapse). Files only: nothing recomputed."""

from __future__ import annotations

from labelrl.report.render import fmt, fmt_ci
from labelrl.report.run_data import ArmData, TaskData


def majority_rows(task: TaskData, cols: list[tuple[str, str]]) -> list[list[str]]:
    """The majority-class predictor's val and holdout rows (none when it was not scored)."""
    majority = task.majority or {}
    if "label" not in majority:
        return []
    note = (f"answers {majority['label']!r} (the {majority.get('counted', 'training sample')}'s most frequent label) on every item: the floor any "
            f"arm must clear; no model, no holdout look (scored on {majority.get('from') or '?'}'s items)")
    rows = []
    for split in ("val", "holdout"):
        m = majority.get(split) or {}
        if m:
            rows.append([f"majority class ({majority['label']})", "constant", "", split, fmt(m.get("n"), 0),
                         *[fmt_ci(m.get(k), m.get(f"{k}_ci")) for k, _ in cols], note if not rows else ""])
    return rows


def collapse_note(arm: ArmData) -> str:
    """``collapsed to ham at step 5 (0.97 of the parsed rollout answers): …`` for a flagged arm, else ""."""
    flag = arm.collapse
    if not flag:
        return ""
    series = "the parsed rollout answers" if flag.get("series", "rollouts") == "rollouts" else "the greedy val answers"
    share = flag.get("share")
    shown = f"{share:.2f} of {series}" if isinstance(share, (int, float)) else series
    outcome = ("stopped (on_collapse: stop): not evaluated" if arm.status == "collapsed"
               else "its scores are a constant answer's, not the method's")
    when = (f"(inherited from {arm.parent or 'its parent'})" if flag.get("inherited")  # the parent answered it already
            else f"at step {flag.get('step')}")
    return f"collapsed to {flag.get('label')} {when} ({shown}): {outcome}"

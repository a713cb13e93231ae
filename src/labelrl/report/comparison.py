"""Section 1 of the report, the comparison table of a task: the label ceiling, the majority-class
predictor, then every arm's val / holdout / generated / other-answer-key / OOD metrics with 95%
intervals and a note (repeat holdout looks, shared evaluations, failed and skipped arms); after
it the threshold and replicate rows, the samples, the paired comparisons, the dropped items, the
tuning grids, and the full error of each failed or skipped arm.
"""

from __future__ import annotations

from labelrl.evaluate.decision import thin_words
from labelrl.report import analyses as A
from labelrl.report import baselines as B
from labelrl.report import conclusions as C
from labelrl.report import tuning as T
from labelrl.report.render import Block, FigureSink, Items, Para, TableBlock, fmt, fmt_ci
from labelrl.report.run_data import ArmData, TaskData


def _metric_columns(task: TaskData) -> list[tuple[str, str]]:
    cols = [("accuracy", "accuracy [95% CI]"), ("balanced_accuracy", "balanced accuracy [95% CI]")]
    if task.kind == "binary":
        cols += [("precision", "precision [95% CI]"), ("recall", "recall [95% CI]"), ("f1", "F1 [95% CI]")]
    if task.kind == "ordinal":
        cols += [("mean_abs_grade_error", "mean |grade error| [95% CI]"), ("within_one_accuracy", "within-one [95% CI]")]
    return cols


def _status_note(arm: ArmData) -> str:
    first = (arm.error or "").strip().splitlines()[0] if (arm.error or "").strip() else ""
    if arm.status == "failed":
        return f"error: {first or 'no error recorded'}"
    if arm.status == "skipped":
        return f"skipped: {first or 'no reason recorded'}"
    if arm.status in ("pending", "running"):
        return f"not finished ({arm.status})"
    if arm.collapse:
        return B.collapse_note(arm)
    if arm.type == "distill":
        return "teacher traces: see section 7"
    if arm.type == "threshold" and arm.rule:
        thin = thin_words(arm.thin_val)
        return (f"no training: {arm.parent}'s scores with a {arm.rule.get('kind')} chosen on val; derived, no new holdout look"
                + (f"; {thin}" if thin else ""))
    return ""


def _arm_rows(arm: ArmData, cols: list[tuple[str, str]]) -> list[list[str]]:
    evals = [("val", arm.val, "")] if arm.val else []
    if arm.holdout:
        evals.append(("holdout REPEAT", arm.holdout, "REPEAT holdout evaluation: not an unbiased estimate")
                     if arm.holdout_repeat else ("holdout", arm.holdout, "first holdout evaluation"))
        if arm.same_model_as:
            evals[-1] = (*evals[-1][:2], f"weights identical to {arm.same_model_as}'s: its holdout result, not a new look")
    if arm.holdout_generate:
        evals += [("val (generated)", arm.val_generate or {}, "greedy generations parsed strictly"),
                  ("holdout (generated)", arm.holdout_generate, "greedy generations parsed strictly: what a user "
                   "without logit access gets")]
    for key, splits in arm.answer_keys.items():
        evals += [(f"{split} vs {key}", m, f"the same predictions against the answer key {key!r} (derived)")
                  for split, m in splits.items() if m]
    evals += [(f"OOD {name}", m, "out of domain") for name, m in arm.ood.items()]
    if arm.eval_max_new_tokens and arm.holdout:
        truncated = arm.holdout.get("n_truncated")
        share = f"; {truncated} of {arm.holdout.get('n')} holdout answers truncated" if truncated is not None else ""
        evals[0] = (*evals[0][:2], f"generated with a cap of {arm.eval_max_new_tokens} tokens{share}")
    note = _status_note(arm) or ("" if evals else "no evaluation recorded")
    evals = evals or [("—", {}, "")]
    kind = arm.type + (f" ({arm.preset})" if arm.preset else "")
    rows = []
    for i, (split, m, split_note) in enumerate(evals):
        notes = "; ".join(n for n in ((note if i == 0 else ""), split_note) if n)
        rows.append([arm.name, kind, arm.status, split, fmt(m.get("n"), 0),
                     *[fmt_ci(m.get(k), m.get(f"{k}_ci")) for k, _ in cols], notes])
    return rows


def _ceiling_row(task: TaskData, cols: list[tuple[str, str]]) -> list[str]:
    if task.ceiling is not None:
        note = f"1 − ε: the accuracy no model can exceed against these labels ({task.ceiling_source or 'audit'})"
    else:
        note = "no audit.json" if task.audit is None else "no ceiling: the audit found no duplicate or rater evidence"
    values = [fmt_ci(task.ceiling, task.ceiling_ci)] + ["—"] * (len(cols) - 1)
    return ["label ceiling (1 − ε)", "audit", "", "all items", fmt((task.audit or {}).get("n_rows"), 0), *values, note]


def comparison(task: TaskData, sink: FigureSink) -> list[Block]:
    """Section 1: the task's table (ceiling first, then every arm's evaluations) and the full
    error or reason of each failed or skipped arm."""
    cols = _metric_columns(task)
    rows, classes = [_ceiling_row(task, cols)], ["ceiling"]
    majority = B.majority_rows(task, cols)  # the constant predictor: the floor every arm must clear
    rows, classes = rows + majority, classes + ["ceiling"] * len(majority)
    for arm in task.arms:
        for row in _arm_rows(arm, cols):
            rows.append(row)
            classes.append("repeat" if row[3].endswith("REPEAT") else arm.status)
        rows += C.threshold_rows(arm, [k for k, _ in cols])
        classes += ["done"] * len(arm.matched)
    replicated = C.replicate_rows(task, [k for k, _ in cols])
    rows, classes = rows + replicated, classes + ["done"] * len(replicated)
    columns = ["arm", "type", "status", "split", "n", *[c for _, c in cols], "note"]
    caption = f"{task.name}: {task.data or '?'} ({task.kind or '?'}; labels {', '.join(task.labels) or '?'})"
    blocks: list[Block] = [TableBlock(columns, rows, caption, classes), *C.samples_table(task), *C.paired_table(task),
                           *A.drop_table(task)]
    blocks += T.tuning(task, sink)  # the values each tuned arm tried on val, and the one chosen
    troubled = [a for a in task.arms if a.status in ("failed", "skipped")]
    if troubled:
        items = [f"{a.name} ({a.status}): {a.error or 'no reason recorded'}"
                 + (f"\nlast lines of {a.dir / 'error.txt'}:\n{a.traceback}" if a.traceback else "") for a in troubled]
        blocks += [Para("Failed and skipped arms:"), Items(items, pre=True)]
    return blocks

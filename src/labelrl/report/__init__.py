"""``labelrl report RUN_DIR``: one document from a ladder run's files (no model, no torch).

``build_report(run_dir, out)`` reads the run (``collect``), draws the figures (``figures``),
assembles the sections below as blocks and writes them as ``out/report.html``
(self-contained) and ``out/report.md`` (figures under ``out/figures/``); ``render`` holds the
block types and both serialisers. A section whose inputs are absent says so in one line; a
failed or skipped arm appears in the table with its error or reason.

0. the verdict per task: each RL arm against SFT, SFT + threshold and the recall-matched
   threshold, paired over items and seeds ("no detectable difference" when the interval covers 0),
   on the holdout and on each OOD set; a direct RL arm's greedy-generation operating point; with
   2+ seeds the stability figures and CoRPO against GRPO by seed (``verdict_tables``);
1. comparison table per task: every arm's val / holdout / OOD metrics with 95% intervals, the
   audit's ceiling, the majority-class constant predictor, RL arms collapsed to one answer,
   repeat-holdout marks, failed and skipped arms, replicate means over seeds,
   the threshold arms; the samples every arm used; the paired comparisons with the config keys
   an ablation changes; the values each tuned arm tried on val, with the one chosen;
2. reward, rollout accuracy and balanced accuracy per RL step; SFT val metrics per eval;
3. completion length, truncation and think closure per step; the truncation tax by length;
4. skip-rule drift: uniform-group fraction, label share among informative groups vs data;
5. failed-positive fraction per step for every RL arm, CoRPO's regime shares;
6. the SFT model's ROC with each RL arm's operating point and verdict, each RL arm's path on val per
   checkpoint (binary: on the SFT parent's val ROC); the routing summary;
7. the distillation decomposition (filter and objective effects) and trace survival;
8. holdout balanced accuracy against injected training-label noise, per arm;
9. the lenient parser's reward inflation on the logged rollouts, and pass@k;
10. the audit per split;
11. time per phase of the last ``labelrl ladder`` (training per arm, scoring, analyses).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from labelrl import metrics_keys as K
from labelrl.fileio import atomic_write_text
from labelrl.report import analyses as A
from labelrl.report import baselines as B
from labelrl.report import conclusions as C
from labelrl.report import figures as F
from labelrl.report import op_path as P
from labelrl.report import tuning as T
from labelrl.report.timing import time_per_phase
from labelrl.report.collect import ArmData, RunData, TaskData, collect_run
from labelrl.report.render import (Block, FigureSink, Heading, Items, Para, TableBlock, fmt, fmt_ci, to_html,
                                   to_markdown)

__all__ = ["SECTIONS", "ReportResult", "build_report", "collect_run", "report_blocks"]

SECTIONS = (
    ("verdict", "Verdict"),
    ("comparison", "1. Comparison table"),
    ("curves", "2. Reward and accuracy per step"),
    ("length", "3. Completion length, truncation and think closure"),
    ("drift", "4. Skip-rule drift: uniform groups and label shares"),
    ("advantages", "5. Failed-positive advantages and CoRPO regimes"),
    ("roc", "6. ROC, operating points and routing"),
    ("distill", "7. Distillation decomposition"),
    ("noise", "8. Label noise"),
    ("parser", "9. Parser and sampling: strict vs lenient, pass@k"),
    ("labels", "10. The labels: audit per split, relabelling"),
    ("time", "11. Time per phase"),
)
NOT_RUN = {
    "verdict": "no task has a finished RL arm and an SFT arm to compare it with (analysis/verdict.json).",
    "noise": "no two tasks on the same data differ in label_noise.",
    "parser": "no RL arm's rollouts were rescored (analysis/rescore-ARM.json) and no arm has pass@k (task key pass_at_k).",
    "labels": "no audit.json with a per-split breakdown.",
    "time": "ladder.json records no phase times (the ladder writes them at the end of each invocation).",
    "comparison": "the ladder lists no task.",
    "curves": "no arm logged per-step metrics (metrics.jsonl or sft_metrics.jsonl).",
    "length": "no RL arm logged per-step metrics or rollouts.",
    "drift": "no RL arm logged groups/uniform_frac.",
    "advantages": "no RL arm logged adv/failed_positive_frac.",
    "roc": "no analysis/sweep.json, analysis/route-*.json or RL val_path.jsonl in any task.",
    "distill": "no analysis/compare.json and no distill arm summary (traces.summary.json) in any task.",
}


@dataclass(frozen=True)
class ReportResult:
    """What ``build_report`` wrote."""

    html: Path
    markdown: Path
    figures: list[Path]
    run: RunData


def _has(records: list[dict], key: str) -> bool:
    return any(isinstance(r.get(key), (int, float)) for r in records)


def _draw(fig_fn: Callable[[], object]) -> Callable[[Path], bytes]:
    return lambda path: F.render_png(fig_fn, path)


# ---------------------------------------------------------------- 1. comparison table

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
        return f"no training: {arm.parent}'s scores with a {arm.rule.get('kind')} chosen on val; derived, no new holdout look"
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


# ---------------------------------------------------------------- 2.–5. per-step curves

def curves(task: TaskData, sink: FigureSink) -> list[Block]:
    """Section 2: per RL arm, reward and rollout accuracy / balanced accuracy per step; per
    SFT-trained arm, val metrics per eval; a note for an RL arm that stopped before logging."""
    blocks: list[Block] = []
    for arm in task.arms:
        name = f"{task.name}-{arm.name}"
        if arm.is_rl and (arm.steps or arm.rollout_steps):
            draw = _draw(lambda a=arm: F.reward_accuracy_figure(a.label, a.steps, a.rollout_steps, task.ceiling))
            blocks.append(sink.image(f"{name}-reward", f"{task.name} / {arm.label}: reward, rollout accuracy and "
                                     "balanced accuracy per step (dashed: label ceiling)", draw))
        elif _has(arm.sft_records, K.EVAL_ACCURACY) or _has(arm.sft_records, K.EVAL_BALANCED_ACCURACY):
            draw = _draw(lambda a=arm: F.sft_eval_figure(a.label, a.sft_records, task.ceiling))
            blocks.append(sink.image(f"{name}-sft", f"{task.name} / {arm.label}: val accuracy and balanced accuracy "
                                     "per eval step, training loss (dashed: label ceiling)", draw))
        elif arm.is_rl and arm.status != "done":
            blocks.append(Para(f"{arm.label} ({arm.status}): no per-step metrics logged.", "note"))
    return blocks


def lengths(task: TaskData, sink: FigureSink) -> list[Block]:
    """Section 3: per RL arm, length / truncation / think closure per step and by length bucket;
    the parse-failure curve; for reasoning arms the truncation tax among finished rollouts."""
    blocks: list[Block] = A.parse_and_tax(task, sink)
    for arm in task.rl_arms():
        name = f"{task.name}-{arm.name}"
        if arm.steps:
            blocks.append(sink.image(f"{name}-length", f"{task.name} / {arm.label}: completion length (mean, p90), "
                                     "truncation and think-closure rates per step",
                                     _draw(lambda a=arm: F.length_figure(a.label, a.steps))))
        if arm.length_buckets:
            blocks.append(sink.image(f"{name}-tax", f"{task.name} / {arm.label}: think-closure rate, truncation rate "
                                     "and mean reward by completion-length bucket, all steps (the truncation tax)",
                                     _draw(lambda a=arm: F.truncation_tax_figure(a.label, a.length_buckets))))
    return blocks


def drift(task: TaskData, sink: FigureSink) -> list[Block]:
    """Section 4: per RL arm, uniform-group fraction and label shares (informative groups vs data),
    the recall per label per step, and the drift to the ambiguous residue."""
    return [sink.image(f"{task.name}-{arm.name}-drift", f"{task.name} / {arm.label}: uniform-group fraction; label "
                       "share among informative groups (solid) vs in the training data (dashed)",
                       _draw(lambda a=arm: F.skip_drift_figure(a.label, a.steps)))
            for arm in task.rl_arms() if _has(arm.steps, K.UNIFORM_FRAC)] + A.recall_and_residue(task, sink)


def _mean(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
    return sum(values) / len(values) if values else None


def advantages(task: TaskData, sink: FigureSink) -> list[Block]:
    """Section 5: failed-positive fraction of every RL arm recomputed from its rollouts with the
    task's one threshold (one plot, and by distance from the label), CoRPO regimes, a summary table."""
    arms = [a for a in task.rl_arms() if _has(a.steps, K.FAILED_POSITIVE_FRAC) or a.failures]
    if not arms:
        return []
    blocks: list[Block] = []
    recomputed = [(a.label, a.failures["per_step"]) for a in arms if a.failures]
    if recomputed:
        threshold = next(a.failures["threshold"] for a in arms if a.failures)
        caption = (f"{task.name}: share of failed rollouts (reward < {threshold:g}, the same for every arm) given a "
                   "positive advantage per step, recomputed from the rollout logs")
        blocks.append(sink.image(f"{task.name}-failed-positive", caption, _draw(
            lambda: F.failed_positive_figure(task.name, recomputed, key="frac", threshold=threshold))))
        blocks.append(_failures_by_distance(task, [a for a in arms if a.failures]))
    else:
        pairs = [(a.label, a.steps) for a in arms]
        caption = f"{task.name}: share of failed rollouts given a positive advantage per step, every RL arm (as logged)"
        blocks.append(sink.image(f"{task.name}-failed-positive", caption,
                                 _draw(lambda: F.failed_positive_figure(task.name, pairs))))
    corpo = [(a.label, a.steps) for a in arms if _has(a.steps, K.CORPO_CORRECTNESS_REGIME)]
    if corpo:
        blocks.append(sink.image(f"{task.name}-corpo-regimes", f"{task.name}: share of groups in CoRPO's correctness "
                                 "and preference regimes per step", _draw(lambda: F.corpo_regime_figure(task.name, corpo))))
    rows = [[a.name, a.type + (f" ({a.preset})" if a.preset else ""), str(len(a.steps)),
             fmt(_mean(a.steps, K.FAILED_POSITIVE_FRAC)),
             fmt(sum(r.get(K.FAILED_POSITIVE_COUNT) or 0 for r in a.steps), 0),
             fmt(_mean(a.steps, K.CORPO_CORRECTNESS_REGIME))] for a in arms]
    blocks.append(TableBlock(["arm", "type", "steps", "mean failed-positive fraction", "failed rollouts with A > 0",
                              "mean correctness-regime share"], rows, f"{task.name}: advantages on failed rollouts"))
    return blocks


def _failures_by_distance(task: TaskData, arms: list[ArmData]) -> Block:
    cats = list(next(iter(a.failures["by_distance"] for a in arms)))
    rows = []
    for a in arms:
        overall, by = a.failures["overall"], a.failures["by_distance"]
        cells = [f"{fmt(by[c]['frac'])} ({by[c]['n_positive']}/{by[c]['n_failed']})" for c in cats]
        rows.append([a.name, f"{fmt(overall['frac'])} ({overall['n_positive']}/{overall['n_failed']})", *cells])
    return TableBlock(["arm", "all failed rollouts", *cats], rows,
                      f"{task.name}: share of failed rollouts with advantage > 0 (count with A > 0 / failed), "
                      f"by how far the answer is from the label; failed = reward < {arms[0].failures['threshold']:g}")


# ---------------------------------------------------------------- 6. ROC and routing

def _sweep_blocks(task: TaskData, s: dict, key: str, sink: FigureSink) -> list[Block]:
    """One SFT parent's ROC (figure ``key``) and the verdict of each arm trained from it."""
    base = (s.get("arms") or {}).get("base") or F.source_arm(s.get("source"))
    text = (f"SFT model ({base}): ROC-AUC {fmt(s.get('roc_auc'))} on {fmt(s.get('n'), 0)} val "
            f"items ({fmt(s.get('n_positive'), 0)} with the positive label {s.get('positive_label')!r}).")
    blocks: list[Block] = [Para(text), sink.image(key, f"{task.name}: ROC of the SFT model {base} with the operating "
                                                  f"point of each RL arm trained from it (hollow: above or below the curve, "
                                                  f"its ΔTPR interval excluding 0)",
                                                  lambda path: F.roc_png(s, path))]
    rows = []
    for c, arm in zip(s.get("compared") or [], F.compared_arms(s)):
        d = c.get("distance") or {}  # a sweep file written before the distance has none: "—"
        rows.append([arm, str(c.get("verdict", "?")), str(c.get("verdict_rests_on", "—")),
                     fmt(d.get("tpr", (c.get("compared_metrics") or {}).get("recall"))),
                     fmt(d.get("fpr", (c.get("compared_metrics") or {}).get("fpr"))), fmt(d.get("curve_tpr")),
                     fmt_ci(d.get("delta_tpr"), d.get("ci"), sign=True), fmt(c.get("recall_matched_threshold"), 4),
                     fmt_ci(c.get("item_agreement"), c.get("item_agreement_ci")), fmt(c.get("chance_agreement"))])
    if rows:
        blocks.append(TableBlock(["arm", "sweep verdict", "rests on", "arm TPR (recall)", "arm FPR (unparsed: not rejected)",
                                  "SFT curve's TPR at that FPR", "ΔTPR [95% CI]", "SFT threshold at the arm's recall",
                                  "items answered as at that threshold [95% CI]", "chance agreement"], rows,
                                 f"{task.name}: is each arm's (and each cascade's) val operating point a threshold on "
                                 f"the SFT model {base}? On the curve when the ΔTPR interval covers 0"))
    return blocks


def _route_row(arm: str, r: dict) -> list[str]:
    best = (r.get("cascade") or {}).get("best") or {}
    d = r.get("disagreement") or {}

    def pair(key: str) -> str:
        return f"{fmt((r.get(key) or {}).get('accuracy'))} / {fmt((r.get(key) or {}).get('balanced_accuracy'))}"

    band = f"[{fmt(best.get('lo'), 2)}, {fmt(best.get('hi'), 2)})" if best else "—"
    return [arm, pair("a"), pair("b"), pair("oracle"), band, fmt(best.get("share_routed")),
            fmt(best.get("delta_balanced_accuracy"), sign=True), f"{fmt(d.get('n_disagree'), 0)} of {fmt(d.get('n'), 0)}",
            fmt(d.get("b_gain"), 0)]


def _why_not(task: TaskData, name: str, default: str) -> str:
    return task.analysis_notes.get(name) or default


def roc(task: TaskData, sink: FigureSink) -> list[Block]:
    """Section 6: each SFT parent's ROC (one per analysis/sweep*.json) with the operating points and
    verdicts of the RL arms trained from it, the parent named; routing per arm."""
    notes = task.analysis_notes
    path = P.path_blocks(task, sink)  # the RL checkpoints' path on val (binary: on the SFT ROC)
    if task.sweep is None and not task.routes and not ("sweep" in notes or "route" in notes):
        return path
    blocks: list[Block] = path
    if task.sweep is not None:
        for i, (parent, sweep) in enumerate(task.sweeps.items() or [("", task.sweep)]):
            blocks += _sweep_blocks(task, sweep, f"{task.name}-roc" + (f"-{parent}" if i else ""), sink)
    else:
        default = "the task is not binary" if task.kind not in (None, "binary") else "no analysis/sweep.json"
        blocks.append(Para(f"ROC not drawn: {_why_not(task, 'sweep', default)}.", "note"))
    if task.routes:
        rows = [_route_row(arm, r) for arm, r in task.routes.items()]
        blocks.append(TableBlock(["B arm", "A = SFT acc / BA", "B acc / BA", "oracle acc / BA", "best cascade band",
                                  "share routed", "Δ balanced accuracy", "disagreements", "B right where A wrong"],
                                 rows, f"{task.name}: routing between the SFT model (A) and each arm (B), val"))
        blocks += [sink.image(f"{task.name}-route-{arm}", f"{task.name}: confidence cascade SFT → {arm}",
                              lambda path, r=r: F.cascade_png(r, path)) for arm, r in task.routes.items()]
    else:
        blocks.append(Para(f"Routing not run: {_why_not(task, 'route', 'no analysis/route-*.json')}.", "note"))
    return blocks


# ---------------------------------------------------------------- 7. distillation

def _survival_rows(summary: dict) -> list[list[str]]:
    groups = [("overall", summary.get("overall") or {})]
    groups += [(f"label {k}", v) for k, v in (summary.get("per_label") or {}).items()]
    groups += [(f"confidence {k}", v) for k, v in (summary.get("by_confidence") or {}).items()]
    return [[name, fmt(c.get("n_items"), 0), fmt(c.get("n_survived"), 0), fmt(c.get("survival_rate")),
             fmt(c.get("mean_attempts_used"), 2)] for name, c in groups]


def distillation(task: TaskData, sink: FigureSink) -> list[Block]:
    """Section 7: the compare.json decomposition and each distill arm's trace survival."""
    blocks: list[Block] = []
    c = task.compare
    if c is None and "compare" in task.analysis_notes:
        blocks.append(Para(f"Decomposition not made: {task.analysis_notes['compare']}.", "note"))
    if c is not None:
        models = c.get("models") or {}
        order = [r for r in ("direct_all", "direct_survivors", "cot") if r in models]
        order += [r for r in models if r not in order]
        rows = [[role, str(models[role].get("name", role)),
                 fmt_ci(models[role].get("balanced_accuracy"), models[role].get("balanced_accuracy_ci"))] for role in order]
        split = c.get("split", "holdout")
        blocks.append(TableBlock(["role", "arm", f"{split} balanced accuracy [95% CI]"], rows,
                                 f"{task.name}: matched-data decomposition on the {fmt(c.get('n'), 0)} {split} items all three were evaluated on"))
        filter_effect = fmt_ci(c.get("filter_effect"), c.get("filter_effect_ci"), sign=True)
        objective_effect = fmt_ci(c.get("objective_effect"), c.get("objective_effect_ci"), sign=True)
        blocks.append(Para(f"Filter effect (direct_all − direct_survivors) {filter_effect}; objective effect "
                           f"(direct_survivors − cot) {objective_effect}; total {fmt(c.get('total_effect'), sign=True)} "
                           "(positive = balanced accuracy lost)."))
        blocks.append(sink.image(f"{task.name}-decomposition", f"{task.name}: balanced accuracy of the three models of "
                                 "the decomposition", _draw(lambda: F.decomposition_figure(task.name, c, task.ceiling))))
    for arm in task.arms:
        if arm.distill_summary:
            s = arm.distill_summary
            caption = (f"{task.name} / {arm.name}: trace survival (teacher {s.get('teacher', '?')}, "
                       f"{s.get('attempts', '?')} attempts per item, keep {s.get('keep', '?')})")
            blocks.append(TableBlock(["items", "n", "survived", "survival rate", "mean attempts used"],
                                     _survival_rows(s), caption))
    return blocks


# ---------------------------------------------------------------- assembly

BUILDERS = {"verdict": C.verdict, "comparison": comparison, "curves": curves, "length": lengths, "drift": drift,
            "advantages": advantages, "roc": roc, "distill": distillation, "parser": A.parser_and_sampling,
            "labels": A.labels}
RUN_BUILDERS = {"noise": C.noise, "time": time_per_phase}  # sections drawn across tasks


def report_blocks(run: RunData, sink: FigureSink) -> list[Block]:
    """The report's blocks: a header, the ``SECTIONS`` (each "not run" when empty), and
    the unreadable files, if any."""
    arms = [a for t in run.tasks for a in t.arms]
    counts = ", ".join(f"{sum(a.status == s for a in arms)} {s}" for s in ("done", "failed", "skipped", "pending", "running")
                       if any(a.status == s for a in arms))
    blocks: list[Block] = [Para(f"Run directory {run.run_dir}; recipe {run.recipe or '?'}; {len(run.tasks)} task(s), "
                                f"{len(arms)} arm(s){': ' + counts if counts else ''}. Built from the run's files only.")]
    for anchor, title in SECTIONS:
        blocks.append(Heading(title, 2, anchor))
        body: list[Block] = []
        if anchor in RUN_BUILDERS:
            body = RUN_BUILDERS[anchor](run, sink)
        for task in run.tasks if anchor in BUILDERS else ():
            part = BUILDERS[anchor](task, sink)
            if part:
                body += [Heading(f"Task {task.name}", 3)] + part
        blocks += body or [Para(f"Not run: {NOT_RUN[anchor]}", "note")]
    if run.problems:
        blocks += [Heading("Unreadable files", 2, "problems"), Items(run.problems)]
    return blocks


def build_report(run_dir: str | Path, out: str | Path | None = None) -> ReportResult:
    """Write ``report.html`` and ``report.md`` (and ``figures/*.png``) for the ladder run in
    ``run_dir`` into ``out`` (default ``RUN_DIR/report``). ValueError when it is not a ladder run."""
    run = collect_run(run_dir)
    out = Path(out) if out is not None else Path(run_dir) / "report"
    sink = FigureSink(out)
    blocks = report_blocks(run, sink)
    title = f"labelrl report: {run.recipe or Path(run_dir).name}"
    html_path, md_path = out / "report.html", out / "report.md"
    atomic_write_text(html_path, to_html(title, blocks))
    atomic_write_text(md_path, to_markdown(title, blocks))
    return ReportResult(html_path, md_path, list(sink.written), run)

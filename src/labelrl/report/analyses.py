"""The report's analyses of how GRPO-on-labels behaves, beyond the headline numbers.

* recall drift and the drift to the ambiguous residue (section 4);
* the parse-failure curve and the finished-only truncation tax by reasoning length (section 3);
* the parser and sampling checks (section 9): the reward a lenient parser would have paid on the
  same rollouts (``labelrl rescore``), and pass@k of the SFT and RL models on val;
* the labels themselves (section 10): the audit per split and, with a relabel arm, the relabel
  summary next to the original labels' duplicate agreement.

Every figure and table is built from the run's files (``collect``); nothing loads a model.
"""

from __future__ import annotations

from typing import Callable

from labelrl import metrics_keys as K
from labelrl.report import figures as F
from labelrl.report.collect import ArmData, TaskData
from labelrl.report.render import Block, FigureSink, Para, TableBlock, fmt, fmt_ci


def _draw(make: Callable[[], object]) -> Callable:
    return lambda path: F.render_png(make, path)


def recall_and_residue(task: TaskData, sink: FigureSink) -> list[Block]:
    """Section 4 additions: per RL arm, recall per label per step and the residue drift."""
    blocks: list[Block] = []
    for arm in task.rl_arms():
        if arm.recall_steps:
            blocks.append(sink.image(f"{task.name}-{arm.name}-recall", f"{task.name} / {arm.label}: recall of each label "
                                     "among the rollouts per step (the recall drift)",
                                     _draw(lambda a=arm: F.recall_figure(a.label, a.recall_steps, task.labels))))
        if arm.residue:
            blocks.append(sink.image(f"{task.name}-{arm.name}-residue", f"{task.name} / {arm.label}: share of the groups "
                                     "trained on whose item is ambiguous, against its share in the training sample",
                                     _draw(lambda a=arm: F.residue_figure(a.label, a.residue))))
    if any(a.recall_steps for a in task.rl_arms()) and not any(a.residue for a in task.rl_arms()):
        blocks.append(Para("Residue drift not drawn: no ambiguous items known (no conflicting duplicates in the audit, "
                           "no SFT scores of the training items, no relabel arm).", "note"))
    return blocks


def parse_and_tax(task: TaskData, sink: FigureSink) -> list[Block]:
    """Section 3 additions: the parse-failure rate per step, and the finished-only tax."""
    blocks: list[Block] = []
    arms = [(a.label, a.steps) for a in task.rl_arms() if any(isinstance(r.get(K.PARSE_FAIL_FRAC), (int, float)) for r in a.steps)]
    if arms:
        blocks.append(sink.image(f"{task.name}-parse-failures", f"{task.name}: share of rollouts the strict parser could "
                                 "not read, per step, every RL arm", _draw(lambda: F.arm_lines_figure(
                                     task.name, arms, K.PARSE_FAIL_FRAC, f"unparsed rollouts {F.FRACTION}", "parse failures per step"))))
    for arm in task.rl_arms():
        if arm.tax:
            blocks.append(sink.image(f"{task.name}-{arm.name}-think-tax", f"{task.name} / {arm.label}: mean reward and think "
                                     "closure by reasoning length among finished rollouts, early vs late steps",
                                     _draw(lambda a=arm: F.think_tax_figure(a.label, a.tax))))
            blocks.append(_tax_table(task, arm))
    return blocks


def _tax_table(task: TaskData, arm: ArmData) -> TableBlock:
    rows = []
    for name, w in arm.tax["windows"].items():
        for b in w["buckets"]:
            rows.append([f"{name} ({w['steps'][0]}–{w['steps'][1]})", f"[{b['lo']:.0f}, {b['hi']:.0f})", str(b["n"]),
                         fmt(b["mean_reward"]), fmt(b["think_closed_rate"]), ""])
        rows.append([f"{name} ({w['steps'][0]}–{w['steps'][1]})", "capped", str(w["n_capped"]), "—",
                     fmt(w["capped_think_closed_rate"]), "cut by the token cap"])
    return TableBlock(["window (steps)", "reasoning length (chars)", "rollouts", "mean reward", "think closure", "note"],
                      rows, f"{task.name} / {arm.label}: the truncation tax among finished rollouts")


def parser_and_sampling(task: TaskData, sink: FigureSink) -> list[Block]:
    """Section 9: lenient-parser reward inflation per step (every RL arm) and pass@k."""
    blocks: list[Block] = []
    rescored = [a for a in task.rl_arms() if a.rescore]
    if rescored:
        pairs = [(a.label, a.rescore["per_step"]) for a in rescored]
        blocks.append(sink.image(f"{task.name}-inflation", f"{task.name}: reward a lenient parser would have paid minus "
                                 "the strict reward, on the same logged rollouts, per step",
                                 _draw(lambda: F.arm_lines_figure(task.name, pairs, "inflation",
                                                                  "lenient − strict mean reward (reward units)",
                                                                  "lenient parser's reward inflation", ylim=None))))
        rows = [[a.name, fmt(a.rescore["overall"]["reward_strict"]), fmt(a.rescore["overall"]["reward_lenient"]),
                 fmt(a.rescore["overall"]["inflation"], sign=True), fmt(a.rescore["overall"]["parsed_strict"]),
                 fmt(a.rescore["overall"]["parsed_lenient"]), fmt(a.rescore["overall"]["answer_changed"])] for a in rescored]
        blocks.append(TableBlock(["arm", "reward strict", "reward lenient", "inflation", "parsed strict", "parsed lenient",
                                  "answer read differently"], rows, f"{task.name}: strict vs lenient parser, all steps"))
    passed = [a for a in task.arms if a.pass_at_k]
    if passed:
        rows = [[a.name, a.type, fmt(a.pass_at_k.get("n_items"), 0), f"{a.pass_at_k.get('n_samples')}",
                 fmt_ci(a.pass_at_k.get("pass_at_1"), a.pass_at_k.get("pass_at_1_ci")),
                 fmt_ci(a.pass_at_k.get("pass_at_k"), a.pass_at_k.get("pass_at_k_ci"))] for a in passed]
        k = passed[0].pass_at_k.get("k")
        blocks.append(TableBlock(["arm", "type", "val items", "samples per item", "pass@1 [95% CI]", f"pass@{k} [95% CI]"],
                                 rows, f"{task.name}: does each model sample the right label in {k} tries? (unbiased "
                                 "estimator, Chen et al. 2021)"))
    return blocks


def labels(task: TaskData, sink: FigureSink) -> list[Block]:
    """Section 10: the audit per split, and each relabel arm's summary next to the original
    labels' own agreement between duplicates."""
    blocks = _split_audit(task)
    for arm in task.arms:
        if arm.relabel:
            blocks.append(_relabel_table(task, arm))
    return blocks


def _relabel_table(task: TaskData, arm: ArmData) -> TableBlock:
    r = arm.relabel
    agreement = r.get("agreement_with_original") or {}
    judge, final = agreement.get("judge") or {}, agreement.get("final") or {}
    rows = [["judge vs original labels", fmt(judge.get("n"), 0), fmt(judge.get("agreement")), fmt(judge.get("kappa")), ""],
            ["final (adjudicated) vs original", fmt(final.get("n"), 0), fmt(final.get("agreement")), fmt(final.get("kappa")),
             f"{r.get('n_adjudicated')} of {r.get('n_items')} adjudicated"]]
    for name, block in (judge.get("per_class") or {}).items():
        rows.append([f"  originally {name}", fmt(block.get("n"), 0), fmt(block.get("agreement")), "—", "judge"])
    sa = r.get("self_agreement") or {}
    rows.append(["judge vs itself (retest)", fmt(sa.get("n_compared"), 0), fmt_ci(sa.get("agreement"), sa.get("agreement_ci")),
                 fmt_ci(sa.get("kappa"), sa.get("kappa_ci")), "an independent second pass on a random sample"])
    audit = task.audit or {}
    d, d_ci = audit.get("disagreement_rate"), audit.get("disagreement_rate_ci")
    if d is not None:
        ci = [1 - d_ci[1], 1 - d_ci[0]] if isinstance(d_ci, list) and len(d_ci) == 2 else None
        rows.append(["original labels: duplicates vs each other", fmt(audit.get("n_pairs"), 0), fmt_ci(1 - d, ci),
                     fmt_ci(audit.get("kappa"), audit.get("kappa_ci")), "1 − d over duplicate pairs (labelrl audit)"])
    return TableBlock(["comparison", "items / pairs", "agreement [95% CI]", "Cohen's κ", "note"], rows,
                      f"{task.name} / {arm.name}: relabelling by {r.get('judge', '?')}; the final label differs from the "
                      f"original for {r.get('n_changed')} items (noisy vs clean: rows 'vs {arm.name}' in the comparison table)")


def _split_audit(task: TaskData) -> list[Block]:
    per_split = (task.audit or {}).get("per_split") or {}
    if not per_split:
        return []
    rows = [[split, fmt(s.get("n_rows"), 0), fmt(s.get("n_duplicate_groups"), 0), fmt(s.get("n_pairs"), 0),
             fmt_ci(s.get("disagreement_rate"), s.get("disagreement_rate_ci")), fmt_ci(s.get("flip_rate"), s.get("flip_rate_ci")),
             fmt_ci(s.get("ceiling"), s.get("ceiling_ci"))] for split, s in per_split.items()]
    uniformity = (task.audit or {}).get("uniformity") or {}
    caption = f"{task.name}: label noise from duplicates within each split"
    if uniformity.get("p_value") is not None:
        caption += f" (chi-square of d across splits: p = {uniformity['p_value']:.3g})"
    return [TableBlock(["split", "rows", "duplicate groups", "pairs", "disagreement d [95% CI]", "flip rate ε [95% CI]",
                        "ceiling 1 − ε [95% CI]"], rows, caption)]


def drop_table(task: TaskData) -> list[Block]:
    """Per arm: val and holdout balanced accuracy and the drop (val − holdout)."""
    rows = []
    for arm in task.arms:
        if arm.val and arm.holdout and arm.val.get("balanced_accuracy") is not None and arm.holdout.get("balanced_accuracy") is not None:
            v, h = arm.val["balanced_accuracy"], arm.holdout["balanced_accuracy"]
            note = "its rule was chosen on these val items" if arm.type == "threshold" else ""
            rows.append([arm.name, fmt(v), fmt(h), fmt(v - h, sign=True), note])
    if not rows:
        return []
    return [TableBlock(["arm", "val BA", "holdout BA", "drop (val − holdout)", "note"], rows,
                       f"{task.name}: val → holdout drop (how much selection on val inflated each val number)")]

"""The report's analyses of how GRPO-on-labels behaves, beyond the headline numbers.

* recall drift and the drift to the ambiguous residue (section 4);
* the parse-failure curve and the finished-only truncation tax by reasoning length (section 3);
* the parser and sampling checks (section 9): the reward a lenient parser would have paid on the
  same rollouts (``labelrl rescore``), and pass@k of the SFT and RL models on val;
* the labels themselves (section 10): the audit per split and, with a relabel arm, the relabel
  summary next to the original labels' duplicate agreement; with an arm trained on a relabel
  arm's labels (``labels_from``), the four cells trained on either labels × scored against either;
* how injected label noise was seeded (``noise_seed_words``, in the samples table's caption), and
  the paired difference of slopes on ε, RL's against SFT's (``noise_slope_lines``, under the
  section 8 figure; ``RUN_DIR/analysis/noise_slope.json``, labelrl.ladder.noise_slope).

Every figure and table is built from the run's files (``collect``); nothing loads a model.
"""

from __future__ import annotations

import json
from pathlib import Path

from labelrl import metrics_keys as K
from labelrl.report import figures as F
from labelrl.report.render import Block, FigureSink, Para, TableBlock, fmt, fmt_ci
from labelrl.report.run_data import ArmData, TaskData


def recall_and_residue(task: TaskData, sink: FigureSink) -> list[Block]:
    """Section 4 additions: per RL arm, recall per label per step and the residue drift."""
    blocks: list[Block] = []
    for arm in task.rl_arms():
        if arm.recall_steps:
            blocks.append(sink.image(f"{task.name}-{arm.name}-recall", f"{task.name} / {arm.label}: recall of each label "
                                     "among the rollouts per step (the recall drift)",
                                     F.drawer(lambda a=arm: F.recall_figure(a.label, a.recall_steps, task.labels))))
        if arm.residue:
            blocks.append(sink.image(f"{task.name}-{arm.name}-residue", f"{task.name} / {arm.label}: share of the groups "
                                     "trained on whose item is ambiguous, against its share in the training sample",
                                     F.drawer(lambda a=arm: F.residue_figure(a.label, a.residue))))
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
                                 "not read, per step, every RL arm", F.drawer(lambda: F.arm_lines_figure(
                                     task.name, arms, K.PARSE_FAIL_FRAC, f"unparsed rollouts {F.FRACTION}", "parse failures per step"))))
    for arm in task.rl_arms():
        if arm.tax:
            blocks.append(sink.image(f"{task.name}-{arm.name}-think-tax", f"{task.name} / {arm.label}: mean reward and think "
                                     "closure by reasoning length among finished rollouts, early vs late steps",
                                     F.drawer(lambda a=arm: F.think_tax_figure(a.label, a.tax))))
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
                                 F.drawer(lambda: F.arm_lines_figure(task.name, pairs, "inflation",
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
    for arm in task.arms:
        if label_source(arm) and arm.holdout:
            blocks.append(four_cells(task, arm))
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
                      f"original for {r.get('n_changed')} items. Every evaluation is also scored against these labels: a "
                      f"second answer key, not ground truth (rows 'vs {arm.name}' in the comparison table)")


def label_source(arm: ArmData) -> str | None:
    """The relabel arm whose labels ``arm`` trained on (its ``train_labels``, that arm's
    ``answer_key.json``, wired by the ladder from ``labels_from``); None: the data's labels."""
    path = (arm.config or {}).get("train_labels")
    return Path(str(path)).parent.name if path else None


def trained_on_original(task: TaskData, arm: ArmData) -> ArmData | None:
    """The run ``arm`` is contrasted with: the first of the task's runs of the same type, preset
    and seed trained on the data's own labels, starting from ``arm``'s parent or from the run
    its parent is contrasted with (so an RL arm from an SFT arm on relabelled labels is set
    against the same RL arm from the SFT arm on the original labels)."""
    by_name = {a.name: a for a in task.arms}
    parent = by_name.get(arm.parent) if arm.parent else None
    starts = {arm.parent}
    if parent is not None and label_source(parent):
        twin = trained_on_original(task, parent)
        starts.add(twin.name if twin else None)
    return next((a for a in task.arms if a.name != arm.name and a.type == arm.type and a.preset == arm.preset
                 and a.seed == arm.seed and label_source(a) is None and a.parent in starts), None)


def four_cells(task: TaskData, arm: ArmData) -> TableBlock:
    """The seed's noisy/clean table for one run trained on a relabel arm's labels: holdout
    balanced accuracy of it and of its twin on the original labels (``trained_on_original``),
    each scored against the original holdout labels and against the relabel arm's."""
    source, twin = label_source(arm), trained_on_original(task, arm)

    def cells(a: ArmData | None) -> list[str]:
        if a is None:
            return ["none: no run of the same type and seed trains on the original labels", "—", "—"]
        keyed = (a.answer_keys.get(source) or {}).get("holdout") or {}
        return [a.name, *(fmt_ci(m.get("balanced_accuracy"), m.get("balanced_accuracy_ci")) for m in (a.holdout or {}, keyed))]

    rows = [["the data's own labels (\"noisy\")", *cells(twin)], [f"{source}'s final labels (\"clean\")", *cells(arm)]]
    relabelled = _read_json(task.dir / arm.name / "train_labels.json")
    judge = next((a.relabel.get("judge") for a in task.arms if a.name == source and a.relabel), None)
    took = (f"{relabelled['n_replaced']} of its {relabelled['n_train']} training labels taken from {source} "
            f"({relabelled['n_changed']} different from the original; {relabelled['n_kept_original']} without a "
            f"{source} label kept their own)" if relabelled else f"its training labels taken from {source}")
    caption = (f"{task.name}: trained on noisy or clean labels × scored against a noisy or clean key, holdout balanced "
               f"accuracy [95% CI]. {arm.name} ({arm.type}) trained on the same items as "
               f"{twin.name if twin else 'its twin'}, {took}; val and holdout items are the same for both. \"Clean\" "
               f"means the final labels of the relabel arm {source}{f' (judge {judge})' if judge else ''}: a second "
               "answer key, not ground truth; \"noisy\" means the data's own labels.")
    return TableBlock(["trained on", "arm", "scored against the data's labels", f"scored against {source}'s labels"],
                      rows, caption)


def noise_seed_words(task: TaskData) -> str:
    """How the task's injected label noise was seeded, for the samples table's caption (from
    ``TASK/label_noise.json``; a file without the key was written when the split seed was the
    only choice)."""
    record = _read_json(task.dir / "label_noise.json")
    if not record:
        return ""
    if record.get("label_noise_seed", "split") == "split":
        return ("; label_noise_seed: split, the same flipped items for every run (seeded by the split seed "
                f"{record.get('seed')})")
    by_seed = record.get("by_seed") or {}
    flipped = ", ".join(f"seed {s}: {r.get('n_flipped')} of {r.get('n_train')} flipped" for s, r in by_seed.items() if r)
    return (f"; label_noise_seed: run, other flipped items for each run seed (the same training items, flips "
            f"seeded by the run's seed; {flipped or 'per run in ARM/label_noise.json'})")


def noise_slope_lines(run_dir: Path, data: str) -> list[str]:
    """The slope comparisons on ``data`` in ``RUN_DIR/analysis/noise_slope.json`` (written by the
    ladder, labelrl.ladder.noise_slope), one sentence each: "RL loses more than SFT as noise rises
    (slope difference …)", or why it was not computed; [] when the file is absent."""
    record = _read_json(Path(run_dir) / "analysis" / "noise_slope.json")
    lines = []
    for c in (record or {}).get("comparisons") or []:
        if isinstance(c, dict) and c.get("data") == data:
            what = c.get("words") or f"slope not computed: {c.get('error')}"
            lines.append(f"{c.get('rl')} vs {c.get('sft')}, holdout balanced accuracy on ε: {what}")
    return lines


def _read_json(path: Path) -> dict | None:
    """A JSON object the report shows a part of; None when absent or unreadable (its part is left out)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


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

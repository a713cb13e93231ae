"""Sections 2–5 of the report, what the training logged per step, per task:

2. reward, rollout accuracy and balanced accuracy per RL step, the policy's entropy and the
   sampler–trainer mismatch per step; val metrics per SFT eval;
3. completion length, truncation and think closure per step and by length bucket (the
   truncation tax), and the parse failures;
4. skip-rule drift: the uniform-group fraction, the label shares among informative groups
   against the data, recall per label and the drift to the ambiguous residue;
5. the failed-positive fraction per step of every RL arm (recomputed from the rollouts with the
   task's one threshold when they were logged), by distance from the label, and CoRPO's regimes.
"""

from __future__ import annotations

from labelrl import metrics_keys as K
from labelrl.report import analyses as A
from labelrl.report import figures as F
from labelrl.report.render import Block, FigureSink, Para, TableBlock, fmt
from labelrl.report.run_data import ArmData, TaskData


def _has(records: list[dict], key: str) -> bool:
    return any(isinstance(r.get(key), (int, float)) for r in records)


def curves(task: TaskData, sink: FigureSink) -> list[Block]:
    """Section 2: per RL arm, reward and rollout accuracy / balanced accuracy per step; per
    SFT-trained arm, val metrics per eval; a note for an RL arm that stopped before logging."""
    blocks: list[Block] = []
    for arm in task.arms:
        name = f"{task.name}-{arm.name}"
        if arm.is_rl and (arm.steps or arm.rollout_steps):
            draw = F.drawer(lambda a=arm: F.reward_accuracy_figure(a.label, a.steps, a.rollout_steps, task.ceiling))
            blocks.append(sink.image(f"{name}-reward", f"{task.name} / {arm.label}: reward, rollout accuracy and "
                                     "balanced accuracy per step (dashed: label ceiling)", draw))
            if _has(arm.steps, K.ENTROPY_MEAN) or _has(arm.steps, K.MISMATCH_KL):
                draw = F.drawer(lambda a=arm: F.entropy_mismatch_figure(a.label, a.steps))
                blocks.append(sink.image(f"{name}-entropy", f"{task.name} / {arm.label}: policy entropy per completion "
                                         "token (mean, 10th percentile) and sampler–trainer mismatch per step", draw))
        elif _has(arm.sft_records, K.EVAL_ACCURACY) or _has(arm.sft_records, K.EVAL_BALANCED_ACCURACY):
            draw = F.drawer(lambda a=arm: F.sft_eval_figure(a.label, a.sft_records, task.ceiling))
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
                                     F.drawer(lambda a=arm: F.length_figure(a.label, a.steps))))
        if arm.length_buckets:
            blocks.append(sink.image(f"{name}-tax", f"{task.name} / {arm.label}: think-closure rate, truncation rate "
                                     "and mean reward by completion-length bucket, all steps (the truncation tax)",
                                     F.drawer(lambda a=arm: F.truncation_tax_figure(a.label, a.length_buckets))))
    return blocks


def drift(task: TaskData, sink: FigureSink) -> list[Block]:
    """Section 4: per RL arm, uniform-group fraction and label shares (informative groups vs data),
    the recall per label per step, and the drift to the ambiguous residue."""
    return [sink.image(f"{task.name}-{arm.name}-drift", f"{task.name} / {arm.label}: uniform-group fraction; label "
                       "share among informative groups (solid) vs in the training data (dashed)",
                       F.drawer(lambda a=arm: F.skip_drift_figure(a.label, a.steps)))
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
        blocks.append(sink.image(f"{task.name}-failed-positive", caption, F.drawer(
            lambda: F.failed_positive_figure(task.name, recomputed, key="frac", threshold=threshold))))
        blocks.append(_failures_by_distance(task, [a for a in arms if a.failures]))
    else:
        pairs = [(a.label, a.steps) for a in arms]
        caption = f"{task.name}: share of failed rollouts given a positive advantage per step, every RL arm (as logged)"
        blocks.append(sink.image(f"{task.name}-failed-positive", caption,
                                 F.drawer(lambda: F.failed_positive_figure(task.name, pairs))))
    corpo = [(a.label, a.steps) for a in arms if _has(a.steps, K.CORPO_CORRECTNESS_REGIME)]
    if corpo:
        blocks.append(sink.image(f"{task.name}-corpo-regimes", f"{task.name}: share of groups in CoRPO's correctness "
                                 "and preference regimes per step", F.drawer(lambda: F.corpo_regime_figure(task.name, corpo))))
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

"""The numbers of a relabel run (``summarise``): how far the judge and the final labels agree
with the original ones (``agreement_with``), how consistent the judge is with itself
(``self_agreement``), and notes on what the run could not decide. See
:mod:`labelrl.audit.relabel` for the phases that produce the journal read here.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Sequence

from labelrl.types import LabelSpace

if TYPE_CHECKING:
    from labelrl.audit.judge_types import Judge
    from labelrl.audit.relabel_journal import Journal, RelabelItems, RelabelPaths


def needs_adjudication(record: dict, min_confidence: float) -> bool:
    """Whether a judge record goes to the adjudicator: no label, no confidence, or a confidence
    below ``min_confidence``."""
    return record["label"] is None or record["confidence"] is None or record["confidence"] < min_confidence


def agreement_with(original: Sequence[str], other: Sequence[str | None], labels: LabelSpace) -> dict:
    """How far ``other`` agrees with the original labels, over the items where it has a label.

    agreement: share of equal labels; kappa: Cohen's κ between the two labelings (Cohen 1960,
    eq. 1, scikit-learn), None when undefined (one label only); per_class[label]: the items
    originally so labelled and the share of them ``other`` labels the same (recall);
    confusion[original][other]: counts.
    """
    from sklearn.metrics import cohen_kappa_score

    pairs = [(a, b) for a, b in zip(original, other) if b is not None]
    block: dict[str, Any] = {"n": len(pairs), "n_missing": len(original) - len(pairs), "agreement": None,
                             "kappa": None, "per_class": {}, "confusion": {}}
    if not pairs:
        return block
    block["agreement"] = sum(a == b for a, b in pairs) / len(pairs)
    a_idx = [labels.index(a) for a, _ in pairs]
    b_idx = [labels.index(b) for _, b in pairs]
    if len(set(a_idx) | set(b_idx)) > 1:
        block["kappa"] = float(cohen_kappa_score(a_idx, b_idx, labels=list(range(labels.k))))
    for name in labels.labels:
        mine = [b for a, b in pairs if a == name]
        block["per_class"][name] = {"n": len(mine), "agreement": sum(b == name for b in mine) / len(mine) if mine else None}
        block["confusion"][name] = {other_name: mine.count(other_name) for other_name in labels.labels}
    return block


def self_agreement(items: RelabelItems, journal: Journal, judge: Judge, sample: Sequence[str], seed: int) -> dict:
    """The judge's two passes over the sample as test-retest pairs (``duplicate_noise``):
    agreement = 1 − d, flip rate ε and ceiling 1 − ε (eq. 1 of labelrl.audit.noise), κ, with
    bootstrap intervals. Pairs where either reply did not parse are counted, not compared."""
    from labelrl.audit.duplicates import DuplicateGroup
    from labelrl.audit.noise import duplicate_noise

    if judge.kind == "local":
        method = ("the local judge's first pass takes the most probable label; the second draws a label from the "
                  f"judge's label distribution (seed {seed}), so agreement estimates how often that distribution "
                  "reproduces the first choice (a deterministic re-score would agree 100% and tell nothing)")
    else:
        temperature = getattr(getattr(judge, "spec", None), "sample_temperature", None)
        method = (f"the {judge.kind} judge was asked again" + (f" at temperature {temperature:g}" if temperature else "")
                  + f" with seed {seed}")
    groups = []
    for item_id in sample:
        first = journal.records["judge"][item_id]["label"]
        second = journal.records["retest"][item_id]["label"]
        if first is not None and second is not None:
            groups.append(DuplicateGroup(key=(item_id,), ids=(item_id, item_id), labels=(first, second), texts=("", "")))
    block: dict[str, Any] = {"method": method, "n_sample": len(sample), "n_compared": len(groups),
                             "n_unparseable": len(sample) - len(groups), "agreement": None, "agreement_ci": None}
    if not groups:
        return block
    noise = duplicate_noise(groups, items.labels, n_boot=1000, seed=seed)
    d, d_ci = noise["disagreement_rate"], noise["disagreement_rate_ci"]
    block.update(agreement=1.0 - d, agreement_ci=[1.0 - d_ci[1], 1.0 - d_ci[0]] if d_ci else None)
    for name in ("kappa", "flip_rate", "ceiling"):
        block[name], block[f"{name}_ci"] = noise[name], noise[f"{name}_ci"]
    block["flip_rate_reason"] = noise["flip_rate_reason"]
    return block


def summarise(items: RelabelItems, journal: Journal, judge: Judge, adjudicator: Judge | None, sample: Sequence[str],
              rows: list[dict], *, min_confidence: float, seed: int, paths: RelabelPaths) -> dict:
    """The numbers of a relabel run (printed by the CLI, saved as ``OUT.summary.json``)."""
    original = [ex.label for ex in items.examples]
    final = [r["label_final"] for r in rows]
    n_low = sum(needs_adjudication(journal.records["judge"][ex.id], min_confidence) for ex in items.examples)
    status = Counter(r["judge_status"] for r in rows)
    summary = {
        "dataset": items.name, "n_items": len(rows), "labels": list(items.labels.labels),
        "judge": judge.name, "adjudicator": adjudicator.name if adjudicator else None,
        "min_confidence": min_confidence, "seed": seed,
        "judge_status": {name: status.get(name, 0) for name in ("ok", "no_confidence", "unparseable")},
        "n_low_confidence": n_low,
        "n_adjudicated": sum(r["adjudicated"] for r in rows),
        "n_adjudicator_unparseable": sum(r["adjudicated"] and r["label_adjudicator"] is None for r in rows),
        "final_source": dict(Counter(r["final_source"] for r in rows)),
        "n_changed": sum(a != b for a, b in zip(original, final)),
        "changed_rate": sum(a != b for a, b in zip(original, final)) / len(rows) if rows else None,
        "label_counts": {"original": _counts(original, items.labels), "final": _counts(final, items.labels)},
        "agreement_with_original": {
            "judge": agreement_with(original, [r["label_judge"] for r in rows], items.labels),
            "final": agreement_with(original, final, items.labels),
        },
        "self_agreement": self_agreement(items, journal, judge, sample, seed),
        "requests": {role: dict(j.stats) for role, j in (("judge", judge), ("adjudicator", adjudicator))
                     if getattr(j, "stats", None) is not None},
        "files": {"out": str(paths.out), "journal": str(paths.journal), "summary": str(paths.summary)},
        "n_skipped_rows": len(items.skipped_rows),
    }
    if items.skipped_rows:
        summary["files"]["skipped_rows"] = str(skipped_rows_path(paths))
    summary["notes"] = _notes(summary, adjudicator is not None)
    return summary


def _counts(labels_seen: Sequence[str], labels: LabelSpace) -> dict[str, int]:
    counts = Counter(labels_seen)
    return {name: counts.get(name, 0) for name in labels.labels}


def _notes(summary: dict, has_adjudicator: bool) -> list[str]:
    notes = []
    bad = summary["judge_status"]["unparseable"]
    if bad:
        fate = "the adjudicator decided them" if has_adjudicator else "they keep their original label"
        notes.append(f"{bad} judge replies held no valid <answer>LABEL</answer> (judge_status 'unparseable'; raw "
                     f"replies are in the journal): {fate}.")
    if summary["n_low_confidence"] and not has_adjudicator:
        notes.append(f"{summary['n_low_confidence']} items fell below --min-confidence {summary['min_confidence']:g} "
                     "but no --adjudicator was given: they keep the judge's label where it parsed.")
    if summary["n_adjudicator_unparseable"]:
        notes.append(f"{summary['n_adjudicator_unparseable']} adjudicator replies did not parse: those items keep "
                     "the judge's label (or the original one).")
    if summary["n_skipped_rows"]:
        notes.append(f"{summary['n_skipped_rows']} rows could not be read (--on-bad-row skip): they are not in the "
                     f"output; {summary['files']['skipped_rows']} lists them.")
    notes.append("Self-agreement: " + summary["self_agreement"]["method"] + ".")
    return notes


def skipped_rows_path(paths: RelabelPaths):
    """``OUT.skipped_rows.jsonl``: the rows ``--on-bad-row skip`` left out of the output."""
    return paths.out.with_suffix(".skipped_rows.jsonl")

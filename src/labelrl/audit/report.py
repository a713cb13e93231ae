"""Assemble the label-noise audit of a dataset: duplicates, noise estimates, splits, raters."""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping, Sequence

from labelrl.audit.duplicates import DuplicateGroup, find_duplicate_groups
from labelrl.audit.noise import duplicate_noise, flip_rate_from_disagreement, homogeneity_test
from labelrl.audit.raters import rater_noise, rating_map_for
from labelrl.types import Dataset

SMALL_GROUP_COUNT = 30
# "A few groups hold most of the pairs": the largest CONCENTRATED_GROUPS (or fewer) groups hold
# at least CONCENTRATED_SHARE of the pairs, among at least MIN_GROUPS_FOR_CONCENTRATION groups.
CONCENTRATED_GROUPS = 3
CONCENTRATED_SHARE = 0.5
MIN_GROUPS_FOR_CONCENTRATION = 5


def _group_record(group: DuplicateGroup) -> dict:
    return {
        "ids": list(group.ids),
        "labels": list(group.labels),
        "texts": list(group.texts),
        "label_counts": dict(Counter(group.labels)),
        "n_disagreeing_pairs": group.n_disagreeing_pairs,
    }


def _split_sets(splits: Mapping[str, Iterable] | None) -> dict[str, frozenset[str]]:
    if splits is None:
        return {}
    return {str(name): frozenset(str(i) for i in ids) for name, ids in splits.items()}


def _cross_split(groups: Sequence[DuplicateGroup], splits: dict[str, frozenset[str]]) -> dict:
    """Duplicate groups whose copies sit in more than one split (the same item seen twice)."""
    where = {i: name for name, ids in splits.items() for i in ids}
    spans: Counter = Counter()
    for group in groups:
        names = sorted({where[i] for i in group.ids if i in where})
        if len(names) > 1:
            spans["+".join(names)] += 1
    return {"n_groups": sum(spans.values()), "by_splits": dict(spans)}


def _per_split(
    dataset: Dataset, groups: Sequence[DuplicateGroup], splits: dict[str, frozenset[str]], n_boot: int, seed: int
) -> dict:
    """The duplicate statistics within each split (both copies of a pair in that split)."""
    present = {e.id for e in dataset.examples}
    result = {}
    for index, (name, ids) in enumerate(splits.items()):
        inside = [g for g in (group.restrict(ids) for group in groups) if g is not None]
        stats = duplicate_noise(inside, dataset.labels, n_boot=n_boot, seed=[seed, index + 1])
        result[name] = {"n_rows": len(ids & present), **stats}
    return result


def _split_section(
    dataset: Dataset, groups: Sequence[DuplicateGroup], splits: dict[str, frozenset[str]], n_boot: int, seed: int
) -> dict:
    """per_split, uniformity (chi-square of d across splits), cross_split, n_split_ids_not_in_data."""
    per_split = _per_split(dataset, groups, splits, n_boot, seed)
    section: dict = {"per_split": per_split, "uniformity": None, "cross_split": None}
    if not splits:
        return section
    table = {
        name: (s["n_disagreeing_pairs"], s["n_pairs"] - s["n_disagreeing_pairs"])
        for name, s in section["per_split"].items()
    }
    section["uniformity"] = homogeneity_test(table)
    section["cross_split"] = _cross_split(groups, splits)
    present = {e.id for e in dataset.examples}
    section["n_split_ids_not_in_data"] = len(frozenset().union(*splits.values()) - present)
    return section


def audit_dataset(
    dataset: Dataset,
    *,
    splits: Mapping[str, Iterable] | None = None,
    key: Sequence[str] | str | None = None,
    normalise: bool = True,
    n_boot: int = 1000,
    seed: int = 0,
    top: int = 20,
) -> dict:
    """How noisy are the labels, and what accuracy can a perfect model reach against them?

    Duplicate groups (see :func:`find_duplicate_groups`; ``key``, ``normalise``) give the
    pairwise disagreement d, the flip rate ε, the ceiling 1 − ε and Cohen's κ between copies,
    each with a 95% interval from ``n_boot`` group resamples (``seed``); ordinal label spaces
    add the mean |grade difference|. ``splits`` (name → ids) adds the same statistics within
    each split, a chi-square test of whether d is the same in every split (``uniformity``)
    and the duplicate groups that straddle splits. Examples with ``meta["ratings"]`` add
    single-rater and aggregated-label noise (``per_rater``, see :mod:`labelrl.audit.raters`).

    Returns a JSON-ready dict: dataset, kind, labels, n_rows, label_counts, n_skipped_rows,
    key, mode, n_duplicate_rows, the keys of :func:`duplicate_noise`, per_split, uniformity,
    cross_split, conflicting_groups (all, most disagreeing pairs first), largest_groups (the
    ``top`` biggest groups), per_rater and notes (plain-language findings).
    """
    if top < 0:
        raise ValueError(f"top={top}: the number of groups to list cannot be negative")
    groups = find_duplicate_groups(dataset.examples, key=key, normalise=normalise)
    split_sets = _split_sets(splits)
    report: dict = {
        "dataset": dataset.name,
        "kind": dataset.labels.kind,
        "labels": list(dataset.labels.labels),
        "n_rows": len(dataset),
        "label_counts": dataset.label_counts(),
        "n_skipped_rows": len(dataset.skipped_rows),
        "key": [key] if isinstance(key, str) else list(key or ["text"]),
        "mode": "normalised" if normalise else "exact",
        "n_duplicate_rows": sum(g.size for g in groups),
        **duplicate_noise(groups, dataset.labels, n_boot=n_boot, seed=seed),
        **_split_section(dataset, groups, split_sets, n_boot, seed),
    }
    conflicting = sorted(
        (g for g in groups if g.conflicting), key=lambda g: (-g.n_disagreeing_pairs, -g.size)
    )
    report["conflicting_groups"] = [_group_record(g) for g in conflicting]
    largest = sorted(groups, key=lambda g: -g.size)
    report["largest_groups"] = [_group_record(g) for g in largest[:top]]
    report["concentrated_pairs"] = concentration(report, [g.size for g in largest[:CONCENTRATED_GROUPS]])
    report["per_rater"] = _per_rater(dataset, n_boot, seed)
    report["notes"] = notes(report)
    return report


def _per_rater(dataset: Dataset, n_boot: int, seed: int) -> dict | None:
    if not any(len(e.meta.get("ratings") or ()) >= 2 for e in dataset.examples):
        return None
    rating_map = rating_map_for(dataset.labels)
    if rating_map is None:
        return {"skipped": f"no rule maps ratings to the labels {list(dataset.labels.labels)}"}
    return rater_noise(dataset.examples, rating_map, n_boot=n_boot, seed=seed)


def concentration(report: dict, largest_sizes: list[int]) -> dict | None:
    """``{"n_groups", "share", "copies"}`` when the largest few groups hold most of the pairs
    (see ``CONCENTRATED_SHARE``), else None: then the pair-weighted d is mostly theirs."""
    shares = report.get("largest_groups_pair_share") or []
    if report["n_duplicate_groups"] < MIN_GROUPS_FOR_CONCENTRATION:
        return None
    m = next((i + 1 for i, share in enumerate(shares[:CONCENTRATED_GROUPS]) if share >= CONCENTRATED_SHARE), None)
    if m is None:
        return None
    return {"n_groups": m, "share": shares[m - 1], "copies": largest_sizes[:m]}


def _ci(block: dict, name: str) -> str:
    ci = block.get(f"{name}_ci")
    return f" (95% CI {ci[0]:.3f}–{ci[1]:.3f})" if ci else ""


def notes(report: dict) -> list[str]:
    """Plain-language statements about an audit report (see :func:`audit_dataset`)."""
    out: list[str] = []
    k = len(report["labels"])
    variants = sum(len(set(g["texts"])) > 1 for g in report["conflicting_groups"])
    if report["n_skipped_rows"]:
        out.append(f"{report['n_skipped_rows']} rows were skipped while loading and are not audited.")
    out.append(_headline(report, k, variants))
    if report.get("concentrated_pairs") and report["disagreement_rate"] is not None:
        out.append(_concentration_note(report, k))
    if variants:
        out.append(
            f"{variants} of {report['n_conflicting_groups']} conflicting groups join texts that differ before "
            "normalisation (case, punctuation): their labels may differ for a reason; compare with --exact."
        )
    if report["n_pairs"] and report["flip_rate_reason"]:
        out.append(report["flip_rate_reason"] + ".")
    if report["n_pairs"]:
        out.append(
            "The duplicate estimate assumes each copy was labelled independently; copies labelled "
            "together (or reconciled by the dataset's authors) agree more, making ε a lower bound."
        )
    if 0 < report["n_duplicate_groups"] < SMALL_GROUP_COUNT:
        out.append(f"only {report['n_duplicate_groups']} duplicate groups: the intervals are rough.")
    if report["n_pairs"] and report["kappa"] is None:
        out.append("κ is undefined: every copy carries the same label, so chance agreement is 1.")
    if report["kind"] == "ordinal" and report["n_pairs"]:
        out.append(
            "ε uses the symmetric K-label model, which ignores that ordinal errors mostly move to a "
            "neighbouring grade; read mean_abs_grade_diff alongside."
        )
    out += _split_notes(report)
    out += _rater_notes(report.get("per_rater"))
    return out


def _headline(report: dict, k: int, variants: int) -> str:
    """The main finding: no duplicates, duplicates without conflicts (with a bound), or d and ε."""
    what = "texts" if report["key"] == ["text"] else f"values of ({', '.join(report['key'])})"
    if report["n_pairs"] == 0:
        return (
            f"no duplicate {what} ({report['mode']}) among {report['n_rows']} rows: "
            "ε cannot be estimated from duplicates."
        )
    if report["n_disagreeing_pairs"] == 0:
        p = report["n_pairs"]
        # Exact one-sided 95% bound for 0 events in p trials, (1 − d)^p = 0.05 (≈ 3/p, the
        # "rule of three"); pairs are treated as independent, which flatters large groups.
        bound = min(1.0 - 0.05 ** (1.0 / p), (k - 1) / k)
        eps = flip_rate_from_disagreement(bound, k)
        return (
            f"{report['n_duplicate_groups']} duplicate groups ({p} pairs), none with conflicting labels: "
            f"d = 0. With 0 disagreements in {p} pairs, d ≤ {bound:.3g} at 95% (exact binomial bound), "
            f"i.e. ε ≤ {eps:.3g} and a ceiling ≥ {1 - eps:.3g}."
        )
    line = (
        f"{report['n_conflicting_groups']} of {report['n_duplicate_groups']} duplicate groups have "
        f"conflicting labels: copies disagree in {report['n_disagreeing_pairs']} of "
        f"{report['n_pairs']} pairs (d = {report['disagreement_rate']:.3f}{_ci(report, 'disagreement_rate')})."
    )
    if report["flip_rate"] is not None:
        same = "If copies are the same item, a" if variants else "A"
        line += (
            f" {same} label flips with ε ≈ {report['flip_rate']:.3f}{_ci(report, 'flip_rate')}, so no "
            f"model can score above ≈ {report['ceiling']:.3f} accuracy against these labels."
        )
    return line


def _concentration_note(report: dict, k: int) -> str:
    """Most pairs come from a few groups: say so, and give d with each group counted once."""
    c, weighted = report["concentrated_pairs"], report["group_weighted"]
    one = c["n_groups"] == 1
    which = "the largest group" if one else f"the largest {c['n_groups']} groups"
    held = (f"{which} ({' and '.join(str(n) for n in c['copies'])} copies) {'holds' if one else 'hold'} "
            f"{c['share']:.0%} of the {report['n_pairs']:,} duplicate pairs")
    if report["n_disagreeing_pairs"] == 0:
        return (f"{held}, so the bound above leans on {'it' if one else 'them'} (it treats their pairs as "
                f"independent); counted once each, none of the {weighted['n_groups']} groups has conflicting labels.")
    line = (
        f"{held}, so the pair-weighted d = {report['disagreement_rate']:.3f} rests mostly on {'it' if one else 'them'}. "
        f"Counting each of the {weighted['n_groups']} groups once: d = {weighted['disagreement_rate']:.3f}"
        f"{_ci(weighted, 'disagreement_rate')}"
    )
    if weighted["flip_rate"] is not None:
        line += (f", ε ≈ {weighted['flip_rate']:.3f}{_ci(weighted, 'flip_rate')}, ceiling ≈ "
                 f"{weighted['ceiling']:.3f}{_ci(weighted, 'ceiling')}")
    formula = "d = 2ε(1 − ε) for two labels" if k == 2 else f"d = 1 − (1 − ε)² − ε²/(K − 1) for K = {k} labels"
    return (line + f". Both estimate the disagreement of symmetric label noise, {formula} (Angluin & Laird 1988), "
            "which holds within every group whatever its size; they differ when the largest groups are noisier or "
            "cleaner than the rest.")


def _split_notes(report: dict) -> list[str]:
    out = []
    cross = report.get("cross_split")
    if cross and cross["n_groups"]:
        spans = ", ".join(f"{n} {name}" for name, n in sorted(cross["by_splits"].items()))
        out.append(
            f"{cross['n_groups']} duplicate groups span more than one split ({spans}): the same item is "
            "seen in training and evaluation."
        )
    small = [name for name, s in report["per_split"].items() if 0 < s["n_duplicate_groups"] < SMALL_GROUP_COUNT]
    if small:
        out.append(f"fewer than {SMALL_GROUP_COUNT} duplicate groups in {', '.join(small)}: those intervals are rough.")
    if report.get("n_split_ids_not_in_data"):
        out.append(f"{report['n_split_ids_not_in_data']} ids in the splits file are not in the data.")
    test = report.get("uniformity")
    if test and test["p_value"] is not None:
        verdict = "d differs across splits" if test["p_value"] < 0.05 else "no evidence that d differs across splits"
        out.append(
            f"{verdict} (chi-square = {test['statistic']:.2f}, dof = {test['dof']}, p = {test['p_value']:.3g})."
        )
    return out


def _rater_notes(raters: dict | None) -> list[str]:
    if not raters:
        return []
    if "skipped" in raters:
        return [f"per-rater scores are present but not audited: {raters['skipped']}."]
    out = []
    agg = raters["aggregated"]
    if raters["flip_rate"] is not None:
        out.append(
            f"one rater's label flips with ε ≈ {raters['flip_rate']:.3f}{_ci(raters, 'flip_rate')} "
            f"(raters disagree in {raters['disagreement_rate']:.3f} of pairs within an item)."
        )
    if agg["flip_rate"] is not None:
        out.append(
            f"a label averaged over about {agg['raters_per_half_median']:.0f} raters flips with "
            f"ε ≈ {agg['flip_rate']:.3f}{_ci(agg, 'flip_rate')} (split-half); the dataset's labels average "
            f"about {raters['raters_per_item']['median']:.0f} raters, so their noise is at most about that "
            f"and the ceiling at least about {agg['ceiling']:.3f}."
        )
    if raters["label_reproduced_rate"] < 0.99:
        out.append(
            f"the rating map reproduces only {100 * raters['label_reproduced_rate']:.1f}% of the recorded "
            "labels from the mean rating: the rater estimates may describe a different labelling."
        )
    return out

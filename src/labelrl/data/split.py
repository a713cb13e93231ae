"""Group-aware train/val/holdout splits, saved once per run directory, and dataset summaries.

Rows whose texts match after ``normalise_text`` form one group, and a group never
straddles two splits: otherwise a model could be scored on a near-copy of an item it was
trained on. Every run in a run directory shares one ``splits.json``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import sys
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from labelrl.fileio import atomic_write_json
from labelrl.types import Dataset, Example

SPLIT_NAMES: tuple[str, str, str] = ("train", "val", "holdout")
DEFAULT_RATIOS: tuple[float, float, float] = (0.8, 0.1, 0.1)
SPLITS_FILE = "splits.json"
SPLITS_FORMAT = 1


@functools.cache
def _punctuation() -> dict[int, None]:
    """Every code point of the Unicode categories P*, mapped to None for ``str.translate``
    (819 of them; found once per process, in about 0.2 s)."""
    return {cp: None for cp in range(sys.maxunicode + 1) if unicodedata.category(chr(cp))[0] == "P"}


def normalise_text(text: str) -> str:
    """Text as compared for near-duplicates: Unicode NFKC, case-folded, punctuation
    (Unicode categories P*) deleted, runs of whitespace collapsed to one space, trimmed."""
    text = unicodedata.normalize("NFKC", text).casefold().translate(_punctuation())
    return " ".join(text.split())


def group_key(text: str) -> str:
    """``normalise_text(text)``, or for a text that is all punctuation (":)", "?!") the
    trimmed text itself, so such texts are not all lumped into one empty-string group."""
    return normalise_text(text) or "\0" + text.strip()


def group_examples(examples: Iterable[Example], key: Callable[[str], str] = group_key) -> dict[str, list[Example]]:
    """Examples grouped by ``key(text)``, groups and members in first-seen order."""
    groups: dict[str, list[Example]] = {}
    for ex in examples:
        groups.setdefault(key(ex.text), []).append(ex)
    return groups


@dataclass(frozen=True)
class Splits:
    """Example ids per split (``SPLIT_NAMES``), in dataset order.

    ``fingerprint`` is the sha256 of the dataset content (id, text, label), the label
    space, the seed and the ratios: equal fingerprints mean equal splits.
    """

    ids: dict[str, tuple[str, ...]]
    seed: int
    ratios: tuple[float, float, float]
    fingerprint: str
    dataset: str = ""

    def sizes(self) -> dict[str, int]:
        return {name: len(self.ids[name]) for name in SPLIT_NAMES}


def check_ratios(ratios: Sequence[float]) -> tuple[float, float, float]:
    values = tuple(float(r) for r in ratios)
    if len(values) != 3 or any(not r > 0 for r in values) or abs(sum(values) - 1.0) > 1e-6:
        raise ValueError(
            f"ratios={list(ratios)}: give 3 positive shares (train, val, holdout) that sum to 1 "
            f"(these sum to {sum(values):g}); e.g. 0.8,0.1,0.1"
        )
    return values  # type: ignore[return-value]


def splits_fingerprint(dataset: Dataset, seed: int, ratios: Sequence[float]) -> str:
    """sha256 over the examples sorted by id (so row order does not matter), labels, seed, ratios.

    Kept per dataset object (``load_dataset`` returns one object per file and options in a
    process): a ladder checks its splits for every run and evaluation, and a 200,000-row file
    took seconds each time."""
    key = ("splits_fingerprint", int(seed), tuple(float(r) for r in ratios))
    if key not in dataset.memo:
        dataset.memo[key] = _fingerprint(dataset, seed, ratios)
    return dataset.memo[key]


def _fingerprint(dataset: Dataset, seed: int, ratios: Sequence[float]) -> str:
    digest = hashlib.sha256()
    head = {"labels": list(dataset.labels.labels), "kind": dataset.labels.kind, "seed": int(seed), "ratios": list(ratios)}
    digest.update(json.dumps(head, sort_keys=True).encode("utf-8"))
    for ex in sorted(dataset.examples, key=lambda e: e.id):
        digest.update(b"\n" + json.dumps([ex.id, ex.text, ex.label], ensure_ascii=False).encode("utf-8"))
    return digest.hexdigest()


def make_splits(dataset: Dataset, *, seed: int = 0, ratios: Sequence[float] = DEFAULT_RATIOS) -> Splits:
    """Assign whole normalised-text groups (``group_key``) to train/val/holdout.

    Group keys are sorted, then shuffled with ``random.Random(seed)``; each group in turn goes
    to the split furthest below its target ``ratio × n_rows`` (ties: train, val, holdout),
    so sizes track the ratios to within one group. Same data and seed → same splits.
    """
    shares = check_ratios(ratios)
    groups = group_examples(dataset.examples)
    keys = sorted(groups)
    random.Random(seed).shuffle(keys)
    targets = [share * len(dataset) for share in shares]
    filled = [0, 0, 0]
    split_of: dict[str, str] = {}
    for key in keys:
        deficits = [t - f for t, f in zip(targets, filled)]
        i = deficits.index(max(deficits))
        filled[i] += len(groups[key])
        for ex in groups[key]:
            split_of[ex.id] = SPLIT_NAMES[i]
    ids = {name: tuple(ex.id for ex in dataset.examples if split_of[ex.id] == name) for name in SPLIT_NAMES}
    return Splits(ids=ids, seed=seed, ratios=shares, fingerprint=splits_fingerprint(dataset, seed, shares), dataset=dataset.name)


def _splits_json(splits: Splits) -> dict:
    return {
        "format": SPLITS_FORMAT,
        "dataset": splits.dataset,
        "seed": splits.seed,
        "ratios": list(splits.ratios),
        "fingerprint": splits.fingerprint,
        "sizes": splits.sizes(),
        "splits": {name: list(splits.ids[name]) for name in SPLIT_NAMES},
    }


def _mismatch(path: Path, old: Splits, new_fingerprint: str, new_seed: int) -> ValueError:
    return ValueError(
        f"{path}: holds splits of dataset {old.dataset!r} with seed {old.seed} (fingerprint {old.fingerprint[:12]}), "
        f"but this dataset with seed {new_seed} has fingerprint {new_fingerprint[:12]}; every run in a run "
        "directory must share its splits: use a fresh --out directory, or the original data and --split-seed"
    )


def save_splits(splits: Splits, run_dir: str | Path) -> Path:
    """Write ``run_dir/splits.json`` atomically; refuses to replace splits with another fingerprint."""
    path = Path(run_dir) / SPLITS_FILE
    if path.exists():
        old = load_splits(run_dir)
        if old.fingerprint != splits.fingerprint:
            raise _mismatch(path, old, splits.fingerprint, splits.seed)
    atomic_write_json(path, _splits_json(splits))
    return path


def load_splits(run_dir: str | Path) -> Splits:
    """Read ``run_dir/splits.json`` (written by ``save_splits``)."""
    path = Path(run_dir) / SPLITS_FILE
    if not path.is_file():
        raise ValueError(f"{path}: no splits file; run a command that makes splits (e.g. labelrl sft) with --out {run_dir}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        ids = {name: tuple(str(i) for i in data["splits"][name]) for name in SPLIT_NAMES}
        return Splits(ids=ids, seed=int(data["seed"]), ratios=tuple(data["ratios"]),  # type: ignore[arg-type]
                      fingerprint=str(data["fingerprint"]), dataset=str(data.get("dataset", "")))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a valid splits file ({exc!r}); delete it to make new splits") from None


def load_or_make_splits(
    dataset: Dataset, run_dir: str | Path, *, seed: int = 0, ratios: Sequence[float] = DEFAULT_RATIOS
) -> Splits:
    """The run directory's splits if they match this dataset and seed, else new ones saved there.

    Splits made from other data or another seed are an error naming both fingerprints.
    """
    shares = check_ratios(ratios)
    path = Path(run_dir) / SPLITS_FILE
    if path.exists():
        old = load_splits(run_dir)
        fingerprint = splits_fingerprint(dataset, seed, shares)
        if old.fingerprint != fingerprint:
            raise _mismatch(path, old, fingerprint, seed)
        return old
    splits = make_splits(dataset, seed=seed, ratios=shares)
    save_splits(splits, run_dir)
    return splits


def select(dataset: Dataset, splits: Splits, name: str) -> list[Example]:
    """The examples of split ``name``, in dataset order."""
    if name not in SPLIT_NAMES:
        raise ValueError(f"split {name!r}: choose one of {', '.join(SPLIT_NAMES)}")
    wanted = set(splits.ids[name])
    examples = [ex for ex in dataset.examples if ex.id in wanted]
    if len(examples) != len(wanted):
        missing = sorted(wanted - {ex.id for ex in examples})
        raise ValueError(
            f"split {name!r} lists {len(missing)} id(s) not in dataset {dataset.name!r} (e.g. {missing[0]!r}); "
            "the splits were made from other data: use a fresh run directory"
        )
    return examples


def _duplicate_stats(groups: dict[str, list[Example]]) -> tuple[int, int]:
    dup = [g for g in groups.values() if len(g) > 1]
    return len(dup), sum(len(g) for g in dup)


RARE_ITEMS = 10  # a label with fewer items has a few at most in val and in the holdout


def label_notes(dataset: Dataset, *, declared: bool) -> list[str]:
    """What a user should know about the label set before training: an integer scale with a
    grade no row has (unless the labels were ``declared``), a declared label no row has, and the
    labels with fewer than ``RARE_ITEMS`` items, each with what it does to balanced accuracy."""
    space, counts = dataset.labels, dataset.label_counts()
    k, notes = len(counts), []
    gaps = scale_gaps(space.labels) if space.kind == "ordinal" and not declared else []
    if gaps:
        # partial credit counts grades by their place in the label list: 3 → 5 would be one grade off
        notes.append(f"No item is graded {', '.join(gaps)}: grades count as steps of the list above, so declare the "
                     f"whole scale if it has them (--labels {','.join(sorted([*space.labels, *gaps], key=int))})")
    absent = [label for label, n in counts.items() if n == 0]
    if absent:  # balanced accuracy is the mean recall of the labels present
        notes.append(f"No item is labelled {', '.join(absent)}: balanced accuracy averages the other "
                     f"{k - len(absent)} labels' recalls")
    rare = [label for label, n in sorted(counts.items(), key=lambda item: -item[1]) if 0 < n < RARE_ITEMS]
    if rare:  # one item of a label alone in a split is 1/k of the mean of the labels' recalls
        notes.append(f"Fewer than {RARE_ITEMS} items of {', '.join(rare)}: val and holdout hold a few at most, and one "
                     f"such item moves balanced accuracy by up to 1/{k} = {1 / k:.3f}")
    return notes


def scale_gaps(labels: Sequence[str]) -> list[str]:
    """The integers missing between an integer scale's lowest and highest grade (a few at most)."""
    try:
        grades = sorted(int(x) for x in labels)
    except ValueError:
        return []
    missing = sorted(set(range(grades[0], grades[-1] + 1)) - set(grades))
    return [str(g) for g in missing] if 0 < len(missing) <= len(grades) else []


def summarize(dataset: Dataset) -> dict:
    """Numbers ``labelrl data show`` prints: rows, label counts and shares, duplicate groups
    (exact text, normalised text, normalised groups with more than one label), text length
    percentiles in characters (linear interpolation), and the skipped rows."""
    n = len(dataset)
    counts = dataset.label_counts()
    exact = group_examples(dataset.examples, key=lambda t: t)
    normal = group_examples(dataset.examples)
    conflicting = [g for g in normal.values() if len({ex.label for ex in g}) > 1]
    exact_groups, exact_rows = _duplicate_stats(exact)
    normal_groups, normal_rows = _duplicate_stats(normal)
    lengths = np.array([len(ex.text) for ex in dataset.examples])
    p10, p50, p90 = np.percentile(lengths, [10, 50, 90])
    return {
        "name": dataset.name,
        "source": dataset.source,
        "n_rows": n,
        "labels": list(dataset.labels.labels),
        "kind": dataset.labels.kind,
        "positive": dataset.labels.positive_label if dataset.labels.kind == "binary" else None,
        "label_counts": counts,
        "label_shares": {k: v / n for k, v in counts.items()},
        "exact_duplicate_groups": exact_groups,
        "exact_duplicate_rows": exact_rows,
        "normalised_duplicate_groups": normal_groups,
        "normalised_duplicate_rows": normal_rows,
        "conflicting_groups": len(conflicting),
        "conflicting_rows": sum(len(g) for g in conflicting),
        "text_length_chars": {"p10": float(p10), "p50": float(p50), "p90": float(p90), "max": int(lengths.max())},
        "n_skipped": len(dataset.skipped_rows),
        "skipped_rows": [dict(r) for r in dataset.skipped_rows],
        "skipped_reasons": dict(Counter(r["reason"] for r in dataset.skipped_rows)),
    }

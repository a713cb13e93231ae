"""Samples that represent their split, and label noise injected on purpose.

A limit (``--limit``, ``eval_limit``, ``holdout_limit``, distill ``--limit``) never takes the
first N items in file order: files are often sorted (the VADER movie snippets are ordered by
sentiment), and a "first N" sample of a sorted file is one-sided. ``sample_examples`` draws a
seeded random sample stratified by label instead, so every label keeps its share of the split
(within one item), and the same split, seed and limit give the same items to every arm of a
task, which is what lets two arms be compared item by item.

A training sample may instead be drawn label-balanced (``train_sample: balanced``): each label an
equal share of the limit, all of its items when it has fewer, the rest shared among the others.
A run that draws its items label-balanced (``prompt_sampling: balanced``) then repeats many items
of a rare label rather than the few a proportional sample keeps: a 320-item sample of a split
with 49 items of a 2% label holds 7 of them, which balanced SFT draws 160 times.

``flip_labels`` is the label-noise control: it flips a seeded random share ε of the training
labels, each to one of the other labels uniformly (symmetric noise, the model behind
d = 2ε(1−ε) in ``labelrl.audit.noise``); val and holdout are never touched.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from typing import Sequence

from labelrl.types import Example

# Offsets that keep the sampling and noise streams apart from the split's own shuffle.
_SAMPLE_STREAM = 7_919
_NOISE_STREAM = 104_729


def allocate(counts: dict[str, int], total: int) -> dict[str, int]:
    """Items per label for a sample of ``total`` from strata of ``counts`` items: proportional
    allocation by the largest-remainder method (Hamilton), so each label gets ⌊total·share⌋ or
    one more, never more than it has; ties go to the larger stratum, then to the label name.

    A label the split holds keeps at least one item while ``total`` covers every such label: a
    label at 1% of a split would otherwise get none in a 32-item sample, and balanced accuracy,
    a threshold or an offset chosen on that sample would not see it. Each such item comes from
    the label with the most items in the sample, so an allocation that already has every label
    is the proportional one."""
    n = sum(counts.values())
    if total >= n:
        return dict(counts)
    exact = {label: total * c / n for label, c in counts.items()}
    out = {label: int(v) for label, v in exact.items()}
    order = sorted(counts, key=lambda label: (-(exact[label] - out[label]), -counts[label], label))
    for label in order[: total - sum(out.values())]:
        out[label] += 1
    present = [label for label in sorted(counts) if counts[label] > 0]
    if total >= len(present):
        for label in (label for label in present if out[label] == 0):
            donor = max(present, key=lambda other: (out[other], other))
            out[donor] -= 1
            out[label] = 1
    return out


def allocate_balanced(counts: dict[str, int], total: int) -> dict[str, int]:
    """Items per label for a label-balanced sample of ``total``: each label an equal share, all of
    its items when it has fewer, what those leave shared equally among the others (water-filling),
    a remainder of fewer items than labels going to the labels with the most items left, then by
    name. A label with no items gets none."""
    n = sum(counts.values())
    if total >= n:
        return dict(counts)
    out = {label: 0 for label in counts}
    left = total
    open_ = sorted(label for label in counts if counts[label] > 0)
    while left and open_:
        share = left // len(open_)
        if share == 0:
            for label in sorted(open_, key=lambda label: (-(counts[label] - out[label]), label))[:left]:
                out[label] += 1
            break
        for label in open_:
            take = min(share, counts[label] - out[label])
            out[label] += take
            left -= take
        open_ = [label for label in open_ if out[label] < counts[label]]
    return out


def sample_examples(examples: Sequence[Example], limit: int | None, seed: int, *, balanced: bool = False) -> list[Example]:
    """A seeded random sample of ``limit`` examples stratified by label, in their original order;
    ``balanced``: each label an equal share instead of its share of the split (``allocate_balanced``).

    All of them when ``limit`` is None or at least their number. Within each label the items are
    chosen by ``random.Random(seed + offset)`` over the items sorted by id, so the sample does not
    depend on the file's row order."""
    if limit is None or limit >= len(examples):
        return list(examples)
    if limit < 1:
        raise ValueError(f"limit={limit}: a sample needs at least 1 item; drop the limit to use the whole split")
    by_label: dict[str, list[Example]] = {}
    for ex in sorted(examples, key=lambda e: e.id):
        by_label.setdefault(ex.label, []).append(ex)
    quota = (allocate_balanced if balanced else allocate)({label: len(items) for label, items in by_label.items()}, limit)
    rng = random.Random(seed * 1_000_003 + _SAMPLE_STREAM)
    chosen: set[str] = set()
    for label in sorted(by_label):
        chosen.update(ex.id for ex in rng.sample(by_label[label], quota[label]))
    return [ex for ex in examples if ex.id in chosen]


def sample_record(split: str, sample: Sequence[Example], full: Sequence[Example], *, seed: int, limit: int | None,
                  balanced: bool = False) -> dict:
    """What a run saves about a sample: how it was drawn, its ids, and its label counts next to the
    full split's."""
    return {
        "split": split, "seed": seed, "limit": limit, "draw": "balanced" if balanced else "stratified",
        "n": len(sample), "n_split": len(full),
        "label_counts": dict(sorted(Counter(ex.label for ex in sample).items())),
        "split_label_counts": dict(sorted(Counter(ex.label for ex in full).items())),
        "ids": [ex.id for ex in sample],
    }


def flip_labels(examples: Sequence[Example], labels: Sequence[str], rate: float, seed: int) -> tuple[list[Example], list[dict]]:
    """``examples`` with a random share ``rate`` of labels flipped, and the flips made.

    Each example (in id order) is flipped with probability ``rate``, independently, to one of the
    other ``len(labels) − 1`` labels chosen uniformly; ``seed`` fixes the draw. Returns the
    examples in their original order and ``[{"id", "from", "to"}]``."""
    if not 0 <= rate < 1:
        raise ValueError(f"label_noise={rate}: the share of flipped training labels must lie in [0, 1); e.g. 0.1")
    if rate > 0 and len(labels) < 2:
        raise ValueError(f"label_noise={rate}: flipping needs at least 2 labels, the data has {list(labels)}")
    rng = random.Random(seed * 1_000_003 + _NOISE_STREAM)
    flips: dict[str, dict] = {}
    for ex in sorted(examples, key=lambda e: e.id):
        if rng.random() < rate:
            to = rng.choice([label for label in labels if label != ex.label])
            flips[ex.id] = {"id": ex.id, "from": ex.label, "to": to}
    out = [dataclasses.replace(ex, label=flips[ex.id]["to"]) if ex.id in flips else ex for ex in examples]
    return out, [flips[ex.id] for ex in examples if ex.id in flips]

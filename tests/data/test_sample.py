"""Samples that represent their split (stratified, seeded, the same for every arm) and label noise
injected on the training split only."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from labelrl.data.options import DataOptions
from labelrl.data.prepare import LABEL_NOISE_FILE, SAMPLES_DIR, prepare_data
from labelrl.data.sample import allocate, allocate_balanced, flip_labels, sample_examples
from labelrl.data.split import load_or_make_splits, select
from labelrl.evaluate.setup import load_eval_data
from labelrl.types import Example

GRADES = ["1", "2", "3", "4", "5"]
# Counts per grade, like the VADER movie snippets' shape (grade 3 rare).
COUNTS = {"1": 180, "2": 300, "3": 60, "4": 280, "5": 180}


@pytest.fixture
def sorted_csv(tmp_path):
    """1,000 rows sorted by label, as the VADER movie file is sorted by sentiment: any "first N
    rows" sample of it (or of a split kept in file order) is one-sided."""
    path = tmp_path / "sorted.csv"
    rows = [f"{i},review number {i} graded {g},{g}" for i, g in enumerate(g for g in GRADES for _ in range(COUNTS[g]))]
    path.write_text("id,text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def options(path, **kw) -> DataOptions:
    return DataOptions(data=str(path), text_col=["text"], label_col="label", labels=",".join(GRADES), kind="ordinal", **kw)


def test_allocation_is_proportional_to_within_one_item():
    quota = allocate(COUNTS, 97)
    assert sum(quota.values()) == 97
    for label, n in COUNTS.items():
        assert abs(quota[label] - 97 * n / 1000) < 1  # largest remainder: ⌊share⌋ or one more
    assert allocate({"a": 3, "b": 1}, 10) == {"a": 3, "b": 1}  # never more than a stratum holds


def test_a_rare_label_keeps_one_item_in_a_small_sample_and_common_shapes_keep_their_proportions():
    # 4 "fraud" in a 299-item split: 32 × 4/299 = 0.43 item, which the largest remainder rounds to 0
    assert allocate({"fraud": 4, "ok": 295}, 32) == {"fraud": 1, "ok": 31}
    quota = allocate({"a": 1, "b": 1, "c": 998}, 10)  # each taken from the largest
    assert quota == {"a": 1, "b": 1, "c": 8}
    assert allocate({"a": 1, "b": 1, "c": 998}, 2) == {"a": 0, "b": 0, "c": 2}  # fewer items than labels: proportional
    assert allocate({"a": 0, "b": 50}, 10) == {"a": 0, "b": 10}  # a label the split lacks gets none
    for total in (32, 97, 512):  # every label already drawn: the largest-remainder allocation, unchanged
        exact = {label: total * c / 1000 for label, c in COUNTS.items()}
        floor = {label: int(v) for label, v in exact.items()}
        ranked = sorted(COUNTS, key=lambda label: (-(exact[label] - floor[label]), -COUNTS[label], label))
        hamilton = {label: floor[label] + (label in ranked[: total - sum(floor.values())]) for label in COUNTS}
        assert allocate(COUNTS, total) == hamilton
    # 5 items of 5 grades: grade 3 (0.3 of an item) takes one from grade 2, the only label drawn twice
    assert allocate(COUNTS, 5) == {"1": 1, "2": 1, "3": 1, "4": 1, "5": 1}


def test_a_balanced_allocation_gives_each_label_an_equal_share_or_all_it_has():
    assert allocate_balanced(COUNTS, 250) == {g: 50 for g in GRADES}
    # grade 3 has 60: all of them, the other 300 − 60 shared by four grades
    assert allocate_balanced(COUNTS, 300) == {"1": 60, "2": 60, "3": 60, "4": 60, "5": 60}
    assert allocate_balanced(COUNTS, 320) == {"1": 65, "2": 65, "3": 60, "4": 65, "5": 65}
    # a 2% label: every one of its 49 items, the rest to the other label
    assert allocate_balanced({"fraud": 49, "ok": 2351}, 320) == {"fraud": 49, "ok": 271}
    # a remainder of fewer items than labels goes to the labels with the most items left, then by name
    assert allocate_balanced({"a": 10, "b": 10, "c": 30}, 8) == {"a": 3, "b": 2, "c": 3}
    assert allocate_balanced({"a": 0, "b": 50}, 10) == {"a": 0, "b": 10}  # a label the split lacks gets none
    assert allocate_balanced({"a": 3, "b": 1}, 10) == {"a": 3, "b": 1}
    # max-min fair on random shapes: the right total, within the strata, and a label short of its
    # items never more than one item behind any other label
    import random

    rng = random.Random(0)
    for _ in range(300):
        counts = {f"l{i}": rng.choice([0, 1, 2, 5, 40, 300]) for i in range(rng.randint(2, 6))}
        total = rng.randint(1, sum(counts.values()) + 3)
        quota = allocate_balanced(counts, total)
        assert sum(quota.values()) == min(total, sum(counts.values())), (counts, total, quota)
        assert all(0 <= quota[k] <= counts[k] for k in counts)
        for a in counts:
            if quota[a] < counts[a]:
                assert all(quota[a] >= quota[b] - 1 for b in counts), (counts, total, quota)


def test_a_balanced_training_sample_is_what_sft_rl_and_the_train_split_evaluation_use(sorted_csv, tmp_path):
    run = tmp_path / "run"
    data = prepare_data(options(sorted_csv, limit=200, train_sample="balanced"), run)
    assert Counter(ex.label for ex in data.train) == {g: 40 for g in GRADES}
    record = json.loads((run / SAMPLES_DIR / "train.json").read_text())
    assert record["draw"] == "balanced" and record["label_counts"] == {g: 40 for g in GRADES}
    # scoring the train split draws the items trained on (distillation survival, the residue)
    scored = load_eval_data(options(sorted_csv, train_sample="balanced"), run, "train", limit=200).examples
    assert [ex.id for ex in scored] == [ex.id for ex in data.train]
    # val and holdout samples stay stratified: they measure the split as it is
    val = Counter(ex.label for ex in load_eval_data(options(sorted_csv, train_sample="balanced"), run, "val", limit=50).examples)
    assert val == Counter(ex.label for ex in load_eval_data(options(sorted_csv), run, "val", limit=50).examples)
    assert val["3"] < val["2"]
    # the default draw is stratified, and says so
    prepare_data(options(sorted_csv, limit=200), tmp_path / "strat")
    assert json.loads((tmp_path / "strat" / SAMPLES_DIR / "train.json").read_text())["draw"] == "stratified"


def test_limited_samples_of_a_sorted_file_hold_every_label_in_proportion(sorted_csv, tmp_path):
    run = tmp_path / "run"
    data = prepare_data(options(sorted_csv, limit=200), run)
    train_full = select(data.dataset, load_or_make_splits(data.dataset, run), "train")
    full = Counter(ex.label for ex in train_full)
    got = Counter(ex.label for ex in data.train)
    assert len(data.train) == 200
    for label in GRADES:
        assert abs(got[label] - 200 * full[label] / len(train_full)) < 1, (label, got, full)
    # the first 200 rows of the split in file order would be grades 1 and 2 only
    assert set(Counter(ex.label for ex in train_full[:200])) <= {"1", "2"}
    record = (run / SAMPLES_DIR / "train.json").read_text()
    assert all(ex.id in record for ex in data.train)
    for split, limit in (("val", 50), ("holdout", 50)):
        sample = load_eval_data(options(sorted_csv), run, split, limit=limit).examples
        whole = Counter(ex.label for ex in select(data.dataset, load_or_make_splits(data.dataset, run), split))
        got = Counter(ex.label for ex in sample)
        n_split = sum(whole.values())
        for label in GRADES:
            expected = limit * whole[label] / n_split
            assert abs(got[label] - expected) < 1, (split, label, got, whole)


def test_two_arms_of_a_task_get_the_same_items(sorted_csv, tmp_path):
    # two arms share the run's splits (the ladder copies splits.json); their own training seeds differ
    first = prepare_data(options(sorted_csv, limit=120), tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "splits.json").write_text((tmp_path / "a" / "splits.json").read_text())
    second = prepare_data(options(sorted_csv, limit=120), tmp_path / "b")
    assert [ex.id for ex in first.train] == [ex.id for ex in second.train]
    val_a = load_eval_data(options(sorted_csv), tmp_path / "a", "val", limit=40).examples
    val_b = load_eval_data(options(sorted_csv), tmp_path / "b", "val", limit=40).examples
    assert [ex.id for ex in val_a] == [ex.id for ex in val_b]
    # another split seed draws other items (the sample is a function of the splits' seed)
    assert {ex.id for ex in sample_examples(first.train, 60, seed=1)} != {ex.id for ex in sample_examples(first.train, 60, seed=0)}


def test_the_sample_does_not_depend_on_row_order():
    examples = [Example(id=f"x{i}", text=f"t{i}", label="ab"[i % 2]) for i in range(100)]
    forward = {ex.id for ex in sample_examples(examples, 30, seed=3)}
    backward = {ex.id for ex in sample_examples(list(reversed(examples)), 30, seed=3)}
    assert forward == backward


@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_flipped_share_is_the_rate_and_only_train_labels_change(sorted_csv, tmp_path, rate):
    run = tmp_path / "run"
    data = prepare_data(options(sorted_csv, label_noise=rate), run)
    splits = load_or_make_splits(data.dataset, run)
    clean = {ex.id: ex.label for ex in data.dataset.examples}
    n = len(data.train)
    flipped = [ex for ex in data.train if ex.label != clean[ex.id]]
    se = math.sqrt(rate * (1 - rate) / n)
    assert abs(len(flipped) / n - rate) <= 2 * se, (len(flipped), n)
    # symmetric: each flip goes to another label, and every other label is reached
    assert all(ex.label in GRADES for ex in flipped)
    assert len({(clean[ex.id], ex.label) for ex in flipped}) > 10
    record = __import__("json").loads((run / LABEL_NOISE_FILE).read_text())
    assert record["n_flipped"] == len(flipped) and {f["id"] for f in record["flips"]} == {ex.id for ex in flipped}
    for split in ("val", "holdout"):  # evaluation reads the clean labels
        evaluated = load_eval_data(options(sorted_csv, label_noise=rate), run, split).examples
        assert [ex.label for ex in evaluated] == [clean[ex.id] for ex in select(data.dataset, splits, split)]


def test_flips_depend_on_the_seed_not_on_row_order():
    examples = [Example(id=f"x{i}", text=f"t{i}", label="ab"[i % 2]) for i in range(200)]
    _, flips = flip_labels(examples, ["a", "b"], 0.2, seed=0)
    _, flips_reversed = flip_labels(list(reversed(examples)), ["a", "b"], 0.2, seed=0)
    _, flips_other = flip_labels(examples, ["a", "b"], 0.2, seed=1)
    assert sorted(f["id"] for f in flips) == sorted(f["id"] for f in flips_reversed)
    assert {f["id"] for f in flips} != {f["id"] for f in flips_other}
    assert all(f["to"] != f["from"] for f in flips)
    with pytest.raises(ValueError, match="label_noise=1.0"):
        flip_labels(examples, ["a", "b"], 1.0, seed=0)

"""Group-aware splits, their files and fingerprints, and the dataset summary."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labelrl.data import split as split_module
from labelrl.data.split import (
    SPLIT_NAMES,
    group_key,
    load_or_make_splits,
    load_splits,
    make_splits,
    normalise_text,
    save_splits,
    select,
    summarize,
)
from labelrl.types import Dataset, Example, LabelSpace

LABELS = LabelSpace(("neg", "pos"), kind="binary")


def make_dataset(texts: list[str], labels: list[str] | None = None, name: str = "toy") -> Dataset:
    labels = labels or ["pos" if i % 3 else "neg" for i in range(len(texts))]
    examples = tuple(Example(id=str(i), text=t, label=l) for i, (t, l) in enumerate(zip(texts, labels)))
    return Dataset(name=name, examples=examples, labels=LABELS)


def with_near_duplicates(n_groups: int = 300) -> Dataset:
    """Item k appears 1–4 times, varied only in case, punctuation and spacing."""
    variants = ["item {k} text", "Item {k} text!", "  ITEM {k},  text.", "item {k} text?!"]
    texts = [variants[j].format(k=k) for k in range(n_groups) for j in range(1 + k % 4)]
    return make_dataset(texts)


def test_normalise_text():
    assert normalise_text("  Hello,   WORLD!! ") == "hello world"
    assert normalise_text("Don't\tstop…") == "dont stop"
    # NFKC folds compatibility forms: full-width letters and the "ﬁ" ligature.
    assert normalise_text("ＡＢＣ ﬁne") == "abc fine"
    assert normalise_text("Straße") == "strasse"  # casefold, not lower
    assert group_key(":)") != group_key(":(")  # all-punctuation texts keep their own groups
    assert group_key(":)") == group_key(" :) ")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_normalise_text_deletes_exactly_the_punctuation_categories(text):
    # the definition, character by character; splits.json groups depend on it staying the same
    import unicodedata

    folded = unicodedata.normalize("NFKC", text).casefold()
    kept = "".join(ch for ch in folded if not unicodedata.category(ch).startswith("P"))
    assert normalise_text(text) == " ".join(kept.split())


def test_a_datasets_splits_fingerprint_is_computed_once(monkeypatch):
    ds = with_near_duplicates()
    calls = []
    real = split_module._fingerprint
    monkeypatch.setattr(split_module, "_fingerprint", lambda *a: calls.append(a) or real(*a))
    first = split_module.splits_fingerprint(ds, 0, (0.8, 0.1, 0.1))
    assert split_module.splits_fingerprint(ds, 0, [0.8, 0.1, 0.1]) == first and len(calls) == 1
    assert split_module.splits_fingerprint(ds, 1, (0.8, 0.1, 0.1)) != first and len(calls) == 2
    assert split_module.splits_fingerprint(make_dataset([ex.text for ex in ds.examples]), 0, (0.8, 0.1, 0.1)) == first


def test_no_normalised_group_straddles_two_splits():
    ds = with_near_duplicates()
    splits = make_splits(ds, seed=3)
    where = {i: name for name in SPLIT_NAMES for i in splits.ids[name]}
    assert sorted(where) == sorted(ex.id for ex in ds.examples)  # every row in exactly one split
    by_key: dict[str, set[str]] = {}
    for ex in ds.examples:
        by_key.setdefault(normalise_text(ex.text), set()).add(where[ex.id])
    assert len(by_key) == 300 and all(len(names) == 1 for names in by_key.values())


def test_same_seed_same_split_other_seed_other_split(fresh_process):
    ds = with_near_duplicates()
    # a second run, in another interpreter with another hash seed (group keys are strings)
    assert fresh_process(make_splits, ds, seed=1) == make_splits(ds, seed=1)
    assert make_splits(ds, seed=1).ids != make_splits(ds, seed=2).ids
    # Row order does not matter: reversed rows give the same split as sets, same fingerprint.
    reversed_ds = Dataset(name="toy", examples=ds.examples[::-1], labels=LABELS)
    a, b = make_splits(ds, seed=1), make_splits(reversed_ds, seed=1)
    assert {n: set(a.ids[n]) for n in SPLIT_NAMES} == {n: set(b.ids[n]) for n in SPLIT_NAMES}
    assert a.fingerprint == b.fingerprint


def test_ratios_are_respected_within_one_group():
    ds = with_near_duplicates()  # 750 rows, groups of at most 4
    for ratios in [(0.8, 0.1, 0.1), (0.5, 0.25, 0.25), (0.6, 0.2, 0.2)]:
        sizes = make_splits(ds, seed=0, ratios=ratios).sizes()
        for name, share in zip(SPLIT_NAMES, ratios):
            assert abs(sizes[name] - share * len(ds)) <= 4, (ratios, sizes)


def test_small_dataset_fills_every_split():
    sizes = make_splits(make_dataset([f"t{i}" for i in range(10)]), seed=0).sizes()
    assert sizes == {"train": 8, "val": 1, "holdout": 1}


@pytest.mark.parametrize("ratios", [(0.8, 0.2), (0.8, 0.3, 0.1), (1.0, 0.0, 0.0), (0.9, 0.2, -0.1)])
def test_bad_ratios(ratios):
    with pytest.raises(ValueError, match=r"give 3 positive shares \(train, val, holdout\) that sum to 1"):
        make_splits(make_dataset(["a", "b", "c"]), ratios=ratios)


@settings(max_examples=40, deadline=None)
@given(
    texts=st.lists(st.sampled_from(["a", "A.", "b", "b!", "c", "d d", "D  d", "e", "f?", "g"]), min_size=3, max_size=40),
    seed=st.integers(0, 10**6),
)
def test_property_groups_never_straddle_and_ids_partition(texts, seed):
    ds = make_dataset(texts)
    splits = make_splits(ds, seed=seed)
    seen: dict[str, str] = {}
    for name in SPLIT_NAMES:
        for i in splits.ids[name]:
            key = normalise_text(ds.examples[int(i)].text)
            assert seen.setdefault(key, name) == name
    assert sorted(sum((list(splits.ids[n]) for n in SPLIT_NAMES), []), key=int) == [ex.id for ex in ds.examples]


def test_save_load_and_select(tmp_path):
    ds = with_near_duplicates()
    splits = make_splits(ds, seed=5)
    path = save_splits(splits, tmp_path)
    data = json.loads(path.read_text())
    assert set(data["splits"]) == set(SPLIT_NAMES) and data["fingerprint"] == splits.fingerprint
    assert not [p for p in tmp_path.iterdir() if p.name != "splits.json"]  # no temp file left behind
    assert load_splits(tmp_path) == splits
    val = select(ds, splits, "val")
    assert [ex.id for ex in val] == list(splits.ids["val"])
    with pytest.raises(ValueError, match="split 'test': choose one of train, val, holdout"):
        select(ds, splits, "test")


def test_run_dir_refuses_splits_of_other_data_or_seed(tmp_path, monkeypatch):
    ds = with_near_duplicates()
    first = load_or_make_splits(ds, tmp_path, seed=0)
    written = (tmp_path / "splits.json").stat().st_mtime_ns

    def remade(*args, **kwargs):
        raise AssertionError("make_splits called: the saved splits were not reused")

    with monkeypatch.context() as patch:
        patch.setattr(split_module, "make_splits", remade)
        assert load_or_make_splits(ds, tmp_path, seed=0) == first  # reused, not remade
    assert (tmp_path / "splits.json").stat().st_mtime_ns == written  # nor rewritten
    other = make_splits(ds, seed=1)
    with pytest.raises(ValueError) as info:
        load_or_make_splits(ds, tmp_path, seed=1)
    message = str(info.value)
    assert first.fingerprint[:12] in message and other.fingerprint[:12] in message
    assert "use a fresh --out directory" in message
    with pytest.raises(ValueError, match=first.fingerprint[:12]):
        save_splits(other, tmp_path)
    changed = make_dataset([ex.text + " more" for ex in ds.examples])
    with pytest.raises(ValueError, match="holds splits of dataset 'toy' with seed 0"):
        load_or_make_splits(changed, tmp_path, seed=0)


def test_select_rejects_ids_missing_from_the_dataset():
    splits = make_splits(make_dataset([f"t{i}" for i in range(10)]), seed=0)
    smaller = make_dataset([f"t{i}" for i in range(5)])
    with pytest.raises(ValueError, match=r"lists \d+ id\(s\) not in dataset 'toy'"):
        select(smaller, splits, "train")


def test_load_splits_errors(tmp_path):
    with pytest.raises(ValueError, match="no splits file"):
        load_splits(tmp_path)
    (tmp_path / "splits.json").write_text('{"splits": {}}')
    with pytest.raises(ValueError, match="not a valid splits file"):
        load_splits(tmp_path)


def test_summarize_counts_duplicates_conflicts_and_lengths():
    texts = ["Hi there", "Hi there", "hi, there!", "Win cash", "win cash", "abcd", "x" * 40]
    labels = ["neg", "neg", "neg", "pos", "neg", "pos", "pos"]
    ds = Dataset(name="toy", examples=tuple(Example(str(i), t, l) for i, (t, l) in enumerate(zip(texts, labels))),
                 labels=LABELS, source="toy.jsonl", skipped_rows=({"row": 9, "column": "text", "value": "", "reason": "empty text"},))
    s = summarize(ds)
    assert s["n_rows"] == 7 and s["label_counts"] == {"neg": 4, "pos": 3}
    assert s["label_shares"]["neg"] == pytest.approx(4 / 7)
    assert (s["exact_duplicate_groups"], s["exact_duplicate_rows"]) == (1, 2)  # "Hi there" ×2
    assert (s["normalised_duplicate_groups"], s["normalised_duplicate_rows"]) == (2, 5)
    assert (s["conflicting_groups"], s["conflicting_rows"]) == (1, 2)  # "win cash": pos vs neg
    # lengths sorted: 4, 8, 8, 8, 8, 10, 40; rank p·6: p10 = 4 + 0.6·(8 − 4) = 6.4, p50 = 8, p90 = 10 + 0.4·(40 − 10) = 22
    assert s["text_length_chars"] == {"p10": pytest.approx(6.4), "p50": 8.0, "p90": pytest.approx(22.0), "max": 40}
    assert s["n_skipped"] == 1 and s["skipped_reasons"] == {"empty text": 1}
    assert s["positive"] == "pos" and s["kind"] == "binary"

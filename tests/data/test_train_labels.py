"""Training labels from another answer key (``train_labels``) and label noise seeded by the run
(``label_noise_seed: run``): what a training run's ``prepare_data`` hands the trainer."""

from __future__ import annotations

import json

import pytest

from labelrl.data.options import DataOptions
from labelrl.data.prepare import LABEL_NOISE_FILE, draw_training_sample, prepare_data
from labelrl.data.train_labels import TRAIN_LABELS_FILE
from labelrl.train.config import SFTConfig
from labelrl.types import Example


@pytest.fixture
def csv(tmp_path):
    """400 rows, labels a/b alternating (so a limit draws both)."""
    path = tmp_path / "toy.csv"
    path.write_text("id,text,label\n" + "\n".join(f"i{n},text number {n},{'ab'[n % 2]}" for n in range(400)) + "\n",
                    encoding="utf-8")
    return path


def options(path, **kw) -> DataOptions:
    return DataOptions(data=str(path), text_col=["text"], label_col="label", labels="a,b", **kw)


def test_train_labels_replace_the_samples_labels_and_keep_its_items(csv, tmp_path):
    plain = prepare_data(options(csv, limit=60), tmp_path / "plain")
    ids = [ex.id for ex in plain.train]
    # a relabel arm's answer key: the first 40 items flipped, 10 unlabelled (null), 10 absent, plus val items
    key = {i: {"a": "b", "b": "a"}[ex.label] for i, ex in zip(ids[:40], plain.train)}
    key |= {i: None for i in ids[40:50]} | {ex.id: "b" for ex in plain.val[:5]}
    key_path = tmp_path / "answer_key.json"
    key_path.write_text(json.dumps({"labels": key, "original": {}}), encoding="utf-8")
    run = tmp_path / "relabelled"
    data = prepare_data(options(csv, limit=60, train_labels=key_path), run)
    assert [ex.id for ex in data.train] == ids  # the same items, in the same order
    original = {ex.id: ex.label for ex in plain.train}
    for ex in data.train:  # the key's label where it has one, the item's own otherwise
        assert ex.label == (key[ex.id] if key.get(ex.id) else original[ex.id]), ex.id
    assert sum(ex.label != original[ex.id] for ex in data.train) == 40
    assert [ex.label for ex in data.val] == [ex.label for ex in plain.val]  # val keeps the data's labels
    record = json.loads((run / TRAIN_LABELS_FILE).read_text())
    assert (record["n_train"], record["n_replaced"], record["n_changed"], record["n_kept_original"]) == (60, 40, 40, 20)
    assert record["labels"] == {ex.id: ex.label for ex in data.train}
    assert set(record["kept_original_ids"]) == set(ids[40:])


def test_a_train_labels_key_from_other_data_or_with_unknown_labels_is_refused(csv, tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"x1": "a", "x2": "b"}), encoding="utf-8")
    with pytest.raises(ValueError, match="none of the 60 training items"):
        prepare_data(options(csv, limit=60, train_labels=other), tmp_path / "r1")
    ids = [ex.id for ex in prepare_data(options(csv, limit=60), tmp_path / "r0").train]
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({ids[0]: "maybe"}), encoding="utf-8")
    with pytest.raises(ValueError, match="'maybe', not one of a, b"):
        prepare_data(options(csv, limit=60, train_labels=odd), tmp_path / "r2")
    with pytest.raises(ValueError, match="two controls|mixes two controls"):
        options(csv, train_labels=odd, label_noise=0.1)


def _flipped(data) -> set[str]:
    return {ex.id for ex in data.train if ex.label != "ab"[int(ex.id[1:]) % 2]}


def test_run_seeded_noise_flips_other_items_per_seed_on_the_same_items(csv, tmp_path):
    def run(seed: int, mode: str, name: str):
        cfg = SFTConfig(data=str(csv), text_col=["text"], label_col="label", labels="a,b", limit=100, label_noise=0.3,
                        label_noise_seed=mode, seed=seed, out=tmp_path / name)
        return prepare_data(cfg, tmp_path / name)

    s0, s1, s0_again = run(0, "run", "s0"), run(1, "run", "s1"), run(0, "run", "s0b")
    assert [ex.id for ex in s0.train] == [ex.id for ex in s1.train]  # the same training items
    assert _flipped(s0) != _flipped(s1) and _flipped(s0) == _flipped(s0_again)  # flips by seed, reproducibly
    assert 15 <= len(_flipped(s0)) <= 45  # 30% of 100, within ~3 standard errors
    record = json.loads((tmp_path / "s1" / LABEL_NOISE_FILE).read_text())
    assert (record["label_noise_seed"], record["seed"], record["n_train"]) == ("run", 1, 100)
    assert {f["id"] for f in record["flips"]} == _flipped(s1)
    # split-seeded noise (the default) ignores the run's seed: every run trains on the same wrong labels
    p0, p1 = run(0, "split", "p0"), run(1, "split", "p1")
    assert _flipped(p0) == _flipped(p1) and [ex.id for ex in p0.train] == [ex.id for ex in p1.train]
    assert json.loads((tmp_path / "p1" / LABEL_NOISE_FILE).read_text())["label_noise_seed"] == "split"


def test_run_seeded_noise_needs_a_seed_and_split_noise_is_drawn_before_the_sample():
    train = [Example(id=f"x{i}", text="t", label="ab"[i % 2]) for i in range(200)]
    with pytest.raises(ValueError, match="label_noise_seed=run"):
        draw_training_sample(train, ["a", "b"], limit=50, split_seed=0, rate=0.2, noise_seed="run", run_seed=None)
    split = draw_training_sample(train, ["a", "b"], limit=None, split_seed=3, rate=0.2, noise_seed="split")
    assert split.noise["n_train"] == 200 and split.noise["seed"] == 3  # the whole split flipped, then sampled
    clean = draw_training_sample(train, ["a", "b"], limit=50, split_seed=3, rate=0.0)
    assert clean.noise is None and clean.record["label_counts"] == {"a": 25, "b": 25}

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sklearn.metrics import cohen_kappa_score

from labelrl.audit import audit_dataset
from labelrl.audit.duplicates import DuplicateGroup
from labelrl.audit.noise import (
    bootstrap_totals,
    disagreement_from_flip_rate,
    duplicate_noise,
    flip_rate_from_disagreement,
    group_features,
    group_label_counts,
    homogeneity_test,
    kappa_between_copies,
    max_disagreement,
    stats_from_totals,
)
from labelrl.types import Dataset, Example, LabelSpace

BINARY = LabelSpace(("a", "b"), kind="binary")


def groups_from(label_lists):
    return [
        DuplicateGroup(key=(str(g),), ids=tuple(f"{g}-{i}" for i in range(len(ls))), labels=tuple(ls), texts=("t",) * len(ls))
        for g, ls in enumerate(label_lists)
    ]


def test_reference_binary_balanced():
    # 100 pairs: 41 (a,a), 41 (b,b), 18 mixed → d = 18/100 = 0.18.
    # ε = (1 − √(1 − 2·0.18))/2 = (1 − √0.64)/2 = (1 − 0.8)/2 = 0.10; ceiling = 0.90.
    # Marginals: a = 2·41 + 18 = 100 endpoints of 200 → p_e = 0.5² + 0.5² = 0.5;
    # κ = (p_o − p_e)/(1 − p_e) = (0.82 − 0.5)/0.5 = 0.64.
    groups = groups_from([("a", "a")] * 41 + [("b", "b")] * 41 + [("a", "b")] * 9 + [("b", "a")] * 9)
    result = duplicate_noise(groups, BINARY, n_boot=200, seed=0)
    assert result["n_pairs"] == 100 and result["n_disagreeing_pairs"] == 18
    assert result["disagreement_rate"] == pytest.approx(0.18)
    assert result["flip_rate"] == pytest.approx(0.10)
    assert result["ceiling"] == pytest.approx(0.90)
    assert result["kappa"] == pytest.approx(0.64)
    for name in ("disagreement_rate", "flip_rate", "ceiling", "kappa"):
        lo, hi = result[f"{name}_ci"]
        assert lo < result[name] < hi
    assert "mean_abs_grade_diff" not in result  # binary labels have no grade order


def test_multiclass_formula_by_hand():
    # K = 3, ε = 0.3: d = 1 − 0.7² − 0.3²/2 = 1 − 0.49 − 0.045 = 0.465.
    assert disagreement_from_flip_rate(0.3, 3) == pytest.approx(0.465)
    assert flip_rate_from_disagreement(0.465, 3) == pytest.approx(0.3)
    # Binary: d = 2ε(1 − ε) = 2·0.2·0.8 = 0.32.
    assert disagreement_from_flip_rate(0.2, 2) == pytest.approx(0.32)


@given(k=st.integers(2, 7), fraction=st.floats(0.0, 1.0))
def test_inversion_round_trip(k, fraction):
    eps = fraction * (k - 1) / k  # the invertible range [0, (K−1)/K]
    d = disagreement_from_flip_rate(eps, k)
    assert 0.0 <= d <= max_disagreement(k) + 1e-12
    assert flip_rate_from_disagreement(d, k) == pytest.approx(eps, abs=1e-6)


def test_disagreement_beyond_the_model_gives_no_flip_rate():
    assert max_disagreement(2) == 0.5 and max_disagreement(5) == pytest.approx(0.8)
    assert flip_rate_from_disagreement(0.5, 2) == pytest.approx(0.5)
    assert flip_rate_from_disagreement(0.51, 2) is None
    # Every pair disagrees (d = 1 > 1/2): no ε, a reason instead, no ceiling.
    result = duplicate_noise(groups_from([("a", "b")] * 30), BINARY, n_boot=50)
    assert result["disagreement_rate"] == 1.0
    assert result["flip_rate"] is None and result["ceiling"] is None and result["flip_rate_ci"] is None
    assert "exceeds 0.500" in result["flip_rate_reason"]
    with pytest.raises(ValueError, match="negative"):
        flip_rate_from_disagreement(-0.1)


def test_group_of_three_gives_three_pairs_and_grade_distance():
    grades = LabelSpace(("1", "2", "3"), kind="ordinal")
    # Copies (1, 3, 3): pairs (1,3), (1,3), (3,3) → 2 of 3 disagree; |Δgrade| = 2, 2, 0 → mean 4/3.
    result = duplicate_noise(groups_from([("1", "3", "3")]), grades, n_boot=0)
    assert result["n_pairs"] == 3 and result["n_disagreeing_pairs"] == 2
    assert result["disagreement_rate"] == pytest.approx(2 / 3)
    assert result["mean_abs_grade_diff"] == pytest.approx(4 / 3)
    assert result["mean_abs_grade_diff_ci"] is None  # n_boot = 0


def test_kappa_closed_form_matches_sklearn_on_the_symmetrised_pair_list():
    rng = np.random.default_rng(3)
    space = LabelSpace(("x", "y", "z"))
    label_lists = [tuple(rng.choice(["x", "y", "z"], size=rng.integers(2, 6), p=[0.5, 0.3, 0.2])) for _ in range(80)]
    first, second = [], []
    for labels in label_lists:
        for i in range(len(labels)):
            for j in range(len(labels)):
                if i != j:  # every unordered pair in both orders
                    first.append(labels[i])
                    second.append(labels[j])
    expected = cohen_kappa_score(first, second)
    counts = group_label_counts(groups_from(label_lists), space)
    assert kappa_between_copies(counts) == pytest.approx(expected)
    assert float(stats_from_totals(group_features(counts).sum(axis=0))["kappa"]) == pytest.approx(expected)


def test_kappa_is_undefined_with_a_single_label():
    counts = group_label_counts(groups_from([("a", "a"), ("a", "a", "a")]), BINARY)
    assert kappa_between_copies(counts) is None


def test_vectorised_bootstrap_equals_a_loop_over_resamples():
    features = group_features(group_label_counts(groups_from([("a", "b"), ("a", "a", "b"), ("b", "b"), ("a", "a")]), BINARY))
    totals = bootstrap_totals(features, 50, seed=7)
    draws = np.random.default_rng(7).integers(0, 4, size=(50, 4))  # one chunk: same draws
    looped = np.stack([features[row].sum(axis=0) for row in draws])
    np.testing.assert_allclose(totals, looped)


def synthetic_groups(k, eps, n_groups, seed):
    """Latent label uniform over K; every copy flips independently with probability ε to a
    uniformly chosen other label (the model of eq. 1); 2 or 3 copies per group."""
    rng = np.random.default_rng(seed)
    label_lists = []
    for _ in range(n_groups):
        truth = rng.integers(k)
        size = rng.integers(2, 4)
        flips = rng.random(size) < eps
        others = (truth + rng.integers(1, k, size=size)) % k
        label_lists.append(tuple(str(x) for x in np.where(flips, others, truth)))
    return groups_from(label_lists)


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("eps", [0.05, 0.10, 0.20])
def test_synthetic_flip_rate_is_recovered(k, eps):
    space = LabelSpace(tuple(str(i) for i in range(k)), kind="binary" if k == 2 else "categorical")
    groups = synthetic_groups(k, eps, n_groups=2500, seed=int(100 * eps) + k)  # ≈ 5,000 pairs
    result = duplicate_noise(groups, space, n_boot=1000, seed=1)
    lo, hi = result["flip_rate_ci"]
    assert lo <= eps <= hi
    assert abs(result["flip_rate"] - eps) <= 0.03
    c_lo, c_hi = result["ceiling_ci"]
    assert c_lo <= 1 - eps <= c_hi
    d_true = disagreement_from_flip_rate(eps, k)
    d_lo, d_hi = result["disagreement_rate_ci"]
    assert d_lo <= d_true <= d_hi


def test_no_pairs_gives_none_everywhere():
    result = duplicate_noise([], BINARY)
    assert result["n_pairs"] == 0 and result["disagreement_rate"] is None
    assert result["flip_rate"] is None and result["kappa"] is None and result["disagreement_rate_ci"] is None
    assert "no duplicate pairs" in result["flip_rate_reason"]


def test_homogeneity_by_hand():
    # Split A: 10 disagree / 90 agree; B: 30 / 70. Pooled share 0.2 → expected 20/80 per row.
    # χ² = (10−20)²/20 + (90−80)²/80 + (30−20)²/20 + (70−80)²/80 = 5 + 1.25 + 5 + 1.25 = 12.5.
    test = homogeneity_test({"A": (10, 90), "B": (30, 70), "C": (0, 0)})
    assert test["splits"] == ["A", "B"] and test["dof"] == 1
    assert test["statistic"] == pytest.approx(12.5)
    assert test["p_value"] == pytest.approx(math.erfc(math.sqrt(12.5 / 2)))  # χ²(1) tail
    same = homogeneity_test({"A": (10, 90), "B": (20, 180)})
    assert same["statistic"] == pytest.approx(0.0) and same["p_value"] == pytest.approx(1.0)
    none_disagree = homogeneity_test({"A": (0, 50), "B": (0, 9)})
    assert none_disagree["statistic"] == 0.0 and none_disagree["p_value"] == 1.0
    single = homogeneity_test({"A": (3, 7), "B": (0, 0)})
    assert single["p_value"] is None and "fewer than 2 splits" in single["reason"]


def make_dataset(rows, space=BINARY, ratings=None):
    examples = tuple(
        Example(id=str(i), text=text, label=label, meta={"ratings": ratings[i]} if ratings else {})
        for i, (text, label) in enumerate(rows)
    )
    return Dataset(name="toy", examples=examples, labels=space)


def test_audit_dataset_overall_per_split_and_conflicts():
    rows = [("spam offer", "b"), ("Spam offer!", "a"), ("hi", "a"), ("hi", "a"), ("x", "b"), ("call me", "a"),
            ("CALL ME", "b"), ("call me.", "b")] + [("ok", "a")] * 4
    report = audit_dataset(make_dataset(rows), splits={"train": ["0", "1", "2", "5", "6"], "val": ["3", "4", "7", "99"]},
                           n_boot=100, top=1)
    assert report["n_rows"] == 12 and report["label_counts"] == {"a": 8, "b": 4}
    # Pairs: spam offer 1 + hi 1 + call me 3 + ok 6 = 11, of which 1 + 2 = 3 disagree.
    assert report["n_duplicate_groups"] == 4 and report["n_pairs"] == 11
    assert report["disagreement_rate"] == pytest.approx(3 / 11)
    # Conflicts: "call me" ×3 (2 disagreeing pairs) before "spam offer" ×2 (1).
    assert [g["ids"] for g in report["conflicting_groups"]] == [["5", "6", "7"], ["0", "1"]]
    assert report["largest_groups"][0]["ids"] == ["8", "9", "10", "11"] and len(report["largest_groups"]) == 1
    train, val = report["per_split"]["train"], report["per_split"]["val"]
    assert train["n_rows"] == 5 and train["n_pairs"] == 2 and train["n_disagreeing_pairs"] == 2
    assert val["n_rows"] == 3 and val["n_pairs"] == 0
    assert report["uniformity"]["p_value"] is None  # only train has pairs
    assert report["cross_split"] == {"n_groups": 2, "by_splits": {"train+val": 2}}
    assert report["n_split_ids_not_in_data"] == 1
    notes = " ".join(report["notes"])
    assert "span more than one split" in notes and "not in the data" in notes
    assert "differ before normalisation" in notes and "If copies are the same item" in notes


def test_audit_dataset_without_duplicates_says_so():
    report = audit_dataset(make_dataset([("one", "a"), ("two", "b")]), n_boot=10)
    assert report["n_duplicate_groups"] == 0 and report["flip_rate"] is None
    assert report["per_split"] == {} and report["uniformity"] is None and report["per_rater"] is None
    assert any("no duplicate texts" in n and "cannot be estimated" in n for n in report["notes"])


def test_audit_dataset_zero_conflicts_reports_an_upper_bound():
    report = audit_dataset(make_dataset([("hi", "a")] * 3 + [("yo", "b")] * 2), n_boot=10)
    # 3 + 1 = 4 pairs, none disagree → d ≤ 1 − 0.05^(1/4) = 0.527, capped at the binary maximum 1/2.
    assert report["disagreement_rate"] == 0.0 and report["kappa"] == pytest.approx(1.0)
    assert any("exact binomial bound" in n and "d ≤ 0.5 " in n for n in report["notes"])
    # 40 pairs: d ≤ 1 − 0.05^(1/40) = 0.0722; ε = (1 − √(1 − 0.1443))/2 = 0.0375; ceiling 0.963.
    many = audit_dataset(make_dataset([(f"t{i}", "a") for i in range(40) for _ in range(2)]), n_boot=0)
    assert any("d ≤ 0.0722" in n and "ε ≤ 0.0375" in n and "ceiling ≥ 0.963" in n for n in many["notes"])
    with pytest.raises(ValueError, match="top=-1"):
        audit_dataset(make_dataset([("hi", "a")]), top=-1)


# ------------------------------------------------------------------ heavy-tailed duplicate groups


def heavy_tailed_rows():
    """One text copied 30 times with labels split 15/15, twenty agreeing pairs, fifty singletons."""
    rows = [("the big one", "a" if i < 15 else "b") for i in range(30)]
    rows += [(f"small {j}", "a") for j in range(20) for _ in range(2)]
    rows += [(f"unique {j}", "ab"[j % 2]) for j in range(50)]
    return rows


def test_group_weighted_estimate_counts_each_group_once():
    from labelrl.audit.noise import group_weighted_noise, largest_group_pair_shares

    counts = group_label_counts(groups_from([["a"] * 15 + ["b"] * 15] + [["a", "a"]] * 20), BINARY)
    # Pair-weighted: 15·15 = 225 disagreeing of 435 + 20 = 455 pairs → d = 0.4945.
    # Group-weighted: the big group's own d = 225/435 = 0.5172, twenty groups at 0 → 0.5172/21 = 0.02463;
    # ε = (1 − √(1 − 2·0.02463))/2 = 0.01247 (eq. 1 inverted, K = 2).
    weighted = group_weighted_noise(counts, 2, n_boot=0, seed=0)
    assert weighted["disagreement_rate"] == pytest.approx(225 / 435 / 21)
    assert weighted["flip_rate"] == pytest.approx((1 - math.sqrt(1 - 2 * 225 / 435 / 21)) / 2)
    assert weighted["ceiling"] == pytest.approx(1 - weighted["flip_rate"]) and weighted["n_groups"] == 21
    # Share of pairs in the largest 1, 2, 3 groups: 435/455, 436/455, 437/455.
    assert largest_group_pair_shares(counts) == pytest.approx([435 / 455, 436 / 455, 437 / 455])
    # With equal groups the two weightings agree: three pairs, one of them disagreeing → d = 1/3 both ways.
    even = group_label_counts(groups_from([["a", "b"], ["a", "a"], ["b", "b"]]), BINARY)
    assert group_weighted_noise(even, 2, n_boot=0, seed=0)["disagreement_rate"] == pytest.approx(
        duplicate_noise(groups_from([["a", "b"], ["a", "a"], ["b", "b"]]), BINARY, n_boot=0)["disagreement_rate"])


def test_group_weighted_interval_resamples_groups():
    from labelrl.audit.noise import group_weighted_noise

    counts = group_label_counts(groups_from([["a"] * 15 + ["b"] * 15] + [["a", "a"]] * 20), BINARY)
    weighted = group_weighted_noise(counts, 2, n_boot=400, seed=3)
    lo, hi = weighted["disagreement_rate_ci"]
    # A resample holds the big group k times out of 21 draws: d = 0.5172·k/21, so the interval
    # runs from 0 (k = 0, probability (20/21)^21 ≈ 0.36) to a few copies' worth; never past 0.5172.
    assert lo == 0.0 and 0.0 < hi <= 225 / 435
    assert weighted["ceiling_ci"][1] == 1.0


def test_audit_notes_say_when_a_few_groups_hold_most_pairs():
    report = audit_dataset(make_dataset(heavy_tailed_rows()), n_boot=100)
    assert report["concentrated_pairs"] == {"n_groups": 1, "share": pytest.approx(435 / 455), "copies": [30]}
    [note] = [n for n in report["notes"] if "largest group" in n]
    assert "the largest group (30 copies) holds 96% of the 455 duplicate pairs" in note
    assert "pair-weighted d = 0.495 rests mostly on it" in note
    assert f"Counting each of the 21 groups once: d = {225 / 435 / 21:.3f} (95% CI" in note
    assert "d = 2ε(1 − ε) for two labels (Angluin & Laird 1988)" in note


def test_audit_notes_are_quiet_when_pairs_are_spread():
    # 25 groups of 2 to 4 copies: the largest 3 hold 18 of 86 pairs; no note, same d both ways
    rows = [(f"item {g}", "ab"[(g + i) % 2 if g % 5 == 0 else 0]) for g in range(25) for i in range(2 + g % 3)]
    report = audit_dataset(make_dataset(rows), n_boot=0)
    assert report["largest_groups_pair_share"][2] < 0.5 and report["concentrated_pairs"] is None
    assert not any("largest group" in n for n in report["notes"])


def test_audit_cli_table_shows_the_group_weighted_rows_when_pairs_are_concentrated(tmp_path):
    import json

    from rich.console import Console

    from labelrl.cli.audit import AuditConfig, run_audit

    path = tmp_path / "heavy.jsonl"
    path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in heavy_tailed_rows()))
    console = Console(record=True, width=200)
    run_audit(AuditConfig(data=str(path), n_boot=50), console)
    text = console.export_text()
    assert "d: each group once" in text and "ceiling: each group once" in text and "holds 96% of the 455" in text

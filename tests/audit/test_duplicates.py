import pytest

from labelrl.audit.duplicates import DuplicateGroup, find_duplicate_groups
from labelrl.types import Example


def ex(i, text, label, **fields):
    return Example(id=str(i), text=text, label=label, fields=fields.get("fields", {}), meta=fields.get("meta", {}))


def test_normalised_mode_groups_case_and_punctuation_variants():
    examples = [
        ex(1, "Hello, World!", "a"),
        ex(2, "other", "a"),
        ex(3, "hello   world", "b"),
        ex(4, "HELLO WORLD.", "a"),
    ]
    groups = find_duplicate_groups(examples)
    assert len(groups) == 1
    assert groups[0].ids == ("1", "3", "4")  # dataset order
    assert groups[0].labels == ("a", "b", "a")
    assert groups[0].texts == ("Hello, World!", "hello   world", "HELLO WORLD.")


def test_exact_mode_requires_identical_text():
    examples = [ex(1, "Hello, World!", "a"), ex(2, "hello world", "a"), ex(3, "Hello, World!", "b")]
    groups = find_duplicate_groups(examples, normalise=False)
    assert [g.ids for g in groups] == [("1", "3")]


def test_singletons_are_not_groups_and_groups_come_in_first_seen_order():
    examples = [ex(1, "b", "x"), ex(2, "a", "x"), ex(3, "c", "x"), ex(4, "a", "y"), ex(5, "b", "y")]
    groups = find_duplicate_groups(examples)
    assert [g.ids for g in groups] == [("1", "5"), ("2", "4")]


def test_all_punctuation_texts_compare_as_themselves_and_blank_keys_never_group():
    # "!!!" and "..." both normalise to "": grouping them would join unrelated items, so an
    # all-punctuation text is compared as itself (the splitter's group_key rule).
    examples = [ex(1, "!!!", "a"), ex(2, "...", "b"), ex(3, "ok", "a"), ex(4, "OK!", "a"), ex(5, " !!! ", "b")]
    groups = find_duplicate_groups(examples)
    assert [g.ids for g in groups] == [("1", "5"), ("3", "4")]
    blank = [ex(1, "t", "a", meta={"note": " "}), ex(2, "u", "b", meta={"note": ""})]
    assert find_duplicate_groups(blank, key=["note"]) == []
    assert find_duplicate_groups(blank, key=["note"], normalise=False) == []


def test_key_fields_come_from_fields_then_meta():
    examples = [
        ex(1, "joined 1", "a", fields={"passage": "P one"}, meta={"driver": "d1"}),
        ex(2, "joined 2", "b", fields={"passage": "p ONE!"}, meta={"driver": "D1"}),
        ex(3, "joined 3", "a", fields={"passage": "P one"}, meta={"driver": "d2"}),
    ]
    groups = find_duplicate_groups(examples, key=["passage", "driver"])
    assert [g.ids for g in groups] == [("1", "2")]
    assert groups[0].key == ("p one", "d1")
    # A comma-separated string is the same key; exact mode separates "P one"/"p ONE!".
    assert find_duplicate_groups(examples, key="passage, driver") == groups
    assert find_duplicate_groups(examples, key="passage,driver", normalise=False) == []
    # Grouping by passage alone puts all three together.
    assert [g.ids for g in find_duplicate_groups(examples, key=["passage"])] == [("1", "2", "3")]


def test_missing_key_field_names_the_field_and_the_choices():
    examples = [ex(1, "t", "a", fields={"passage": "p"})]
    with pytest.raises(ValueError, match=r"'driver'.*example '1'.*available: passage, text"):
        find_duplicate_groups(examples, key=["driver"])
    with pytest.raises(ValueError, match="at least one column"):
        find_duplicate_groups(examples, key=" , ")


def test_group_pair_counts_and_restrict():
    group = DuplicateGroup(key=("k",), ids=("1", "2", "3", "4"), labels=("a", "a", "b", "c"), texts=("t",) * 4)
    # 4 copies → 4·3/2 = 6 pairs; only (1,2) agree → 5 disagree.
    assert group.n_pairs == 6
    assert group.n_disagreeing_pairs == 5
    assert group.conflicting
    sub = group.restrict({"1", "2", "9"})
    assert sub is not None and sub.ids == ("1", "2") and sub.labels == ("a", "a")
    assert not sub.conflicting and sub.n_disagreeing_pairs == 0
    assert group.restrict({"3"}) is None

"""Bad rows: each case names file, row, column, value and the fix; skip mode records them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from labelrl.data import load_dataset
from labelrl.data.schema import infer_kind, infer_labels, label_to_str, scalar_to_str


def jsonl(tmp_path: Path, rows: list, name: str = "items.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


GOOD = [{"text": "fine", "label": "a"}, {"text": "also fine", "label": "b"}]


@pytest.mark.parametrize(
    ("bad", "column", "value", "reason"),
    [
        ({"text": "x"}, "label", "None", "missing label"),
        ({"text": "x", "label": None}, "label", "None", "missing label"),
        ({"text": "x", "label": "  "}, "label", "'  '", "missing label"),
        ({"text": "x", "label": "NaN"}, "label", "'NaN'", "missing label (NaN is how a missing value prints)"),
        ({"text": "x", "label": ["a"]}, "label", "['a']", "label must be a string or number, got list"),
        ({"text": "   ", "label": "a"}, "text", "'   '", "empty text"),
        ({"label": "a"}, "text", "None", "missing text"),
        ({"text": {"k": "v"}, "label": "a"}, "text", "{'k': 'v'}", "text must be a string, got dict"),
        ({"text": ["x", "y"], "label": "a"}, "text", "['x', 'y']", "text must be a string, got list"),
    ],
)
def test_bad_row_error_names_file_row_column_value(tmp_path, bad, column, value, reason):
    path = jsonl(tmp_path, [*GOOD, bad])
    with pytest.raises(ValueError) as info:
        load_dataset(path)
    message = str(info.value)
    assert message.startswith(f"{path}: row 3, column '{column}': {reason} (value {value})")
    assert "pass --on-bad-row skip to skip such rows" in message


def test_of_several_text_columns_an_empty_one_is_an_empty_field_and_all_empty_a_bad_row(tmp_path):
    rows = [{"title": "Refund", "body": "I was charged twice", "label": "a"},
            {"title": "Thanks!", "body": "", "label": "b"},  # a title without a body
            {"title": "Hello", "label": "a"},  # no body at all
            {"title": " ", "body": None, "label": "b"}]  # no text in either
    path = jsonl(tmp_path, rows)
    with pytest.raises(ValueError) as info:
        load_dataset(path, text_cols=["title", "body"])
    assert str(info.value).startswith(f"{path}: row 4, column 'title': empty text in every text column (title, body) "
                                      "(value ' ')")
    ds = load_dataset(path, text_cols=["title", "body"], on_bad_row="skip")
    assert [e.text for e in ds.examples] == ["title: Refund\nbody: I was charged twice", "title: Thanks!\nbody:",
                                             "title: Hello\nbody:"]
    assert [r["row"] for r in ds.skipped_rows] == [4]
    # one text column: an empty one is still a bad row
    with pytest.raises(ValueError, match=r"row 2, column 'body': empty text \(value ''\)"):
        load_dataset(path, text_cols=["body"])


def test_label_outside_declared_set_suggests_labels(tmp_path):
    path = jsonl(tmp_path, [*GOOD, {"text": "x", "label": "c"}])
    with pytest.raises(ValueError) as info:
        load_dataset(path, labels=["a", "b"])
    assert str(info.value) == (
        f"{path}: row 3, column 'label': label is not one of ['a', 'b'] (value 'c'); "
        "declare the full label set with --labels a,b,c, or pass --on-bad-row skip to skip such rows"
    )


def test_duplicate_id_is_a_bad_row(tmp_path):
    rows = [{"id": 7, "text": "x", "label": "a"}, {"id": 8, "text": "y", "label": "b"}, {"id": 7.0, "text": "z", "label": "a"}]
    path = jsonl(tmp_path, rows)
    with pytest.raises(ValueError, match=r"row 3, column 'id': duplicate id \(value '7'\)"):
        load_dataset(path, id_col="id")
    ds = load_dataset(path, id_col="id", on_bad_row="skip")
    assert [ex.id for ex in ds.examples] == ["7", "8"]
    assert ds.skipped_rows == ({"row": 3, "column": "id", "value": "7", "reason": "duplicate id"},)


def test_missing_id_is_a_bad_row(tmp_path):
    path = jsonl(tmp_path, [{"id": "", "text": "x", "label": "a"}, {"id": "k", **GOOD[0]}, {"id": 3, **GOOD[1]}])
    with pytest.raises(ValueError, match=r"row 1, column 'id': missing id \(value ''\); give every row an id"):
        load_dataset(path, id_col="id")


def test_broken_json_line_is_a_bad_row(tmp_path):
    path = jsonl(tmp_path, [GOOD[0], '{"text": "x", "label":', "[1, 2]", GOOD[1]])
    with pytest.raises(ValueError, match=r"items\.jsonl: row 2: not valid JSON \(Expecting value at char 22\)"):
        load_dataset(path)
    ds = load_dataset(path, on_bad_row="skip")
    assert len(ds) == 2
    assert [(r["row"], r["column"], r["reason"]) for r in ds.skipped_rows] == [
        (2, None, "not valid JSON (Expecting value at char 22)"),
        (3, None, "a JSONL row must be a JSON object, got list"),
    ]


def test_csv_bad_rows(tmp_path):
    path = tmp_path / "items.csv"
    path.write_text('text,label\nfine,a\n"too, many",b,extra\n,a\nok,\nlast,b\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"items\.csv: row 2: row has 3 fields but the header has 2 \(value \['extra'\]\)"):
        load_dataset(path)
    ds = load_dataset(path, on_bad_row="skip")
    assert [ex.text for ex in ds.examples] == ["fine", "last"]
    assert [(r["row"], r["column"], r["reason"]) for r in ds.skipped_rows] == [
        (2, None, "row has 3 fields but the header has 2"),
        (3, "text", "missing text"),  # an empty CSV field is a missing value
        (4, "label", "missing label"),
    ]


def test_error_counts_the_other_bad_rows(tmp_path):
    path = jsonl(tmp_path, [{"text": "", "label": "a"}, *GOOD, {"text": "x"}, {"text": "y", "label": None}])
    with pytest.raises(ValueError, match=r"row 1, column 'text': empty text .*\(2 more bad rows\)$"):
        load_dataset(path)


@pytest.mark.parametrize("suffix", ["jsonl", "csv"])
def test_non_utf8_user_file_names_byte_offset_and_line(tmp_path, suffix):
    path = tmp_path / f"latin.{suffix}"
    good = b'{"text": "ok", "label": "a"}\n' if suffix == "jsonl" else b"text,label\nok,a\n"
    bad = b'{"text": "caf\xe9", "label": "b"}\n' if suffix == "jsonl" else b"caf\xe9,b\n"
    path.write_bytes(good + bad)
    offset = len(good) + bad.index(b"\xe9")
    line = 2 if suffix == "jsonl" else 3
    with pytest.raises(ValueError, match=re.escape(f"byte offset {offset} (line {line}) is not valid UTF-8 (b'\\xe9')")):
        load_dataset(path)


def test_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufefftext,label\nx,a\ny,b\n".encode("utf-8"))
    assert [ex.label for ex in load_dataset(path).examples] == ["a", "b"]


def test_every_row_skipped_is_an_error(tmp_path):
    path = jsonl(tmp_path, [{"text": "", "label": "a"}, {"text": "x"}])
    with pytest.raises(ValueError, match=r"every one of the 2 rows was skipped \(first: row 1: empty text\)"):
        load_dataset(path, on_bad_row="skip")


def test_skip_mode_records_every_bad_row_and_keeps_the_rest(tmp_path):
    path = jsonl(tmp_path, [GOOD[0], {"text": "x", "label": "zzz"}, {"text": None, "label": "a"}, GOOD[1]])
    ds = load_dataset(path, labels=["a", "b"], on_bad_row="skip")
    assert [ex.text for ex in ds.examples] == ["fine", "also fine"]
    assert [ex.id for ex in ds.examples] == ["1", "4"]  # ids stay the source row numbers
    assert ds.skipped_rows == (
        {"row": 2, "column": "label", "value": "zzz", "reason": "label is not one of ['a', 'b']"},
        {"row": 3, "column": "text", "value": None, "reason": "missing text"},
    )


def test_bad_on_bad_row_value(tmp_path):
    with pytest.raises(ValueError, match="on_bad_row='drop': choose 'error'"):
        load_dataset(jsonl(tmp_path, GOOD), on_bad_row="drop")


def test_single_inferred_label_and_unordered_ordinal_are_errors(tmp_path):
    path = jsonl(tmp_path, [{"text": "x", "label": "a"}, {"text": "y", "label": "a"}])
    with pytest.raises(ValueError, match=r"found only the label\(s\) \['a'\]; a task needs at least 2 labels"):
        load_dataset(path)
    path = jsonl(tmp_path, [*GOOD, {"text": "z", "label": "c"}], name="three.jsonl")
    with pytest.raises(ValueError, match="kind=ordinal but the labels .* are not numbers"):
        load_dataset(path, kind="ordinal")


def test_scalar_to_str_rules():
    assert scalar_to_str(1.0) == "1"
    assert scalar_to_str(2.5) == "2.5"
    assert scalar_to_str(3) == "3"
    assert scalar_to_str(True) == "True"
    assert scalar_to_str("  spam ") == "spam"
    assert scalar_to_str(float("nan")) is None
    assert scalar_to_str("") is None
    with pytest.raises(TypeError):
        scalar_to_str({"a": 1})


def test_infer_labels_and_kind():
    # the first spelling wins among case variants seen as often; numbers sort numerically
    assert infer_labels(["Spam", "ham", "spam"]) == ("ham", "Spam")
    assert infer_labels(["10", "-1", "2"]) == ("-1", "2", "10")
    assert infer_kind(["0", "1"]) == "binary"
    assert infer_kind(["1", "2", "3"]) == "ordinal"
    assert infer_kind(["1", "2", "x"]) == "categorical"
    # half-star ratings are a scale too, in numeric order, not string order
    assert infer_labels(["4.5", "10", "0.5", "2"]) == ("0.5", "2", "4.5", "10")
    assert infer_kind(["0.5", "1", "1.5"]) == "ordinal"


def test_a_label_is_spelled_as_most_rows_spell_it():
    # the file's first row says " Ham ", nine in ten say "ham": the task's label is "ham"
    observed = ["Ham"] + ["ham"] * 9 + ["spam"] * 3 + ["SPAM"]
    assert infer_labels(observed) == ("ham", "spam")


def test_labels_read_one_way_whatever_the_format(tmp_path):
    """A CSV grade column saved by pandas with a missing value reads "4.0": the same grade as
    JSON's 4.0 and 4, so the task is the 1–5 ordinal scale; runs of spaces inside a label fold."""
    grades = tmp_path / "grades.csv"
    grades.write_text("review,stars\n" + "".join(f"text {i},{1 + i % 5}.0\n" for i in range(10)), encoding="utf-8")
    data = load_dataset(grades, text_cols="review", label_col="stars")
    assert data.labels.labels == ("1", "2", "3", "4", "5") and data.labels.kind == "ordinal"
    assert {ex.label for ex in data.examples} == {"1", "2", "3", "4", "5"}
    declared = load_dataset(grades, text_cols="review", label_col="stars", labels=["1.0", "2.0", "3.0", "4.0", "5.0"])
    assert declared.labels.labels == ("1", "2", "3", "4", "5") and len(declared.examples) == 10
    spaced = jsonl(tmp_path, [{"text": "a", "label": "not  spam"}, {"text": "b", "label": "spam"},
                              {"text": "c", "label": " Not spam"}], name="spaced.jsonl")
    data = load_dataset(spaced)
    assert data.labels.labels == ("not spam", "spam")
    assert [ex.label for ex in data.examples] == ["not spam", "spam", "not spam"]


def test_label_to_str_rules():
    assert label_to_str("4.0") == "4" and label_to_str("-2.00") == "-2" and label_to_str(3.0) == "3"
    assert label_to_str("4.5") == "4.5" and label_to_str("1.0.0") == "1.0.0" and label_to_str("v4.0") == "v4.0"
    assert label_to_str(" not \t spam ") == "not spam"
    assert label_to_str("  ") is None and label_to_str(None) is None


def test_a_trl_style_prompt_completion_dataset_loads_directly(tmp_path):
    import datasets

    from labelrl.data import load_dataset

    rows = [
        {"prompt": [{"role": "system", "content": "Label it."}, {"role": "user", "content": f"msg {i}"}],
         "completion": [{"role": "assistant", "content": f"<answer>{'spam' if i % 2 else 'ham'}</answer>"}]}
        for i in range(6)
    ]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "conv"))
    plain = [{"prompt": f"text {i}", "completion": "spam" if i % 3 == 0 else "ham"} for i in range(6)]
    datasets.Dataset.from_list(plain).to_parquet(str(tmp_path / "plain.parquet"))

    conv = load_dataset(str(tmp_path / "conv"))
    assert [ex.text for ex in conv.examples[:2]] == ["msg 0", "msg 1"]  # the user turn only
    assert [ex.label for ex in conv.examples[:2]] == ["ham", "spam"] and conv.labels.kind == "binary"
    flat = load_dataset(str(tmp_path / "plain.parquet"))
    assert flat.label_counts() == {"ham": 4, "spam": 2}

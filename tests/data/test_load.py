"""Readers (JSONL, CSV, Parquet, save_to_disk), column mapping, label sets, ids, skipped rows."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from labelrl.data import load_dataset, write_skipped_rows

ROWS = [
    {"id": "a", "title": "Win cash", "body": "Reply now to claim", "label": "spam"},
    {"id": "b", "title": "Lunch?", "body": "See you at noon", "label": "ham"},
    {"id": "c", "title": "Prize", "body": "You have won", "label": "spam"},
]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_csv(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_saved(path: Path, rows: list[dict]) -> Path:
    import datasets

    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


WRITERS = {
    "data.jsonl": write_jsonl,
    "data.csv": write_csv,
    "data.parquet": write_parquet,
    "saved_dir": write_saved,
}


@pytest.mark.parametrize("name", list(WRITERS))
def test_every_reader_gives_the_same_dataset(tmp_path, name):
    path = WRITERS[name](tmp_path / name, ROWS)
    ds = load_dataset(path, text_cols=["title", "body"], id_col="id")
    assert [ex.id for ex in ds.examples] == ["a", "b", "c"]
    assert [ex.label for ex in ds.examples] == ["spam", "ham", "spam"]
    # Two text columns are joined as "col: value" lines and kept separately in fields.
    assert ds.examples[0].text == "title: Win cash\nbody: Reply now to claim"
    assert dict(ds.examples[0].fields) == {"title": "Win cash", "body": "Reply now to claim"}
    assert ds.labels.labels == ("ham", "spam") and ds.labels.kind == "binary"
    assert ds.source == str(path) and ds.skipped_rows == ()


def test_defaults_text_and_label_columns_and_row_number_ids(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "x", "label": "no", "score": 3}, {"text": "y", "label": "yes"}])
    ds = load_dataset(path)
    assert [ex.id for ex in ds.examples] == ["1", "2"]  # 1-based data row numbers
    assert ds.examples[0].text == "x" and dict(ds.examples[0].fields) == {"text": "x"}
    # Columns that are not text, label or id travel in meta.
    assert dict(ds.examples[0].meta) == {"score": 3}
    assert ds.name == "d"


def test_unknown_column_lists_available_columns(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(ValueError, match=r"--text-col 'texte'.*no such column.*id, title, body, label"):
        load_dataset(path, text_cols=["texte"])
    with pytest.raises(ValueError, match=r"--label-col 'lab'.*id, title, body, label"):
        load_dataset(path, text_cols=["body"], label_col="lab")
    with pytest.raises(ValueError, match=r"no 'text' column; name the text column\(s\) with --text-col"):
        load_dataset(path)


def test_missing_file_and_unknown_extension_name_the_accepted_forms(tmp_path):
    with pytest.raises(ValueError, match=r"nothere\.jsonl: no such file or built-in dataset.*sms-spam.*\.parquet"):
        load_dataset(tmp_path / "nothere.jsonl")
    with pytest.raises(ValueError, match=r"sms: no such built-in dataset or file; built-ins are sms-spam: SMS Spam"):
        load_dataset("sms")
    odd = tmp_path / "data.xlsx"
    odd.write_text("x")
    with pytest.raises(ValueError, match=r"data\.xlsx: unknown file type '\.xlsx'.*\.jsonl, \.csv or \.parquet"):
        load_dataset(odd)
    plain_dir = tmp_path / "not_a_dataset"
    plain_dir.mkdir()
    with pytest.raises(ValueError, match="not one written by datasets.Dataset.save_to_disk"):
        load_dataset(plain_dir)


def test_dataset_dict_directory_asks_for_one_split(tmp_path):
    import datasets

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ValueError, match=r"several splits \(train\); give one split's folder"):
        load_dataset(tmp_path / "dd", text_cols=["body"])


def test_empty_files_are_clear_errors(tmp_path):
    for name in ("e.jsonl", "e.csv"):
        (tmp_path / name).write_text("")
        with pytest.raises(ValueError, match="no data rows"):
            load_dataset(tmp_path / name)
    (tmp_path / "h.csv").write_text("text,label\n")
    with pytest.raises(ValueError, match=r"h\.csv: the file has no data rows"):
        load_dataset(tmp_path / "h.csv")


@pytest.mark.parametrize(
    ("values", "labels", "kind"),
    [
        (["b", "a", "b"], ("a", "b"), "binary"),
        (["cat", "dog", "bird"], ("bird", "cat", "dog"), "categorical"),
        # integer-looking values sort numerically (10 after 9), so they are ordinal
        ([9, 10, 2, 9], ("2", "9", "10"), "ordinal"),
        # ints, floats with integral values and numeric strings all become "1"-style strings
        ([1.0, 0, "1"], ("0", "1"), "binary"),
        ([True, False], ("False", "True"), "binary"),
    ],
)
def test_label_inference(tmp_path, values, labels, kind):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": f"t{i}", "label": v} for i, v in enumerate(values)])
    ds = load_dataset(path)
    assert ds.labels.labels == labels
    assert ds.labels.kind == kind


def test_declared_labels_kind_and_positive(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "a", "label": "Low"}, {"text": "b", "label": "high"}])
    ds = load_dataset(path, labels="low,mid,high", kind="ordinal")
    assert ds.labels.labels == ("low", "mid", "high") and ds.labels.kind == "ordinal"
    # Labels match after trimming and case-folding and take the declared spelling.
    assert [ex.label for ex in ds.examples] == ["low", "high"]
    assert ds.label_counts() == {"low": 1, "mid": 0, "high": 1}
    ds = load_dataset(path, positive="LOW")
    assert ds.labels.kind == "binary" and ds.labels.positive_label == "Low"
    with pytest.raises(ValueError, match="only binary tasks have a positive label"):
        load_dataset(path, labels=["low", "mid", "high"], positive="low")
    with pytest.raises(ValueError, match="kind='nominal': not a label kind"):
        load_dataset(path, kind="nominal")


def test_write_skipped_rows_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"text": "ok", "label": "a"}, {"text": "  ", "label": "b"}, {"text": "fine", "label": "b"},
        {"text": {"nested": 1}, "label": "a"},
    ])
    ds = load_dataset(path, on_bad_row="skip")
    out = write_skipped_rows(ds, tmp_path / "run" / "skipped_rows.jsonl")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records == [
        {"row": 2, "column": "text", "value": "  ", "reason": "empty text"},
        {"row": 4, "column": "text", "value": {"nested": 1}, "reason": "text must be a string, got dict"},
    ]
    assert [ex.id for ex in ds.examples] == ["1", "3"]


# ------------------------------------------------------------------ CSV quirks real files have


def _csv_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r\r\n"])
def test_a_bare_carriage_return_in_an_unquoted_field_is_text(tmp_path, line_end):
    # pandas' to_csv (the csv module with "\n" line ends) writes a cell's "\r" unquoted.
    body = b"text,label" + line_end + b"first line\rsecond line,spam" + line_end + b"plain,ham" + line_end
    ds = load_dataset(_csv_bytes(tmp_path / "cr.csv", body))
    assert [(ex.text, ex.label) for ex in ds.examples] == [("first line\rsecond line", "spam"), ("plain", "ham")]


def test_a_file_whose_lines_end_in_bare_carriage_returns_still_has_rows(tmp_path):
    # classic Mac OS line ends: with no "\n" anywhere, "\r" is the row break
    ds = load_dataset(_csv_bytes(tmp_path / "mac.csv", b"text,label\rone,spam\rtwo,ham\r"))
    assert [(ex.text, ex.label) for ex in ds.examples] == [("one", "spam"), ("two", "ham")]


def test_quoted_line_breaks_and_quotes_survive(tmp_path):
    body = 'text,label\n"line one\nline two, with ""quotes""",spam\n"a\r\nb",ham\n'.encode()
    ds = load_dataset(_csv_bytes(tmp_path / "quoted.csv", body))
    assert [ex.text for ex in ds.examples] == ['line one\nline two, with "quotes"', "a\r\nb"]


def test_semicolon_files_with_a_bom_are_sniffed(tmp_path):
    # Excel in locales with a decimal comma: UTF-8 with a BOM, ";" between fields, "," in texts
    body = "\ufefftext;label\nhello, world;spam\n\"a;b\";ham\n".encode("utf-8")
    ds = load_dataset(_csv_bytes(tmp_path / "excel.csv", body))
    assert [(ex.text, ex.label) for ex in ds.examples] == [("hello, world", "spam"), ("a;b", "ham")]


def test_commas_win_when_semicolons_are_only_inside_texts(tmp_path):
    body = b"text,label\nwait; what,spam\nno; yes; maybe,ham\nok,ham\n"
    ds = load_dataset(_csv_bytes(tmp_path / "commas.csv", body))
    assert [ex.text for ex in ds.examples] == ["wait; what", "no; yes; maybe", "ok"]


@pytest.mark.parametrize("given", ["\t", "tab", "\\t"])
def test_a_named_delimiter_is_used(tmp_path, given):
    body = b"text\tlabel\na, b; c\tspam\nd\tham\n"
    ds = load_dataset(_csv_bytes(tmp_path / "tabs.csv", body), delimiter=given)
    assert [(ex.text, ex.label) for ex in ds.examples] == [("a, b; c", "spam"), ("d", "ham")]


def test_a_wrong_delimiter_names_the_fix(tmp_path):
    body = b"text;label\nhello;spam\nbye;ham\n"
    path = _csv_bytes(tmp_path / "semi.csv", body)
    with pytest.raises(ValueError, match=r"no 'text' column"):
        load_dataset(path, delimiter=",")
    assert len(load_dataset(path, delimiter=";")) == 2
    with pytest.raises(ValueError, match=r"--delimiter ';;': a CSV delimiter is one character"):
        load_dataset(path, delimiter=";;")
    jsonl = write_jsonl(tmp_path / "x.jsonl", [{"text": "a", "label": "x"}, {"text": "b", "label": "y"}])
    with pytest.raises(ValueError, match=r"--delimiter ';' applies to \.csv files.*drop --delimiter"):
        load_dataset(jsonl, delimiter=";")


def test_a_row_with_too_many_fields_names_the_delimiter(tmp_path):
    path = _csv_bytes(tmp_path / "extra.csv", b"text,label\nfine,spam\none, two,ham\nok,ham\n")
    with pytest.raises(ValueError, match=r"row 2: row has 3 fields but the header has 2 .*the delimiter is ',': quote "
                                         r"fields that contain it, or name another with --delimiter"):
        load_dataset(path)


def test_a_pandas_ordered_categorical_is_an_ordinal_scale_in_its_own_order(tmp_path):
    import pandas as pd

    grades = pd.Categorical(["mid", "low", "high", "mid", "low"], categories=["low", "mid", "high", "top"], ordered=True)
    pd.DataFrame({"text": list("abcde"), "quality": grades, "tag": ["x", "y", "x", "y", "x"]}).to_parquet(tmp_path / "q.parquet")
    data = load_dataset(tmp_path / "q.parquet", label_col="quality")
    # the categories' order, not the alphabet's; "top", declared but unused, stays on the scale
    assert data.labels.labels == ("low", "mid", "high", "top") and data.labels.kind == "ordinal"
    assert [ex.label for ex in data.examples] == ["mid", "low", "high", "mid", "low"]
    assert load_dataset(tmp_path / "q.parquet", label_col="quality", kind="categorical").labels.kind == "categorical"
    assert load_dataset(tmp_path / "q.parquet", label_col="tag").labels.labels == ("x", "y")  # a plain column: inferred


def test_a_datasets_class_label_reads_as_its_names(tmp_path):
    import datasets

    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "neutral", "positive"])})
    datasets.Dataset.from_dict({"text": ["bad", "fine", "great", "unlabelled"], "label": [0, 1, 2, -1]},
                               features=features).save_to_disk(str(tmp_path / "reviews"))
    data = load_dataset(tmp_path / "reviews", on_bad_row="skip")
    assert data.labels.labels == ("negative", "neutral", "positive") and data.labels.kind == "categorical"
    assert [ex.label for ex in data.examples] == ["negative", "neutral", "positive"]
    assert [r["reason"] for r in data.skipped_rows] == ["missing label"]  # -1 is the ClassLabel of no label


def test_a_file_is_parsed_once_per_process_and_again_when_its_bytes_change(tmp_path, monkeypatch):
    """A ladder loads its task's file for every run and evaluation: a 200,000-row CSV took 6–8 s
    each time. The parsed dataset is kept, keyed on the file's bytes and the options."""
    from labelrl.data import load as L

    path = tmp_path / "reviews.csv"
    path.write_text("text,label\ngood,pos\nbad,neg\n", encoding="utf-8")
    reads = []
    monkeypatch.setattr(L, "read_table", lambda *a, **k: reads.append(a) or L.read_csv(a[0], None, "utf-8"))
    first = load_dataset(path)
    assert load_dataset(path) is first and len(reads) == 1
    assert load_dataset(path, labels="neg,pos,meh").labels.labels == ("neg", "pos", "meh") and len(reads) == 2
    path.write_text("text,label\ngood,pos\nawful,neg\n", encoding="utf-8")  # the same size, rewritten in place
    assert [ex.text for ex in load_dataset(path).examples] == ["good", "awful"] and len(reads) == 3

"""Bad input, fuzzed (hypothesis): loaders and parsers never crash.

* ``labelrl.data.load_dataset`` on generated JSONL, CSV and Parquet files (unicode, control
  characters, very long texts, duplicate ids, mixed label types, missing columns, empty
  files, undecodable bytes, truncated Parquet) either returns a Dataset or raises ValueError
  whose message names the file and says why (a row number when a row is to blame). With
  ``on_bad_row="skip"`` every data row is either an example or a skipped-row record.
* ``labelrl.rewards.parse_answer`` on completions built from nested, quoted, partial and
  repeated tags never raises and returns a known status; ``grade`` never raises on its result.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from labelrl.data import load_dataset
from labelrl.rewards import ParseStatus, RewardScale, grade, parse_answer
from labelrl.types import LabelSpace, canonical_label

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                      HealthCheck.too_slow])

# What a file-level rejection may be about (each phrase appears in one message of labelrl.data).
FILE_REASONS = (
    "has no data rows", "no 'text' column", "no 'label' column", "a task needs at least 2 labels",
    "is not valid UTF-8", "malformed CSV", "the header repeats", "not a readable Parquet file",
    "rows was skipped", "labels must differ", "found only the label",
)
ROW_REASON = re.compile(r": row (\d+)(, column '[^']*')?: ")

# ------------------------------------------------------------------------------ datasets

# Text: any unicode (control characters and line/paragraph separators included), now and then
# very long; surrogates cannot be written as UTF-8 and are left out by hypothesis already.
texts = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec="utf-8", categories=["Cc", "Zl", "Zp", "Cf"]), max_size=10),
    st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=3), st.integers(2_000, 40_000)),
)
labels = st.one_of(
    st.sampled_from(["spam", "ham", "SPAM ", " Ham", "1", "2", "3", "<b>", ""]),
    st.integers(-3, 3), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
    st.text(max_size=6), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
ids = st.one_of(st.sampled_from(["a", "b", "c", "1", "01"]), st.integers(0, 3), st.none(), st.floats(0, 2))


@st.composite
def rows(draw) -> list[dict]:
    """Rows whose keys may be missing or renamed; values of any JSON type."""
    n = draw(st.integers(0, 12))
    out = []
    for i in range(n):
        if draw(st.integers(0, 2)):  # most rows are well formed, so loads succeed often too
            row = {"id": f"ok{i}", "text": draw(texts.filter(str.strip)), "label": draw(st.sampled_from(["spam", "ham"]))}
        else:
            row = {"id": draw(ids), "text": draw(texts), "label": draw(labels)}
        for key in ("id", "text", "label"):
            if draw(st.integers(0, 9)) == 0:
                del row[key]  # a missing column in this row (or in all rows, by chance)
        if draw(st.booleans()):
            row[draw(st.sampled_from(["extra", "Text", "label "]))] = draw(texts)
        out.append(row)
    return out


def write_jsonl(path: Path, data: list[dict], ascii_only: bool) -> None:
    lines = [json.dumps(r, ensure_ascii=ascii_only, allow_nan=True) for r in data]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def write_csv(path: Path, data: list[dict]) -> None:
    columns = list(dict.fromkeys(k for r in data for k in r)) if data else ["text", "label"]
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    for r in data:
        writer.writerow({k: "" if v is None else str(v) for k, v in r.items()})
    path.write_text(buffer.getvalue(), encoding="utf-8", newline="")


PARQUET_TYPES = {
    "string": (pa.string(), st.one_of(st.none(), texts, st.sampled_from(["spam", "ham"]))),
    "int": (pa.int64(), st.one_of(st.none(), st.integers(-3, 3))),
    "float": (pa.float64(), st.one_of(st.none(), st.floats(allow_nan=True))),
    "bool": (pa.bool_(), st.one_of(st.none(), st.booleans())),
    "list": (pa.list_(pa.string()), st.one_of(st.none(), st.lists(st.text(max_size=3), max_size=2))),
    "binary": (pa.binary(), st.one_of(st.none(), st.binary(max_size=4))),
}


@st.composite
def parquet_tables(draw) -> pa.Table:
    """Typed columns (Parquet has one type per column); any of the three may be absent."""
    n = draw(st.integers(0, 10))
    if draw(st.booleans()):  # a well-formed table with one extra column of any type
        arrow_type, values = PARQUET_TYPES[draw(st.sampled_from(sorted(PARQUET_TYPES)))]
        return pa.table({"text": pa.array([draw(texts.filter(str.strip)) for _ in range(n)], type=pa.string()),
                         "label": pa.array([draw(st.sampled_from(["spam", "ham"])) for _ in range(n)], type=pa.string()),
                         "extra": pa.array([draw(values) for _ in range(n)], type=arrow_type)})
    columns = {}
    for name in ("id", "text", "label"):
        if draw(st.integers(0, 7)) == 0:
            continue
        kind = draw(st.sampled_from(["string"] * 5 + sorted(PARQUET_TYPES)))  # mostly the usual type
        arrow_type, values = PARQUET_TYPES[kind]
        columns[name] = pa.array([draw(values) for _ in range(n)], type=arrow_type)
    if not columns:
        columns["other"] = pa.array([1] * n, type=pa.int64())
    return pa.table(columns)


def check_outcome(path: Path, n_rows: int | None, on_bad_row: str) -> None:
    """The contract: a Dataset, or a ValueError naming the file and a row or a file-level reason."""
    try:
        dataset = load_dataset(path, on_bad_row=on_bad_row)
    except ValueError as exc:
        message = str(exc)
        assert str(path) in message, message
        reasons = [reason for reason in FILE_REASONS if reason in message]
        if reasons:
            event(f"file refused: {reasons[0]}")
            return
        match = ROW_REASON.search(message)
        assert match, f"names neither a row nor a known file-level reason: {message}"
        event("row refused")
        assert n_rows is None or 1 <= int(match.group(1)) <= n_rows, message
        assert "(value " in message and "--on-bad-row skip" in message, message
        return
    examples = dataset.examples
    event(f"loaded ({'with' if dataset.skipped_rows else 'no'} skipped rows)")
    assert len({ex.id for ex in examples}) == len(examples)  # ids are unique
    assert all(ex.label in dataset.labels.labels and ex.text.strip() for ex in examples)
    if n_rows is not None:  # nothing dropped silently
        assert len(examples) + len(dataset.skipped_rows) == n_rows
    if on_bad_row == "error":
        assert not dataset.skipped_rows
    for record in dataset.skipped_rows:
        assert set(record) == {"row", "column", "value", "reason"} and record["reason"]
        json.dumps(record, allow_nan=True)  # what write_skipped_rows saves must be JSON


@FUZZ
@given(data=rows(), ascii_only=st.booleans(), on_bad_row=st.sampled_from(["error", "skip"]))
def test_jsonl_files_load_or_name_the_row(data, ascii_only, on_bad_row, tmp_path):
    path = tmp_path / "data.jsonl"
    write_jsonl(path, data, ascii_only)
    check_outcome(path, len(data), on_bad_row)


@FUZZ
@given(data=rows(), on_bad_row=st.sampled_from(["error", "skip"]))
def test_csv_files_load_or_name_the_row(data, on_bad_row, tmp_path):
    path = tmp_path / "data.csv"
    write_csv(path, data)
    # Row counts are not checked: a CSV row of empty fields is no row to the csv module.
    check_outcome(path, None, on_bad_row)


@FUZZ
@given(table=parquet_tables(), on_bad_row=st.sampled_from(["error", "skip"]))
def test_parquet_files_load_or_name_the_row(table, on_bad_row, tmp_path):
    path = tmp_path / "data.parquet"
    pq.write_table(table, path)
    check_outcome(path, table.num_rows, on_bad_row)


@FUZZ
@given(blob=st.binary(max_size=200), suffix=st.sampled_from([".jsonl", ".csv", ".parquet"]),
       cut=st.floats(0.0, 1.0))
def test_arbitrary_and_truncated_bytes_are_a_value_error_or_a_dataset(blob, suffix, cut, tmp_path):
    path = tmp_path / f"blob{suffix}"
    if suffix == ".parquet":  # a real file cut short, as a kill during a copy leaves it
        buffer = io.BytesIO()
        pq.write_table(pa.table({"text": ["a", "b"], "label": ["x", "y"]}), buffer)
        blob = buffer.getvalue()[: int(len(buffer.getvalue()) * cut)]
    path.write_bytes(blob)
    check_outcome(path, None, "skip")


# Texts that stress CSV: the delimiters, quotes, line breaks of every kind (a bare "\r" too),
# spaces at the ends, and a BOM-like character inside a text.
CSV_PIECES = [",", ";", "\t", "|", '"', "'", "\n", "\r", "\r\n", " ", "\ufeff", "é", "日本", "a", "b c"]
csv_texts = st.lists(st.one_of(st.sampled_from(CSV_PIECES), st.text(max_size=4)), min_size=1, max_size=8).map("".join)


@FUZZ
@given(texts_=st.lists(csv_texts.filter(lambda t: t.strip() and not t.endswith("\r")), min_size=2, max_size=8),
       delimiter=st.sampled_from([",", ";", "\t"]), line_end=st.sampled_from(["\n", "\r\n"]),
       bom=st.booleans(), name_it=st.booleans(), text_first=st.booleans())
def test_csv_quirks_round_trip(texts_, delimiter, line_end, bom, name_it, text_first, tmp_path):
    """Whatever a CSV writer produces (quoted delimiters and line breaks; with "\n" line ends a
    "\r" is left unquoted, as pandas writes it), with or without a BOM, with the delimiter
    sniffed or named, reads back as the very texts written. Texts ending in "\r" are left out:
    as the last field of a line, a trailing "\r" cannot be told from a line end."""
    labels_ = ["spam" if i % 2 else "ham" for i in range(len(texts_))]
    columns = ["text", "label"] if text_first else ["label", "text"]
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, delimiter=delimiter, lineterminator=line_end)
    writer.writerow(columns)
    for text, label in zip(texts_, labels_):
        writer.writerow([text, label] if text_first else [label, text])
    path = tmp_path / "quirks.csv"
    path.write_text(("\ufeff" if bom else "") + buffer.getvalue(), encoding="utf-8", newline="")
    dataset = load_dataset(path, delimiter=delimiter if name_it else None)
    assert [(ex.text, ex.label) for ex in dataset.examples] == list(zip(texts_, labels_))


def test_empty_files_are_refused_by_name(tmp_path):
    for suffix in (".jsonl", ".csv", ".parquet"):
        path = tmp_path / f"empty{suffix}"
        path.write_bytes(b"")
        with pytest.raises(ValueError, match=re.escape(str(path))):
            load_dataset(path)


def test_deeply_nested_json_row_is_a_named_bad_row(tmp_path):
    path = tmp_path / "deep.jsonl"
    deep = "[" * 100_000 + "]" * 100_000
    path.write_text('{"text": "a", "label": ' + deep + '}\n{"text": "b", "label": "x"}\n{"text": "c", "label": "y"}\n')
    with pytest.raises(ValueError, match=re.escape(f"{path}: row 1")):
        load_dataset(path)
    assert len(load_dataset(path, on_bad_row="skip")) == 2


def test_a_very_long_csv_text_loads_as_it_does_from_jsonl(tmp_path):
    long_text = "word " * 40_000  # 200,000 characters
    path = tmp_path / "long.csv"
    write_csv(path, [{"text": long_text, "label": "x"}, {"text": "short", "label": "y"}])
    assert load_dataset(path).examples[0].text == long_text


# ------------------------------------------------------------------------------ completions

SPACES = [
    LabelSpace(("ham", "spam"), kind="binary", positive="spam"),
    LabelSpace(("neg", "neu", "pos")),
    LabelSpace(("1", "2", "3", "4", "5"), kind="ordinal"),
    LabelSpace(("-1", "+1"), kind="binary"),
    LabelSpace(("très bien", "ΣΠΑΜ", "日本")),
]
PIECES = [
    "<answer>", "</answer>", "<think>", "</think>", "<answer >", "</ answer>", "<ANSWER>", "<answer", "answer>",
    "</answer", "<", ">", "/", '"', "'", "`", "<answer><answer>", "</answer></answer>", "\n", " ", "\t", "\x00",
    "\u2028", "the answer is ", "&lt;answer&gt;", '"<answer>spam</answer>"',
]


@st.composite
def completions(draw) -> tuple[str, LabelSpace]:
    space = draw(st.sampled_from(SPACES))
    words = PIECES + list(space.labels) + [x.upper() for x in space.labels] + [f" {x} " for x in space.labels]
    parts = draw(st.lists(st.one_of(st.sampled_from(words), st.text(max_size=5)), max_size=14))
    return "".join(parts), space


@settings(max_examples=400, deadline=None)
@given(case=completions(), reasoning=st.booleans(), mode=st.sampled_from(["strict", "lenient"]), truncated=st.booleans())
def test_parse_answer_never_raises_and_grade_accepts_its_result(case, reasoning, mode, truncated):
    text, space = case
    result = parse_answer(text, reasoning=reasoning, mode=mode, labels=space, truncated=truncated)
    assert isinstance(result.status, ParseStatus)
    assert (result.answer is not None) == (result.status is ParseStatus.OK)
    assert result.answer is None or result.answer in space.labels
    assert result.think_closed == ("</think>" in text)
    if truncated and not result.ok:
        assert result.status is ParseStatus.TRUNCATED
    if mode == "strict" and result.ok:
        # strict accepts exactly one block with only whitespace around it in the answer region
        region = text[text.rfind("</think>") + len("</think>"):] if reasoning else text
        assert region.strip() == f"<answer>{result.raw}</answer>"
        assert canonical_label(result.raw) == canonical_label(result.answer)
    scale = RewardScale.from_labels(space)
    rewards = {grade(answer, label, scale) for label in space.labels for answer in (result.answer, result.raw, text)}
    assert all(math.isfinite(r) and scale.incorrect <= r <= scale.correct for r in rewards)
    if result.answer is None:
        assert {grade(None, label, scale) for label in space.labels} == {scale.incorrect}


@pytest.mark.parametrize("text", [None, b"<answer>ham</answer>", 42, "", "   \n"])
def test_parse_answer_treats_non_text_as_empty(text):
    result = parse_answer(text, reasoning=False, labels=SPACES[0])
    assert result.status is ParseStatus.EMPTY and result.answer is None

"""Load a labelled dataset from a built-in name or a file, validated into a ``Dataset``."""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import itertools
import json
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Sequence

from labelrl.data.builtin import BUILTIN_DATASETS, builtin_help
from labelrl.data.schema import ColumnSpec, RawTable, RowProblem, build_examples, label_to_str, resolve_columns
from labelrl.fileio import atomic_write_text
from labelrl.types import Dataset, LabelSpace

JSONL_SUFFIXES = (".jsonl", ".ndjson")
CSV_SUFFIXES = (".csv",)
TEXT_SUFFIXES = JSONL_SUFFIXES + CSV_SUFFIXES  # the files --encoding applies to
PARQUET_SUFFIXES = (".parquet", ".pq")


def accepted_forms() -> str:
    names = ", ".join(BUILTIN_DATASETS.names())
    return (
        f"a built-in name ({names}), a .jsonl, .csv or .parquet file, "
        "or a directory written by datasets.Dataset.save_to_disk"
    )


# Codecs tried, in order, on a file that is not valid UTF-8, to name the likely one in the error:
# Windows-1252 (what Excel and Notepad save in Western locales) decodes most such files, and
# latin-1 decodes every byte string, so it names the rest. UTF-16 only when its BOM says so.
LIKELY_ENCODINGS = ("cp1252", "latin-1")
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def check_encoding(encoding: str) -> str:
    """The canonical name of a text codec a user named (``latin-1`` → ``iso8859-1``); ValueError otherwise."""
    try:
        name = codecs.lookup(encoding).name
        b"a".decode(name, "replace")  # codecs such as base64 and hex exist but do not turn bytes into text
    except (LookupError, TypeError):
        raise ValueError(
            f"--encoding {encoding!r}: not a text encoding Python knows; give e.g. --encoding utf-8, cp1252, "
            "latin-1 or utf-16 (any name codecs.lookup accepts)"
        ) from None
    return name


def likely_encoding(raw: bytes) -> str:
    """The first codec that decodes ``raw``: ``utf-16`` when it starts with a UTF-16 BOM, else
    the first of ``LIKELY_ENCODINGS`` (latin-1 always decodes, so there is always one)."""
    if raw.startswith(_UTF16_BOMS):
        return "utf-16"
    for name in LIKELY_ENCODINGS:
        try:
            raw.decode(name)
        except UnicodeDecodeError:
            continue
        return name
    raise AssertionError("latin-1 decodes every byte string")


def decode_text(path: Path, encoding: str = "utf-8") -> str:
    """A user's text file as str, read with ``encoding`` (a UTF-8 byte-order mark is dropped).

    A byte the codec cannot decode is an error naming its offset and line and, for UTF-8, the
    encoding the file most likely has (``likely_encoding``) and the ``--encoding`` that reads it.
    """
    codec = check_encoding(encoding)
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig" if codec == "utf-8" else codec)
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        bad = raw[exc.start : exc.start + 1]
        where = f"{path}: byte offset {exc.start} (line {line}) is not valid {'UTF-8' if codec == 'utf-8' else encoding}"
        if codec != "utf-8":
            raise ValueError(f"{where} ({bad!r}); give the file's own encoding with --encoding (e.g. cp1252, latin-1)") from None
        guess = likely_encoding(raw)
        raise ValueError(
            f"{where} ({bad!r}); it decodes as {guess}: pass --encoding {guess} (or re-save the file as UTF-8)"
        ) from None


def read_jsonl(path: Path, encoding: str = "utf-8") -> RawTable:
    """One JSON object per line (text in ``encoding``); blank lines are ignored, a broken line is a bad row."""
    rows: list[dict[str, Any] | RowProblem] = []
    columns: dict[str, None] = {}
    # Split on "\n" only: str.splitlines would also split on U+2028 inside JSON strings.
    for line in decode_text(path, encoding).split("\n"):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        row = len(rows) + 1
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            rows.append(RowProblem(row, None, line, f"not valid JSON ({exc.msg} at char {exc.pos})"))
            continue
        except RecursionError:
            rows.append(RowProblem(row, None, line, "JSON nested too deeply to read"))
            continue
        if not isinstance(obj, dict):
            rows.append(RowProblem(row, None, obj, f"a JSONL row must be a JSON object, got {type(obj).__name__}"))
            continue
        columns.update(dict.fromkeys(obj))
        rows.append(obj)
    return RawTable(str(path), tuple(columns), rows)


# Delimiters a CSV file may use, in the order a tie is broken: commas first (the standard),
# then the semicolons of spreadsheets in locales whose decimal mark is a comma, tabs, pipes.
CSV_DELIMITERS = (",", ";", "\t", "|")
DELIMITER_NAMES = {"tab": "\t", "\\t": "\t", "comma": ",", "semicolon": ";", "pipe": "|"}
SNIFF_RECORDS = 50
_BARE_CR = re.compile(r"\r(?!\r*\n)")


def check_delimiter(delimiter: str) -> str:
    """The one-character delimiter a user named (``tab``, ``\\t``, ``;``, ...); ValueError otherwise."""
    value = DELIMITER_NAMES.get(delimiter.lower(), delimiter)
    if len(value) != 1 or value in "\"\r\n":
        raise ValueError(
            f"--delimiter {delimiter!r}: a CSV delimiter is one character other than a quote or a line break; "
            "give e.g. --delimiter ';' or --delimiter tab"
        )
    return value


def sniff_delimiter(text: str) -> str:
    """The delimiter among ``CSV_DELIMITERS`` that splits the header into the most columns
    that the first ``SNIFF_RECORDS`` records repeat; a comma when none splits the header.

    A delimiter that also occurs inside the texts (a comma in a ``;`` file) leaves the header
    whole or gives the records other widths than the header, so it loses to the right one.
    """
    best, best_score = ",", (0, 0)
    for candidate in CSV_DELIMITERS:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=candidate)
        try:
            records = [r for r in itertools.islice(reader, SNIFF_RECORDS + 1) if r]
        except csv.Error:
            continue
        if not records or len(records[0]) < 2:
            continue
        width = len(records[0])
        score = (sum(len(r) == width for r in records[1:]), width)
        if score > best_score:
            best, best_score = candidate, score
    return best


def protect_bare_carriage_returns(text: str) -> tuple[str, Callable[[str | None], str | None]]:
    """``text`` with stand-ins for the carriage returns that are text, not line ends, and the
    function that puts them back into a value read from it.

    pandas (through the csv module, whose writer quotes ``\\n`` but not ``\\r`` when lines end in
    ``\\n``) and some spreadsheets write a cell's own carriage return bare, inside an unquoted
    field; the csv module would end the row there and shift every later field. In a file whose
    lines end in ``\\n``, a ``\\r`` is a line end only when ``\\n`` follows it (``\\r\\n``, or the
    ``\\r\\r\\n`` of a CSV written in text mode on Windows); any other is text. A file with no
    ``\\n`` at all ends its lines in ``\\r`` (classic Mac OS), so it is left alone.
    """
    if "\n" not in text or not _BARE_CR.search(text):
        return text, lambda value: value
    standin = next((chr(c) for c in range(0xE000, 0xF900) if chr(c) not in text), None)
    if standin is None:  # a file holding all 6,400 private-use characters: read it as the csv module does
        return text, lambda value: value
    return _BARE_CR.sub(standin, text), lambda value: value.replace(standin, "\r") if value else value


def read_csv(path: Path, delimiter: str | None = None, encoding: str = "utf-8") -> RawTable:
    """A CSV file with a header line; every value is a string (empty → missing).

    The text is read with ``encoding`` (``decode_text``; a UTF-8 byte-order mark is dropped); the delimiter is ``delimiter`` or sniffed
    (``sniff_delimiter``); a bare carriage return inside a field is kept as text
    (``protect_bare_carriage_returns``); quoted fields may hold delimiters, quotes and line breaks.
    """
    csv.field_size_limit(2**31 - 1)  # the default 131,072 characters would refuse texts JSONL and Parquet accept
    protected, _restore = protect_bare_carriage_returns(decode_text(path, encoding))
    delimiter = check_delimiter(delimiter) if delimiter else sniff_delimiter(protected)
    reader = csv.DictReader(io.StringIO(protected, newline=""), delimiter=delimiter)
    shown = "tab" if delimiter == "\t" else repr(delimiter)
    try:
        header = reader.fieldnames
        if header is None:
            return RawTable(str(path), (), [])
        header = [_restore(c) for c in header]
        reader.fieldnames = header
        repeated = sorted({c for c in header if header.count(c) > 1})
        if repeated:
            raise ValueError(f"{path}: the header repeats column(s) {repeated}; give every column a distinct name")
        rows: list[dict[str, Any] | RowProblem] = []
        for values in reader:
            row = len(rows) + 1
            if None in values:
                n = len(header) + len(values[None])
                rows.append(RowProblem(row, None, values[None], f"row has {n} fields but the header has {len(header)}",
                                       f"the delimiter is {shown}: quote fields that contain it, or name another "
                                       "with --delimiter"))
            else:
                rows.append({k: (None if v == "" else _restore(v)) for k, v in values.items()})
    except csv.Error as exc:
        raise ValueError(f"{path}: line {reader.line_num}: malformed CSV ({exc}); fix the quoting on that line") from None
    return RawTable(str(path), tuple(header), rows)


def read_parquet(path: Path) -> RawTable:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise ValueError(f"{path}: not a readable Parquet file ({exc}); write it with pyarrow or pandas") from None
    spaces = {}
    for column in table.schema:
        # pandas writes an ordered categorical (pd.Categorical(..., ordered=True)) as an ordered
        # dictionary: its categories are the grades, lowest first, used or not
        chunks = table.column(column.name).chunks
        if pa.types.is_dictionary(column.type) and column.type.ordered and chunks:  # every chunk has pandas' categories
            grades = [label_to_str(x) for x in chunks[0].dictionary.to_pylist()]
            if len(grades) >= 2 and all(grades):
                spaces[column.name] = LabelSpace(tuple(grades), kind="ordinal")
    return RawTable(str(path), tuple(table.column_names), table.to_pylist(), spaces)


def read_saved_dataset(path: Path) -> RawTable:
    """A directory written by ``datasets.Dataset.save_to_disk`` (one split)."""
    import datasets

    try:
        data = datasets.load_from_disk(str(path))
    except FileNotFoundError:
        raise ValueError(
            f"{path}: a directory, but not one written by datasets.Dataset.save_to_disk; give {accepted_forms()}"
        ) from None
    if isinstance(data, datasets.DatasetDict):
        splits = ", ".join(data)
        raise ValueError(
            f"{path}: holds several splits ({splits}); give one split's folder, e.g. {path / next(iter(data))}"
        )
    rows, spaces = data.to_list(), {}
    for name, feature in data.features.items():
        if isinstance(feature, datasets.ClassLabel) and len(feature.names) >= 2:
            # a ClassLabel column holds each label's index: the rows name the label instead, and the
            # feature's names are the label set, used or not (-1, the index of "no label", is missing)
            names = feature.names
            for row in rows:
                index = row.get(name)
                row[name] = names[index] if isinstance(index, int) and 0 <= index < len(names) else None
            spaces[name] = LabelSpace(tuple(names), kind="binary" if len(names) == 2 else "categorical")
    return RawTable(str(path), tuple(data.column_names), rows, spaces)


def read_table(path: Path, delimiter: str | None = None, encoding: str = "utf-8") -> RawTable:
    """Dispatch on the path: a directory, or a file by its extension (``delimiter``: CSV only;
    ``encoding``: CSV and JSONL, which are text; Parquet and ``datasets`` directories say their own)."""
    if delimiter and not (path.is_file() and path.suffix.lower() in CSV_SUFFIXES):
        raise ValueError(f"--delimiter {delimiter!r} applies to .csv files, and {path} is not one; drop --delimiter")
    if check_encoding(encoding) != "utf-8" and not (path.is_file() and path.suffix.lower() in TEXT_SUFFIXES):
        raise ValueError(f"--encoding {encoding!r} applies to .csv and .jsonl files, and {path} is not one; drop --encoding")
    if path.is_dir():
        return read_saved_dataset(path)
    if not path.is_file():
        if not path.suffix and len(path.parts) == 1:  # looks like a misspelt built-in name
            raise ValueError(f"{path}: no such built-in dataset or file; built-ins are {builtin_help()}")
        raise ValueError(f"{path}: no such file or built-in dataset; give {accepted_forms()}")
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return read_jsonl(path, encoding)
    if suffix in CSV_SUFFIXES:
        return read_csv(path, delimiter, encoding)
    if suffix in PARQUET_SUFFIXES:
        return read_parquet(path)
    raise ValueError(f"{path}: unknown file type {suffix or '(no extension)'!r}; give {accepted_forms()}")


def read_source(source: str | Path, delimiter: str | None = None,
                encoding: str = "utf-8") -> tuple[str, RawTable, ColumnSpec | None, dict]:
    """A built-in name or a file, read into a raw table: (dataset name, table, the
    built-in's default columns or None, the built-in's label spaces by column)."""
    name = str(source)
    if name in BUILTIN_DATASETS:
        if delimiter:
            raise ValueError(f"--delimiter {delimiter!r} applies to .csv files, and {name} is a built-in dataset; drop --delimiter")
        if check_encoding(encoding) != "utf-8":
            raise ValueError(f"--encoding {encoding!r} applies to .csv and .jsonl files, and {name} is a built-in dataset; drop --encoding")
        builtin = BUILTIN_DATASETS.get(name).read()
        table = RawTable(name, builtin.columns, builtin.rows)
        return name, table, ColumnSpec(builtin.text_cols, builtin.label_col, builtin.id_col), builtin.label_spaces
    path = Path(source)
    table = read_table(path, delimiter, encoding)
    return (path.stem if path.is_file() else path.name), table, None, table.label_spaces


def load_dataset(
    source: str | Path,
    *,
    text_cols: Sequence[str] | str | None = None,
    label_col: str | None = None,
    labels: Sequence[str] | str | None = None,
    kind: str | None = None,
    positive: str | None = None,
    id_col: str | None = None,
    on_bad_row: str = "error",
    delimiter: str | None = None,
    encoding: str = "utf-8",
) -> Dataset:
    """Read and validate a labelled dataset.

    ``source`` is a built-in name (see ``BUILTIN_DATASETS``) or a path to a JSONL, CSV or
    Parquet file, or to a ``datasets.save_to_disk`` directory. ``text_cols`` (several are
    joined as ``col: value`` lines, an empty one as ``col:``, a row being bad only when all are
    empty; each is also kept in ``Example.fields``) and
    ``label_col`` default to the built-in's choices, else to columns named ``text`` and
    ``label``. Columns not used as text, label or id go to ``Example.meta``.

    The label set is ``labels`` (ordered, lowest grade first for ordinal; a comma-separated
    string is split) with ``kind`` and, for binary, ``positive``; else the built-in's; else
    inferred from the data (``schema.infer_labels``, ``schema.infer_kind``). Ids come from
    ``id_col``, else a column named ``id``, else the 1-based data row number. Bad rows raise (``on_bad_row="error"``) or
    are recorded in ``Dataset.skipped_rows`` (``"skip"``); see ``schema.build_examples``. ``delimiter`` is a CSV
    file's delimiter (default: sniffed, see ``read_csv``); ``encoding`` a CSV or JSONL file's text
    encoding (any ``codecs`` name; see ``decode_text``).
    """
    if isinstance(text_cols, str):
        text_cols = [text_cols]
    if isinstance(labels, str):
        labels = [x.strip() for x in labels.split(",") if x.strip()]
    content = _content_key(source)
    key = None if content is None else (content, str(source), tuple(text_cols or ()), label_col, tuple(labels or ()),
                                        kind, positive, id_col, on_bad_row, delimiter, encoding)
    if key in _LOADED:  # a ladder reads its task's file for every run and evaluation: parse it once per process
        _LOADED.move_to_end(key)
        return _LOADED[key]
    dataset = _load(source, text_cols, label_col, labels, kind, positive, id_col, on_bad_row, delimiter, encoding)
    if key is not None:
        _LOADED[key] = dataset
        while len(_LOADED) > KEPT_DATASETS:
            _LOADED.popitem(last=False)
    return dataset


KEPT_DATASETS = 4  # parsed datasets a process keeps: a ladder's tasks and their out-of-domain sets
_LOADED: OrderedDict[tuple, Dataset] = OrderedDict()


def _content_key(source: str | Path) -> tuple | None:
    """What a file's rows depend on: its path and the digest of its bytes (a file rewritten in
    place is read again, whatever its size and time stamps say); None for a built-in (read in a
    fraction of a second) or a ``datasets`` directory, which are read each time."""
    path = Path(source)
    if str(source) in BUILTIN_DATASETS or not path.is_file():
        return None
    with open(path, "rb") as handle:
        return (str(path.resolve()), hashlib.file_digest(handle, "blake2b").hexdigest())


def _load(source, text_cols, label_col, labels, kind, positive, id_col, on_bad_row, delimiter, encoding) -> Dataset:
    name, table, defaults, default_spaces = read_source(source, delimiter, encoding)
    spec = resolve_columns(table, text_cols, label_col, id_col, defaults)
    examples, space, skipped = build_examples(
        table, spec, labels=labels, kind=kind, positive=positive,
        default_space=default_spaces.get(spec.label_col), on_bad_row=on_bad_row,
    )
    return Dataset(name=name, examples=tuple(examples), labels=space, source=str(source), skipped_rows=tuple(skipped))


def write_skipped_rows(dataset: Dataset, path: str | Path) -> Path:
    """Write ``dataset.skipped_rows`` as JSONL (one ``{row, column, value, reason}`` a line).

    An empty file means no row was skipped, so a reader can tell "none" from "not saved".
    """
    path = Path(path)
    lines = [json.dumps(r, ensure_ascii=False, sort_keys=True, default=str) + "\n" for r in dataset.skipped_rows]
    atomic_write_text(path, "".join(lines))
    return path

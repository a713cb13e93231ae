"""Row validation: raw rows (dicts of columns) → validated ``Example`` objects.

Every reader (JSONL, CSV, Parquet, ``datasets`` directory, built-ins) produces a
``RawTable``; ``build_examples`` maps its columns, settles the label space and checks each
row. A malformed row is either an error naming the file, row, column and value, or (with
``on_bad_row="skip"``) a record ``{row, column, value, reason}``: nothing is dropped silently.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from labelrl.types import Example, LabelKind, LabelSpace, canonical_label

ON_BAD_ROW = ("error", "skip")
LABEL_KINDS = ("binary", "categorical", "ordinal")
SKIP_HINT = "pass --on-bad-row skip to skip such rows"
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)")
_INTEGRAL_DECIMAL = re.compile(r"([+-]?\d+)\.0+")
MISSING_TEXT, EMPTY_TEXT = "missing text", "empty text"  # a text cell without text, which of several columns may be


@dataclass(frozen=True)
class RowProblem:
    """Why one data row (1-based, header excluded) cannot become an Example."""

    row: int
    column: str | None
    value: Any
    reason: str
    fix: str = ""

    def record(self) -> dict:
        """The JSON-friendly record kept in ``Dataset.skipped_rows``."""
        return {"row": self.row, "column": self.column, "value": json_safe(self.value), "reason": self.reason}

    def message(self, source: str) -> str:
        where = f"{source}: row {self.row}" + (f", column {self.column!r}" if self.column else "")
        return f"{where}: {self.reason} (value {shorten(self.value)}); {self.fix or 'fix the row'}, or {SKIP_HINT}"


@dataclass(frozen=True)
class RawTable:
    """Rows as read from a source; ``rows[i]`` is data row ``i + 1`` (or why it is unreadable).
    ``label_spaces``: the label set a column's own type declares (a pandas ordered categorical in
    Parquet, a ``datasets`` ClassLabel), by column."""

    source: str
    columns: tuple[str, ...]
    rows: list[dict[str, Any] | RowProblem]
    label_spaces: dict[str, LabelSpace] = field(default_factory=dict)


@dataclass(frozen=True)
class ColumnSpec:
    text_cols: tuple[str, ...]
    label_col: str
    id_col: str | None = None


@dataclass(frozen=True)
class _Draft:
    row: int
    id: str
    text: str
    fields: dict[str, str]
    label: str
    meta: dict[str, Any]


def shorten(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def json_safe(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    return repr(value)


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


_ANSWER_ONLY = re.compile(r"\s*<answer>(.*?)</answer>\s*", re.DOTALL)


def scalar_to_str(value: Any) -> str | None:
    """A label or id as a string: ints and bools by ``str``, integral floats without ".0"
    (1.0 → "1"), strings trimmed; None for a missing or empty value.

    Raises TypeError for containers (dict, list, ...), which never make a label or id.
    """
    if _is_missing(value):
        return None
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else str(value)
    if isinstance(value, (str, int, bool)):
        text = str(value).strip()
        return text or None
    raise TypeError(type(value).__name__)


def label_to_str(value: Any) -> str | None:
    """A label as ``scalar_to_str`` reads it, written one way whatever the file's format:
    runs of whitespace as one space ("not  spam" → "not spam") and an integral decimal as an
    integer ("4.0" → "4", as a JSON 4.0 reads; pandas writes an integer column with a missing
    value as floats), so a 1–5 grade column saved from pandas stays an ordinal scale."""
    text = scalar_to_str(value)
    if text is None:
        return None
    text = " ".join(text.split())
    integral = _INTEGRAL_DECIMAL.fullmatch(text)
    return integral.group(1) if integral else text


def is_scale(names: Sequence[str]) -> bool:
    """Every label a number: a scale, ordinal in numeric order."""
    return bool(names) and all(_NUMBER.fullmatch(x) for x in names)


def require_rows(table: RawTable) -> None:
    if not table.rows:
        raise ValueError(f"{table.source}: the file has no data rows; give a file with at least 2 labelled rows")


def resolve_columns(
    table: RawTable,
    text_cols: Sequence[str] | None,
    label_col: str | None,
    id_col: str | None,
    defaults: ColumnSpec | None = None,
) -> ColumnSpec:
    """Chosen columns, else the built-in's defaults, else columns named ``text`` / ``label``
    (and ``id`` for ids, when there is one; otherwise ids are row numbers)."""
    require_rows(table)
    available = ", ".join(table.columns) or "(none)"

    def check(name: str, flag: str) -> str:
        if name not in table.columns:
            raise ValueError(f"{table.source}: {flag} {name!r}: no such column; available columns: {available}")
        return name

    if text_cols:
        texts = tuple(check(c, "--text-col") for c in dict.fromkeys(text_cols))
    elif defaults is not None:
        texts = defaults.text_cols
    elif "text" in table.columns:
        texts = ("text",)
    elif "prompt" in table.columns:  # a TRL-style prompt/completion dataset
        texts = ("prompt",)
    else:
        raise ValueError(f"{table.source}: no 'text' column; name the text column(s) with --text-col (available columns: {available})")
    if label_col:
        label = check(label_col, "--label-col")
    elif defaults is not None:
        label = defaults.label_col
    elif "label" in table.columns:
        label = "label"
    elif "completion" in table.columns:
        label = "completion"
    else:
        raise ValueError(f"{table.source}: no 'label' column; name it with --label-col (available columns: {available})")
    if id_col:
        ident = check(id_col, "--id-col")
    elif defaults is not None:
        ident = defaults.id_col
    else:
        ident = "id" if "id" in table.columns else None
    return ColumnSpec(text_cols=texts, label_col=label, id_col=ident)


def _message_text(value: Any, role: str) -> str | None:
    """The text of a TRL-style conversational cell (a list of {"role", "content"} dicts):
    its ``role`` messages joined; None when ``value`` is not such a list."""
    if not isinstance(value, (list, tuple)) or not value or not all(
        isinstance(m, dict) and "role" in m and "content" in m for m in value
    ):
        return None
    chosen = [str(m["content"]) for m in value if m["role"] == role]
    return "\n".join(chosen) if chosen else None


def _unwrap_answer(value: Any) -> Any:
    """A TRL-style completion ``<answer>spam</answer>`` names the label ``spam``."""
    match = _ANSWER_ONLY.fullmatch(value) if isinstance(value, str) else None
    return match.group(1) if match else value


def _text_value(row: int, column: str, value: Any) -> str | RowProblem:
    conversational = _message_text(value, "user")
    if conversational is not None:
        value = conversational
    if _is_missing(value):
        return RowProblem(row, column, value, MISSING_TEXT)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return RowProblem(row, column, value, f"text must be a string, got {type(value).__name__}",
                          "choose another column with --text-col")
    text = str(value)
    if not text.strip():
        return RowProblem(row, column, value, EMPTY_TEXT)
    return text


def _scalar_value(row: int, column: str, value: Any, what: str, fix: str, read=scalar_to_str) -> str | RowProblem:
    try:
        text = read(value)
    except TypeError as exc:
        return RowProblem(row, column, value, f"{what} must be a string or number, got {exc}", fix)
    return text if text is not None else RowProblem(row, column, value, f"missing {what}", fix)


def _draft(row: int, values: dict[str, Any], spec: ColumnSpec) -> _Draft | RowProblem:
    """Phase 1: the checks that need no label space."""
    ident = str(row)
    if spec.id_col:
        ident = _scalar_value(row, spec.id_col, values.get(spec.id_col), "id", "give every row an id")
        if isinstance(ident, RowProblem):
            return ident
    fields: dict[str, str] = {}
    blank: list[RowProblem] = []
    for column in spec.text_cols:
        text = _text_value(row, column, values.get(column))
        if isinstance(text, RowProblem):
            # of several text columns, one left empty (a title without a body) is an empty field
            # of an item that has text; a row is bad when none of its text columns holds any
            if len(spec.text_cols) == 1 or text.reason not in (MISSING_TEXT, EMPTY_TEXT):
                return text
            blank.append(text)
            text = ""
        fields[column] = text
    if len(blank) == len(spec.text_cols):
        return replace(blank[0], reason=f"{blank[0].reason} in every text column ({', '.join(spec.text_cols)})")
    raw_label = values.get(spec.label_col)
    raw_label = _message_text(raw_label, "assistant") or raw_label
    label = _scalar_value(row, spec.label_col, _unwrap_answer(raw_label), "label", "give every row a label", label_to_str)
    if isinstance(label, RowProblem):
        return label
    if label.lower() == "nan":  # a missing value as pandas prints it (str(float("nan"))), not a class
        return RowProblem(row, spec.label_col, raw_label, "missing label (NaN is how a missing value prints)",
                          "give every row a label")
    if len(fields) == 1:
        text = next(iter(fields.values()))
    else:
        text = "\n".join(f"{column}: {value}" if value else f"{column}:" for column, value in fields.items())
    used = {spec.id_col, spec.label_col, *spec.text_cols}
    meta = {k: v for k, v in values.items() if k not in used}
    return _Draft(row, ident, text, fields, label, meta)


def infer_kind(labels: Sequence[str]) -> LabelKind:
    """2 labels → binary; all numbers (1–5, 0.5–5.0 in halves) → ordinal; else categorical."""
    if len(labels) == 2:
        return "binary"
    if is_scale(labels):
        return "ordinal"
    return "categorical"


def infer_labels(observed: Sequence[str]) -> tuple[str, ...]:
    """Distinct labels, each written as most rows write it ("ham" of 900 "ham", 100 "Ham" and
    one " ham "; the first seen on a tie), in numeric order when all are numbers, else sorted."""
    spellings = Counter(observed)
    spelling: dict[str, str] = {}
    for label, _ in spellings.most_common():  # equal counts keep the order first seen
        spelling.setdefault(canonical_label(label), label)
    names = list(spelling.values())
    if is_scale(names):
        return tuple(sorted(names, key=float))
    return tuple(sorted(names, key=canonical_label))


def resolve_label_space(
    source: str,
    observed: Sequence[str],
    labels: Sequence[str] | None,
    kind: str | None,
    positive: str | None,
    default: LabelSpace | None,
) -> LabelSpace:
    """Declared labels, else the built-in default, else inferred from ``observed``."""
    if kind is not None and kind not in LABEL_KINDS:
        raise ValueError(f"kind={kind!r}: not a label kind; choose one of {', '.join(LABEL_KINDS)}")
    if labels:
        names = tuple(label_to_str(x) or str(x).strip() for x in labels)
    elif default is not None:
        names = default.labels
        kind = kind or default.kind
        positive = positive if positive is not None else (default.positive if kind == "binary" else None)
    else:
        names = infer_labels(observed)
        if kind == "ordinal" and not is_scale(names):
            raise ValueError(
                f"{source}: kind=ordinal but the labels {list(names)} are not numbers, so their order "
                "is unknown; declare it with --labels low,mid,high (lowest first)"
            )
        if len(names) < 2:
            raise ValueError(
                f"{source}: found only the label(s) {list(names)}; a task needs at least 2 labels. "
                "Check --label-col, or declare the set with --labels a,b"
            )
    kind = kind or infer_kind(names)
    if positive is not None:
        if kind != "binary":
            raise ValueError(f"positive={positive!r}: only binary tasks have a positive label (kind={kind!r}); drop --positive")
        positive = next((n for n in names if canonical_label(n) == canonical_label(positive)), positive)
    try:
        return LabelSpace(names, kind=kind, positive=positive)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def build_examples(
    table: RawTable,
    spec: ColumnSpec,
    *,
    labels: Sequence[str] | None = None,
    kind: str | None = None,
    positive: str | None = None,
    default_space: LabelSpace | None = None,
    on_bad_row: str = "error",
) -> tuple[list[Example], LabelSpace, list[dict]]:
    """Validate every row; returns (examples, label space, skipped-row records).

    ``on_bad_row="error"`` raises a ValueError for the first bad row (file, row, column,
    value and the fix); ``"skip"`` records each bad row and keeps going. Rows are checked
    in two passes: shape first (id, text, label present and of the right type), then, once
    the label space is known, the label's membership and the id's uniqueness (a later copy
    of an id already seen is the bad row).
    """
    if on_bad_row not in ON_BAD_ROW:
        raise ValueError(f"on_bad_row={on_bad_row!r}: choose 'error' (stop at a bad row) or 'skip' (skip and record it)")
    require_rows(table)
    problems: list[RowProblem] = []
    drafts: list[_Draft] = []
    for row, values in enumerate(table.rows, start=1):
        draft = values if isinstance(values, RowProblem) else _draft(row, values, spec)
        (problems if isinstance(draft, RowProblem) else drafts).append(draft)
    _stop_if_needed(table, problems, bool(drafts), on_bad_row)
    space = resolve_label_space(table.source, [d.label for d in drafts], labels, kind, positive, default_space)
    examples, seen = [], set()
    for d in drafts:
        label = space.normalise(d.label)
        if label is None:
            problems.append(RowProblem(d.row, spec.label_col, d.label,
                                       f"label is not one of {list(space.labels)}",
                                       "declare the full label set with --labels a,b,c"))
        elif d.id in seen:
            problems.append(RowProblem(d.row, spec.id_col, d.id, "duplicate id", "give every row a distinct id"))
        else:
            seen.add(d.id)
            examples.append(Example(id=d.id, text=d.text, label=label, fields=d.fields, meta=d.meta))
    _stop_if_needed(table, problems, bool(examples), on_bad_row)
    return examples, space, [p.record() for p in sorted(problems, key=lambda p: p.row)]


def _stop_if_needed(table: RawTable, problems: list[RowProblem], any_left: bool, on_bad_row: str) -> None:
    """Raise for the earliest bad row in error mode, or when every row was skipped."""
    if not problems:
        return
    first = min(problems, key=lambda p: p.row)
    if on_bad_row == "error":
        more = f" ({len(problems) - 1} more bad rows)" if len(problems) > 1 else ""
        raise ValueError(first.message(table.source) + more)
    if not any_left:
        raise ValueError(
            f"{table.source}: every one of the {len(table.rows)} rows was skipped "
            f"(first: row {first.row}: {first.reason}); check --text-col, --label-col and --labels"
        )

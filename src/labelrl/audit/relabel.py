"""Audited relabelling: a judge applies a written rubric to every item, unsure items go to an
adjudicator, and the judge's own consistency and its agreement with the old labels are measured.

``run_relabel`` works in phases, each resumable from the journal (``OUT.journal.jsonl``, one
flushed line per answer; a re-run asks only for what the journal lacks):

1. **judge**: every item gets the judge's label and confidence (``Judge.label``).
2. **adjudicate**: items whose judge confidence is below ``min_confidence``, or missing, or
   whose reply did not parse, go to the adjudicator, whose label decides. Adjudications made by
   another adjudicator (an earlier run's) are not reused.
3. **self-agreement**: the judge labels a seeded random sample of items again as an
   independent sample (``Judge.label(..., sample_seed=seed)``): a local judge draws a label
   from its own label distribution (its first answer is the most probable label, so the rate
   estimates how often the distribution reproduces that choice; a deterministic re-score would
   agree 100% by construction and say nothing); an endpoint is asked again at its sampling
   temperature with a seed. The two passes are treated as a test-retest pair, as duplicates
   are in :mod:`labelrl.audit.noise`: disagreement d, flip rate ε (eq. 1 there), κ.
4. **output**: every original column plus the provenance columns (``PROVENANCE_COLUMNS``),
   written atomically to a new file, and a summary beside it (``OUT.summary.json``).

``label_final`` is the adjudicator's label when the item was adjudicated and that reply
parsed; else the judge's label when it parsed; else the original label (nothing replaced it).
``final_source`` says which.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from labelrl.audit.judges import Judge, JudgeError, Verdict
from labelrl.audit.relabel_journal import Journal, RelabelItems, RelabelPaths
from labelrl.audit.relabel_summary import (
    agreement_with,
    needs_adjudication,
    self_agreement,
    skipped_rows_path,
    summarise,
)
from labelrl.fileio import atomic_write_bytes, atomic_write_json, atomic_write_text
from labelrl.types import Example

PROVENANCE_COLUMNS = (
    "label_original", "label_judge", "judge_confidence", "judge_status", "adjudicated",
    "label_adjudicator", "adjudicator_confidence", "label_final", "final_source",
)
OUTPUT_SUFFIXES = (".jsonl", ".parquet")
JOURNAL_FORMAT = 1
OnRecord = Callable[[str, str], None]

__all__ = [
    "JOURNAL_FORMAT",
    "OUTPUT_SUFFIXES",
    "PROVENANCE_COLUMNS",
    "Journal",
    "OnRecord",
    "RelabelItems",
    "RelabelPaths",
    "agreement_with",
    "load_items",
    "needs_adjudication",
    "output_paths",
    "output_rows",
    "read_rubric",
    "run_relabel",
    "self_agreement",
    "self_agreement_ids",
    "summarise",
    "write_rows",
]


def read_rubric(path: str | Path) -> str:
    """The rubric's text; ValueError for a missing or empty file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--rubric {path}: no such file; write the labelling rules in a text or Markdown file and give its path")
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise ValueError(f"--rubric {path}: the file is empty; write the rules the judge must apply")
    return text


def load_items(
    data: str | Path, *, text_cols: Sequence[str] | None = None, label_col: str | None = None,
    labels: Sequence[str] | str | None = None, limit: int | None = None, on_bad_row: str = "error",
    delimiter: str | None = None, encoding: str = "utf-8", only_ids: Sequence[str] | None = None,
) -> RelabelItems:
    """Read and validate ``data`` (a built-in name or a file, as ``labelrl.data.load_dataset``),
    keeping each row's original columns. Relabel writes every row back, so a bad row stops it
    (``on_bad_row="error"``) unless ``"skip"``: then it is left out of the output and listed in
    ``RelabelItems.skipped_rows``. ``only_ids`` keeps the rows of those item ids (e.g. the samples
    a ladder task trains and is scored on); ``limit`` keeps the first N rows. ``delimiter`` and
    ``encoding`` are a CSV (or JSONL) file's, as ``load_dataset`` takes them."""
    from labelrl.data.load import read_source
    from labelrl.data.schema import build_examples, resolve_columns

    if isinstance(labels, str):
        labels = [x.strip() for x in labels.split(",") if x.strip()]
    if limit is not None and limit < 1:
        raise ValueError(f"--limit {limit}: must be 1 or more rows (leave it out for all rows)")
    name, table, defaults, spaces = read_source(data, delimiter, encoding)
    path = None if defaults is not None else Path(data)
    spec = resolve_columns(table, list(text_cols) if text_cols else None, label_col, None, defaults)
    examples, space, skipped = build_examples(
        table, spec, labels=labels, default_space=spaces.get(spec.label_col), on_bad_row=on_bad_row
    )
    clash = [c for c in PROVENANCE_COLUMNS if c in table.columns]
    if clash:
        raise ValueError(
            f"{table.source}: already has the column(s) {clash} that relabel writes (is it a relabel "
            "output?); rename them, or relabel the original file"
        )
    digest = hashlib.sha256()
    for ex in examples:
        digest.update(json.dumps([ex.id, ex.text, ex.label]).encode("utf-8"))
    left_out = {record["row"] for record in skipped}
    # build_examples keeps the rows it does not skip in their order, so these line up with examples
    rows = [row for number, row in enumerate(table.rows, start=1) if number not in left_out]
    assert len(rows) == len(examples), "every row is an example or a skipped row"
    if only_ids is not None:
        wanted = {str(i) for i in only_ids}
        pairs = [(row, ex) for row, ex in zip(rows, examples) if ex.id in wanted]
        rows, examples = [p[0] for p in pairs], [p[1] for p in pairs]
    keep = len(examples) if limit is None else limit
    return RelabelItems(name, path, rows[:keep], tuple(examples[:keep]), space, digest.hexdigest(), tuple(skipped))


def output_paths(items: RelabelItems, out: str | Path | None) -> RelabelPaths:
    """``out`` (default ``NAME.relabelled.jsonl`` beside the input file, or here for a built-in),
    its journal ``OUT.journal.jsonl`` and summary ``OUT.summary.json``; none may be the input."""
    if out is None:
        folder = items.path.parent if items.path is not None and items.path.is_file() else Path(".")
        out = folder / f"{items.name}.relabelled.jsonl"
    out = Path(out)
    paths = RelabelPaths(out, out.with_suffix(".journal.jsonl"), out.with_suffix(".summary.json"))
    if items.path is not None:
        source = items.path.resolve()
        for what, path in (("it", paths.out), ("its journal", paths.journal), ("its summary", paths.summary)):
            if path.resolve() == source:
                raise ValueError(f"--out {out}: {what} would be the input file {items.path}; relabel never "
                                 "overwrites its input; choose another --out")
    if out.suffix.lower() not in OUTPUT_SUFFIXES:
        raise ValueError(f"--out {out}: relabel writes .jsonl or .parquet; give a path ending in one of them")
    return paths


def self_agreement_ids(examples: Sequence[Example], n: int, seed: int) -> list[str]:
    """A seeded random sample of ``min(n, len)`` item ids, in dataset order."""
    n = min(max(n, 0), len(examples))
    chosen = np.random.default_rng(seed).choice(len(examples), size=n, replace=False)
    return [examples[i].id for i in sorted(chosen.tolist())]


def run_relabel(
    items: RelabelItems, rubric: str, judge: Judge, adjudicator: Judge | None, paths: RelabelPaths, *,
    min_confidence: float = 0.7, self_agreement_sample: int = 50, seed: int = 0,
    console=None, on_record: OnRecord | None = None,
) -> dict:
    """Run the phases of the module docstring; returns the summary (``summarise``).

    ``console`` (a rich Console) shows a count with an ETA per phase; ``on_record(kind, id)`` is
    called after each journal line. A JudgeError keeps everything already journaled and is
    re-raised with how much is saved and how to resume.
    """
    if not 0.0 <= min_confidence <= 1.0:
        raise ValueError(f"--min-confidence {min_confidence}: a probability lies in [0, 1]")
    header = {"kind": "header", "format": JOURNAL_FORMAT, "input": items.fingerprint, "labels": list(items.labels.labels),
              "rubric_sha256": hashlib.sha256(rubric.encode("utf-8")).hexdigest(), "judge": judge.name}
    journal = Journal(paths.journal, header)
    done = journal.records

    def phase(kind: str, title: str, who: Judge, todo: list[Example], **kw: Any) -> None:
        _run_phase(kind, title, who, todo, journal, console, on_record, **kw)

    phase("judge", "judging", judge, [ex for ex in items.examples if ex.id not in done["judge"]])
    low = [ex for ex in items.examples if needs_adjudication(done["judge"][ex.id], min_confidence)]
    if adjudicator is not None:
        todo = [ex for ex in low if done["adjudicate"].get(ex.id, {}).get("by") != adjudicator.name]
        phase("adjudicate", "adjudicating", adjudicator, todo)
    by_id = {ex.id: ex for ex in items.examples}
    sample = self_agreement_ids(items.examples, self_agreement_sample, seed)
    todo = [by_id[i] for i in sample if done["retest"].get(i, {}).get("seed") != seed]
    phase("retest", "self-agreement", judge, todo, sample_seed=seed)
    rows = output_rows(items, journal, adjudicator, min_confidence)
    write_rows(paths.out, rows)
    if items.skipped_rows:  # --on-bad-row skip: said (a note) and saved, never silent
        atomic_write_text(skipped_rows_path(paths), "".join(json.dumps(r, ensure_ascii=False, sort_keys=True, default=str)
                                                            + "\n" for r in items.skipped_rows))
    summary = summarise(items, journal, judge, adjudicator, sample, rows,
                        min_confidence=min_confidence, seed=seed, paths=paths)
    atomic_write_json(paths.summary, summary)
    return summary


def _run_phase(kind: str, title: str, who: Judge, todo: list[Example], journal: Journal, console,
               on_record: OnRecord | None, sample_seed: int | None = None) -> None:
    """Ask ``who`` about ``todo``, journaling each answer; a count with an ETA on ``console``'s
    stream (a bar on a terminal, plain lines elsewhere; nothing when ``console`` is None)."""
    from labelrl.progress import Counter

    if not todo:
        return
    extra = {"seed": sample_seed} if sample_seed is not None else {}
    with Counter(len(todo), title, quiet=console is None, console=console) as count:

        def save(index: int, verdict: Verdict) -> None:
            journal.add(kind, todo[index].id, verdict, who.name, **extra)
            count.advance()
            if on_record is not None:
                on_record(kind, todo[index].id)

        try:
            who.label(todo, sample_seed=sample_seed, on_result=save)
        except JudgeError as exc:
            saved = {k: len(v) for k, v in journal.records.items() if v}
            counts = ", ".join(f"{n} {k}" for k, n in saved.items()) or "nothing yet"
            raise JudgeError(f"{exc}. Saved so far in {journal.path}: {counts}; re-run the same command to resume") from None


def _decide(original: str, judged: dict, adjudged: dict | None) -> tuple[str, str]:
    if adjudged is not None and adjudged["label"] is not None:
        return adjudged["label"], "adjudicator"
    if judged["label"] is not None:
        return judged["label"], "judge"
    return original, "original"


def output_rows(items: RelabelItems, journal: Journal, adjudicator: Judge | None, min_confidence: float) -> list[dict]:
    """Each original row plus the provenance columns, in input order."""
    rows = []
    for row, ex in zip(items.rows, items.examples):
        judged = journal.records["judge"][ex.id]
        adjudged = None
        if adjudicator is not None and needs_adjudication(judged, min_confidence):
            adjudged = journal.records["adjudicate"][ex.id]
        final, source = _decide(ex.label, judged, adjudged)
        rows.append({
            **row,
            "label_original": ex.label, "label_judge": judged["label"],
            "judge_confidence": judged["confidence"], "judge_status": judged["status"],
            "adjudicated": adjudged is not None,
            "label_adjudicator": adjudged["label"] if adjudged else None,
            "adjudicator_confidence": adjudged["confidence"] if adjudged else None,
            "label_final": final, "final_source": source,
        })
    return rows


def write_rows(path: Path, rows: list[dict]) -> None:
    """Write ``rows`` atomically as JSONL or Parquet (by the suffix)."""
    if path.suffix.lower() == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pa.Table.from_pylist(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ValueError(f"--out {path}: the columns do not fit Parquet ({exc}); write .jsonl instead") from None
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        atomic_write_bytes(path, buffer.getvalue())
    else:
        atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows))

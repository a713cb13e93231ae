"""What a relabel run reads and keeps: the items, the output paths and the journal of answers.

Kept apart from ``labelrl.audit.relabel`` (the phases) so that the summary module can name these
types without importing the phases: ``relabel`` → ``relabel_summary`` → ``relabel_journal``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labelrl.audit.judge_types import Verdict
from labelrl.fileio import append_jsonl, atomic_write_jsonl, drop_torn_tail, read_jsonl
from labelrl.types import Example, LabelSpace


@dataclass(frozen=True)
class RelabelItems:
    """The rows to relabel: ``rows[i]`` (original columns, as read) is ``examples[i]``."""

    name: str
    path: Path | None  # None for a built-in dataset
    rows: list[dict[str, Any]]
    examples: tuple[Example, ...]
    labels: LabelSpace
    fingerprint: str  # sha256 of every (id, text, label), limit or not
    skipped_rows: tuple[dict, ...] = ()  # --on-bad-row skip: the rows left out, {row, column, value, reason}


@dataclass(frozen=True)
class RelabelPaths:
    out: Path
    journal: Path
    summary: Path


class Journal:
    """The append-only record of every answer; a header line ties it to one input, rubric,
    label set and judge, so a re-run never mixes answers from different setups. A journal that
    holds only a header (no answer yet) is started afresh for a new setup."""

    KINDS = ("judge", "adjudicate", "retest")

    def __init__(self, path: Path, header: dict) -> None:
        self.path = Path(path)
        self.records: dict[str, dict[str, dict]] = {kind: {} for kind in self.KINDS}
        drop_torn_tail(self.path)
        lines = read_jsonl(self.path)
        if not lines:
            append_jsonl(self.path, header)
            return
        if not isinstance(lines[0], dict) or lines[0].get("kind") != "header":
            raise ValueError(f"{self.path} is not a relabel journal; move it away, or choose another --out")
        differ = [k for k in header if lines[0].get(k) != header[k]]
        if differ and len(lines) == 1:
            # Only a header: the setup changed before any answer was saved (e.g. the first
            # request was refused for a wrong --judge-model), so there is nothing to mix up.
            atomic_write_jsonl(self.path, [header])
            return
        if differ:
            raise ValueError(
                f"{self.path} was written for a different {', '.join(differ)}; delete it to start over, or "
                "choose another --out"
            )
        for record in lines[1:]:
            self.records[record["kind"]][record["id"]] = record

    def add(self, kind: str, item_id: str, verdict: Verdict, by: str, **extra: Any) -> None:
        record = {"kind": kind, "id": item_id, "label": verdict.label, "confidence": verdict.confidence,
                  "status": verdict.status, "raw": verdict.raw, "by": by, **extra}
        append_jsonl(self.path, record)
        self.records[kind][item_id] = record

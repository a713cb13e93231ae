"""Teacher traces by rejection sampling: a teacher reasons about each item without its label,
and only traces whose free conclusion matches the reference label are kept.

``run_distill`` asks the teacher (a ``labelrl.audit.judges.Judge``: a local model or an
OpenAI-compatible endpoint) for up to ``attempts`` replies per item in reasoning mode. The
prompt is built from the item's text, the label set and the rubric only
(``teacher_messages``): the reference label is never part of it, so a kept trace is one the
teacher reached on its own, not a rationalisation of a given answer.

Attempt ``a`` (0-based) of every item uses seed ``seed + a``. An attempt is **matched** when
the strict parser (``labelrl.rewards.parse_answer``, reasoning mode) reads exactly the
reference label AND the text is a well-formed trace ``<think>…</think><answer>…</answer>``
(``labelrl.data.prompts.answer_target`` accepts it), so every kept trace is a valid CoT-SFT
target. ``keep="first"`` stops at the first matched attempt; ``keep="all"`` makes all
``attempts`` and keeps every matched one.

Every attempt is appended to the journal (``OUT.attempts.jsonl``: id, attempt, seed, text,
status, answer, matched) as soon as it is known, so a re-run asks nothing already answered.
The traces file (``OUT``, JSONL) has one record per kept trace and one (``kept`` false,
``trace`` null) per item with none: ``id``, ``label``, ``trace``, ``attempt``,
``attempts_used``, ``kept``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Sequence

from labelrl.audit.judges import Judge, JudgeError
from labelrl.data.prompts import answer_target, render_messages
from labelrl.fileio import append_jsonl, atomic_write_jsonl, atomic_write_text, drop_torn_tail, read_jsonl
from labelrl.rewards import parse_answer
from labelrl.types import Example, LabelSpace

JOURNAL_FORMAT = 1
KEEP_MODES = ("first", "all")
KeepMode = Literal["first", "all"]

__all__ = ["DistillPaths", "KEEP_MODES", "AttemptJournal", "distill_paths", "grade_attempt", "run_distill",
           "teacher_messages", "traces_records"]


@dataclass(frozen=True)
class DistillPaths:
    out: Path  # traces file (JSONL)
    journal: Path  # every attempt, appended as it arrives
    summary: Path


def distill_paths(out: str | Path) -> DistillPaths:
    """``OUT``, its attempts journal ``OUT.attempts.jsonl`` and summary ``OUT.summary.json``."""
    out = Path(out)
    if out.suffix.lower() != ".jsonl":
        raise ValueError(f"--out {out}: the traces file is JSONL; give a path ending in .jsonl")
    stem = out.name.removesuffix(out.suffix)
    return DistillPaths(out, out.with_name(stem + ".attempts.jsonl"), out.with_name(stem + ".summary.json"))


def teacher_messages(text: str, labels: LabelSpace, rubric: str | None) -> list[dict[str, str]]:
    """The teacher's chat for an item: reasoning-mode system prompt (labels, format, rubric) and
    the item text as the user turn. Takes the text, not the Example, so no label can leak in."""
    return render_messages(Example(id="", text=text, label=""), labels=labels, mode="reasoning", rubric=rubric)


def grade_attempt(text: str, label: str, labels: LabelSpace) -> dict:
    """``{"status", "answer", "matched"}`` for one teacher reply (see the module docstring)."""
    parsed = parse_answer(text, reasoning=True, mode="strict", labels=labels)
    status = parsed.status.value if hasattr(parsed.status, "value") else str(parsed.status)
    matched = parsed.answer is not None and labels.normalise(parsed.answer) == labels.normalise(label)
    if matched:
        try:
            answer_target(label, "reasoning", trace=text)
        except ValueError:
            matched = False  # parses, but lacks the <think> opener or has stray tags: not a trainable trace
    return {"status": status, "answer": parsed.answer, "matched": matched}


class AttemptJournal:
    """Append-only record of every attempt, keyed by (id, attempt); its header ties it to one
    input, label set, rubric, teacher and generation setting. A journal that holds only a header
    (no attempt yet) is started afresh for a new setup."""

    def __init__(self, path: Path, header: dict) -> None:
        self.path = Path(path)
        self.records: dict[tuple[str, int], dict] = {}
        self._lock = threading.Lock()
        drop_torn_tail(self.path)
        lines = read_jsonl(self.path) if self.path.is_file() else []
        if not lines:
            append_jsonl(self.path, header)
            return
        if lines[0].get("kind") != "header":
            raise ValueError(f"{self.path} is not a distill attempts journal; move it away, or choose another --out")
        differ = [k for k in header if lines[0].get(k) != header[k]]
        if differ and len(lines) == 1:
            # Only a header: the setup changed before any attempt was saved (e.g. the first
            # request was refused for a wrong --teacher-model), so there is nothing to mix up.
            atomic_write_jsonl(self.path, [header])
            return
        if differ:
            raise ValueError(f"{self.path} was written for a different {', '.join(differ)}; delete it to start over, "
                             "or choose another --out")
        for record in lines[1:]:
            self.records[(record["id"], record["attempt"])] = record

    def add(self, record: dict) -> None:
        with self._lock:
            append_jsonl(self.path, {"kind": "attempt", **record})
            self.records[(record["id"], record["attempt"])] = record


def journal_header(examples: Sequence[Example], labels: LabelSpace, rubric: str | None, teacher: Judge,
                   max_new_tokens: int, temperature: float, seed: int) -> dict:
    digest = hashlib.sha256()
    for ex in examples:
        digest.update(json.dumps([ex.id, ex.text, ex.label]).encode("utf-8"))
    return {"kind": "header", "format": JOURNAL_FORMAT, "input": digest.hexdigest(), "labels": list(labels.labels),
            "rubric_sha256": hashlib.sha256((rubric or "").encode("utf-8")).hexdigest(), "teacher": teacher.name,
            "max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed}


def _item_attempts(example: Example, labels: LabelSpace, rubric: str | None, teacher: Judge,
                   journal: AttemptJournal, *, attempts: int, keep: str, max_new_tokens: int,
                   temperature: float, seed: int) -> None:
    messages = teacher_messages(example.text, labels, rubric)
    for a in range(attempts):
        record = journal.records.get((example.id, a))
        if record is None:
            text = teacher.generate(messages, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed + a)
            record = {"id": example.id, "attempt": a, "seed": seed + a, "text": text,
                      **grade_attempt(text, example.label, labels)}
            journal.add(record)
        if keep == "first" and record["matched"]:
            return


def traces_records(examples: Sequence[Example], journal_records: dict[tuple[str, int], dict], *,
                   attempts: int, keep: str) -> list[dict]:
    """The traces file's records from the journal (see the module docstring), in item order.

    ``attempts_used`` counts the attempts the item consumed: up to and including the first
    match for ``keep="first"``, every journaled attempt otherwise."""
    out = []
    for ex in examples:
        tried = [journal_records[(ex.id, a)] for a in range(attempts) if (ex.id, a) in journal_records]
        matched = [r for r in tried if r["matched"]]
        if keep == "first" and matched:
            matched = matched[:1]
        used = matched[0]["attempt"] + 1 if keep == "first" and matched else len(tried)
        for r in matched:
            out.append({"id": ex.id, "label": ex.label, "trace": r["text"].strip(), "attempt": r["attempt"],
                        "attempts_used": used, "kept": True})
        if not matched:
            out.append({"id": ex.id, "label": ex.label, "trace": None, "attempt": None, "attempts_used": used,
                        "kept": False})
    return out


def run_distill(
    examples: Sequence[Example], labels: LabelSpace, rubric: str | None, teacher: Judge, paths: DistillPaths, *,
    attempts: int = 4, keep: str = "first", max_new_tokens: int = 512, temperature: float = 0.7,
    seed: int = 0, concurrency: int = 1, on_item: Callable[[str], None] | None = None,
) -> list[dict]:
    """Make (or resume) the attempts for every item and write the traces file; returns its records.

    Items run on ``concurrency`` threads (an endpoint's requests in flight; a local teacher
    should use 1). A JudgeError keeps every journaled attempt and is re-raised with how to resume.
    """
    if attempts < 1:
        raise ValueError(f"--attempts {attempts}: each item needs at least 1 attempt; set --attempts 1 or more")
    if keep not in KEEP_MODES:
        raise ValueError(f"--keep {keep!r}: choose 'first' (stop at the first matching trace) or 'all'")
    if concurrency < 1:
        raise ValueError(f"--concurrency {concurrency}: must be 1 or more requests at a time")
    journal = AttemptJournal(paths.journal, journal_header(examples, labels, rubric, teacher, max_new_tokens,
                                                           temperature, seed))

    def one(example: Example) -> None:
        _item_attempts(example, labels, rubric, teacher, journal, attempts=attempts, keep=keep,
                       max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
        if on_item is not None:
            on_item(example.id)

    try:
        if concurrency == 1:
            for example in examples:
                one(example)
        else:
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                for future in [pool.submit(one, ex) for ex in examples]:
                    future.result()
    except JudgeError as exc:
        raise JudgeError(f"{exc}. Saved so far in {journal.path}: {len(journal.records)} attempts; re-run the same "
                         "command to resume") from None
    records = traces_records(examples, journal.records, attempts=attempts, keep=keep)
    atomic_write_text(paths.out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return records

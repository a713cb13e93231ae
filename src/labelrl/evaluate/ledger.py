"""The holdout ledger: one line per evaluation, beside ``splits.json`` and in a shared store.

A holdout estimates how a final model does on data nobody has looked at. Once its number
has been seen, any choice made afterwards (another checkpoint, another threshold, another
arm) is selection on the holdout, and the number stops being an unbiased estimate. So each
model (identified by its weights' fingerprint) may be evaluated on a holdout once; a second
evaluation is refused unless explicitly allowed, and then recorded with ``repeat: true`` so
every listing marks it.

A holdout is identified by its content (``holdout_fingerprint``: its items' ids, texts and
labels), not by the directory its splits were saved in: a second splits directory made from
the same data rebuilds the same holdout, and must not come with an empty ledger. Every holdout
record is therefore also appended to the shared ledger of that holdout,
``$LABELRL_LEDGER_DIR/HOLDOUT_FINGERPRINT.jsonl`` (default
``$XDG_DATA_HOME/labelrl/ledgers`` or ``~/.local/share/labelrl/ledgers``), and the check reads
both. ``ledger.jsonl`` beside the splits keeps that directory's own history.

A *derived* evaluation (``derived: true``) applies a decision rule chosen on val (e.g. a
threshold on an SFT model's scores) to the holdout scores a model already produced in its one
look: nothing new is seen, so it is recorded but is not a look and is never refused.

Val evaluations are recorded too (never refused): together with the val metrics a run saved
during training, they give the val → holdout drop per model, which shows how much each arm's
val number was inflated by the selection done on val.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Sequence

from labelrl.fileio import append_jsonl, read_jsonl
from labelrl.types import Example

LEDGER_FILE = "ledger.jsonl"
LEDGER_DIR_ENV = "LABELRL_LEDGER_DIR"
HOLDOUT = "holdout"
SUMMARY_METRICS = ("accuracy", "balanced_accuracy", "precision", "recall", "f1", "roc_auc", "pr_auc", "ece",
                   "mean_abs_grade_error", "within_one_accuracy")
SUMMARY_COUNTS = ("n", "n_unparsed", "n_truncated", "max_new_tokens")
# Val metrics a run saved while training (sft_summary.json "best"), by our metric name.
RUN_FILE_METRICS = {"accuracy": "eval/accuracy", "balanced_accuracy": "eval/balanced_accuracy"}


def ledger_path(splits_dir: str | Path) -> Path:
    return Path(splits_dir) / LEDGER_FILE


def shared_ledger_dir() -> Path:
    """Where the shared holdout ledgers live (module docstring)."""
    configured = os.environ.get(LEDGER_DIR_ENV, "").strip()
    if configured:
        return Path(configured).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME", "").strip()
    return (Path(data_home) if data_home else Path.home() / ".local" / "share") / "labelrl" / "ledgers"


def shared_ledger_path(holdout_fingerprint: str) -> Path:
    return shared_ledger_dir() / f"{holdout_fingerprint}.jsonl"


def holdout_fingerprint(examples: Sequence[Example]) -> str:
    """sha256 of the holdout's content: every (id, text, label), sorted by id."""
    digest = hashlib.sha256()
    for ex in sorted(examples, key=lambda e: e.id):
        digest.update(json.dumps([ex.id, ex.text, ex.label], ensure_ascii=False).encode("utf-8") + b"\n")
    return digest.hexdigest()


def read_ledger(splits_dir: str | Path) -> list[dict]:
    """Every evaluation recorded beside these splits, oldest first (a torn last line is
    ignored; corruption anywhere else is a ValueError naming the line)."""
    return read_jsonl(ledger_path(splits_dir))


def holdout_records(records: Iterable[dict], model_fingerprint: str, split_fingerprint: str,
                    holdout_fp: str | None = None, method: str | None = None) -> list[dict]:
    """The holdout *looks* (derived records excluded) of this model on this holdout: the same
    splits fingerprint, or the same holdout content; with ``method``, of that method only (a
    model's label-token scores and its generated answers are two decision procedures, each
    looked at once; a record without a method is a scores look)."""
    return [r for r in records if r.get("split") == HOLDOUT and not r.get("derived")
            and r.get("model_fingerprint") == model_fingerprint
            and (method is None or (r.get("method") or "scores") == method)
            and (r.get("split_fingerprint") == split_fingerprint
                 or (holdout_fp is not None and r.get("holdout_fingerprint") == holdout_fp))]


def earlier_looks(splits_dir: str | Path, model_fingerprint: str, split_fingerprint: str,
                  holdout_fp: str | None = None, method: str | None = None) -> list[dict]:
    """This model's earlier looks at this holdout, from the splits directory's ledger and the
    holdout's shared ledger (a record in both counts once), oldest first."""
    records = read_ledger(splits_dir) + (read_jsonl(shared_ledger_path(holdout_fp)) if holdout_fp else [])
    seen, out = set(), []
    for r in holdout_records(records, model_fingerprint, split_fingerprint, holdout_fp, method):
        key = json.dumps(r, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return sorted(out, key=lambda r: str(r.get("time", "")))


def check_holdout(splits_dir: str | Path, model_fingerprint: str, split_fingerprint: str, *, allow_repeat: bool = False,
                  holdout_fp: str | None = None, method: str | None = None) -> bool:
    """Whether evaluating this model on this holdout would be a repeat.

    Raises ValueError (before anything is predicted) when it would be and ``allow_repeat``
    is False.
    """
    earlier = earlier_looks(splits_dir, model_fingerprint, split_fingerprint, holdout_fp, method)
    if earlier and not allow_repeat:
        first = earlier[0]
        ba = first.get("metrics", {}).get("balanced_accuracy")
        seen = f" (balanced accuracy {ba:.3f})" if isinstance(ba, (int, float)) else ""
        where = first.get("splits_dir") or str(splits_dir)
        raise ValueError(
            f"this holdout was already evaluated with this model (fingerprint {model_fingerprint[:12]}) on "
            f"{first.get('time', '?')}{seen}, with the splits in {where} (see {ledger_path(where)}). A holdout touched "
            "twice stops being a holdout: anything chosen after seeing its number is selection on it, and the number "
            "it then gives is inflated. Report the first number; to evaluate again anyway pass --allow-repeat-holdout "
            "(the result is recorded and marked as a repeat)"
        )
    return bool(earlier)


def summary_metrics(metrics: dict) -> dict:
    """The scalar metrics (with their intervals) worth keeping in the ledger."""
    out = {k: metrics[k] for k in SUMMARY_COUNTS if k in metrics}
    for name in SUMMARY_METRICS:
        if name in metrics:
            out[name] = metrics[name]
            out[f"{name}_ci"] = metrics.get(f"{name}_ci")
    return out


def record_evaluation(
    splits_dir: str | Path,
    *,
    split: str,
    model_spec: str,
    model_fingerprint: str,
    split_fingerprint: str,
    metrics: dict,
    repeat: bool = False,
    holdout_fp: str | None = None,
    derived: bool = False,
    extra: dict | None = None,
) -> dict:
    """Append one evaluation to the splits directory's ledger (and, for a holdout, to the
    holdout's shared ledger) and return the record."""
    record = {
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "split": split,
        "model_spec": str(model_spec),
        "model_fingerprint": model_fingerprint,
        "split_fingerprint": split_fingerprint,
        "holdout_fingerprint": holdout_fp,
        "splits_dir": str(Path(splits_dir).resolve()),
        "repeat": bool(repeat),
        "derived": bool(derived),
        "metrics": summary_metrics(metrics),
        **(extra or {}),
    }
    append_jsonl(ledger_path(splits_dir), record)
    if split == HOLDOUT and holdout_fp is not None:
        append_jsonl(shared_ledger_path(holdout_fp), record)
    return record


def _run_file_val(model_spec: str) -> dict | None:
    """Val metrics saved by the training run whose ``model/`` directory is ``model_spec``."""
    spec = Path(model_spec)
    summary = spec.parent / "sft_summary.json"
    if spec.name != "model" or not summary.is_file():
        return None
    try:
        best = json.loads(summary.read_text(encoding="utf-8")).get("best") or {}
    except json.JSONDecodeError:
        return None
    found = {ours: best[theirs] for ours, theirs in RUN_FILE_METRICS.items() if isinstance(best.get(theirs), (int, float))}
    return found or None


def drop_table(records: Iterable[dict]) -> list[dict]:
    """Per model with a holdout evaluation: val and holdout metrics and their drop (val − holdout).

    The holdout number is the model's first (non-repeat) holdout record; the val number is
    the latest val record of the same model on the same splits with the same method and
    answer key, else the val metrics its training run saved (``sft_summary.json``; these
    may cover only the first ``--eval-limit`` val items). Rows are sorted by balanced-accuracy drop, largest first.
    """
    records = list(records)
    rows = []
    seen: set[tuple[str, str]] = set()
    for rec in records:
        key = (rec.get("model_fingerprint"), rec.get("split_fingerprint"))
        if rec.get("split") != HOLDOUT or rec.get("derived") or key in seen:
            continue
        seen.add(key)
        same = (rec.get("model_fingerprint"), rec.get("split_fingerprint"), rec.get("method"), rec.get("label_col"))
        vals = [r for r in records if r.get("split") == "val"
                and (r.get("model_fingerprint"), r.get("split_fingerprint"), r.get("method"), r.get("label_col")) == same]
        val, source = (vals[-1]["metrics"], "ledger") if vals else (_run_file_val(rec["model_spec"]), "run files")
        if val is None:
            continue
        row = {"model_spec": rec["model_spec"], "model_fingerprint": key[0], "val_source": source,
               "holdout_repeat": bool(rec.get("repeat"))}
        for name in RUN_FILE_METRICS:
            v, h = val.get(name), rec["metrics"].get(name)
            row[f"val_{name}"], row[f"holdout_{name}"] = v, h
            row[f"drop_{name}"] = v - h if v is not None and h is not None else None
        rows.append(row)
    rows.sort(key=lambda r: -(r["drop_balanced_accuracy"] if r["drop_balanced_accuracy"] is not None else float("-inf")))
    return rows

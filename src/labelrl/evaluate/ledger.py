"""The holdout ledger: ``ledger.jsonl`` beside ``splits.json``, one line per evaluation.

A holdout estimates how a final model does on data nobody has looked at. Once its number
has been seen, any choice made afterwards (another checkpoint, another threshold, another
arm) is selection on the holdout, and the number stops being an unbiased estimate. So each
model (identified by its weights' fingerprint) may be evaluated on a holdout (identified by
its splits fingerprint) once; a second evaluation is refused unless explicitly allowed, and
then recorded with ``repeat: true`` so every listing marks it.

Val evaluations are recorded too (never refused): together with the val metrics a run saved
during training, they give the val → holdout drop per model, which shows how much each arm's
val number was inflated by the selection done on val.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

from labelrl.fileio import append_jsonl, read_jsonl

LEDGER_FILE = "ledger.jsonl"
HOLDOUT = "holdout"
SUMMARY_METRICS = ("accuracy", "balanced_accuracy", "precision", "recall", "f1", "roc_auc", "pr_auc", "ece",
                   "mean_abs_grade_error", "within_one_accuracy")
# Val metrics a run saved while training (sft_summary.json "best"), by our metric name.
RUN_FILE_METRICS = {"accuracy": "eval/accuracy", "balanced_accuracy": "eval/balanced_accuracy"}


def ledger_path(splits_dir: str | Path) -> Path:
    return Path(splits_dir) / LEDGER_FILE


def read_ledger(splits_dir: str | Path) -> list[dict]:
    """Every recorded evaluation, oldest first (a torn last line is ignored)."""
    return read_jsonl(ledger_path(splits_dir))


def holdout_records(records: Iterable[dict], model_fingerprint: str, split_fingerprint: str) -> list[dict]:
    return [r for r in records if r.get("split") == HOLDOUT and r.get("model_fingerprint") == model_fingerprint
            and r.get("split_fingerprint") == split_fingerprint]


def check_holdout(splits_dir: str | Path, model_fingerprint: str, split_fingerprint: str, *, allow_repeat: bool = False) -> bool:
    """Whether evaluating this model on this holdout would be a repeat.

    Raises ValueError (before anything is predicted) when it would be and ``allow_repeat``
    is False.
    """
    earlier = holdout_records(read_ledger(splits_dir), model_fingerprint, split_fingerprint)
    if earlier and not allow_repeat:
        first = earlier[0]
        ba = first.get("metrics", {}).get("balanced_accuracy")
        seen = f" (balanced accuracy {ba:.3f})" if isinstance(ba, (int, float)) else ""
        raise ValueError(
            f"the holdout in {splits_dir} was already evaluated with this model (fingerprint {model_fingerprint[:12]}) "
            f"on {first.get('time', '?')}{seen}, see {ledger_path(splits_dir)}. A holdout touched twice stops being a "
            "holdout: anything chosen after seeing its number is selection on it, and the number it then gives is "
            "inflated. Report the first number; to evaluate again anyway pass --allow-repeat-holdout (the result is "
            "recorded and marked as a repeat)"
        )
    return bool(earlier)


def summary_metrics(metrics: dict) -> dict:
    """The scalar metrics (with their intervals) worth keeping in the ledger."""
    out = {k: metrics[k] for k in ("n", "n_unparsed") if k in metrics}
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
    extra: dict | None = None,
) -> dict:
    """Append one evaluation to the ledger and return the record."""
    record = {
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "split": split,
        "model_spec": str(model_spec),
        "model_fingerprint": model_fingerprint,
        "split_fingerprint": split_fingerprint,
        "repeat": bool(repeat),
        "metrics": summary_metrics(metrics),
        **(extra or {}),
    }
    append_jsonl(ledger_path(splits_dir), record)
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
        if rec.get("split") != HOLDOUT or key in seen:
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

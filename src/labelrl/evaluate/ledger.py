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

A model has one look per holdout, however many ways it is read. Its label-token scores and its
greedy generations parsed strictly are two *readings* (``method``) of the same weights: the
first evaluation is the look, and a later evaluation by another method is recorded as a reading
of that look (``reading_of``: the look's time and splits directory), not as a second look. The
listings (``merge_readings``, ``drop_table``, ``labelrl ledger``) show each look as one row with
every reading. Reading the same method again is a repeat.

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


def reading(record: dict) -> str:
    """The method that produced a record's metrics (a record without one is a scores reading)."""
    return record.get("method") or "scores"


def holdout_records(records: Iterable[dict], model_fingerprint: str, split_fingerprint: str,
                    holdout_fp: str | None = None, method: str | None = None) -> list[dict]:
    """This model's records on this holdout (the same splits fingerprint, or the same holdout
    content), derived ones excluded: without ``method`` its *looks* (readings attached to a look
    excluded); with ``method``, every record holding that reading, a look's own or one attached
    to a look (module docstring)."""
    return [r for r in records if r.get("split") == HOLDOUT and not r.get("derived")
            and r.get("model_fingerprint") == model_fingerprint
            and (reading(r) == method if method is not None else not r.get("reading_of"))
            and (r.get("split_fingerprint") == split_fingerprint
                 or (holdout_fp is not None and r.get("holdout_fingerprint") == holdout_fp))]


def earlier_looks(splits_dir: str | Path, model_fingerprint: str, split_fingerprint: str,
                  holdout_fp: str | None = None, method: str | None = None) -> list[dict]:
    """``holdout_records`` of the splits directory's ledger and the holdout's shared ledger (a
    record in both counts once), oldest first: this model's looks at this holdout, or with
    ``method`` its records of that reading."""
    records = read_ledger(splits_dir) + (read_jsonl(shared_ledger_path(holdout_fp)) if holdout_fp else [])
    seen, out = set(), []
    for r in holdout_records(records, model_fingerprint, split_fingerprint, holdout_fp, method):
        key = json.dumps(r, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return sorted(out, key=lambda r: str(r.get("time", "")))


def plan_holdout(splits_dir: str | Path, model_fingerprint: str, split_fingerprint: str, *, allow_repeat: bool = False,
                 holdout_fp: str | None = None, method: str | None = None) -> tuple[bool, dict | None]:
    """(repeat, look): how evaluating this model on this holdout by ``method`` is recorded.

    * No earlier look: a new look ``(False, None)``.
    * An earlier look without this reading: the reading joins it ``(False, look)`` and is not
      refused: the weights are the look's, and every listing shows both readings in its row,
      so neither can be reported as the model's one number without the other beside it.
    * This reading taken before (without ``method``: any look): a repeat ``(True, None)``, and a
      ValueError (before anything is predicted) unless ``allow_repeat``.
    """
    earlier = earlier_looks(splits_dir, model_fingerprint, split_fingerprint, holdout_fp, method)
    if earlier and not allow_repeat:
        raise ValueError(_refusal(earlier[0], model_fingerprint, splits_dir, method))
    if earlier:
        return True, None
    looks = [] if method is None else earlier_looks(splits_dir, model_fingerprint, split_fingerprint, holdout_fp)
    return False, next((r for r in looks if not r.get("repeat")), looks[0] if looks else None)


def _refusal(first: dict, model_fingerprint: str, splits_dir: str | Path, method: str | None) -> str:
    ba = first.get("metrics", {}).get("balanced_accuracy")
    seen = f" (balanced accuracy {ba:.3f})" if isinstance(ba, (int, float)) else ""
    where = first.get("splits_dir") or str(splits_dir)
    how = f" and read by {method}" if method is not None else ""
    return (
        f"this holdout was already evaluated with this model (fingerprint {model_fingerprint[:12]}){how} on "
        f"{first.get('time', '?')}{seen}, with the splits in {where} (see {ledger_path(where)}). A holdout touched "
        "twice stops being a holdout: anything chosen after seeing its number is selection on it, and the number "
        "it then gives is inflated. Report the first number; to evaluate again anyway pass --allow-repeat-holdout "
        "(the result is recorded and marked as a repeat)"
    )


def check_holdout(splits_dir: str | Path, model_fingerprint: str, split_fingerprint: str, *, allow_repeat: bool = False,
                  holdout_fp: str | None = None, method: str | None = None) -> bool:
    """Whether evaluating this model on this holdout (by ``method``) would be a repeat
    (``plan_holdout``; ValueError when it would be and ``allow_repeat`` is False)."""
    return plan_holdout(splits_dir, model_fingerprint, split_fingerprint, allow_repeat=allow_repeat,
                        holdout_fp=holdout_fp, method=method)[0]


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
    reading_of: dict | None = None,
) -> dict:
    """Append one evaluation to the splits directory's ledger (and, for a holdout, to the
    holdout's shared ledger) and return the record; ``reading_of`` is the look this evaluation
    is another reading of (``plan_holdout``)."""
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
    if reading_of is not None:
        record["reading_of"] = {k: reading_of.get(k) for k in ("time", "splits_dir", "model_spec")}
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


def _is_look(record: dict) -> bool:
    return record.get("split") == HOLDOUT and not record.get("derived") and not record.get("reading_of")


def merge_readings(records: Iterable[dict]) -> list[dict]:
    """The records in order, each holdout reading attached to a look folded into that look's
    row: every holdout record that is not derived gets ``readings`` (method → metrics, the
    look's own first). A reading whose look is not among ``records`` (e.g. in another splits
    directory's ledger) keeps a row of its own, with its ``reading_of``."""
    rows: list[dict] = []
    looks: dict[tuple, dict] = {}
    for rec in records:
        if rec.get("split") != HOLDOUT or rec.get("derived"):
            rows.append(rec)
            continue
        of = rec.get("reading_of") or {}
        look = looks.get((rec.get("model_fingerprint"), of.get("time"))) if of else None
        if look is not None and reading(rec) not in look["readings"]:
            look["readings"][reading(rec)] = rec["metrics"]
            continue
        row = dict(rec, readings={reading(rec): rec["metrics"]})
        if _is_look(rec):
            looks.setdefault((rec.get("model_fingerprint"), rec.get("time")), row)
        rows.append(row)
    return rows


def _val_metrics(records: list[dict], look: dict, method: str) -> tuple[dict | None, str]:
    """(val metrics, source) of the look's model by ``method``: its latest val record on the same
    splits with the same answer key, else, for the look's own method, what its training run saved."""
    same = (look.get("model_fingerprint"), look.get("split_fingerprint"), method, look.get("label_col"))
    vals = [r for r in records if r.get("split") == "val" and not r.get("derived")
            and (r.get("model_fingerprint"), r.get("split_fingerprint"), reading(r), r.get("label_col")) == same]
    if vals:
        return vals[-1]["metrics"], "ledger"
    return (_run_file_val(look["model_spec"]) if method == reading(look) else None), "run files"


def _drops(val: dict, holdout: dict) -> dict:
    row = {}
    for name in RUN_FILE_METRICS:
        v, h = val.get(name), holdout.get(name)
        row[f"val_{name}"], row[f"holdout_{name}"] = v, h
        row[f"drop_{name}"] = v - h if v is not None and h is not None else None
    return row


def drop_table(records: Iterable[dict]) -> list[dict]:
    """Per model with a holdout look: val and holdout metrics and their drop (val − holdout).

    The holdout number is the model's first (non-repeat) look; the val number is the latest val
    record of the same model on the same splits with the same method and answer key, else the
    val metrics its training run saved (``sft_summary.json``; these may cover only the first
    ``--eval-limit`` val items). The row's top-level figures are the look's own reading; its
    ``readings`` hold every reading of the look with a val number (method → val source and
    figures), so a direct model read by scores and by generations is one row. Rows are sorted by
    balanced-accuracy drop, largest first.
    """
    records = list(records)
    rows = []
    seen: set[tuple[str, str]] = set()
    for look in merge_readings(records):
        key = (look.get("model_fingerprint"), look.get("split_fingerprint"))
        if look.get("split") != HOLDOUT or look.get("derived") or key in seen:
            continue
        seen.add(key)
        readings = {}
        for method, metrics in look["readings"].items():
            val, source = _val_metrics(records, look, method)
            if val is not None:
                readings[method] = {"val_source": source, **_drops(val, metrics)}
        own = readings.get(reading(look))
        if own is None:
            continue
        rows.append({"model_spec": look["model_spec"], "model_fingerprint": key[0], "method": reading(look),
                     "holdout_repeat": bool(look.get("repeat")), **own, "readings": readings})
    rows.sort(key=lambda r: -(r["drop_balanced_accuracy"] if r["drop_balanced_accuracy"] is not None else float("-inf")))
    return rows

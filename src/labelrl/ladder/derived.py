"""Arms that train nothing: the SFT model with a decision rule chosen on val (``threshold``).

The baseline an RL arm on labels has to beat is the SFT model it started from, with the
decision rule tuned on val (``labelrl.evaluate.decision``): RL on labels mostly moves the
operating point along the SFT model's ROC curve, and a threshold moves it for free. A
``threshold`` arm reads its parent's val and holdout predictions (label-token scores) and writes:

* ``eval/ARM-val.*`` and ``eval/ARM-holdout.*``: the rule with the best val balanced accuracy
  (a threshold on P(positive) for binary tasks, per-label offsets otherwise);
* binary tasks, for each RL arm started from the same parent: ``eval/ARM-recall-RL-holdout.*``,
  the threshold whose val recall matches that RL arm's val recall, on the holdout.

Nothing new is looked at: the holdout scores are those of the parent's one look. The ledger
records each as *derived* (``labelrl.evaluate.ledger``), never as a look.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from labelrl.fileio import atomic_write_json
from labelrl.ladder.layout import eval_paths


class ThresholdConfig(BaseModel):
    """A ``threshold`` arm (wired by the ladder: ``out``, ``parent``, ``n_boot``)."""

    model_config = ConfigDict(extra="forbid")

    out: Path
    parent: Path
    n_boot: int = Field(1000, ge=0)
    recall_match: bool = Field(True, description="Binary tasks: also apply, for each RL arm from the same parent, the threshold matching its val recall.")
    positive_label: Optional[str] = Field(None, description="Binary tasks: the positive label (default: the task's).")


def matched_name(arm_name: str, rl_arm: str) -> str:
    """The evaluation name of the threshold matching ``rl_arm``'s val recall."""
    return f"{arm_name}-recall-{rl_arm}"


def _write_derived(task_dir: Path, name: str, split: str, scored, rule: dict, n_boot: int) -> dict:
    """Apply ``rule`` to a scored model's predictions, write them and their metrics as an
    evaluation named ``name``, and record it in the ledger as derived; an existing one is read."""
    from labelrl.evaluate.decision import apply_rule
    from labelrl.evaluate.io import write_predictions
    from labelrl.evaluate.ledger import record_evaluation
    from labelrl.evaluate.metrics import classification_metrics

    pred_path, report_path = eval_paths(task_dir, name, split)
    if report_path.is_file():
        return json.loads(report_path.read_text(encoding="utf-8"))
    pred = apply_rule(scored, rule, source=name)
    metrics = classification_metrics(pred.y_true, pred.y_pred, pred.labels, scores=pred.scores(), n_boot=n_boot)
    write_predictions(pred, pred_path)
    info = scored.info
    files = {"predictions": str(pred_path.resolve()), "report": str(report_path.resolve())}
    record = record_evaluation(
        task_dir, split=split, model_spec=f"{info.get('model_spec')} + {rule['kind']} chosen on val",
        model_fingerprint=str(info.get("model_fingerprint")), split_fingerprint=str(info.get("split_fingerprint")),
        metrics=metrics, holdout_fp=info.get("holdout_fingerprint"), derived=True,
        extra={"method": "threshold", "rule": rule, "derived_from": info.get("model_spec"), "n": pred.n, "files": files})
    report = {"metrics": metrics, "info": pred.info, "ledger": record, "files": files, "rule": rule}
    atomic_write_json(report_path, report)
    return report


def evaluate_threshold_arm(task_dir: Path, arm_name: str, cfg: ThresholdConfig, rl_arms: list[str],
                           positive_label: str | None) -> dict:
    """The arm's ladder state: its rule, val and holdout evaluations, the recall-matched holdout
    evaluations per RL arm in ``rl_arms`` (finished arms from the same parent), and ``thin_val``:
    the labels val held too few items of to place a rule (``labelrl.evaluate.decision.thin_labels``)."""
    from labelrl.evaluate.decision import best_rule, recall_matched_rule, thin_labels
    from labelrl.evaluate.io import read_predictions
    from labelrl.evaluate.ledger import summary_metrics
    from labelrl.evaluate.sweep import operating_point

    parent = cfg.parent.name
    positive = cfg.positive_label or positive_label
    sources = {split: eval_paths(task_dir, parent, split)[0] for split in ("val", "holdout")}
    missing = [str(p) for p in sources.values() if not p.is_file()]
    if missing:
        raise ValueError(f"{arm_name}: needs its parent {parent!r}'s val and holdout predictions ({', '.join(missing)} "
                         "missing); the parent must finish first")
    val, holdout = (read_predictions(sources[s], positive_label=positive) for s in ("val", "holdout"))
    rule = best_rule(val, positive)
    state = {"rule": rule, "derived_from": parent, "thin_val": thin_labels(val)}
    for split, scored in (("val", val), ("holdout", holdout)):
        state[split] = summary_metrics(_write_derived(task_dir, arm_name, split, scored, rule, cfg.n_boot)["metrics"])
    state["matched"] = {}
    if val.labels.kind == "binary" and cfg.recall_match:
        for rl in rl_arms:
            rl_val = read_predictions(eval_paths(task_dir, rl, "val")[0], positive_label=positive)
            recall = operating_point(rl_val, rule["positive_label"])["recall"]
            matched = recall_matched_rule(val, recall, rule["positive_label"], name=rl)
            report = _write_derived(task_dir, matched_name(arm_name, rl), "holdout", holdout, matched, cfg.n_boot)
            state["matched"][rl] = {"rule": matched, "holdout": summary_metrics(report["metrics"])}
    return state


def rescore_against(task_dir: Path, arm_name: str, split: str, key_name: str, key: dict[str, str], n_boot: int) -> dict:
    """The arm's ``split`` predictions scored against another answer key (``id → label``), written
    as ``eval/ARM-SPLIT-key-NAME.*``; the holdout record is derived (the same predictions, no new
    look). Items the key lacks are left out. Returns the summary metrics (read back on a re-run)."""
    from labelrl.evaluate.io import Predictions, predictions_table, read_predictions, write_predictions
    from labelrl.evaluate.ledger import record_evaluation, summary_metrics
    from labelrl.evaluate.metrics import classification_metrics

    pred_path, report_path = eval_paths(task_dir, arm_name, f"{split}-key-{key_name}")
    if report_path.is_file():
        return summary_metrics(json.loads(report_path.read_text(encoding="utf-8"))["metrics"])
    pred = read_predictions(eval_paths(task_dir, arm_name, split)[0])
    rows = [i for i, item in enumerate(pred.ids) if item in key and pred.labels.normalise(key[item]) is not None]
    if not rows:
        raise ValueError(f"answer key {key_name!r}: none of {arm_name}'s {split} items has a label there; check the column")
    pred = pred.take(rows)
    scores = pred.scores()
    table = predictions_table(pred.ids, [pred.labels.normalise(key[i]) for i in pred.ids], pred.y_pred,
                              pred.table.column("parse_status").to_pylist(), pred.labels, scores)
    rescored = Predictions(table, pred.labels, dict(pred.info, answer_key=key_name))
    metrics = classification_metrics(rescored.y_true, rescored.y_pred, rescored.labels, scores=scores, n_boot=n_boot)
    write_predictions(rescored, pred_path)
    info = pred.info
    record = record_evaluation(
        task_dir, split=split, model_spec=str(info.get("model_spec")), model_fingerprint=str(info.get("model_fingerprint")),
        split_fingerprint=str(info.get("split_fingerprint")), metrics=metrics, holdout_fp=info.get("holdout_fingerprint"),
        derived=True, extra={"method": info.get("method"), "label_col": key_name, "n": rescored.n,
                             "files": {"predictions": str(pred_path.resolve()), "report": str(report_path.resolve())}})
    atomic_write_json(report_path, {"metrics": metrics, "info": rescored.info, "ledger": record, "answer_key": key_name})
    return summary_metrics(metrics)


def relabel_arm(task_dir: Path, arm_name: str, cfg, console) -> dict:
    """A ``relabel`` arm: the task's samples (train, val, holdout) relabelled by a judge under the
    rubric (``labelrl.audit.relabel_run``; resumable from its journal), saved as
    ``ARM/answer_key.json`` (id → final and original label) for the evaluations and the residue.
    Returns the summary figures the report shows."""
    from labelrl.audit.relabel_run import final_labels, run_relabel_config

    arm_dir = task_dir / arm_name
    key_path = arm_dir / "answer_key.json"
    if not key_path.is_file():
        samples = json.loads((task_dir / "samples.json").read_text(encoding="utf-8"))
        atomic_write_json(arm_dir / "ids.json", sorted({i for s in samples.values() for i in s["ids"]}))
        summary = run_relabel_config(cfg)
        final = final_labels(cfg)
        original = {r["id"]: r["label"] for r in _sample_labels(cfg)}
        atomic_write_json(key_path, {"labels": final, "original": {i: original.get(i) for i in final}})
        console.print(f"{arm_name}: {summary['n_items']} items relabelled; the final label differs from the original "
                      f"for {summary['n_changed']}")
    summary = json.loads((arm_dir / "relabelled.summary.json").read_text(encoding="utf-8"))
    keep = ("n_items", "n_changed", "changed_rate", "n_adjudicated", "n_low_confidence", "agreement_with_original",
            "self_agreement", "judge", "adjudicator", "min_confidence")
    return {k: summary.get(k) for k in keep}


def _sample_labels(cfg) -> list[dict]:
    """(id, original label) of the relabelled items."""
    from labelrl.audit.relabel_run import _items

    return [{"id": ex.id, "label": ex.label} for ex in _items(cfg).examples]

"""The RL policy scored on val while it trains (``--val-path``): ``RUN_DIR/val_path.jsonl``.

At step 0 (the starting model), every ``--checkpoint-every`` steps and at the last step, the main
process scores the policy on the val sample (``labelrl.data.prepare.val_sample``: the items SFT's
in-loop evaluation and, with the ladder's ``eval_limit``, the ladder's val evaluations score) with
the scorer of ``labelrl eval`` and of SFT (``labelrl.evaluate.predict.score_counted``), and appends
``labelrl.evaluate.val_path.val_point`` of its answers. The other processes wait at the step's
checkpoint barrier (at step 0, at the one here).

The items are ``--eval-limit`` of the val sample of ``--val-path-within`` items (the whole split
when unset): the ladder sets its task's val sample there, so the path's items are among those its
val evaluations score, and with ``--val-path-start`` (the ladder gives each RL arm its parent's val
predictions) step 0's point is read from the starting model's scores instead of scoring the same
model again. It is read only when the file's model has the starting model's weights bit for bit
(``labelrl.models.load.model_fingerprint``), its scores were taken in the run's precision and it
holds every path item; otherwise step 0 is scored, and stderr says why. The line then names the
file (``read_from``).

A step's line is written before its checkpoint, so a kill loses it only together with the
checkpoint: on resume the lines after the checkpoint's step are dropped (as ``metrics.jsonl``'s
are) and redone, and a due step without its line (a kill during step 0's scoring) is scored again.

With ``--val-path-end`` (the ladder's: it scores every RL run on its val sample right after
training) the last step is not scored here either. The run ends with ``val_path_pending`` in
``rl_summary.json`` (the step, the path's items and labels, the final model's fingerprint and
where its val predictions will be), and ``complete_val_path``, called once those predictions are
written, appends the step's line read from them (``read_from``) and makes the collapse flag again
with it. When they cannot stand for the final model (other weights, precision or items) the line
is left out and the summary says why (``val_path_end_missing``). A kill between the two writes
leaves the pending entry: the next call writes the line again.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from labelrl import metrics_keys as K
from labelrl.data.prepare import prompt_ids, val_sample
from labelrl.data.sample import sample_examples
from labelrl.evaluate.val_path import VAL_PATH_FILE, val_point
from labelrl.fileio import append_jsonl, atomic_write_json, atomic_write_jsonl, read_jsonl
from labelrl.types import LabelSpace

PENDING = "val_path_pending"  # rl_summary.json: the last step's point, to be read from the final val predictions


def enabled(cfg) -> bool:
    """``--val-path``, by default on in direct mode (label-token scoring needs direct answers)."""
    return cfg.val_path if cfg.val_path is not None else cfg.mode == "direct"


def due(step: int, cfg) -> bool:
    """Step 0, every ``--checkpoint-every`` steps and the last step are on the path."""
    return step == 0 or step % cfg.checkpoint_every == 0 or step == cfg.steps


def scored_here(step: int, cfg) -> bool:
    """A due step the run scores itself (``--val-path`` on): all but the last under
    ``--val-path-end`` (module docstring)."""
    return enabled(cfg) and due(step, cfg) and not (deferred(cfg) and step == cfg.steps and step > 0)


def deferred(cfg) -> bool:
    """The last step's point is read from the final model's val predictions (``--val-path-end``)."""
    return enabled(cfg) and getattr(cfg, "val_path_end", None) is not None


def start_val_path(run) -> None:
    """Before the first step of an invocation: a fresh run starts the file anew, a resumed one keeps
    the lines up to its checkpoint's step; the current step is scored when due and not yet there."""
    if not enabled(run.cfg):
        return
    if run.is_main:
        path = run.run_dir / VAL_PATH_FILE
        kept = [r for r in read_jsonl(path) if r["step"] <= run.step] if run.cfg.resume else []
        if path.exists():
            atomic_write_jsonl(path, kept)  # one rewrite: a kill here keeps the old file or the cut one
        if scored_here(run.step, run.cfg) and all(r["step"] != run.step for r in kept):
            score_and_write(run)
    run.accelerator.wait_for_everyone()


def record_val_point(run) -> dict:
    """After step ``run.step``'s update and before its checkpoint: score and append the line when
    the step is due; returns ``{perf/val_seconds: s}`` for the step's metrics (main process only)."""
    if not (run.is_main and enabled(run.cfg) and scored_here(run.step, run.cfg)):
        return {}
    record = score_and_write(run)
    return {K.VAL_SECONDS: record["seconds"]} if record else {}


def score_and_write(run) -> dict | None:
    """Score the policy on the val sample, append the line, return it (None: the val split is empty)."""
    from labelrl.evaluate.predict import score_counted

    started = time.perf_counter()
    cfg, data = run.cfg, run.data
    examples, prompts = val_prompts(run, path_items(data, cfg))
    if not examples:
        return None
    probs, read_from = None, {}
    if run.step == 0 and cfg.val_path_start is not None:
        probs, why = starting_scores(run, examples)
        if probs is None:
            print(f"val path: step 0 scored, not read from {cfg.val_path_start}: {why}", file=sys.stderr, flush=True)
        else:
            read_from = {"read_from": str(cfg.val_path_start)}
    if probs is None:
        probs = score_counted(run.policy, run.tokenizer, prompts, data.dataset.labels, batch_size=16,
                              description=f"scoring {len(examples)} val items at step {run.step}", plain=cfg.quiet,
                              dtype=run.dtype).double().numpy()
    point = val_point(data.dataset.labels, [ex.label for ex in examples], probs)
    record = {"step": run.step, **point, "seconds": round(time.perf_counter() - started, 3), **read_from}
    append_jsonl(run.run_dir / VAL_PATH_FILE, record)
    return record


def path_items(data, cfg) -> list:
    """The path's items: ``--eval-limit`` of the val sample of ``--val-path-within`` items."""
    return sample_examples(val_sample(data, cfg.val_path_within), cfg.eval_limit, data.split_seed)


def starting_scores(run, examples: list) -> tuple[np.ndarray | None, str]:
    """The label probabilities [N, K] of ``examples`` from ``--val-path-start`` (module
    docstring), or None and why they cannot stand for scoring the starting model here."""
    from labelrl.models.load import model_fingerprint
    from labelrl.models.precision import precision_name

    return scores_for(Path(run.cfg.val_path_start), [ex.id for ex in examples], run.data.dataset.labels.labels,
                      precision_name(run.dtype), lambda: model_fingerprint(run.policy), "the starting model")


def scores_for(path: Path, ids: list[str], labels, precision: str, fingerprint,
               whose: str) -> tuple[np.ndarray | None, str]:
    """The label probabilities [N, K] of the items ``ids`` from the val predictions at ``path``,
    or None and why they cannot stand for scoring ``whose`` model, the one whose fingerprint
    ``fingerprint()`` gives (called last: it hashes every weight), in ``precision`` with
    ``labels`` in this order."""
    from labelrl.evaluate.io import read_predictions

    if not path.is_file():
        return None, "no such file"
    pred = read_predictions(path)
    info, scores = pred.info, pred.scores()
    wanted = {"split": "val", "method": "scores", "precision": precision}
    differs = [f"{k} {info.get(k)!r}, not {v!r}" for k, v in wanted.items() if info.get(k) != v]
    if differs or scores is None or tuple(pred.labels.labels) != tuple(labels):
        return None, "; ".join(differs) or f"its labels {list(pred.labels.labels)} or scores do not fit this run's"
    rows = {item: i for i, item in enumerate(pred.ids)}
    missing = [item for item in ids if item not in rows]
    if missing:
        return None, f"{len(missing)} of the path's {len(ids)} items are not in it (e.g. id {missing[0]!r})"
    if info.get("model_fingerprint") != fingerprint():
        return None, f"its model's weights are not {whose}'s"
    return scores[[rows[item] for item in ids]], ""


def pending_end(run) -> dict | None:
    """``rl_summary.json``'s ``val_path_pending`` of a run that finished its steps under
    ``--val-path-end`` (module docstring), or None when its last step was scored here."""
    from labelrl.models.load import model_fingerprint
    from labelrl.models.precision import precision_name
    from labelrl.train.collapse import collapse_settings

    cfg = run.cfg
    if not (deferred(cfg) and run.step >= cfg.steps > 0):
        return None
    examples, _ = val_prompts(run, path_items(run.data, cfg))
    labels = run.data.dataset.labels
    return {"step": run.step, "predictions": str(cfg.val_path_end), "ids": [ex.id for ex in examples],
            "y_true": [ex.label for ex in examples], "labels": list(labels.labels), "kind": labels.kind,
            "positive": labels.positive, "precision": precision_name(run.dtype),
            "model_fingerprint": model_fingerprint(run.policy), "collapse_settings": collapse_settings(cfg)}


def complete_val_path(run_dir: str | Path) -> bool:
    """Append the pending last step's line of ``RUN_DIR/val_path.jsonl`` from the final model's
    val predictions and make the collapse flag in ``rl_summary.json`` again (module docstring).
    False when nothing is pending or the predictions are not written yet; else True (the line
    appended, or left out with the reason in ``val_path_end_missing``)."""
    from labelrl.train.collapse import detect_collapse

    run_dir = Path(run_dir)
    summary_path = run_dir / "rl_summary.json"
    summary = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.is_file() else {}
    pending = summary.get(PENDING)
    if not pending or not Path(pending["predictions"]).is_file():
        return False
    started, source = time.perf_counter(), Path(pending["predictions"])
    probs, why = scores_for(source, pending["ids"], pending["labels"], pending["precision"],
                            lambda: pending["model_fingerprint"], "the final model")
    lines = [r for r in read_jsonl(run_dir / VAL_PATH_FILE) if r.get("step") != pending["step"]]
    if probs is None:
        summary["val_path_end_missing"] = f"step {pending['step']} not read from {source}: {why}"
        print(f"val path: {summary['val_path_end_missing']}", file=sys.stderr, flush=True)
    else:
        labels = LabelSpace(tuple(pending["labels"]), kind=pending["kind"], positive=pending["positive"])
        point = val_point(labels, pending["y_true"], probs)
        lines.append({"step": pending["step"], **point, "seconds": round(time.perf_counter() - started, 3),
                      "read_from": str(source)})
    atomic_write_jsonl(run_dir / VAL_PATH_FILE, lines)  # first: a kill before the summary leaves it pending
    summary.pop(PENDING)
    summary["collapse"] = detect_collapse(run_dir, **pending["collapse_settings"])
    atomic_write_json(summary_path, summary)
    return True


def val_path_pending(run_dir: str | Path) -> bool:
    """Whether the run's last val point waits for its val predictions (``complete_val_path``)."""
    path = Path(run_dir) / "rl_summary.json"
    return path.is_file() and bool(json.loads(path.read_text(encoding="utf-8")).get(PENDING))


def val_prompts(run, examples: list) -> tuple[list, list[list[int]]]:
    """The val items and their prompt ids, fitted to the model's context with room for the answer
    by ``--on-long-item``, as ``labelrl eval`` fits them (``labelrl.evaluate.predict.fit_to_context``)."""
    from labelrl.data.length import fit_prompts
    from labelrl.evaluate.predict import answer_tokens

    cfg, data, tokenizer = run.cfg, run.data, run.tokenizer
    render = lambda ex: prompt_ids(tokenizer, [ex], data, cfg.mode)[0]  # noqa: E731
    context = getattr(getattr(run.policy, "config", None), "max_position_embeddings", None)
    if not context or not examples:
        return examples, [render(ex) for ex in examples]
    answer = answer_tokens(tokenizer, data.dataset.labels, cfg.mode, "scores", None)
    _, kept, prompts, _ = fit_prompts(tokenizer, examples, render, context - answer, policy=cfg.on_long_item,
                                      stage="val items", limit=f"the model's context of {context} tokens with {answer} "
                                      "for the answer", fix="shorten the texts")
    return kept, prompts

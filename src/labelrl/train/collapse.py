"""Collapse to one answer: an RL run that ends up answering one label for (nearly) every item.

A run at too high a learning rate can fall into answering one label whatever the item. Its
holdout scores are then the scores of a constant predictor, and reporting them as the
method's result ("RL is worse than SFT") misreads an optimisation accident. So the run is
named: *collapsed to L at step S*.

**The rule.** Given a series of (step, {label: share of the answers}) and each label's share
of the items answered, the run is collapsed to L at step S when L takes at least ``share``
(default 0.95) of the answers at k consecutive points of the series, while L's share of the
items is below ``max_label_share`` (default 0.8): a task whose items are 90% one label and a
model that answers that label is not flagged, since answering it is what a sound model nearly
does. S is the first step of the first such run of k points; ``share`` must exceed 0.5 so that
at most one label can qualify at a point. The flag's ``share`` is L's mean share over those k
points. A point with no answer at all (every share 0: nothing parsed) says nothing about which
label the model prefers: it is passed over, neither counting towards k nor ending a run, so a
model that answers "ham" or breaks its format is still collapsed to ham.

**The two series** (each judged by the same rule; the earlier flag wins, rollouts on a tie):

* ``rollouts``: per RL step, each label's share among the step's parsed rollout answers
  (``rollout/answer_share/<label>`` in metrics.jsonl), against the labels' shares of the
  training items (``groups/label_share_data/<label>``, logged with every step). Unparsed
  answers are left out of the denominator. Here k = ``collapse_steps`` steps.
* ``val``: per in-loop evaluation after the first update, each label's share of the greedy
  (argmax) val answers (``label_share`` of ``RUN_DIR/val_path.jsonl``,
  ``labelrl.evaluate.val_path``), when that file exists, against the labels' shares of the val
  sample scored. Here k = ``evals_needed(n_evals, collapse_steps)``: k evaluations, but never
  more than half of the n evaluations made (at least one). A greedy answer on every val item is
  far stronger evidence than one step's B×G samples, and a run evaluated every 10 steps for 20
  steps has too few points for 3 in a row.

**Inherited, not caused.** The starting model's evaluation (step 0 of ``val_path.jsonl``) is the
baseline: a label on which it is already collapsed (the rule at that one point) is never flagged,
in either series. Answering it is the parent's doing (its own verdict shows it), and RL that kept
it is not an optimisation accident.
"""

from __future__ import annotations

from pathlib import Path
from typing import Collection, Mapping, Sequence

from labelrl import metrics_keys as K
from labelrl.fileio import read_jsonl

METRICS_FILE = "metrics.jsonl"
SERIES = ("rollouts", "val")
DEFAULTS = {"share": 0.95, "steps": 3, "max_label_share": 0.8}


def answer_shares(answers: Sequence[str | None], label_names: Sequence[str]) -> dict[str, float]:
    """``{label: share}`` of each label among the parsed ``answers`` (None: unparsed, left out of
    the denominator). Every label of ``label_names`` is present; all are 0 when nothing parsed.
    An answer outside ``label_names`` counts in the denominator but has no share of its own."""
    parsed = [a for a in answers if a is not None]
    if not parsed:
        return {label: 0.0 for label in label_names}
    return {label: sum(a == label for a in parsed) / len(parsed) for label in label_names}


def evals_needed(n_evals: int, steps: int) -> int:
    """Consecutive evaluations that make a val collapse: ``steps`` (k), but at most half of the
    ``n_evals`` evaluations made, and at least 1 (module docstring)."""
    return max(1, min(steps, n_evals // 2))


def _check(share: float, steps: int, max_label_share: float) -> None:
    if not 0.5 < share <= 1:
        raise ValueError(f"collapse_share={share}: must be in (0.5, 1] so that at most one label can hold it; "
                         "set e.g. --collapse-share 0.95")
    if steps < 1:
        raise ValueError(f"collapse_steps={steps}: a collapse needs at least 1 step; set --collapse-steps 1 or more")
    if not 0 < max_label_share <= 1:
        raise ValueError(f"collapse_max_label_share={max_label_share}: must be in (0, 1]; set e.g. "
                         "--collapse-max-label-share 0.8")


def find_collapse(series: Sequence[tuple[int, Mapping[str, float]]], item_share: Mapping[str, float], *,
                  share: float = DEFAULTS["share"], steps: int = DEFAULTS["steps"],
                  max_label_share: float = DEFAULTS["max_label_share"], inherited: Collection[str] = ()) -> dict | None:
    """The first collapse in ``series`` (points in order: ``(step, {label: share})``) by the
    module docstring's rule with k = ``steps``: ``{"label", "step", "share"}`` (``step``: the first
    step of the run of k points; ``share``: the label's mean share over them), or None. Points
    with every share 0 (nothing parsed) are passed over. ``item_share`` gives each label's share
    of the items answered (a label absent there: 0); labels in ``inherited`` are never flagged."""
    _check(share, steps, max_label_share)
    run_label, run = None, []
    for step, shares in series:
        if not any(shares.values()):  # nothing parsed: no evidence either way
            continue
        top = max(shares, key=lambda label: shares[label])
        held = shares[top] >= share and item_share.get(top, 0.0) < max_label_share and top not in inherited
        if not held:
            run_label, run = None, []
            continue
        if top != run_label:
            run_label, run = top, []
        run.append((step, shares[top]))
        if len(run) == steps:
            return {"label": top, "step": run[0][0], "share": sum(s for _, s in run) / steps}
    return None


def rollout_series(records: Sequence[dict]) -> list[tuple[int, dict[str, float]]]:
    """(step, {label: share of parsed rollout answers}) of each metrics.jsonl record that has them."""
    prefix = K.ANSWER_SHARE + "/"
    out = []
    for record in records:
        shares = {k[len(prefix):]: float(v) for k, v in record.items() if k.startswith(prefix)}
        if shares:
            out.append((int(record[K.STEP]), shares))
    return out


def data_shares(records: Sequence[dict]) -> dict[str, float]:
    """Each label's share of the training items, as logged with the steps (the same every step)."""
    prefix = K.LABEL_SHARE_DATA + "/"
    for record in records:
        shares = {k[len(prefix):]: float(v) for k, v in record.items() if k.startswith(prefix)}
        if shares:
            return shares
    return {}


def detect_collapse(run_dir: str | Path, *, share: float = DEFAULTS["share"], steps: int = DEFAULTS["steps"],
                    max_label_share: float = DEFAULTS["max_label_share"],
                    val_item_share: Mapping[str, float] | None = None) -> dict | None:
    """The run's collapse flag from its files, both series (module docstring):
    ``{"label", "step", "share", "series"}`` of the earlier flag, or None. ``val_item_share``: the
    labels' shares of the val sample scored (default: of the training items)."""
    from labelrl.evaluate.val_path import read_val_path  # numpy and scikit-learn: only when a run is judged

    run_dir = Path(run_dir)
    records = read_jsonl(run_dir / METRICS_FILE)
    train = data_shares(records)
    val = train if val_item_share is None else dict(val_item_share)
    evals = [(int(r["step"]), {str(k): float(v) for k, v in (r.get("label_share") or {}).items()})
             for r in read_val_path(run_dir)]
    rule = {"share": share, "max_label_share": max_label_share}
    start = [(step, shares) for step, shares in evals if step == 0]
    inherited = {flag["label"]} if (flag := find_collapse(start, val, steps=1, **rule)) else set()
    evals = [(step, shares) for step, shares in evals if step > 0]
    flags = []
    for name, points, items, k in (("rollouts", rollout_series(records), train, steps),
                                   ("val", evals, val, evals_needed(len(evals), steps))):
        flag = find_collapse(points, items, steps=k, inherited=inherited, **rule)
        if flag is not None:
            flags.append({**flag, "series": name})
    return min(flags, key=lambda f: (f["step"], SERIES.index(f["series"])), default=None)


def run_collapse(run) -> dict | None:
    """The flag of an RL run (``labelrl.train.rl.RLRun``) from its files, with the label shares
    of the val sample its in-loop evaluations score (``labelrl.data.prepare.val_sample``)."""
    from labelrl.data.prepare import val_sample

    examples = val_sample(run.data, getattr(run.cfg, "eval_limit", None))
    labels = run.data.dataset.labels.labels
    val = {x: sum(ex.label == x for ex in examples) / len(examples) for x in labels} if examples else None
    return detect_collapse(run.run_dir, val_item_share=val, **collapse_settings(run.cfg))


def collapse_settings(cfg) -> dict:
    """The detector's settings from an RL config (its ``collapse_*`` fields)."""
    return {"share": cfg.collapse_share, "steps": cfg.collapse_steps, "max_label_share": cfg.collapse_max_label_share}


def collapse_text(flag: Mapping) -> str:
    """``collapsed to ham at step 5``: how every summary, table and verdict names a collapse."""
    return f"collapsed to {flag['label']} at step {flag['step']}"


def collapse_detail(flag: Mapping) -> str:
    """``collapsed to ham at step 5 (0.97 of the parsed rollout answers)``."""
    what = "the parsed rollout answers" if flag.get("series", "rollouts") == "rollouts" else "the greedy val answers"
    return f"{collapse_text(flag)} ({flag['share']:.2f} of {what})"

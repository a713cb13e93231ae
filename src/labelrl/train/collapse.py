"""Collapse to one answer: an RL run that ends up answering one label whatever the item.

A run at too high a learning rate can fall into answering one label whatever the item. Its
holdout scores are then the scores of a constant predictor, and reporting them as the
method's result ("RL is worse than SFT") misreads an optimisation accident. So the run is
named: *collapsed to L at step S*.

**The rule.** A series is a sequence of points (step, {label: share of the parsed answers},
{label: recall}), where a label's recall is the share of the items of that label answered with
it (an unparsed answer counts as wrong; None: no item of that label at the point). A point is
*collapsed to L* when both

(a) L holds at least ``share`` (default 0.95) of the parsed answers, and
(b) the answers carry (almost) no information about the items: their lift over chance is below
    ``max_lift`` (default 0.25), where, over the K labels that have items at the point,
    BA = the mean of their recalls (balanced accuracy) and lift = (BA − 1/K) / (1 − 1/K).

The run is collapsed to L at step S when k consecutive points are collapsed to L; S is the first
step of the first such run of k points, and the flag's ``share`` and ``lift`` are L's mean share
and the mean lift over those k points. ``share`` must exceed 0.5 so that at most one label can
qualify at a point. A point that is no evidence is passed over, neither counting towards k nor
ending a run: one where nothing parsed (every share 0), and one where fewer than 2 labels have
items (a lift needs two); so a model that answers "ham" or breaks its format is still collapsed
to ham (its unparsed answers are wrong answers in the recalls).

*Why information, not shares.* Whether answering one label is a collapse depends on the items,
not on the share alone: on sms-spam (86.6% ham) a constant "ham" has accuracy 0.866 but recalls
1 and 0, so BA = 1/2 and lift 0 (a constant answer has lift exactly 0 on any label mix), while a
sound model answering ham on 96.5% of a 97%-ham task with spam recall 0.9 has ham recall
(0.965 − 0.03·0.1)/0.97 = 0.992, BA 0.946, lift 0.89. An earlier rule exempted a label making
up ≥ 0.8 of the items, and so never flagged the constant "ham" on sms-spam.

*Why max_lift = 0.25.* With (a), the answers other than L are at most 1 − share = 5% of the
items; the most they can add to BA is being right on the smallest label (item share m), whose
recall is then at most 0.05/m, while L's recall is at most 1. So BA ≤ (1 + 0.05/m)/K and
lift ≤ (0.05/m)/(K − 1). A 5-grade task whose rarest grade is 10% of the items: lift ≤
(0.05/0.10)/4 = 0.125, and under 0.25 while that grade holds more than 5%. A sound model is far above:
spam recalls 0.95/0.90 give BA 0.925, lift 0.85. A binary task with a rare label (m = 0.134 on
sms-spam) can reach lift 0.37 at share 0.95 (spam recall 0.37, ham recall 1): a weak model that
still separates some items, not a constant one, and is not flagged. The threshold is this
argument's choice, not a measured one: lower it to flag fewer runs, raise it to flag more.

**The two series** (each judged by the same rule; the earlier flag wins, rollouts on a tie):

* ``rollouts``: per RL step, each label's share among the step's parsed rollout answers
  (``rollout/answer_share/<label>`` in metrics.jsonl) and each label's recall among the step's
  rollouts (``rollout/answer_recall/<label>``; absent for a label no prompt of the step had).
  Here k = ``collapse_steps`` steps. A metrics file written before the recall was logged has
  no point with 2 labels' recall: it is never flagged.
* ``val``: per in-loop evaluation after the first update, the greedy (argmax) val answers'
  ``label_share`` and ``recall`` in ``RUN_DIR/val_path.jsonl`` (``labelrl.evaluate.val_path``),
  when that file exists. Here k = ``evals_needed(n_evals, collapse_steps)``: k evaluations, but
  never more than half of the n evaluations made (at least one). A greedy answer on every val
  item is far stronger evidence than one step's B×G samples, and a run evaluated every 10 steps
  for 20 steps has too few points for 3 in a row.

**Inherited, not caused.** The starting model's evaluation (step 0 of ``val_path.jsonl``) is the
baseline. When the run's points are collapsed to a label the start was already collapsed to (the
rule at that one point), the flag is still returned, with ``"inherited": True``: the run answers
one label, and its scores are still a constant answer's, but the parent did it, not this run's
RL. ``collapse_text`` says so ("collapsed to ham (inherited from its parent)").

**Did entropy fall before it?** Falling policy entropy is the early sign of a collapse to one
answer, so the flag carries ``entropy`` (``entropy_trend``), from ``rollout/entropy_mean`` in
metrics.jsonl over the steps before S only: the *early* mean is the mean over the first k logged
steps, the *before* mean the mean over the last k logged steps before S that are not among them
(k = ``collapse_steps``). Entropy *fell* when the before mean is below (1 − 0.2) × the early
mean: a fall of at least a fifth. Measured on SmolLM2 and sms-spam (B×G = 8, 32 new tokens, four
steps of each sampler in docs/algorithms.md), the per-step mean entropy's standard deviation was
10–15% of its mean, so the difference of two 3-step means has one of about a tenth, and a fifth
is about two of them: a smaller margin would call noise a fall. Like max_lift the margin is this
rule's choice. ``fell`` is None when the steps before S cannot fill
both windows with at least one step each (a collapse at the start), and the flag has no
``entropy`` when the run logged none before S (a run written before entropy was logged).
``collapse_detail`` adds the finding to the note.
"""

from __future__ import annotations

from pathlib import Path
from typing import Collection, Mapping, Optional, Sequence

from labelrl import metrics_keys as K
from labelrl.fileio import read_jsonl

METRICS_FILE = "metrics.jsonl"
ENTROPY_FALL = 0.2  # entropy fell before a collapse: the before-mean below (1 − this) × the early mean
SERIES = ("rollouts", "val")
DEFAULTS = {"share": 0.95, "steps": 3, "max_lift": 0.25}

# A point of a series: (step, {label: share of the parsed answers}, {label: recall, None without items}).
Point = tuple[int, Mapping[str, float], Mapping[str, Optional[float]]]


def answer_shares(answers: Sequence[str | None], label_names: Sequence[str]) -> dict[str, float]:
    """``{label: share}`` of each label among the parsed ``answers`` (None: unparsed, left out of
    the denominator). Every label of ``label_names`` is present; all are 0 when nothing parsed.
    An answer outside ``label_names`` counts in the denominator but has no share of its own."""
    parsed = [a for a in answers if a is not None]
    if not parsed:
        return {label: 0.0 for label in label_names}
    return {label: sum(a == label for a in parsed) / len(parsed) for label in label_names}


def answer_recalls(answers: Sequence[str | None], labels: Sequence[str],
                   label_names: Sequence[str]) -> dict[str, float | None]:
    """``{label: recall}``: among the answers whose item has that label (``labels[i]``: answer i's
    item's label), the share that answered it; an unparsed answer (None) is wrong. None for a
    label with no item. Every label of ``label_names`` is present."""
    if len(answers) != len(labels):
        raise ValueError(f"{len(answers)} answers for {len(labels)} labels: give one item label per answer")
    out: dict[str, float | None] = {}
    for label in label_names:
        mine = [a for a, y in zip(answers, labels) if y == label]
        out[label] = sum(a == label for a in mine) / len(mine) if mine else None
    return out


def lift(recall: Mapping[str, float | None]) -> float | None:
    """The answers' lift over chance (module docstring): (BA − 1/K) / (1 − 1/K), BA the mean recall
    over the K labels whose recall is not None; None when K < 2 (no evidence). 0 for a constant
    answer on any label mix, 1 for every item right, negative below chance."""
    known = [float(r) for r in recall.values() if r is not None]
    if len(known) < 2:
        return None
    chance = 1 / len(known)
    return (sum(known) / len(known) - chance) / (1 - chance)


def evals_needed(n_evals: int, steps: int) -> int:
    """Consecutive evaluations that make a val collapse: ``steps`` (k), but at most half of the
    ``n_evals`` evaluations made, and at least 1 (module docstring)."""
    return max(1, min(steps, n_evals // 2))


def _check(share: float, steps: int, max_lift: float) -> None:
    if not 0.5 < share <= 1:
        raise ValueError(f"collapse_share={share}: must be in (0.5, 1] so that at most one label can hold it; "
                         "set e.g. --collapse-share 0.95")
    if steps < 1:
        raise ValueError(f"collapse_steps={steps}: a collapse needs at least 1 step; set --collapse-steps 1 or more")
    if not 0 < max_lift <= 1:
        raise ValueError(f"collapse_max_lift={max_lift}: must be in (0, 1] (a constant answer has lift 0, and a "
                         "point is collapsed only below the bound); set e.g. --collapse-max-lift 0.25")


def find_collapse(points: Sequence[Point], *, share: float = DEFAULTS["share"], steps: int = DEFAULTS["steps"],
                  max_lift: float = DEFAULTS["max_lift"], inherited: Collection[str] = ()) -> dict | None:
    """The first collapse in ``points`` (in order: ``(step, {label: share}, {label: recall})``) by
    the module docstring's rule with k = ``steps``: ``{"label", "step", "share", "lift",
    "inherited"}`` (``step``: the first step of the run of k points; ``share`` and ``lift``: their
    means over it; ``inherited``: the label is in ``inherited``, the labels the starting model was
    already collapsed to), or None. Points with nothing parsed or fewer than 2 labels with items
    are passed over."""
    _check(share, steps, max_lift)
    run_label, run = None, []
    for step, shares, recall in points:
        gain = lift(recall)
        if not any(shares.values()) or gain is None:  # nothing parsed, or one label only: no evidence either way
            continue
        top = max(shares, key=lambda label: shares[label])
        if shares[top] < share or gain >= max_lift:
            run_label, run = None, []
            continue
        if top != run_label:
            run_label, run = top, []
        run.append((step, shares[top], gain))
        if len(run) == steps:
            return {"label": top, "step": run[0][0], "share": sum(s for _, s, _ in run) / steps,
                    "lift": sum(g for _, _, g in run) / steps, "inherited": top in inherited}
    return None


def _per_label(record: Mapping, prefix: str) -> dict[str, float]:
    return {k[len(prefix) + 1:]: float(v) for k, v in record.items() if k.startswith(prefix + "/") and v is not None}


def rollout_series(records: Sequence[dict]) -> list[Point]:
    """(step, {label: share of parsed rollout answers}, {label: recall among the step's rollouts})
    of each metrics.jsonl record that has shares; a label without a logged recall is absent."""
    out = []
    for record in records:
        shares = _per_label(record, K.ANSWER_SHARE)
        if shares:
            out.append((int(record[K.STEP]), shares, _per_label(record, K.ANSWER_RECALL)))
    return out


def val_series(records: Sequence[dict]) -> list[Point]:
    """(step, {label: share of the greedy val answers}, {label: recall or None}) of each
    ``val_path.jsonl`` record (``labelrl.evaluate.val_path``)."""
    return [(int(r["step"]), {str(k): float(v) for k, v in (r.get("label_share") or {}).items()},
             {str(k): (None if v is None else float(v)) for k, v in (r.get("recall") or {}).items()})
            for r in records]


def entropy_trend(records: Sequence[dict], step: int, window: int = DEFAULTS["steps"]) -> dict | None:
    """Whether ``rollout/entropy_mean`` fell before ``step`` (module docstring): ``{"fell",
    "early", "before", "early_steps", "before_steps"}`` (the two windows' means and their first and
    last steps; ``fell`` None when the steps before ``step`` cannot fill both), or None when no
    record before ``step`` logged entropy."""
    points = [(int(r[K.STEP]), float(r[K.ENTROPY_MEAN])) for r in records
              if isinstance(r.get(K.ENTROPY_MEAN), (int, float)) and int(r[K.STEP]) < step]
    if not points:
        return None
    early, before = points[:window], points[window:][-window:]
    mean = lambda pts: sum(v for _, v in pts) / len(pts) if pts else None  # noqa: E731
    span = lambda pts: [pts[0][0], pts[-1][0]] if pts else None  # noqa: E731
    fell = None if not before else mean(before) < (1 - ENTROPY_FALL) * mean(early)
    return {"fell": fell, "early": mean(early), "before": mean(before), "early_steps": span(early),
            "before_steps": span(before)}


def detect_collapse(run_dir: str | Path, *, share: float = DEFAULTS["share"], steps: int = DEFAULTS["steps"],
                    max_lift: float = DEFAULTS["max_lift"]) -> dict | None:
    """The run's collapse flag from its files, both series (module docstring):
    ``{"label", "step", "share", "lift", "inherited", "series"}`` of the earlier flag, or None.
    ``inherited`` is True when the starting model (val step 0) was already collapsed to the label;
    ``entropy`` (present when the run logged entropy) says whether the policy's entropy fell
    before it (``entropy_trend``)."""
    from labelrl.evaluate.val_path import read_val_path  # numpy and scikit-learn: only when a run is judged

    run_dir = Path(run_dir)
    evals = val_series(read_val_path(run_dir))
    rule = {"share": share, "max_lift": max_lift}
    start = find_collapse([p for p in evals if p[0] == 0], steps=1, **rule)
    inherited = {start["label"]} if start else set()
    evals = [p for p in evals if p[0] > 0]
    flags = []
    records = read_jsonl(run_dir / METRICS_FILE)
    for name, points, k in (("rollouts", rollout_series(records), steps),
                            ("val", evals, evals_needed(len(evals), steps))):
        flag = find_collapse(points, steps=k, inherited=inherited, **rule)
        if flag is not None:
            flags.append({**flag, "series": name})
    first = min(flags, key=lambda f: (f["step"], SERIES.index(f["series"])), default=None)
    trend = None if first is None else entropy_trend(records, first["step"], steps)
    return first if trend is None else {**first, "entropy": trend}


def run_collapse(run) -> dict | None:
    """The flag of an RL run (``labelrl.train.rl.RLRun``) from its files, by its config's settings."""
    return detect_collapse(run.run_dir, **collapse_settings(run.cfg))


def collapse_settings(cfg) -> dict:
    """The detector's settings from an RL config (its ``collapse_*`` fields)."""
    return {"share": cfg.collapse_share, "steps": cfg.collapse_steps, "max_lift": cfg.collapse_max_lift}


def collapse_text(flag: Mapping, parent: str | None = None) -> str:
    """How every summary, table and verdict names a collapse: ``collapsed to ham at step 5``, or for
    an inherited one ``collapsed to ham (inherited from its parent)`` (``parent``: the parent's
    name, when known, in place of "its parent")."""
    if flag.get("inherited"):
        return f"collapsed to {flag['label']} (inherited from {parent or 'its parent'})"
    return f"collapsed to {flag['label']} at step {flag['step']}"


def collapse_detail(flag: Mapping, parent: str | None = None) -> str:
    """``collapsed to ham at step 5 (0.97 of the parsed rollout answers)``, and when the run logged
    entropy, whether it fell before: ``; entropy fell before it (1.20 → 0.55 nats per token)``."""
    what = "the parsed rollout answers" if flag.get("series", "rollouts") == "rollouts" else "the greedy val answers"
    return f"{collapse_text(flag, parent)} ({flag['share']:.2f} of {what}){entropy_note(flag.get('entropy'))}"


def entropy_note(trend: Mapping | None) -> str:
    """The entropy finding of a collapse flag (``entropy_trend``) as a clause, '' when not logged."""
    if trend is None:
        return ""
    if trend["fell"] is None:
        return "; too few steps before it to tell whether entropy fell"
    verb = "fell" if trend["fell"] else "did not fall"
    return (f"; entropy {verb} before it ({trend['early']:.2f} → {trend['before']:.2f} nats per token, "
            f"steps {trend['early_steps'][0]}–{trend['early_steps'][1]} → "
            f"{trend['before_steps'][0]}–{trend['before_steps'][1]})")

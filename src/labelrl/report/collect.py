"""Read a ladder run directory into plain data for the report (files only; no model, no torch).

``collect_run(run_dir)`` reads ``ladder.json`` (required) and, per task and arm, whatever of
the layout ``labelrl ladder`` writes is there: ``audit.json``, the arms' ``metrics.jsonl``,
``sft_metrics.jsonl`` and rollout log, ``eval/ARM-*.json``, ``analysis/*.json`` and the
distill arms' ``traces.summary.json``, a failed arm's ``error.txt``. From ladder.json it also
takes the run order (``task_order``, ``arm_order``), the ceiling with its interval and source,
and the ladder's notes on analyses it could not make. A missing file leaves its field empty;
an unreadable one does too and adds a line to ``problems`` (the report prints them), so a
half-finished or damaged run still gets a report. What it fills (``RunData``, ``TaskData``,
``ArmData``) is defined in ``labelrl.report.run_data``.

Two quantities are computed here from the rollout log rather than read:

* per step, rollout accuracy and **balanced accuracy**: for each reference label present in
  the step, the share of its rollouts whose parsed answer equals the label (trimmed and
  case-folded, as everywhere; an unparsed answer is wrong), averaged over those labels;
* per **completion-length bucket** (equal-width buckets in tokens over all steps): the
  think-closure rate, truncation rate and mean reward (the truncation tax).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from labelrl import metrics_keys as K
from labelrl.evaluate.ledger import summary_metrics
from labelrl.fileio import read_jsonl
from labelrl.report.rollout_stats import graded_rollouts, recall_per_step, residue_drift, think_length_tax
from labelrl.report.run_data import ArmData, RunData, TaskData
from labelrl.types import canonical_label

LADDER_FILE = "ladder.json"
N_LENGTH_BUCKETS = 8
# The rollout columns the report needs (labelrl.rollout.log.ROLLOUT_SCHEMA names); that module
# is not imported because its package imports torch.
ROLLOUT_COLUMNS = ("step", "prompt_id", "sample_index", "label", "completion", "answer", "reward", "advantage",
                   "completion_tokens", "truncated", "think_closed", "skipped")
LOW_CONFIDENCE_SHARE = 0.25  # the SFT model's lowest-confidence quarter of the training sample
TRACEBACK_LINES = 15
# ladder.json is written with sorted keys; the ladder keeps the run order in task_order and
# arm_order. Without them, arms are ordered by type as the ladder runs them (then by name).
TYPE_ORDER = ("relabel", "sft", "rl", "random_reward", "threshold", "distill", "control", "cot_sft", "cot_rl")


def read_json(path: Path, problems: list[str]) -> dict | None:
    """The JSON object in ``path``; None when absent or unreadable (noted in ``problems``)."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        problems.append(f"{path}: unreadable ({exc}); its part of the report is left out")
        return None
    if not isinstance(value, dict):
        problems.append(f"{path}: expected a JSON object, found {type(value).__name__}; left out")
        return None
    return value


def rollout_step_stats(table: pa.Table) -> list[dict]:
    """Per step: ``{"step", "n", "accuracy", "balanced_accuracy"}`` of the rollouts (module docstring)."""
    if table.num_rows == 0:
        return []
    steps, labels, correct = graded_rollouts(table)
    out = []
    for step in np.unique(steps):
        mask = steps == step
        recalls = [correct[mask & (labels == label)].mean() for label in np.unique(labels[mask])]
        out.append({"step": int(step), "n": int(mask.sum()), "accuracy": float(correct[mask].mean()),
                    "balanced_accuracy": float(np.mean(recalls))})
    return out


def length_buckets(table: pa.Table, n_buckets: int = N_LENGTH_BUCKETS) -> list[dict]:
    """Equal-width completion-length buckets ``[lo, hi)`` in tokens over all rollouts, each with
    ``n``, ``think_closed_rate``, ``truncated_rate`` and ``mean_reward`` (None when empty)."""
    if table.num_rows == 0:
        return []
    tokens = np.asarray(table.column("completion_tokens").to_pylist(), dtype=np.int64)
    closed = np.asarray(table.column("think_closed").to_pylist(), dtype=bool)
    truncated = np.asarray(table.column("truncated").to_pylist(), dtype=bool)
    reward = np.asarray(table.column("reward").to_pylist(), dtype=np.float64)
    lo, hi = int(tokens.min()), int(tokens.max()) + 1
    # Integer edges, at least one token wide, so a bucket reads "12–15 tokens" exactly.
    edges = np.unique(np.round(np.linspace(lo, hi, min(n_buckets, hi - lo) + 1)).astype(np.int64))
    which = np.searchsorted(edges, tokens, side="right") - 1
    out = []
    for b in range(len(edges) - 1):
        mask = which == b
        n = int(mask.sum())
        out.append({"lo": int(edges[b]), "hi": int(edges[b + 1]), "n": n,
                    "think_closed_rate": float(closed[mask].mean()) if n else None,
                    "truncated_rate": float(truncated[mask].mean()) if n else None,
                    "mean_reward": float(reward[mask].mean()) if n else None})
    return out


def failed_positive_breakdown(table: pa.Table, threshold: float, labels: Sequence[str], kind: str | None) -> dict:
    """Failed rollouts (reward < ``threshold``) given a positive advantage, recomputed from the
    rollout log with the task's one threshold, so every arm is judged by the same definition.

    Returns ``overall`` ({n_failed, n_positive, frac}), ``per_step`` ([{step, frac}]) and
    ``by_distance``: the failed rollouts split by how far the answer is from the label —
    ordinal tasks: ``one grade off``, ``two or more off``; others: ``wrong label``; and
    ``unparsed`` — each with its counts (a failure with the right label, e.g. a truncated
    reasoning, is ``right label, low reward``)."""
    reward = np.asarray(table.column("reward").to_pylist(), dtype=np.float64)
    advantage = np.asarray(table.column("advantage").to_pylist(), dtype=np.float64)
    steps = np.asarray(table.column("step").to_pylist(), dtype=np.int64)
    failed, positive = reward < threshold, advantage > 0
    index = {canonical_label(x): i for i, x in enumerate(labels)}
    truth = [index.get(canonical_label(v)) for v in table.column("label").to_pylist()]
    answer = [None if a is None else index.get(canonical_label(a)) for a in table.column("answer").to_pylist()]
    category = np.array([_distance_category(a, t, kind) for a, t in zip(answer, truth)], dtype=object)

    def counts(mask: np.ndarray) -> dict:
        n, k = int((failed & mask).sum()), int((failed & mask & positive).sum())
        return {"n_failed": n, "n_positive": k, "frac": k / n if n else None}

    cats = ("one grade off", "two or more off") if kind == "ordinal" else ("wrong label",)
    return {"threshold": threshold, "overall": counts(np.ones(len(reward), dtype=bool)),
            "per_step": [{"step": int(s), "frac": counts(steps == s)["frac"]} for s in np.unique(steps)],
            "by_distance": {c: counts(category == c) for c in (*cats, "unparsed", "right label, low reward")}}


def _distance_category(answer: int | None, truth: int | None, kind: str | None) -> str:
    if answer is None or truth is None:
        return "unparsed"
    if answer == truth:
        return "right label, low reward"
    if kind != "ordinal":
        return "wrong label"
    return "one grade off" if abs(answer - truth) == 1 else "two or more off"


def read_rollout_table(arm_dir: Path, problems: list[str]) -> pa.Table | None:
    """The report's columns of every ``rollouts/step_*.parquet`` part; None without a log."""
    parts = sorted((arm_dir / "rollouts").glob("step_*.parquet"))
    tables = []
    for part in parts:
        try:
            tables.append(pq.read_table(part, columns=list(ROLLOUT_COLUMNS)))
        except (pa.ArrowInvalid, OSError, KeyError) as exc:
            problems.append(f"{part}: unreadable rollout part ({exc}); left out")
    return pa.concat_tables(tables) if tables else None


def ambiguous_items(task: TaskData, problems: list[str]) -> dict[str, set]:
    """Item ids that are ambiguous, by kind: in a group of conflicting duplicates (audit.json);
    in the direct SFT model's lowest-confidence quarter of the training sample (its train
    scores, eval/*-train.parquet); relabelled differently (a relabel arm's output)."""
    out: dict[str, set] = {}
    groups = (task.audit or {}).get("conflicting_groups") or []
    out["conflicting duplicates"] = {str(i) for g in groups if isinstance(g, dict) for i in g.get("ids") or []}
    scored = sorted((task.dir / "eval").glob("*-train.parquet"))
    if scored:
        try:
            table = pq.read_table(scored[0])
        except (pa.ArrowInvalid, OSError) as exc:
            problems.append(f"{scored[0]}: unreadable ({exc}); left out")
        else:
            cols = [c for c in table.column_names if c == "score" or c.startswith("score_")]
            if cols:
                probs = np.stack([np.asarray(table.column(c).to_pylist(), dtype=np.float64) for c in cols], axis=1)
                conf = probs.max(axis=1) if len(cols) > 1 else np.maximum(probs[:, 0], 1 - probs[:, 0])
                cut = np.quantile(conf, LOW_CONFIDENCE_SHARE)
                ids = table.column("id").to_pylist()
                out["SFT low confidence"] = {str(i) for i, c in zip(ids, conf) if c <= cut}
    for path in sorted(task.dir.glob("*/answer_key.json")):  # a relabel arm's final labels
        key = read_json(path, problems) or {}
        original = _mapping(key.get("original"))
        changed = {str(i) for i, v in _mapping(key.get("labels")).items() if v is not None and v != original.get(i)}
        out.setdefault("relabel disagrees", set()).update(changed)
    return out


def _read_json_list(path: Path, problems: list[str]) -> list:
    """The JSON list in ``path``; [] when absent or unreadable (noted in ``problems``)."""
    if not path.is_file():
        return []
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        problems.append(f"{path}: unreadable ({exc}); its part of the report is left out")
        return []
    return value if isinstance(value, list) else []


def _step_records(path: Path, problems: list[str]) -> list[dict]:
    """The records of a metrics JSONL file that carry a step (a torn last line is ignored)."""
    try:
        records = read_jsonl(path)
    except (UnicodeDecodeError, OSError, ValueError) as exc:
        problems.append(f"{path}: unreadable ({exc}); left out")
        return []
    return [r for r in records if isinstance(r, dict) and K.STEP in r]


def _mapping(value) -> dict:
    return value if isinstance(value, dict) else {}


def _eval_json(task_dir: Path, arm: str, split: str, problems: list[str]) -> dict | None:
    return read_json(task_dir / "eval" / f"{arm}-{split}.json", problems)


def _fill_metrics(arm: ArmData, entry: dict, task: TaskData, problems: list[str]) -> None:
    """Summary metrics from ladder.json, else from the eval JSON files ``labelrl eval`` wrote."""

    def from_file(split: str) -> tuple[dict | None, dict | None]:
        report = _eval_json(task.dir, arm.name, split, problems)
        if report is None or not isinstance(report.get("metrics"), dict):
            return None, None
        return summary_metrics(report["metrics"]), report.get("ledger") or {}

    arm.val = _mapping(entry.get("val")) or from_file("val")[0]
    arm.holdout = _mapping(entry.get("holdout")) or None
    repeat = entry.get("holdout_repeat")
    if arm.holdout is None or repeat is None:
        metrics, ledger = from_file("holdout")
        arm.holdout = arm.holdout or metrics
        repeat = repeat if repeat is not None else bool((ledger or {}).get("repeat"))
    arm.holdout_repeat = bool(repeat)
    arm.same_model_as = entry.get("holdout_same_model_as")
    ood = {name: m for name, m in _mapping(entry.get("ood")).items() if isinstance(m, dict)}
    for name in task.ood_names:
        if not ood.get(name):
            metrics, _ = from_file(f"ood-{name}")
            if metrics is not None:
                ood[name] = metrics
    arm.ood = {k: v for k, v in ood.items() if v}


def failed_threshold(arm_dir: Path, arm: ArmData, task: TaskData, problems: list[str]) -> float:
    """The reward below which the trainer counted a rollout of this run as failed: the
    ``success_threshold`` its ``rl_summary.json`` records (``Algorithm.success_threshold``: the
    run's --success-threshold, else the lowest per-class boundary of its reward scale, which
    --class-reward and --reward-table move). Runs written before it was recorded fall back to the
    task's success threshold, else the arm's ``correct_reward`` (right for plain rewards only)."""
    recorded = (read_json(arm_dir / "rl_summary.json", problems) or {}).get("success_threshold")
    if isinstance(recorded, (int, float)) and not isinstance(recorded, bool):
        return float(recorded)
    fallback = task.success_threshold if task.success_threshold is not None else arm.config.get("correct_reward", 1.0)
    return float(fallback)


def _read_arm(name: str, entry: dict, task: TaskData, run_dir: Path, problems: list[str]) -> ArmData:
    arm_dir = run_dir / entry["dir"] if entry.get("dir") else task.dir / name
    arm = ArmData(name=name, type=str(entry.get("type", "?")), status=str(entry.get("status", "pending")),
                  dir=arm_dir, preset=entry.get("preset"), seconds=entry.get("seconds"),
                  error=None if entry.get("error") is None else str(entry["error"]),
                  depends_on=list(entry.get("depends_on") or []), replicate_of=entry.get("replicate_of"),
                  seed=entry.get("seed"), parent=entry.get("from"), config=_mapping(entry.get("config")),
                  algorithm=_mapping(entry.get("algorithm")), rule=entry.get("rule"), thin_val=dict(entry.get("thin_val") or {}),
                  matched={k: v for k, v in _mapping(entry.get("matched")).items() if isinstance(v, dict)})
    _fill_metrics(arm, entry, task, problems)
    arm.steps = _step_records(arm_dir / "metrics.jsonl", problems)
    arm.sft_records = _step_records(arm_dir / "sft_metrics.jsonl", problems)
    rollouts = read_rollout_table(arm_dir, problems)
    if rollouts is not None:
        arm.rollout_steps = rollout_step_stats(rollouts)
        arm.length_buckets = length_buckets(rollouts)
        if rollouts.num_rows:
            arm.failures = failed_positive_breakdown(rollouts, failed_threshold(arm_dir, arm, task, problems),
                                                     task.labels, task.kind)
            arm.recall_steps = recall_per_step(rollouts, task.labels)
            arm.residue = residue_drift(rollouts, task.ambiguous, task.train_ids)
            if arm.config.get("mode") == "reasoning":
                arm.tax = think_length_tax(rollouts)
    arm.rescore = read_json(task.dir / "analysis" / f"rescore-{name}.json", problems)
    for key in ("val_generate", "holdout_generate", "pass_at_k", "relabel"):
        setattr(arm, key, _mapping(entry.get(key)) or None)
    arm.answer_keys = {k: v for k, v in _mapping(entry.get("answer_keys")).items() if isinstance(v, dict)}
    arm.eval_max_new_tokens = entry.get("eval_max_new_tokens")
    arm.collapse = _mapping(_mapping(entry.get("train")).get("collapse")) or None
    arm.tune = _mapping(entry.get("tune")) or None
    if arm.status == "failed" and (arm_dir / "error.txt").is_file():
        lines = (arm_dir / "error.txt").read_text(encoding="utf-8", errors="replace").strip().splitlines()
        arm.traceback = "\n".join(lines[-TRACEBACK_LINES:])
    if arm.type == "distill":
        # labelrl.distill.teacher.distill_paths(ARM/traces.jsonl).summary, spelled out here
        # because that module pulls in the judge clients.
        arm.distill_summary = read_json(arm_dir / "traces.summary.json", problems)
    return arm


def _analysis_notes(analysis) -> dict[str, str]:
    """Why the ladder made no sweep / routing / decomposition (its ``analysis`` notes and errors)."""
    analysis = _mapping(analysis)
    if isinstance(analysis.get("note"), str):  # nothing was analysed at all
        return {name: analysis["note"] for name in ("sweep", "route", "compare")}
    notes = {}
    for name in ("sweep", "route", "compare"):
        part = _mapping(analysis.get(name))
        why = part.get("error") or part.get("note")
        if why:
            notes[name] = str(why)
    return notes


def read_sweeps(analysis_dir: Path, analysis, problems: list[str]) -> dict[str, dict]:
    """Every threshold sweep of the task, SFT parent arm → result, first parent first.

    The ladder writes one per SFT parent of an RL arm (labelrl.ladder.analysis: ``sweep.json``
    for the first, ``sweep-PARENT.json`` for the others) and lists them in its ``analysis``
    entry (``sweep.files``, parent → path); the files are looked up by name in ``analysis_dir``
    so a moved run directory still reads. Without that list, every ``sweep*.json`` there is read
    (``sweep.json`` first). A sweep's parent is its ``arms.base``, else the name of its file."""
    listed = _mapping(_mapping(_mapping(analysis).get("sweep")).get("files"))
    names = [Path(str(p)).name for p in listed.values()]
    if not names:
        found = sorted(p.name for p in analysis_dir.glob("sweep*.json"))
        names = sorted(found, key=lambda n: n != "sweep.json")
    sweeps: dict[str, dict] = {}
    for file_name, parent in zip(names, list(listed) or [None] * len(names)):
        result = read_json(analysis_dir / file_name, problems)
        if result is None:
            continue
        base = _mapping(result.get("arms")).get("base") or parent or Path(file_name).stem.removeprefix("sweep").lstrip("-")
        sweeps[str(base) or "sft"] = result
    return sweeps


def _read_task(name: str, entry: dict, run_dir: Path, problems: list[str]) -> TaskData:
    task = TaskData(name=name, dir=run_dir / name, kind=entry.get("kind"), labels=list(entry.get("labels") or []),
                    positive_label=entry.get("positive_label"), data=entry.get("data"),
                    ood_names=list(entry.get("ood") or []))
    task.audit = read_json(task.dir / "audit.json", problems)
    task.label_noise = float(entry.get("label_noise") or 0.0)
    task.success_threshold = entry.get("success_threshold")
    samples = read_json(task.dir / "samples.json", problems) or {}
    task.samples = _mapping(entry.get("samples")) or {k: {x: y for x, y in v.items() if x != "ids"} for k, v in samples.items()}
    task.train_ids = [str(i) for i in _mapping(samples.get("train")).get("ids") or []]
    task.ambiguous = ambiguous_items(task, problems)
    if "ceiling" in entry:  # the ladder chose it (duplicates, or the raters' split-half estimate)
        task.ceiling, task.ceiling_ci, task.ceiling_source = (entry.get("ceiling"), entry.get("ceiling_ci"),
                                                              entry.get("ceiling_source"))
    elif task.audit is not None:
        task.ceiling, task.ceiling_ci, task.ceiling_source = task.audit.get("ceiling"), task.audit.get("ceiling_ci"), "duplicates"
    arms = _mapping(entry.get("arms"))
    read = [_read_arm(arm, _mapping(arms[arm]), task, run_dir, problems) for arm in arms]
    rank = {t: i for i, t in enumerate(TYPE_ORDER)}
    order = {name: i for i, name in enumerate(entry.get("arm_order") or [])}
    task.arms = sorted(read, key=lambda a: (order.get(a.name, len(order)), rank.get(a.type, len(rank)), a.name))
    task.analysis_notes = _analysis_notes(entry.get("analysis"))
    analysis = task.dir / "analysis"
    task.sweeps = read_sweeps(analysis, entry.get("analysis"), problems)
    task.sweep = next(iter(task.sweeps.values()), None)
    task.compare = read_json(analysis / "compare.json", problems)
    task.majority = read_json(analysis / "majority.json", problems)
    task.stability = read_json(analysis / "stability.json", problems)
    task.verdict = [v for v in (entry.get("verdict") or []) if isinstance(v, dict)]
    paired = _read_json_list(analysis / "paired.json", problems)
    task.paired = [c for c in paired if isinstance(c, dict) and isinstance(c.get("result"), dict)]
    for path in sorted(analysis.glob("route-*.json")):
        result = read_json(path, problems)
        if result is not None:
            task.routes[path.stem.removeprefix("route-")] = result
    return task


def collect_run(run_dir: str | Path) -> RunData:
    """Read ``run_dir`` (see the module docstring). Raises ValueError when it is not a ladder run."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run_dir={str(run_dir)!r} is not a directory; pass the --out directory of `labelrl ladder`")
    problems: list[str] = []
    ladder = read_json(run_dir / LADDER_FILE, problems)
    if ladder is None:
        why = problems[0] if problems else f"{run_dir / LADDER_FILE} does not exist"
        raise ValueError(f"{why}: a report needs the ladder's state file; run `labelrl ladder RECIPE.yaml --out {run_dir}` first")
    tasks = ladder.get("tasks") or {}
    if not isinstance(tasks, dict):
        raise ValueError(f"{run_dir / LADDER_FILE}: 'tasks' must map task names to their entries; "
                         "was it written by `labelrl ladder`?")
    given = [t for t in ladder.get("task_order") or [] if t in tasks]
    order = given + [t for t in tasks if t not in given]
    read = [_read_task(name, _mapping(tasks[name]), run_dir, problems) for name in order]
    phases = [p for p in ladder.get("phases") or [] if isinstance(p, dict) and isinstance(p.get("seconds"), (int, float))]
    wall = ladder.get("seconds_last_invocation")
    return RunData(run_dir=run_dir, recipe=ladder.get("recipe"), tasks=read, problems=problems, phases=phases,
                   seconds_last_invocation=float(wall) if isinstance(wall, (int, float)) else None)

"""A matched tuning budget: an arm trains one candidate per value of its grid, each candidate is
scored on val only, and the best becomes the arm (the grid itself: ``labelrl.ladder.tune_grid``).

* **Candidates.** Each trains in ``TASK/ARM/tune/NAME/`` (``NAME`` e.g. ``learning_rate=1e-05``)
  with the arm's config and its values, and is scored on the task's val sample exactly as the arm
  itself is (``labelrl.ladder.arms.evaluate_arm``: ``eval_limit`` items, label-token scores or, in
  reasoning mode, generations at the arm's token cap), written beside it as
  ``tune/NAME-val.parquet`` and ``tune/NAME-val.json``. No candidate is evaluated on the holdout.
* **Selection.** The highest val balanced accuracy wins. Candidates whose val balanced accuracy
  is equal (to 1e-9: the same answers count on the same items) are a **tie**, recorded
  (``tune.tie``) and printed as one: it is broken by the first val metric that separates the tied
  candidates, in the order of ``TIE_BREAKERS`` (ROC-AUC of the label-token scores: the ranking;
  the mean absolute grade error for ordinal labels; accuracy). Only when none separates them is
  the first listed kept, and the tie says so. A candidate that fails is recorded with its error
  (``tune/NAME/error.txt``) and left out; the arm fails when every candidate does.
* **The arm.** The winner's run directory is linked into ``TASK/ARM`` (hard links where the file
  system allows, else copies) and its val evaluation becomes ``eval/ARM-val.*`` (the same model
  on the same items); ``tune/selected.json`` is written last. From then on the arm is the
  winner: its one holdout look, OOD and generated evaluations, its children (``from: ARM``) and
  every analysis use it, and its recorded ``config`` holds the chosen values.
* **Replicates.** An arm with several seeds tunes on its first seed's run only; its other runs
  (``tuned_by`` that run) train once with the values it chose.
* **Resume.** A finished candidate is kept and its val evaluation read back; a killed one
  restarts (SFT) or resumes (RL) as any arm does. Once ``tune/selected.json`` exists the
  selection is kept as it is (failed candidates are not retried).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import traceback
from pathlib import Path

from pydantic import BaseModel
from rich.console import Console

from labelrl.fileio import atomic_write_json, atomic_write_text
from labelrl.ladder.arms import LadderStopped, note_made, train_arm
from labelrl.ladder.evaluations import candidate_eval_paths, eval_cap, evaluate_candidate, scoring_job
from labelrl.ladder.layout import eval_paths
from labelrl.ladder.side_by_side import Job, train_side_by_side
from labelrl.ladder.spec import TaskSpec
from labelrl.ladder.tune_grid import Grid, with_values

TUNE_DIR = "tune"
SELECTED_FILE = "selected.json"
SELECT_METRIC = "balanced_accuracy"
TIE_BREAK = "the first val metric that separates them (ROC-AUC, mean |grade error|, accuracy), else the first listed"
# (metric, higher is better): the val metrics that break a tie on balanced accuracy, in order.
TIE_BREAKERS = (("roc_auc", True), ("mean_abs_grade_error", False), ("accuracy", True))
TIE_TOL = 1e-9


def values_text(values: dict) -> str:
    """``learning_rate=1e-05`` (``,`` between keys, in grid order)."""
    return ",".join(f"{k}={v}" for k, v in values.items())


def candidate_names(candidates: list[dict]) -> list[str]:
    """A directory name per candidate: its ``values_text`` made path-safe, numbered when two
    would collide."""
    names = [re.sub(r"[^A-Za-z0-9_.,=+-]", "_", values_text(v)) for v in candidates]
    return names if len(set(names)) == len(names) else [f"{i}-{n}" for i, n in enumerate(names)]


def _score(record: dict, metric: str) -> float | None:
    value = (record.get("val") or {}).get(metric)
    return float(value) if record.get("status") == "done" and isinstance(value, (int, float)) and math.isfinite(value) else None


def tie(records: list[dict]) -> dict | None:
    """The tie on val balanced accuracy at the top, or None: ``{"candidates": [index…], "score",
    "broken_by": metric or None, "by": {index: value}}`` (module docstring)."""
    scores = {i: v for i, r in enumerate(records) if (v := _score(r, SELECT_METRIC)) is not None}
    if not scores:
        return None
    top = max(scores.values())
    tied = [i for i, v in scores.items() if top - v <= TIE_TOL]
    if len(tied) < 2:
        return None
    for metric, higher in TIE_BREAKERS:
        values = {i: _score(records[i], metric) for i in tied}
        if any(v is None for v in values.values()):
            continue
        best = max(values.values()) if higher else min(values.values())
        if sum(abs(v - best) <= TIE_TOL for v in values.values()) == 1:
            return {"candidates": tied, "score": top, "broken_by": metric, "by": values}
    return {"candidates": tied, "score": top, "broken_by": None, "by": {}}


def select(records: list[dict]) -> int | None:
    """Index of the winning candidate: the highest finite val balanced accuracy among the finished
    ones; a tie is broken as ``tie`` says (the first listed only when no val metric separates the
    tied candidates); None when none finished."""
    scores = {i: v for i, r in enumerate(records) if (v := _score(r, SELECT_METRIC)) is not None}
    if not scores:
        return None
    found = tie(records)
    if found is None:
        return max(scores, key=lambda i: scores[i])
    if found["broken_by"] is None:
        return found["candidates"][0]
    higher = dict(TIE_BREAKERS)[found["broken_by"]]
    pick = max if higher else min
    return pick(found["by"], key=lambda i: found["by"][i])


def tie_text(records: list[dict], found: dict | None) -> str | None:
    """``tie on val balanced accuracy 0.391 (learning_rate=3e-06, learning_rate=1e-05): broken by val
    roc_auc (0.912 vs 0.897)``, or ``…: no val metric separates them, the first listed kept``."""
    if found is None:
        return None
    names = ", ".join(values_text(records[i]["values"]) for i in found["candidates"])
    head = f"tie on val balanced accuracy {found['score']:.3f} ({names})"
    if found["broken_by"] is None:
        return f"{head}: no val metric separates them, the first listed kept"
    by = " vs ".join(f"{found['by'][i]:.3f}" for i in found["candidates"])
    return f"{head}: broken by val {found['broken_by']} ({by})"


def _run_candidate(task: TaskSpec, task_dir: Path, arm_type: str, cfg: BaseModel, values: dict, configs: dict,
                   console: Console) -> dict:
    """Train one candidate (kept when finished) and score it on val; a failure is recorded, not raised."""
    from labelrl.evaluate.ledger import summary_metrics

    out = Path(cfg.out)
    record = {"values": values, "dir": out.relative_to(task_dir.parent).as_posix(), "status": "done", "val": None,
              "error": None}
    try:
        train_arm(arm_type, cfg, task_dir, console)
        report = evaluate_candidate(task, task_dir, out, cfg.mode, eval_cap(task, arm_type, cfg, configs), cfg.precision)
        record["val"] = summary_metrics(report["metrics"])
        (out / "error.txt").unlink(missing_ok=True)
    except LadderStopped:
        raise
    except Exception as exc:  # one bad value (e.g. a diverging learning rate) leaves the others to choose from
        record.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "error.txt", traceback.format_exc())
    return record


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # a finished run's files are never rewritten in place: sharing them is safe
    except OSError:
        shutil.copy2(src, dst)


def adopt_winner(task_dir: Path, arm_name: str, winner: Path) -> None:
    """Make ``TASK/ARM`` the winner's run (everything but ``tune/`` replaced by the winner's
    files) and its val evaluation the arm's."""
    arm_dir = task_dir / arm_name
    for entry in arm_dir.iterdir():
        if entry.name == TUNE_DIR:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for entry in winner.iterdir():
        if entry.name == ".lock":  # the candidate's writer lock (labelrl.fileio.RunLock), not part of its run
            continue
        if entry.is_dir():
            shutil.copytree(entry, arm_dir / entry.name, copy_function=_link_or_copy)
        else:
            _link_or_copy(str(entry), str(arm_dir / entry.name))
    for src, dst in zip((winner.parent / f"{winner.name}-val.parquet", winner.parent / f"{winner.name}-val.json"),
                        eval_paths(task_dir, arm_name, "val")):
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)


def tune_arm(task: TaskSpec, task_dir: Path, arm_name: str, arm_type: str, cfg: BaseModel, grid: Grid, configs: dict,
             st: dict, save, console: Console, workers: int = 1) -> BaseModel:
    """Train and score every candidate of ``grid``, select on val, adopt the winner (module
    docstring); records ``st["tune"]`` and returns the arm's config with the chosen values."""
    arm_dir = task_dir / arm_name
    selected_path = arm_dir / TUNE_DIR / SELECTED_FILE
    if selected_path.is_file():
        selected = json.loads(selected_path.read_text(encoding="utf-8"))
        if selected.get("grid") != grid.grid:
            raise ValueError(f"{arm_name}: tuned in {arm_dir} on the grid {selected.get('grid')}, not {grid.grid}; use a "
                             f"new run directory, or delete {arm_dir} and its eval/{arm_name}-* files to tune it again")
        st["tune"] = selected
        console.print(f"[dim]{arm_name}: tuned earlier, {values_text(selected['chosen'])} kept[/]")
        return with_values(cfg, selected["chosen"])
    if eval_paths(task_dir, arm_name, "holdout")[1].is_file():
        raise ValueError(f"{arm_name}: its holdout was evaluated before it was tuned, so a tuned model would be a second "
                         "look for this arm; use a new run directory")
    records: list[dict] = []
    st["tune"] = {"grid": grid.grid, "set_in": grid.where, "metric": f"val {SELECT_METRIC}", "ties": TIE_BREAK,
                  "candidates": records}
    names = candidate_names(grid.candidates)
    candidates = [with_values(cfg, values, out=arm_dir / TUNE_DIR / name) for values, name in zip(grid.candidates, names)]
    if getattr(cfg, "val_path_end", None) is not None:  # an RL candidate's path ends at its own val scores
        candidates = [c.model_copy(update={"val_path_end": candidate_eval_paths(Path(c.out))[0]}) for c in candidates]
    if workers > 1:  # every candidate trained and scored on val side by side; then read back here, in order
        scored = scoring_job("candidate", task, eval_cap(task, arm_type, cfg, configs))
        train_side_by_side([Job(f"{arm_name}: {values_text(v)}", arm_type, c, task_dir, evaluate=scored)
                            for v, c in zip(grid.candidates, candidates)], workers, console)
    for values, candidate in zip(grid.candidates, candidates):
        records.append(_run_candidate(task, task_dir, arm_type, candidate, values, configs, console))
        val = records[-1]["val"]
        console.print(f"{arm_name}: {values_text(values)}: " + (f"val balanced accuracy {val[SELECT_METRIC]:.3f}" if val
                                                                  else f"failed ({records[-1]['error']})"))
        save()
    best = select(records)
    if best is None:
        errors = "; ".join(f"{values_text(r['values'])}: {r['error']}" for r in records)
        raise ValueError(f"{arm_name}: every candidate of its grid failed ({errors}); see {arm_dir / TUNE_DIR}/*/error.txt")
    adopt_winner(task_dir, arm_name, arm_dir / TUNE_DIR / names[best])
    note_made(arm_dir)
    tied = tie_text(records, tie(records))
    st["tune"].update(chosen=records[best]["values"], chosen_dir=records[best]["dir"], tie=tied)
    atomic_write_json(selected_path, st["tune"])  # last: the arm directory is complete
    console.print(f"[bold]{arm_name}: {values_text(records[best]['values'])} chosen on val[/] "
                  + (f"({tied})" if tied else f"(highest val balanced accuracy of {len(records)} candidates)"))
    return with_values(cfg, records[best]["values"])


def tune_or_follow(task: TaskSpec, task_dir: Path, arm_name: str, arm_type: str, cfg: BaseModel, grid: Grid | None,
                   configs: dict, arms_state: dict, save, console: Console, workers: int = 1) -> BaseModel:
    """The config the run trains with: ``cfg`` itself (no grid), its grid's winner (``tune_arm``),
    or, for a replicate run ``tuned_by`` its first seed's run, the values that run chose."""
    st = arms_state[arm_name]
    tuned_by = task.arms[arm_name].tuned_by
    if tuned_by is not None:
        chosen = chosen_by(arms_state, tuned_by)
        if chosen is None:
            raise ValueError(f"{arm_name}: trains with the values {tuned_by!r} chooses on val, and {tuned_by!r} has not "
                             "chosen; re-run the ladder once it has finished")
        st["tune"] = {"chosen": chosen, "selected_by": tuned_by}
        return with_values(cfg, chosen)
    if grid is None:
        if (task_dir / arm_name / TUNE_DIR / SELECTED_FILE).is_file():
            raise ValueError(f"{arm_name}: tuned earlier in {task_dir / arm_name}, and its recipe now sets no grid; restore "
                             "its tune, or use a new run directory")
        return cfg
    return tune_arm(task, task_dir, arm_name, arm_type, cfg, grid, configs, st, save, console, workers)


def chosen_by(arms_state: dict, tuned_by: str) -> dict | None:
    """The values the run ``tuned_by`` chose on val, or None while it has not chosen."""
    return ((arms_state.get(tuned_by) or {}).get("tune") or {}).get("chosen")


def known_config(task: TaskSpec, arm_name: str, cfg: BaseModel, grid: Grid | None, arms_state: dict) -> BaseModel | None:
    """The config the run will train with, when it is known without training anything
    (``tune_or_follow`` without side effects): ``cfg`` itself, or a replicate's followed values;
    None for a run still to be tuned or whose tuning run has not chosen."""
    tuned_by = task.arms[arm_name].tuned_by
    if tuned_by is not None:
        chosen = chosen_by(arms_state, tuned_by)
        return None if chosen is None else with_values(cfg, chosen)
    return cfg if grid is None else None


def tune_note(arm: dict) -> str | None:
    """One line on a run's tuning for the console (from its ladder.json entry), or None."""
    tune = arm.get("tune") or {}
    if not tune.get("chosen"):
        return None
    if tune.get("selected_by"):
        return f"{values_text(tune['chosen'])}, chosen on val by {tune['selected_by']}"
    tried = ", ".join(f"{values_text(r['values'])} → " + (f"{r['val'][SELECT_METRIC]:.3f}" if r.get("val") else "failed")
                      for r in tune.get("candidates") or [])
    return f"{values_text(tune['chosen'])} chosen on val (val BA: {tried})" + (f"; {tune['tie']}" if tune.get("tie") else "")

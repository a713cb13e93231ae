"""A matched tuning budget: an arm trains one candidate per value of its grid, each candidate is
scored on val only, and the best becomes the arm (the grid itself: ``labelrl.ladder.tune_grid``).

* **Candidates.** Each trains in ``TASK/ARM/tune/NAME/`` (``NAME`` e.g. ``learning_rate=1e-05``)
  with the arm's config and its values, and is scored on the task's val sample exactly as the arm
  itself is (``labelrl.ladder.arms.evaluate_arm``: ``eval_limit`` items, label-token scores or, in
  reasoning mode, generations at the arm's token cap), written beside it as
  ``tune/NAME-val.parquet`` and ``tune/NAME-val.json``. No candidate is evaluated on the holdout.
* **Selection.** The highest val balanced accuracy wins; a tie goes to the candidate listed
  first. A candidate that fails is recorded with its error (``tune/NAME/error.txt``) and left
  out; the arm fails when every candidate does.
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
from labelrl.ladder.arms import LadderStopped, eval_paths, train_arm
from labelrl.ladder.recipe import TaskSpec
from labelrl.ladder.tune_grid import Grid, with_values

TUNE_DIR = "tune"
SELECTED_FILE = "selected.json"
SELECT_METRIC = "balanced_accuracy"
TIE_BREAK = "the first value listed"


def values_text(values: dict) -> str:
    """``learning_rate=1e-05`` (``,`` between keys, in grid order)."""
    return ",".join(f"{k}={v}" for k, v in values.items())


def candidate_names(candidates: list[dict]) -> list[str]:
    """A directory name per candidate: its ``values_text`` made path-safe, numbered when two
    would collide."""
    names = [re.sub(r"[^A-Za-z0-9_.,=+-]", "_", values_text(v)) for v in candidates]
    return names if len(set(names)) == len(names) else [f"{i}-{n}" for i, n in enumerate(names)]


def select(records: list[dict]) -> int | None:
    """Index of the winning candidate: the highest finite val balanced accuracy among the
    finished ones, the first listed on a tie; None when none finished."""
    best, best_score = None, -math.inf
    for i, record in enumerate(records):
        score = (record.get("val") or {}).get(SELECT_METRIC)
        if record.get("status") == "done" and isinstance(score, (int, float)) and math.isfinite(score) and score > best_score:
            best, best_score = i, score  # strictly greater: an equal later score keeps the earlier candidate
    return best


def evaluate_candidate(task: TaskSpec, task_dir: Path, run: Path, mode: str, cap: int | None, precision: str) -> dict:
    """The candidate's val evaluation (module docstring), read back when it was written before."""
    from labelrl.evaluate.predict import prepare
    from labelrl.evaluate.run import EvalConfig, evaluate_and_write

    predictions, report = run.parent / f"{run.name}-val.parquet", run.parent / f"{run.name}-val.json"
    if report.is_file():
        return json.loads(report.read_text(encoding="utf-8"))
    cfg = EvalConfig(run_or_model=str(run), split="val", splits=task_dir, out=predictions, json_path=report,
                     limit=task.eval_limit, n_boot=task.n_boot, max_new_tokens=cap, precision=precision)
    setup = prepare(cfg.run_or_model, cfg.data_options(), "val", splits_dir=task_dir, limit=cfg.limit, precision=precision)
    return evaluate_and_write(setup, cfg)


def _run_candidate(task: TaskSpec, task_dir: Path, arm_type: str, cfg: BaseModel, values: dict, configs: dict,
                   console: Console) -> dict:
    """Train one candidate (kept when finished) and score it on val; a failure is recorded, not raised."""
    from labelrl.evaluate.ledger import summary_metrics
    from labelrl.ladder.evaluations import eval_cap

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
             st: dict, save, console: Console) -> BaseModel:
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
    for values, name in zip(grid.candidates, names):
        records.append(_run_candidate(task, task_dir, arm_type, with_values(cfg, values, out=arm_dir / TUNE_DIR / name),
                                      values, configs, console))
        val = records[-1]["val"]
        console.print(f"{arm_name}: {values_text(values)}: " + (f"val balanced accuracy {val[SELECT_METRIC]:.3f}" if val
                                                                  else f"failed ({records[-1]['error']})"))
        save()
    best = select(records)
    if best is None:
        errors = "; ".join(f"{values_text(r['values'])}: {r['error']}" for r in records)
        raise ValueError(f"{arm_name}: every candidate of its grid failed ({errors}); see {arm_dir / TUNE_DIR}/*/error.txt")
    adopt_winner(task_dir, arm_name, arm_dir / TUNE_DIR / names[best])
    st["tune"].update(chosen=records[best]["values"], chosen_dir=records[best]["dir"])
    atomic_write_json(selected_path, st["tune"])  # last: the arm directory is complete
    console.print(f"[bold]{arm_name}: {values_text(records[best]['values'])} chosen on val[/] (highest val balanced "
                  f"accuracy of {len(records)} candidates; ties go to {TIE_BREAK})")
    return with_values(cfg, records[best]["values"])


def tune_or_follow(task: TaskSpec, task_dir: Path, arm_name: str, arm_type: str, cfg: BaseModel, grid: Grid | None,
                   configs: dict, arms_state: dict, save, console: Console) -> BaseModel:
    """The config the run trains with: ``cfg`` itself (no grid), its grid's winner (``tune_arm``),
    or, for a replicate run ``tuned_by`` its first seed's run, the values that run chose."""
    st = arms_state[arm_name]
    tuned_by = task.arms[arm_name].tuned_by
    if tuned_by is not None:
        chosen = ((arms_state.get(tuned_by) or {}).get("tune") or {}).get("chosen")
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
    return tune_arm(task, task_dir, arm_name, arm_type, cfg, grid, configs, st, save, console)


def tune_note(arm: dict) -> str | None:
    """One line on a run's tuning for the console (from its ladder.json entry), or None."""
    tune = arm.get("tune") or {}
    if not tune.get("chosen"):
        return None
    if tune.get("selected_by"):
        return f"{values_text(tune['chosen'])}, chosen on val by {tune['selected_by']}"
    tried = ", ".join(f"{values_text(r['values'])} → " + (f"{r['val'][SELECT_METRIC]:.3f}" if r.get("val") else "failed")
                      for r in tune.get("candidates") or [])
    return f"{values_text(tune['chosen'])} chosen on val (val BA: {tried})"

"""``labelrl ladder``: every arm of a recipe, in dependency order, on shared splits.

Per task: load the data, make (or reuse) the task's splits, audit the labels once, then run
the arms in dependency order. Each arm trains, is evaluated on val (the only split any choice
is made on), then on the holdout exactly once through the ledger, then out of domain. An arm
that fails is recorded with its error and the arms that need it are skipped; the others go on.
``ladder.json`` is rewritten atomically after every change, so a killed ladder re-run skips
its finished arms and resumes the rest. Analyses (sweep, routing, distillation decomposition)
are rebuilt from the evaluation files at the end of each task.
"""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from labelrl.fileio import RunLock, atomic_write_json, atomic_write_text
from labelrl.ladder.arms import (
    LadderStopped,
    arm_config,
    eval_paths,
    evaluate_arm,
    train_arm,
)
from labelrl.ladder.recipe import FAMILY, Recipe, TaskSpec, dependencies, run_order

STATE_FILE = "ladder.json"
STATE_FORMAT = 1
RL_TYPES = ("rl", "random_reward", "cot_rl")


def read_state(run_dir: Path) -> dict | None:
    path = Path(run_dir) / STATE_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


class Ladder:
    """The state of one ladder run and the steps that change it (each one saved at once)."""

    def __init__(self, recipe: Recipe, run_dir: Path, console: Console) -> None:
        self.recipe, self.run_dir, self.console = recipe, Path(run_dir).resolve(), console
        self.configs = {t: {a: arm_config(recipe, t, a, self.run_dir) for a in task.arms} for t, task in recipe.tasks.items()}
        self.state = read_state(self.run_dir) or {"format": STATE_FORMAT, "recipe": recipe.name, "tasks": {}}
        self.state["run_dir"] = str(self.run_dir)
        self.state["task_order"] = list(recipe.tasks)  # the JSON is saved with sorted keys
        self._check_finished_arms_unchanged()

    def save(self) -> None:
        atomic_write_json(self.run_dir / STATE_FILE, self.state)

    def _check_finished_arms_unchanged(self) -> None:
        for task_name, arms in self.configs.items():
            for arm_name, cfg in arms.items():
                old = self.state["tasks"].get(task_name, {}).get("arms", {}).get(arm_name)
                if old and old.get("status") == "done" and old.get("config") != cfg.model_dump(mode="json"):
                    raise ValueError(
                        f"tasks.{task_name}.arms.{arm_name}: finished in {self.run_dir} with another config; "
                        f"use a new run directory, or delete {self.run_dir / task_name / arm_name} and its entry to redo it")

    def run(self) -> dict:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with RunLock(self.run_dir, "ladder"):
            atomic_write_text(self.run_dir / "recipe.yaml",
                              yaml.safe_dump(self.recipe.model_dump(mode="json", by_alias=True, exclude={"fast"}), sort_keys=False))
            for task_name, task in self.recipe.tasks.items():
                self.run_task(task_name, task)
        return self.state

    # ------------------------------------------------------------ one task

    def run_task(self, task_name: str, task: TaskSpec) -> None:
        task_dir = self.run_dir / task_name
        self.console.rule(f"task {task_name}: {task.data}")
        tstate = self.state["tasks"].setdefault(task_name, {"arms": {}})
        tstate.update(prepare_task(task, task_dir, self.recipe.seed), arm_order=run_order(task))
        self.save()
        for arm_name in run_order(task):
            self.run_arm(task_name, task, arm_name)
        tstate["analysis"] = analyse_task(task, task_dir, tstate)
        self.save()

    def run_arm(self, task_name: str, task: TaskSpec, arm_name: str) -> None:
        arm = task.arms[arm_name]
        arms = self.state["tasks"][task_name]["arms"]
        st = arms.setdefault(arm_name, {})
        if st.get("status") == "done":
            self.console.print(f"[dim]{task_name}/{arm_name}: done earlier, skipped[/]")
            return
        cfg = self.configs[task_name][arm_name]
        deps = dependencies(task, arm_name)
        st.update(type=arm.type, depends_on=deps, dir=f"{task_name}/{arm_name}", config=cfg.model_dump(mode="json"),
                  error=None, **({"preset": cfg.preset} if FAMILY[arm.type] == "rl" else {}))
        blocked = [d for d in deps if arms.get(d, {}).get("status") != "done"]
        if blocked:
            st.update(status="skipped", error=f"depends on arm {blocked[0]!r}, which {arms[blocked[0]]['status']}")
            self.console.print(f"[yellow]{task_name}/{arm_name}: skipped[/] ({st['error']})")
            self.save()
            return
        self.console.rule(f"{task_name}/{arm_name} ({arm.type}{', from ' + arm.from_ if arm.from_ else ''})")
        st["status"] = "running"
        self.save()
        start = time.monotonic()
        try:
            self._train_and_evaluate(task, self.run_dir / task_name, arm_name, arm.type, cfg, st)
            st["status"] = "done"
        except LadderStopped:
            st["seconds"] = st.get("seconds", 0.0) + time.monotonic() - start
            self.save()
            raise
        except Exception as exc:  # an arm's failure is reported; the ladder goes on with what does not need it
            st.update(status="failed", error=f"{type(exc).__name__}: {exc}")
            arm_dir = self.run_dir / task_name / arm_name
            arm_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(arm_dir / "error.txt", traceback.format_exc())
            self.console.print(f"[bold red]{task_name}/{arm_name} failed[/]: {st['error']} (traceback in {arm_dir / 'error.txt'})")
        st["seconds"] = st.get("seconds", 0.0) + time.monotonic() - start
        self.save()

    def _train_and_evaluate(self, task: TaskSpec, task_dir: Path, arm_name: str, arm_type: str, cfg, st: dict) -> None:
        from labelrl.evaluate.ledger import summary_metrics

        train_arm(arm_type, cfg, task_dir, self.console)
        if FAMILY[arm_type] == "distill":
            summary = json.loads((task_dir / arm_name / "traces.summary.json").read_text(encoding="utf-8"))
            st["survival"] = summary["overall"]
            return
        if FAMILY[arm_type] == "rl":
            st["train"] = rl_training_summary(task_dir / arm_name)
        mode, precision = cfg.mode, cfg.precision
        st["val"] = summary_metrics(evaluate_arm(task, task_dir, arm_name, mode, "val", precision=precision)["metrics"])
        self.save()
        holdout = evaluate_arm(task, task_dir, arm_name, mode, "holdout", precision=precision)
        st["holdout"], st["holdout_repeat"] = summary_metrics(holdout["metrics"]), bool(holdout["ledger"].get("repeat"))
        if holdout.get("same_model_as"):
            st["holdout_same_model_as"] = holdout["same_model_as"]
            self.console.print(f"[yellow]{arm_name}: weights identical to {holdout['same_model_as']}'s (it never updated); "
                               "holdout result shared, not looked at again[/]")
        self.save()
        st["ood"] = {}
        for name in task.ood:
            st["ood"][name] = summary_metrics(
                evaluate_arm(task, task_dir, arm_name, mode, "holdout", ood=name, precision=precision)["metrics"])
            self.save()


def rl_training_summary(arm_dir: Path) -> dict[str, Any]:
    """First and last step's mean reward and the run's mean failed-positive fraction."""
    from labelrl import metrics_keys as K
    from labelrl.fileio import read_jsonl

    records = read_jsonl(arm_dir / "metrics.jsonl")
    return {"steps": len(records), "reward_first": records[0][K.REWARD_MEAN], "reward_last": records[-1][K.REWARD_MEAN],
            "failed_positive_frac": sum(r[K.FAILED_POSITIVE_FRAC] for r in records) / len(records)}


def prepare_task(task: TaskSpec, task_dir: Path, seed: int) -> dict[str, Any]:
    """Load the data, make or reuse the shared splits, audit once; the task's state fields."""
    from labelrl.audit import audit_dataset
    from labelrl.data.options import DataOptions
    from labelrl.data.prepare import load_checked_dataset
    from labelrl.data.split import load_or_make_splits

    dataset = load_checked_dataset(DataOptions(**task.data_options()))
    splits = load_or_make_splits(dataset, task_dir, seed=task.split_seed)
    labels = list(dataset.labels.labels)
    positive = task.positive_label or (labels[-1] if dataset.labels.kind == "binary" else None)
    if positive is not None and positive not in labels:
        raise ValueError(f"positive_label {positive!r}: not a label of {task.data} ({', '.join(labels)})")
    audit_path = task_dir / "audit.json"
    if task.audit and not audit_path.is_file():
        atomic_write_json(audit_path, audit_dataset(dataset, splits=splits.ids, n_boot=200, seed=seed, top=0))
    audit = json.loads(audit_path.read_text(encoding="utf-8")) if audit_path.is_file() else None
    return {"data": task.data, "kind": dataset.labels.kind, "labels": labels, "positive_label": positive,
            "ood": list(task.ood), "splits": splits.sizes(), **label_ceiling(audit)}


def label_ceiling(audit: dict | None) -> dict[str, Any]:
    """The accuracy ceiling 1 − ε to draw on every plot, and where it comes from.

    Labels averaged over several raters: the split-half estimate of the aggregated label
    (labelrl.audit.raters; a lower bound on the ceiling of the all-rater label). Otherwise
    conflicting duplicates (d = 2ε(1−ε), labelrl.audit.noise)."""
    none = {"ceiling": None, "ceiling_ci": None, "ceiling_source": None}
    if audit is None:
        return none
    aggregated = (audit.get("per_rater") or {}).get("aggregated") or {}
    if aggregated.get("ceiling") is not None:
        return {"ceiling": aggregated["ceiling"], "ceiling_ci": aggregated.get("ceiling_ci"),
                "ceiling_source": "rater split-half (aggregated label)"}
    if audit.get("ceiling") is not None:
        return {"ceiling": audit["ceiling"], "ceiling_ci": audit.get("ceiling_ci"), "ceiling_source": "duplicates"}
    return none


def analyse_task(task: TaskSpec, task_dir: Path, tstate: dict) -> dict:
    """Sweep (binary), routing and the distillation decomposition from the evaluation files.

    Each analysis that cannot be made says why in the returned dict instead of failing the task."""
    order = tstate.get("arm_order") or list(tstate["arms"])
    arms = {name: tstate["arms"][name] for name in order if tstate["arms"].get(name, {}).get("status") == "done"}
    base = next((n for n, st in arms.items() if st["type"] == "sft"), None)
    out: dict[str, Any] = {}
    if base is None:
        return {"note": "no finished direct SFT arm: nothing to compare against"}
    rl_arms = [n for n, st in arms.items() if st["type"] in RL_TYPES]
    (task_dir / "analysis").mkdir(parents=True, exist_ok=True)
    for name, make in (("sweep", lambda: _sweep(task_dir, base, rl_arms, tstate)),
                       ("route", lambda: _routes(task_dir, base, rl_arms)),
                       ("compare", lambda: _compare(task_dir, base, arms, task.n_boot))):
        try:
            out[name] = make()
        except Exception as exc:  # an analysis that cannot be made is reported, not fatal
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def _sweep(task_dir: Path, base: str, rl_arms: list[str], tstate: dict) -> dict:
    from labelrl.evaluate.io import read_predictions
    from labelrl.evaluate.plots import plot_roc
    from labelrl.evaluate.sweep import sweep

    if tstate["kind"] != "binary":
        return {"note": f"{tstate['kind']} labels: the threshold sweep is for binary tasks"}
    positive = tstate["positive_label"]
    scored = read_predictions(eval_paths(task_dir, base, "val")[0], positive_label=positive)
    others = [read_predictions(eval_paths(task_dir, n, "val")[0], positive_label=positive) for n in rl_arms]
    result = sweep(scored, positive_label=positive, compare=others)
    result["arms"] = {"base": base, "compared": rl_arms}
    path = task_dir / "analysis" / "sweep.json"
    result["plot"] = str(plot_roc(result, path.with_suffix(".roc.png")))
    atomic_write_json(path, result)
    return {"file": str(path), "verdicts": {n: c["verdict"] for n, c in zip(rl_arms, result["compared"])}}


def _routes(task_dir: Path, base: str, rl_arms: list[str]) -> dict:
    from labelrl.evaluate.io import read_predictions
    from labelrl.evaluate.route import route

    audit = task_dir / "audit.json"
    scored = read_predictions(eval_paths(task_dir, base, "val")[0])
    files = {}
    for name in rl_arms:
        result = route(scored, read_predictions(eval_paths(task_dir, name, "val")[0]), audit=audit if audit.is_file() else None)
        result["arms"] = {"a": base, "b": name}
        path = task_dir / "analysis" / f"route-{name}.json"
        atomic_write_json(path, result)
        files[name] = str(path)
    return {"files": files}


def _compare(task_dir: Path, base: str, arms: dict, n_boot: int) -> dict:
    from labelrl.distill.compare import compare_models
    from labelrl.evaluate.io import read_predictions

    control = next((n for n, st in arms.items() if st["type"] == "control"), None)
    cot = next((n for n, st in arms.items() if st["type"] == "cot_sft"), None)
    if control is None or cot is None:
        return {"note": "needs finished control and cot_sft arms"}
    preds = [read_predictions(eval_paths(task_dir, n, "holdout")[0]) for n in (base, control, cot)]
    result = compare_models(*preds, names=[base, control, cot], n_boot=n_boot)
    path = task_dir / "analysis" / "compare.json"
    atomic_write_json(path, result)
    return {"file": str(path), "filter_effect": result["filter_effect"], "objective_effect": result["objective_effect"]}

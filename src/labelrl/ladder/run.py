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
from labelrl.ladder.analysis import analyse_task
from labelrl.ladder.arms import LadderStopped, arm_config, evaluate_arm, forget_made, rl_training_summary, train_arm
from labelrl.ladder.collapse import COLLAPSED, stops_on_collapse
from labelrl.ladder.evaluations import eval_cap, scoring_job
from labelrl.train.collapse import collapse_detail
from labelrl.ladder.kinds import FAMILY, RL_TYPES
from labelrl.ladder.recipe import Recipe, requires, run_order
from labelrl.ladder.spec import TaskSpec
from labelrl.ladder.phases import phase_times
from labelrl.ladder.noise_slope import noise_slope_step
from labelrl.ladder.side_by_side import Job, close_workers, train_side_by_side
from labelrl.ladder.tune import known_config, tune_or_follow
from labelrl.ladder.tune_grid import arm_grid, config_changes, moved_to_run

STATE_FILE = "ladder.json"
STATE_FORMAT = 1


def read_state(run_dir: Path) -> dict | None:
    path = Path(run_dir) / STATE_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


class Ladder:
    """The state of one ladder run and the steps that change it (each one saved at once)."""

    def __init__(self, recipe: Recipe, run_dir: Path, console: Console) -> None:
        self.recipe, self.run_dir, self.console = recipe, Path(run_dir).resolve(), console
        self.configs = {t: {a: arm_config(recipe, t, a, self.run_dir) for a in task.arms} for t, task in recipe.tasks.items()}
        self.grids = {t: {a: arm_grid(recipe, t, a, cfg) for a, cfg in arms.items()} for t, arms in self.configs.items()}
        self.state = read_state(self.run_dir) or {"format": STATE_FORMAT, "recipe": recipe.name, "tasks": {}}
        made_in = self.state.get("run_dir")  # elsewhere when the run directory was moved or copied here
        self.state["run_dir"] = str(self.run_dir)
        self.state["task_order"] = list(recipe.tasks)  # the JSON is saved with sorted keys
        self._check_finished_arms_unchanged(made_in)
        self.ahead: dict[Path, dict[str, float]] = {}  # run dir → its shares of the wall time side by side: train, eval

    def save(self) -> None:
        atomic_write_json(self.run_dir / STATE_FILE, self.state)

    def _check_finished_arms_unchanged(self, made_in: str | None) -> None:
        """Refuse a recipe that changes a finished arm's config. Paths under the run directory
        compare relative to it (``made_in``: where the state was written), so a moved run keeps its
        finished arms; their recorded paths are then moved here too (every path-valued field of
        the state under ``made_in``), so the state names the files where they now are."""
        made_in = made_in or str(self.run_dir)
        for task_name, arms in self.configs.items():
            for arm_name, cfg in arms.items():
                old = self.state["tasks"].get(task_name, {}).get("arms", {}).get(arm_name)
                changes = config_changes(cfg, self.grids[task_name][arm_name], old, old_run_dir=made_in,
                                         run_dir=self.run_dir) if old and old.get("status") == "done" else []
                if changes:
                    raise ValueError(
                        f"tasks.{task_name}.arms.{arm_name}: finished in {self.run_dir} with another config "
                        f"({'; '.join(changes[:3])}{'; …' if len(changes) > 3 else ''}); "
                        f"use a new run directory, or delete {self.run_dir / task_name / arm_name} and its entry to redo it")
        if Path(made_in) != self.run_dir:
            self.state["tasks"] = moved_to_run(self.state["tasks"], made_in, self.run_dir)

    def run(self) -> dict:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with RunLock(self.run_dir, "ladder"):
            forget_made()  # what an earlier ladder in this process made was "finished earlier" for this one
            atomic_write_text(self.run_dir / "recipe.yaml", yaml.safe_dump(self.recipe.as_written(), sort_keys=False))
            try:
                for task_name, task in self.recipe.tasks.items():
                    self.run_task(task_name, task)
            finally:
                close_workers()  # the side-by-side workers live as long as the ladder runs
            if (slope := noise_slope_step(self.run_dir, self.state, self.recipe, self.console)) is not None:
                self.state["noise_slope"] = slope  # across tasks: RL's slope on label noise against SFT's
            # where the time went, for the console and the report (which reads files only)
            self.state["phases"] = phase_times(self.state)
            self.state["seconds_last_invocation"] = time.monotonic() - started
            self.save()
        return self.state

    # ------------------------------------------------------------ one task

    def run_task(self, task_name: str, task: TaskSpec) -> None:
        task_dir = self.run_dir / task_name
        self.console.rule(f"task {task_name}: {task.data}")
        tstate = self.state["tasks"].setdefault(task_name, {"arms": {}})
        run_seeds = sorted({cfg.seed for a, cfg in self.configs[task_name].items() if FAMILY[task.arms[a].type] in ("sft", "rl")})
        tstate.update(prepare_task(task, task_dir, self.recipe.seed, run_seeds=run_seeds), arm_order=run_order(task))
        self.save()
        check_answer_caps(task_name, task, self.configs[task_name], self.grids[task_name], tstate["labels"])
        order = run_order(task)
        for i, arm_name in enumerate(order):
            if self.recipe.workers > 1:
                self._train_ahead(task_name, task, order[i:])
            self.run_arm(task_name, task, arm_name)
        started = time.monotonic()
        tstate["analysis"] = analyse_task(task, task_dir, tstate)
        tstate["seconds_analysis"] = time.monotonic() - started
        tstate["verdict"] = tstate["analysis"].get("verdict", [])
        self.save()

    def _train_ahead(self, task_name: str, task: TaskSpec, upcoming: list[str]) -> None:
        """Train side by side every upcoming SFT or RL run that can start now: its dependencies
        done and its config known (``labelrl.ladder.side_by_side``); ``run_arm`` then finds it
        trained. A run still to be tuned trains its candidates side by side in ``tune_arm``."""
        arms, jobs = self.state["tasks"][task_name]["arms"], []
        for name in upcoming:
            if FAMILY[task.arms[name].type] not in ("sft", "rl") or arms.get(name, {}).get("status") == "done":
                continue
            if any(arms.get(dep, {}).get("status") != "done" for dep in requires(task, name)):
                continue
            cfg = known_config(task, name, self.configs[task_name][name], self.grids[task_name][name], arms)
            if cfg is not None:  # the worker scores the run too, as evaluate_final would
                cap = eval_cap(task, task.arms[name].type, cfg, self.configs[task_name])
                jobs.append(Job(name, task.arms[name].type, cfg, self.run_dir / task_name,
                                evaluate=scoring_job("final", task, cap, arm=name)))
        self.ahead.update(train_side_by_side(jobs, self.recipe.workers, self.console))

    def run_arm(self, task_name: str, task: TaskSpec, arm_name: str) -> None:
        arm = task.arms[arm_name]
        arms = self.state["tasks"][task_name]["arms"]
        st = arms.setdefault(arm_name, {})
        if st.get("status") == "done":
            self.console.print(f"[dim]{task_name}/{arm_name}: done earlier, skipped[/]")
            return
        cfg = self.configs[task_name][arm_name]
        deps = requires(task, arm_name)
        st.update(type=arm.type, depends_on=deps, dir=f"{task_name}/{arm_name}", config=cfg.model_dump(mode="json"),
                  error=None, replicate_of=arm.replicate_of, seed=getattr(cfg, "seed", None), **{"from": arm.from_},
                  labels_from=arm.labels_from,
                  **(_rl_fields(cfg) if FAMILY[arm.type] == "rl" else {}))
        blocked = [d for d in deps if arms.get(d, {}).get("status") != "done"]
        if blocked:
            st.update(status="skipped", error=f"depends on arm {blocked[0]!r}, which {arms[blocked[0]]['status']}")
            self.console.print(f"[yellow]{task_name}/{arm_name}: skipped[/] ({st['error']})")
            self.save()
            return
        self.console.rule(f"{task_name}/{arm_name} ({arm.type}{', from ' + arm.from_ if arm.from_ else ''})")
        st["status"] = "running"
        self.save()
        start = time.monotonic() - (sum(self.ahead.get(Path(cfg.out), {}).values()) if hasattr(cfg, "out") else 0.0)
        try:
            self._train_and_evaluate(task, self.run_dir / task_name, arm_name, arm.type, cfg, st)
            st["status"] = COLLAPSED if stops_on_collapse(task, st) else "done"
            st.pop("error", None)  # a rerun that succeeds leaves no trace of an earlier failure
            (self.run_dir / task_name / arm_name / "error.txt").unlink(missing_ok=True)
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
        from labelrl.ladder.evaluations import evaluate_final
        from labelrl.train.val_scoring import val_path_pending

        if FAMILY[arm_type] == "threshold":
            self._derive(task_dir, arm_name, cfg, st)
            return
        if FAMILY[arm_type] == "relabel":
            from labelrl.ladder.derived import relabel_arm

            st["relabel"] = relabel_arm(task_dir, arm_name, cfg, self.console)
            return
        started = time.monotonic()
        cfg = self.configs[task_dir.name][arm_name] = tune_or_follow(  # a tuned arm becomes its grid's winner
            task, task_dir, arm_name, arm_type, cfg, self.grids[task_dir.name][arm_name], self.configs[task_dir.name],
            self.state["tasks"][task_dir.name]["arms"], self.save, self.console, self.recipe.workers)
        st["config"] = cfg.model_dump(mode="json")
        train_arm(arm_type, cfg, task_dir, self.console)
        ahead = self.ahead.pop(Path(cfg.out), {})  # its shares of the time it trained and was scored side by side
        started -= ahead.get("train", 0.0)
        if FAMILY[arm_type] == "distill":
            summary = json.loads((task_dir / arm_name / "traces.summary.json").read_text(encoding="utf-8"))
            st["survival"] = summary["overall"]
            return
        st["seconds_train"] = time.monotonic() - started  # tuning candidates included (their val scoring too)
        if FAMILY[arm_type] == "rl":
            if val_path_pending(task_dir / arm_name):  # its last val point and collapse flag wait for its val scores
                evaluate_arm(task, task_dir, arm_name, cfg.mode, "val", precision=cfg.precision,
                             max_new_tokens=eval_cap(task, arm_type, cfg, self.configs[task_dir.name]))
            st["train"] = rl_training_summary(task_dir / arm_name)
            if stops_on_collapse(task, st):  # on_collapse: stop: no look spent on a constant answer
                self.console.print(f"[yellow]{task_dir.name}/{arm_name}: {collapse_detail(st['train']['collapse'])}; "
                                   "on_collapse: stop, so it is not evaluated[/]")
                return
        started = time.monotonic()
        evaluate_final(task, task_dir, arm_name, arm_type, cfg, self.configs[task_dir.name], st, self.save, self.console)
        st["seconds_eval"] = time.monotonic() - started + ahead.get("eval", 0.0)

    def _derive(self, task_dir: Path, arm_name: str, cfg, st: dict) -> None:
        """A threshold arm: its parent's scores with rules chosen on val (no training, no new look)."""
        from labelrl.evaluate.decision import thin_words
        from labelrl.ladder.derived import evaluate_threshold_arm

        tstate = self.state["tasks"][task_dir.name]
        rl_arms = [n for n, a in tstate["arms"].items()
                   if a.get("status") == "done" and a.get("type") in RL_TYPES and a.get("from") == cfg.parent.name]
        st.update(evaluate_threshold_arm(task_dir, arm_name, cfg, rl_arms, tstate.get("positive_label")))
        thin = thin_words(st.get("thin_val") or {})
        self.console.print(f"{arm_name}: {st['rule']['kind']} chosen on val ({st['rule']['chosen_by']}); "
                           f"holdout balanced accuracy {st['holdout'].get('balanced_accuracy', float('nan')):.3f} "
                           "(derived from the parent's holdout look, not a new one)" + (f"; [yellow]{thin}[/]" if thin else ""))


def _rl_fields(cfg) -> dict[str, Any]:
    """An RL arm's preset and the algorithm it resolves to (what an ablation changes)."""
    from labelrl.train.presets import resolve_preset

    preset = resolve_preset(cfg.preset, estimator=cfg.estimator, surrogate=cfg.surrogate, aggregation=cfg.aggregation)
    algorithm = {"estimator": preset.estimator, **{f"estimator.{k}": v for k, v in preset.estimator_options.items()},
                 "surrogate": preset.surrogate, **{f"surrogate.{k}": v for k, v in preset.surrogate_options.items()},
                 "aggregation": preset.aggregation, "dynamic_sampling": cfg.dynamic_sampling or preset.dynamic_sampling}
    if preset.estimator == "corpo":
        algorithm["estimator.threshold"] = cfg.threshold
    return {"preset": cfg.preset, "algorithm": algorithm}


def prepare_task(task: TaskSpec, task_dir: Path, seed: int, run_seeds: list[int] | None = None) -> dict[str, Any]:
    """Load the data, make or reuse the shared splits, audit once, record the samples every arm
    trains and is scored on (and the flipped labels of each of ``run_seeds``, the seeds of the
    training runs, with ``label_noise_seed: run``); the task's state fields."""
    from labelrl.audit import audit_dataset
    from labelrl.data.options import DataOptions
    from labelrl.data.prepare import load_checked_dataset
    from labelrl.data.split import load_or_make_splits

    options = DataOptions(**task.data_options())
    dataset = load_checked_dataset(options)
    splits = load_or_make_splits(dataset, task_dir, seed=task.split_seed, ratios=options.ratios())
    samples = record_samples(task, dataset, splits, task_dir, run_seeds or [seed])
    labels = list(dataset.labels.labels)
    positive = task.positive_label or (dataset.labels.positive_label if dataset.labels.kind == "binary" else None)
    if positive is not None and positive not in labels:
        raise ValueError(f"positive_label {positive!r}: not a label of {task.data} ({', '.join(labels)})")
    audit_path = task_dir / "audit.json"
    if task.audit and not audit_path.is_file():
        atomic_write_json(audit_path, audit_dataset(dataset, splits=splits.ids, n_boot=200, seed=seed, top=0))
    audit = json.loads(audit_path.read_text(encoding="utf-8")) if audit_path.is_file() else None
    return {"data": task.data, "kind": dataset.labels.kind, "labels": labels, "positive_label": positive,
            "ood": list(task.ood), "splits": splits.sizes(), "split_ratios": list(splits.ratios),
            "label_noise": task.label_noise, "label_noise_seed": task.label_noise_seed, "success_threshold": task.success_threshold, "samples": samples,
            **label_ceiling(audit)}


def check_answer_caps(task_name: str, task: TaskSpec, configs: dict, grids: dict, labels: list[str]) -> None:
    """Before the task's first run trains: every RL arm's token cap (each value its grid tries
    too) and the task's ``eval_max_new_tokens`` must hold the longest answer tag and its
    end-of-text token in the task's model's tokens (``labelrl.data.prompts.check_answer_fits``,
    which the RL run and a generated evaluation check again when they start). A cap that cannot
    would otherwise stop its arm after its parent has trained."""
    from labelrl.data.prompts import check_answer_fits
    from labelrl.models.load import load_tokenizer

    caps = [(f"tasks.{task_name}.eval_max_new_tokens", task.eval_max_new_tokens)] if task.eval_max_new_tokens else []
    for name, cfg in configs.items():
        if task.arms[name].type in RL_TYPES:
            candidates = grids[name].candidates if grids.get(name) is not None else [{}]
            caps += [(f"{task_name}/{name}'s max_new_tokens", values.get("max_new_tokens", cfg.max_new_tokens))
                     for values in candidates]
    models = [cfg.model for name, cfg in configs.items() if FAMILY[task.arms[name].type] == "sft"]
    if not caps or not models:
        return
    tokenizer = load_tokenizer(models[0])
    for where, cap in caps:
        try:
            check_answer_fits(tokenizer, labels, cap)
        except ValueError as exc:
            raise ValueError(f"recipe: {where}: {exc}") from None


def record_samples(task: TaskSpec, dataset, splits, task_dir: Path, run_seeds: list[int]) -> dict[str, dict]:
    """``TASK/samples.json``: per split, the sample every arm uses (``limit``, ``eval_limit``,
    ``holdout_limit``; labelrl.data.sample) with its label counts next to the whole split's, and
    ``TASK/label_noise.json`` when training labels are flipped: the flips every run trains on
    (``label_noise_seed: split``), or per seed of ``run_seeds`` the flips of the runs with that
    seed (``run``; each run also saves its own). Returns the counts (no ids)."""
    from labelrl.data.prepare import LABEL_NOISE_FILE, draw_training_sample
    from labelrl.data.sample import sample_examples, sample_record
    from labelrl.data.split import select

    def draw(run_seed: int):
        return draw_training_sample(select(dataset, splits, "train"), dataset.labels.labels, limit=task.limit,
                                    split_seed=splits.seed, rate=task.label_noise, noise_seed=task.label_noise_seed,
                                    run_seed=run_seed, balanced=task.train_sample == "balanced")

    drawn = draw(run_seeds[0])
    if task.label_noise > 0 and task.label_noise_seed == "split":
        _write_if_changed(task_dir / LABEL_NOISE_FILE, drawn.noise)
    elif task.label_noise > 0:
        _write_if_changed(task_dir / LABEL_NOISE_FILE, {"label_noise": task.label_noise, "label_noise_seed": "run",
                                                        "by_seed": {str(s): draw(s).noise for s in run_seeds}})
    records = {"train": drawn.record}
    for split, limit in (("val", task.eval_limit), ("holdout", task.holdout_limit)):
        full = select(dataset, splits, split)
        records[split] = sample_record(split, sample_examples(full, limit, splits.seed), full, seed=splits.seed, limit=limit)
    _write_if_changed(task_dir / "samples.json", records)
    return {split: {k: v for k, v in r.items() if k != "ids"} for split, r in records.items()}


def _write_if_changed(path: Path, obj: dict) -> None:
    """Write ``obj`` unless ``path`` already holds it (a re-run touches no finished file)."""
    if not path.is_file() or json.loads(path.read_text(encoding="utf-8")) != json.loads(json.dumps(obj, default=str)):
        atomic_write_json(path, obj)


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

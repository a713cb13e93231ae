"""One arm of a ladder: its resolved config, its training, and its evaluations.

Every arm trains in ``RUN_DIR/TASK/ARM`` on the task's shared splits (the task's
``splits.json`` is copied in before the arm starts; the trainers check its fingerprint
against the data, so an arm can never train on other splits). An arm with ``labels_from``
trains on the same items with a relabel arm's labels (``train_labels``, its answer key). Evaluations are written to
``RUN_DIR/TASK/eval`` and recorded in the task's ledger, so each final model touches the
holdout once.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from rich.console import Console

from labelrl.fileio import atomic_write_json
from labelrl.ladder.kinds import FAMILY
from labelrl.ladder.layout import eval_paths
from labelrl.ladder.recipe import Recipe, deep_merge
from labelrl.ladder.spec import TaskSpec

# Keys the ladder sets itself; a recipe setting them would silently break the wiring.
WIRED = {
    "sft": {"out", "traces", "only_ids_from", "train_labels"},
    "rl": {"out", "model", "random_reward", "resume", "success_threshold", "train_labels", "val_path_within",
           "val_path_start", "val_path_end"},
    "distill": {"out", "run_dir", "split", "teacher"},
    "threshold": {"out", "parent"},
    "relabel": {"out", "only_ids"},
}


class LadderStopped(Exception):
    """A training command stopped early (SIGTERM/SIGINT, --stop-after): the ladder stops too."""


def _config_class(family: str) -> type[BaseModel]:
    from labelrl.audit.relabel_run import RelabelConfig
    from labelrl.distill.run import DistillConfig
    from labelrl.ladder.derived import ThresholdConfig
    from labelrl.train.config import RLConfig, SFTConfig

    return {"sft": SFTConfig, "rl": RLConfig, "distill": DistillConfig, "threshold": ThresholdConfig,
            "relabel": RelabelConfig}[family]


def arm_config(recipe: Recipe, task_name: str, arm_name: str, run_dir: Path) -> BaseModel:
    """The arm's command config: recipe defaults < task defaults < the arm's own keys < wiring."""
    task = recipe.tasks[task_name]
    arm = task.arms[arm_name]
    family = FAMILY[arm.type]
    where = f"tasks.{task_name}.arms.{arm_name}"
    task_dir = run_dir / task_name
    options = deep_merge(recipe.defaults.get(family, {}), task.defaults.get(family, {}))
    options = deep_merge(options, arm.options())
    options.pop("tune", None)  # a defaults section's grid (labelrl.ladder.tune_grid), not an option of the command
    clash = sorted(set(options) & WIRED[family])
    if clash:
        raise ValueError(f"{where}: {', '.join(clash)} set by the ladder (from the arm's place in the recipe); drop them")
    cls = _config_class(family)
    unknown = sorted(set(options) - set(cls.model_fields))
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {unknown} for a {arm.type} arm; see `labelrl {family} --help`")
    shared = {k: v for k, v in (("seed", recipe.seed), ("precision", recipe.precision)) if k in cls.model_fields}
    fields = _wiring(recipe, task, task_dir, arm_name) | shared | options | _wiring(recipe, task, task_dir, arm_name, forced=True)
    try:
        return cls(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "config"
        raise ValueError(f"{where}: {loc}: {first['msg']}") from None


def _wiring(recipe: Recipe, task: TaskSpec, task_dir: Path, arm_name: str, *, forced: bool = False) -> dict[str, Any]:
    """Defaults (``forced=False``: the task's data, the recipe's model) or the wired keys."""
    arm = task.arms[arm_name]
    family = FAMILY[arm.type]
    parent = task_dir / arm.from_ if arm.from_ else None
    if family == "threshold":
        return {"out": task_dir / arm_name, "parent": parent, "n_boot": task.n_boot} if forced else {}
    if family == "relabel":
        if forced:  # the items every arm trains and is scored on (the ladder writes ids.json)
            return {"out": task_dir / arm_name / "relabelled.jsonl", "only_ids": task_dir / arm_name / "ids.json"}
        keys = ("data", "label_col", "labels", "rubric", "on_bad_row", "delimiter", "encoding")
        return {k: v for k, v in task.data_options().items() if k in keys} | ({"text_col": task.text_col} if task.text_col else {})
    if family == "distill":
        if not forced:
            keys = ("data", "label_col", "labels", "rubric", "limit", "train_sample", "split_seed", "split_ratios", "on_bad_row",
                    "delimiter", "encoding")
            return {k: v for k, v in task.data_options().items() if k in keys} | ({"text_col": task.text_col} if task.text_col else {})
        teacher = str(parent) if parent is not None else str(task_dir / arm.teacher) if arm.teacher in task.arms else arm.teacher
        return {"out": task_dir / arm_name / "traces.jsonl", "run_dir": task_dir, "split": "train", "teacher": teacher}
    if not forced:
        base = task.data_options() | {"model": recipe.model}
        if family == "rl":  # the RL path on val (--val-path) scores the items of the arms' val evaluations
            base["eval_limit"] = task.eval_limit
        return base | ({"mode": "reasoning"} if arm.type in ("cot_sft", "cot_rl") else {})
    wired: dict[str, Any] = {"out": task_dir / arm_name}
    if arm.type == "cot_sft":
        wired["traces"] = parent / "traces.jsonl"
    elif arm.type == "control":
        wired["only_ids_from"] = parent / "traces.jsonl"
    elif family == "rl":
        wired["model"] = str(parent)
        wired["random_reward"] = arm.type == "random_reward"
        wired["success_threshold"] = task.success_threshold  # one definition of failure for every arm
        # the path on val: items among the task's val sample, step 0 read from the parent's val scores
        wired["val_path_within"] = task.eval_limit
        wired["val_path_start"] = eval_paths(task_dir, arm.from_, "val")[0]
        # and the last step read from the arm's own val scores, which the ladder takes right after training
        wired["val_path_end"] = eval_paths(task_dir, arm_name, "val")[0]
    if arm.labels_from:  # the relabel arm's key (labelrl.data.train_labels): same items, its labels
        wired["train_labels"] = task_dir / arm.labels_from / "answer_key.json"
    return wired


# ---------------------------------------------------------------- training


_MADE_HERE: set[Path] = set()  # run dirs this process's ladder trained in a worker or adopted from a tuning candidate


def note_made(out: Path) -> None:
    """Record that this ladder invocation made the run in ``out`` (a worker trained it, or it is a
    tuned arm's winning candidate), so reading it back is not reported as reusing an earlier run."""
    _MADE_HERE.add(Path(out).resolve())


def forget_made() -> None:
    """Start a ladder invocation with nothing recorded by ``note_made``."""
    _MADE_HERE.clear()


def train_finished(arm_type: str, out: Path) -> bool:
    family = FAMILY[arm_type]
    if family == "relabel":
        return (out / "answer_key.json").is_file()
    if family == "sft":
        return (out / "sft_summary.json").is_file() and (out / "model").is_dir()
    if family == "rl":
        return (out / "rl_summary.json").is_file() and (out / "model").is_dir()
    return (out / "traces.summary.json").is_file()


def train_arm(arm_type: str, cfg: BaseModel, task_dir: Path, console: Console) -> None:
    """Run the arm's command unless its outputs are already complete.

    A killed SFT arm restarts from scratch (its partial files are removed: nothing of it was
    used); a killed RL arm resumes from its last checkpoint; a distill arm re-reads its journal
    and asks the teacher only what it has not answered.
    """
    from labelrl.train.checkpoint import latest_checkpoint

    family = FAMILY[arm_type]
    out = Path(cfg.out).parent if family == "distill" else Path(cfg.out)
    if train_finished(arm_type, out):
        made = Path(out).resolve() in _MADE_HERE
        console.print(f"[dim]{out}: {'trained above' if made else 'finished earlier, reused'}[/]")
        return
    if family == "sft" and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    if family != "distill":
        shutil.copyfile(task_dir / "splits.json", out / "splits.json")
    if family == "sft":
        from labelrl.train.sft import run_sft

        run_sft(cfg)
    elif family == "rl":
        from labelrl.train.rl import run_rl

        started = latest_checkpoint(out) is not None or (out / "metrics.jsonl").exists()
        summary = run_rl(cfg.model_copy(update={"resume": started}))
        if summary.get("stopped_early"):
            raise LadderStopped(f"{out}: stopped after {summary['steps_done']} of {summary['steps']} steps; "
                                "re-run the ladder to resume it")
    else:
        from labelrl.distill.run import run_distill_config

        scored = sorted((task_dir / "eval").glob("*-train.parquet"))  # the direct SFT model's train scores
        if scored and cfg.difficulty is None:  # survival by the SFT model's confidence band
            cfg = cfg.model_copy(update={"difficulty": scored[0]})
        run_distill_config(cfg)


# ---------------------------------------------------------------- evaluation


def evaluate_arm(task: TaskSpec, task_dir: Path, arm_name: str, mode: str, split: str, *,
                 ood: str | None = None, method: str | None = None, max_new_tokens: int | None = None,
                 precision: str = "auto") -> dict:
    """Evaluate the arm's final model on val, holdout or another dataset's holdout; returns the
    ``run_eval`` report (also saved). A finished evaluation is read back, never redone, so a
    re-run never spends a second holdout look.

    On a holdout, the ledger is read first: a model with the same weights as an arm already
    scored there (e.g. an RL arm whose every group was uniform, so it never updated) shares that
    arm's result, marked ``same_model_as``, instead of looking again; a look of this very arm
    whose report was never written (killed in between) is taken again and marked a repeat. An RL
    run's path on val takes its last step from the val scores (``complete_val_path``)."""
    from labelrl.train.val_scoring import complete_val_path

    result = _evaluate_arm(task, task_dir, arm_name, mode, split, ood=ood, method=method, max_new_tokens=max_new_tokens,
                           precision=precision)
    complete_val_path(task_dir / arm_name)  # a no-op unless these are the scores its pending path point waits for
    return result


def _evaluate_arm(task: TaskSpec, task_dir: Path, arm_name: str, mode: str, split: str, *, ood: str | None,
                  method: str | None, max_new_tokens: int | None, precision: str) -> dict:
    from labelrl.evaluate.ledger import earlier_looks
    from labelrl.evaluate.setup import prepare
    from labelrl.evaluate.run import EvalConfig, evaluate_and_write

    tag = (f"ood-{ood}" if ood else split) + ("-generate" if method == "generate" and mode == "direct" else "")
    predictions, report = eval_paths(task_dir, arm_name, tag)
    if report.is_file():
        return json.loads(report.read_text(encoding="utf-8"))
    splits = task_dir / "ood" / ood if ood else task_dir
    splits.mkdir(parents=True, exist_ok=True)
    limit = {"val": task.eval_limit, "holdout": task.holdout_limit, "train": task.limit}[split]
    cfg = EvalConfig(run_or_model=str(task_dir / arm_name), split=split, splits=splits, out=predictions, json_path=report,
                     limit=limit, n_boot=task.n_boot, method=method, max_new_tokens=max_new_tokens, precision=precision,
                     **({"data": ood, "mode": mode, "split_seed": task.split_seed,
                         "split_ratios": task.ood_split_ratios or task.split_ratios} if ood else {}))
    setup = prepare(cfg.run_or_model, cfg.data_options(), split, splits_dir=splits, limit=cfg.limit, precision=precision)
    if split == "holdout":
        data = setup.data
        look_method = method or ("scores" if mode == "direct" else "generate")
        earlier = earlier_looks(splits, setup.model_fingerprint, data.split_fingerprint, data.holdout_fingerprint, look_method)
        arm_dir = (task_dir / arm_name).resolve()
        mine = [r for r in earlier if Path(r["model_spec"]).resolve().is_relative_to(arm_dir)]
        shared = next((r for r in earlier if r not in mine and _shareable(r, limit=cfg.limit, n=len(data.examples))), None)
        if shared is not None and not mine:
            return _share_evaluation(shared, task_dir, arm_name, tag)
        cfg = cfg.model_copy(update={"allow_repeat_holdout": bool(earlier)})
    return evaluate_and_write(setup, cfg)


def _shareable(record: dict, *, limit: int | None, n: int) -> bool:
    """An earlier look whose files are still there and that scored the same number of items."""
    files = record.get("files") or {}
    return bool(files.get("predictions") and files.get("report") and Path(files["report"]).is_file()
                and Path(files["predictions"]).is_file() and (record.get("metrics") or {}).get("n") == n)


def _share_evaluation(record: dict, task_dir: Path, arm_name: str, tag: str) -> dict:
    """Copy the evaluation of the model with these exact weights (another arm of this ladder, or
    the same model evaluated on this holdout elsewhere), marked ``same_model_as``."""
    model = Path(record["model_spec"])
    source = model.parent.name if model.name == "model" else model.name
    report = json.loads(Path(record["files"]["report"]).read_text(encoding="utf-8"))
    same_ladder = Path(record["files"]["report"]).resolve().parent == (task_dir / "eval").resolve()
    report["same_model_as"] = source if same_ladder else str(model)
    predictions, path = eval_paths(task_dir, arm_name, tag)
    shutil.copyfile(record["files"]["predictions"], predictions)
    atomic_write_json(path, report)
    return report


def rl_training_summary(arm_dir: Path) -> dict[str, Any]:
    """First and last step's mean reward, the run's mean failed-positive fraction and its
    collapse flag (``rl_summary.json``'s, labelrl.train.collapse; None when not collapsed)."""
    from labelrl import metrics_keys as K
    from labelrl.fileio import read_jsonl

    records = read_jsonl(arm_dir / "metrics.jsonl")
    summary = json.loads((arm_dir / "rl_summary.json").read_text(encoding="utf-8"))
    return {"steps": len(records), "reward_first": records[0][K.REWARD_MEAN], "reward_last": records[-1][K.REWARD_MEAN],
            "failed_positive_frac": sum(r[K.FAILED_POSITIVE_FRAC] for r in records) / len(records),
            "collapse": summary.get("collapse")}

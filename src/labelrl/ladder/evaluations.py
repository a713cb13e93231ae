"""Every evaluation of a finished arm, in order: val, the holdout once, generated answers of a
direct RL arm, out-of-domain holdouts, other answer keys, pass@k on val, and the direct SFT
model's scores on the training sample.

* A reasoning arm is scored with its own generation cap (the cap it trained at, or for a CoT-SFT
  arm the cap its traces were distilled at) unless the task sets ``eval_max_new_tokens``: a
  shorter cap would count its truncated answers as wrong.
* A direct RL arm is also scored by its own greedy generations parsed strictly (``-generate``
  evaluations): the label-token scores need logit access a deployed generator does not give.
  On the holdout this is a second reading of the model's one look, recorded as such
  (``labelrl.evaluate.ledger``): one look per final model, with both readings. An arm whose
  weights equal an earlier arm's shares that look and adds the reading it lacks.
* Out-of-domain holdouts are other holdouts (their own splits and ledger): one look each.
* pass@k samples val only (the holdout is refused); train scores are never recorded; a
  threshold arm's holdout records are derived from its parent's look (``labelrl.ladder.derived``).
* Another answer key (``eval_label_cols``) rescores the same predictions against another label
  column: nothing new is looked at, so its holdout record is derived.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from labelrl.ladder.arms import evaluate_arm, rl_training_summary
from labelrl.ladder.kinds import FAMILY
from labelrl.ladder.spec import TaskSpec


def eval_cap(task: TaskSpec, arm_type: str, cfg, configs: dict) -> int | None:
    """The token cap of the arm's generated evaluations (module docstring); None: the default."""
    if task.eval_max_new_tokens is not None:
        return task.eval_max_new_tokens
    if FAMILY[arm_type] == "rl" and cfg.mode == "reasoning":
        return cfg.max_new_tokens
    if arm_type == "cot_sft":
        parent = next((c for c in configs.values() if getattr(c, "out", None) == Path(cfg.traces)), None)
        return getattr(parent, "max_new_tokens", None)
    return None


def _look(result: dict, st: dict, key: str, console) -> None:
    """Record a holdout evaluation's summary and whether it was shared or repeated."""
    from labelrl.evaluate.ledger import summary_metrics

    st[key] = summary_metrics(result["metrics"])
    st[f"{key}_repeat"] = bool((result.get("ledger") or {}).get("repeat"))
    if result.get("same_model_as"):
        st[f"{key}_same_model_as"] = result["same_model_as"]
        console.print(f"[yellow]weights identical to {result['same_model_as']}'s: {key} result shared, not looked at again[/]")


def scored_evaluations(task: TaskSpec, arm_type: str, mode: str) -> list[tuple[str, dict]]:
    """The evaluations of a finished arm that score its model, in ``evaluate_final``'s order:
    ``(state key, evaluate_arm keywords)`` (an OOD set's key: ``ood/NAME``). A side-by-side
    worker runs the same list after training (``evaluate_ahead``)."""
    out = [("val", {"split": "val"}), ("holdout", {"split": "holdout"})]
    if FAMILY[arm_type] == "rl" and mode == "direct" and task.generate_eval:
        out += [("val_generate", {"split": "val", "method": "generate"}),
                ("holdout_generate", {"split": "holdout", "method": "generate"})]
    return out + [(f"ood/{name}", {"split": "holdout", "ood": name}) for name in task.ood]


def evaluate_final(task: TaskSpec, task_dir: Path, arm_name: str, arm_type: str, cfg, configs: dict, st: dict,
                   save: Callable[[], None], console) -> None:
    """Run every evaluation of the module docstring the task asks for, saving state after each."""
    from labelrl.evaluate.setup import shared_models

    with shared_models():  # the arm's model is loaded once for all of them
        _evaluate_final(task, task_dir, arm_name, arm_type, cfg, configs, st, save, console)


def _evaluate_final(task: TaskSpec, task_dir: Path, arm_name: str, arm_type: str, cfg, configs: dict, st: dict,
                    save: Callable[[], None], console) -> None:
    from labelrl.evaluate.ledger import summary_metrics

    mode, cap = cfg.mode, eval_cap(task, arm_type, cfg, configs)
    at = {"max_new_tokens": cap, "precision": cfg.precision}
    st["eval_max_new_tokens"] = cap
    st["ood"] = {}
    for key, where in scored_evaluations(task, arm_type, mode):
        result = evaluate_arm(task, task_dir, arm_name, mode, **where, **at)
        if key.startswith("ood/"):
            st["ood"][where["ood"]] = summary_metrics(result["metrics"])
        elif where["split"] == "holdout":
            _look(result, st, key, console)
        else:
            st[key] = summary_metrics(result["metrics"])
        save()
    if task.eval_label_cols:
        st["answer_keys"] = answer_keys(task, task_dir, arm_name)
        save()
    if task.pass_at_k and FAMILY[arm_type] in ("sft", "rl"):
        st["pass_at_k"] = pass_at_k(task, task_dir, arm_name, cap, cfg.precision)
        save()
    if arm_type == "sft" and wants_train_scores(task) and first_direct_sft(task) == (st.get("replicate_of") or arm_name):
        evaluate_arm(task, task_dir, arm_name, mode, "train", precision=cfg.precision)
        st["train_scores"] = True


def candidate_eval_paths(run: Path) -> tuple[Path, Path]:
    """(predictions, report) of a tuning candidate's val evaluation, beside its run directory."""
    return run.parent / f"{run.name}-val.parquet", run.parent / f"{run.name}-val.json"


def evaluate_candidate(task: TaskSpec, task_dir: Path, run: Path, mode: str, cap: int | None, precision: str) -> dict:
    """A tuning candidate's val evaluation (``labelrl.ladder.tune``), read back when it was written
    before (a side-by-side worker scores it right after training it); an RL candidate's path on
    val then gets its last step from it (``labelrl.train.val_scoring.complete_val_path``)."""
    from labelrl.evaluate.setup import prepare
    from labelrl.evaluate.run import EvalConfig, evaluate_and_write
    from labelrl.train.val_scoring import complete_val_path

    predictions, report = candidate_eval_paths(run)
    if report.is_file():
        result = json.loads(report.read_text(encoding="utf-8"))
    else:
        cfg = EvalConfig(run_or_model=str(run), split="val", splits=task_dir, out=predictions, json_path=report,
                         limit=task.eval_limit, n_boot=task.n_boot, max_new_tokens=cap, precision=precision)
        setup = prepare(cfg.run_or_model, cfg.data_options(), "val", splits_dir=task_dir, limit=cfg.limit,
                        precision=precision)
        result = evaluate_and_write(setup, cfg)
    complete_val_path(run)
    return result


def scoring_job(kind: str, task: TaskSpec, cap: int | None, arm: str | None = None) -> dict:
    """What a side-by-side worker scores after training (``labelrl.ladder.worker.evaluate``), in
    plain values: ``candidate`` (val) or ``final`` (``evaluate_ahead`` of ``arm``)."""
    return {"kind": kind, "task": task.model_dump(mode="json"), "cap": cap, **({"arm": arm} if arm else {})}


def evaluate_ahead(task: TaskSpec, task_dir: Path, arm_name: str, arm_type: str, mode: str, cap: int | None,
                   precision: str) -> None:
    """``scored_evaluations`` of a run a side-by-side worker has just trained, as the ladder would
    make them (``evaluate_arm`` writes each report; ``evaluate_final`` then reads them back). A run
    the task stops on collapse is scored on val only (its path's last point comes from there, and
    with it the collapse flag): the ladder spends no holdout look on it."""
    from labelrl.evaluate.setup import shared_models
    from labelrl.ladder.collapse import stops_on_collapse

    with shared_models():  # the run's model is loaded once for all of them
        for key, where in scored_evaluations(task, arm_type, mode):
            if (key != "val" and FAMILY[arm_type] == "rl"
                    and stops_on_collapse(task, {"train": rl_training_summary(task_dir / arm_name)})):
                return
            evaluate_arm(task, task_dir, arm_name, mode, **where, max_new_tokens=cap, precision=precision)


def wants_train_scores(task: TaskSpec) -> bool:
    """Score the training sample with the SFT model: asked, or (by default) for distillation."""
    return task.score_train if task.score_train is not None else any(a.type == "distill" for a in task.arms.values())


def first_direct_sft(task: TaskSpec) -> str | None:
    """The first direct SFT arm of the task (the one whose train scores the analyses use)."""
    return next(((a.replicate_of or n) for n, a in task.arms.items() if a.type == "sft"), None)


def answer_keys(task: TaskSpec, task_dir: Path, arm_name: str) -> dict[str, dict]:
    """The arm's val and holdout predictions rescored against each of ``task.eval_label_cols``."""
    from labelrl.ladder.derived import rescore_against

    out: dict[str, dict] = {}
    for col in task.eval_label_cols:
        key = answer_key(task, task_dir, col)
        out[col] = {split: rescore_against(task_dir, arm_name, split, col, key, task.n_boot) for split in ("val", "holdout")}
    return out


def answer_key(task: TaskSpec, task_dir: Path, col: str) -> dict[str, str]:
    """id → label of another answer key: a relabel arm's final labels, or a label column of the data."""
    from labelrl.data.load import load_dataset

    key_file = task_dir / col / "answer_key.json"
    if col in task.arms and key_file.is_file():  # a relabel arm
        labels = json.loads(key_file.read_text(encoding="utf-8"))["labels"]
        return {str(i): str(v) for i, v in labels.items() if v is not None}
    dataset = load_dataset(task.data, text_cols=task.text_col, label_col=col, labels=task.labels and task.labels.split(","),
                           kind=task.kind, on_bad_row="skip", delimiter=task.delimiter,
                           encoding=task.encoding or "utf-8")
    return {ex.id: ex.label for ex in dataset.examples}


def pass_at_k(task: TaskSpec, task_dir: Path, arm_name: str, cap: int | None, precision: str = "auto") -> dict:
    """pass@k of the arm's sampled answers on the val sample (read back on a re-run)."""
    import json

    from labelrl.evaluate.setup import prepare
    from labelrl.evaluate.run import EvalConfig, pass_at_k_and_write

    path = task_dir / "eval" / f"{arm_name}-val-pass.json"
    if not path.is_file():
        cfg = EvalConfig(run_or_model=str(task_dir / arm_name), split="val", splits=task_dir, json_path=path,
                         limit=task.eval_limit, n_boot=task.n_boot, pass_at_k=task.pass_at_k,
                         pass_samples=task.pass_samples, max_new_tokens=cap, precision=precision)
        pass_at_k_and_write(prepare(cfg.run_or_model, None, "val", splits_dir=task_dir, limit=cfg.limit,
                                    precision=precision), cfg)
    result = json.loads(path.read_text(encoding="utf-8"))["pass_at_k"]
    return {k: result[k] for k in ("k", "n_samples", "n_items", "pass_at_k", "pass_at_k_ci", "pass_at_1", "pass_at_1_ci")}

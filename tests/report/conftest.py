"""A synthetic ladder run directory, written with the real writers so its formats are the real ones.

``build_ladder_run(root, sweep=..., distill=..., ood=...)`` writes ``root/run`` with:

* task ``spam`` (binary ham/spam): ``sft`` (done, sft_metrics.jsonl, val + holdout), ``grpo``
  (rl, done, metrics.jsonl + rollout log, val + holdout), ``corpo`` (rl, done, repeat holdout),
  ``random`` (random_reward, failed), ``distill`` (done, traces.summary.json), ``control`` and
  ``cot_sft`` (done, val), ``cot_rl`` (skipped); analysis/sweep.json, route-grpo.json and
  compare.json; audit.json with a ceiling and its interval;
* the spam task also has a ``threshold`` arm (SFT + threshold chosen on val, with the
  recall-matched thresholds of grpo and corpo), analysis/paired.json and the verdict, and the
  holdout sample's label counts;
* task ``spam_noisy``: the spam data with 20% of training labels flipped (sft and grpo holdout
  evaluations), for the label-noise section;
* task ``movies`` (ordinal 1–5): ``sft``, ``grpo`` and ``corpo`` (partial-credit rewards; corpo's
  holdout shared with grpo), each also evaluated out of domain on ``vader-tweets``; the
  ladder's analysis notes say why there is no sweep and no decomposition.

ladder.json carries what ``labelrl ladder`` writes: task_order, arm_order, the ceiling with its
interval and source, per-arm status/error/metrics, the analysis notes.

Predictions go through write_predictions/read_predictions, metrics through
classification_metrics, the ledger through record_evaluation, rollouts through
labelrl.rollout.log.write_step, analyses through sweep/route/compare_models.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from labelrl import metrics_keys as K
from labelrl.distill.compare import compare_models
from labelrl.distill.reject import survival_summary
from labelrl.evaluate.io import Predictions, predictions_table, read_predictions, write_predictions
from labelrl.evaluate.ledger import record_evaluation, summary_metrics
from labelrl.evaluate.metrics import classification_metrics
from labelrl.evaluate.passk import summarise as pass_summary
from labelrl.evaluate.route import route
from labelrl.evaluate.sweep import sweep
from labelrl.fileio import append_jsonl, atomic_write_json
from labelrl.ladder.analysis import paired_comparisons, task_verdict
from labelrl.ladder.derived import ThresholdConfig, evaluate_threshold_arm
from labelrl.types import LabelSpace

SPAM = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
MOVIES = LabelSpace(("1", "2", "3", "4", "5"), kind="ordinal")
FAILED_ERROR = "ValueError: reward <script>alert(1)</script> broke\n  File \"rl.py\", line 3, in step"
SKIP_REASON = "depends on arm 'random', which failed"
SWEEP_NOTE = "ordinal labels: the threshold sweep is for binary tasks"
N_VAL = 60
G = 4


def make_predictions(labels: LabelSpace, n: int, skill: float, seed: int) -> Predictions:
    """Scored predictions on a fixed answer key (the same for every model): the true label's
    probability is raised by ``skill``."""
    truth = np.random.default_rng(100 + labels.k).integers(0, labels.k, n)
    rng = np.random.default_rng(seed)
    probs = rng.random((n, labels.k))
    probs[np.arange(n), truth] += skill * labels.k * rng.random(n)
    probs /= probs.sum(axis=1, keepdims=True)
    pred = [labels.labels[i] for i in probs.argmax(axis=1)]
    table = predictions_table([f"i{i}" for i in range(n)], [labels.labels[t] for t in truth], pred, ["ok"] * n, labels, probs)
    return Predictions(table, labels, {"method": "scores"})


def write_eval(task_dir: Path, arm: str, split: str, pred: Predictions, repeat: bool = False) -> dict:
    """What `labelrl eval` leaves: predictions Parquet, ARM-SPLIT.json, a ledger line; returns summary metrics."""
    path = write_predictions(pred, task_dir / "eval" / f"{arm}-{split}.parquet")
    pred = read_predictions(path)
    metrics = classification_metrics(pred.y_true, pred.y_pred, pred.labels, scores=pred.scores(), n_boot=40, seed=0)
    record = record_evaluation(task_dir, split=split, model_spec=str(task_dir / arm / "model"), model_fingerprint=arm,
                               split_fingerprint="splits-1", metrics=metrics, repeat=repeat)
    atomic_write_json(task_dir / "eval" / f"{arm}-{split}.json", {"metrics": metrics, "info": pred.info, "ledger": record})
    return summary_metrics(metrics)


def rollout_rows(labels: LabelSpace, step: int, seed: int, corpo: bool, tau: float = 0.5) -> dict[str, list]:
    """One step's rollouts: 4 prompts × G, accuracy rising with the step, partial credit for ordinal labels."""
    rng = np.random.default_rng(seed * 1000 + step)
    rows: dict[str, list] = {k: [] for k in ("step", "prompt_id", "sample_index", "label", "completion", "completion_tokens",
                                             "truncated", "think_closed", "parse_status", "answer", "reward",
                                             "advantage", "group_uniform", "skipped")}
    for p in range(4):
        true = p % labels.k
        tokens = rng.integers(4, 41, G)
        truncated = tokens >= 40
        answers = [None if t else (true if rng.random() < 0.3 + 0.1 * step else int(rng.integers(0, labels.k)))
                   for t in truncated]
        rewards = np.array([0.0 if a is None else 1.0 - abs(a - true) / (labels.k - 1) for a in answers])
        baseline = max(rewards.mean(), tau) if corpo else rewards.mean()  # CoRPO clamps the baseline at τ
        uniform = bool(np.all(rewards == rewards[0]))
        for i in range(G):
            rows["step"].append(step)
            rows["prompt_id"].append(f"p{step}-{p}")
            rows["sample_index"].append(i)
            rows["label"].append(labels.labels[true])
            rows["completion"].append("<think>…</think><answer>x</answer>")
            rows["completion_tokens"].append(int(tokens[i]))
            rows["truncated"].append(bool(truncated[i]))
            rows["think_closed"].append(bool(not truncated[i] and tokens[i] < 30))
            rows["parse_status"].append("truncated" if truncated[i] else "ok")
            rows["answer"].append(None if answers[i] is None else labels.labels[answers[i]])
            rows["reward"].append(float(rewards[i]))
            rows["advantage"].append(float(rewards[i] - baseline))
            rows["group_uniform"].append(uniform)
            rows["skipped"].append(uniform)
    rows["sampler_logprobs"] = [[-0.5] * n for n in rows["completion_tokens"]]  # one per token, as a sampler logs
    return rows


def step_metrics(rows: dict[str, list], labels: LabelSpace, corpo: bool, tau: float = 0.5) -> dict:
    """The metrics.jsonl record the trainer would log for these rollouts."""
    reward, adv = np.array(rows["reward"]), np.array(rows["advantage"])
    tokens = np.array(rows["completion_tokens"])
    correct = [a == t for a, t in zip(rows["answer"], rows["label"])]
    uniform = np.array(rows["group_uniform"][::G])
    group_labels = rows["label"][::G]
    failed = reward < (tau if corpo else 1.0)
    record = {K.STEP: rows["step"][0], K.REWARD_MEAN: float(reward.mean()), K.ACCURACY: float(np.mean(correct)),
              K.LENGTH_MEAN: float(tokens.mean()), K.LENGTH_P90: float(np.percentile(tokens, 90)),
              K.TRUNCATED_FRAC: float(np.mean(rows["truncated"])), K.THINK_CLOSED_FRAC: float(np.mean(rows["think_closed"])),
              K.UNIFORM_FRAC: float(uniform.mean()),
              K.FAILED_POSITIVE_FRAC: float((failed & (adv > 0)).sum() / max(failed.sum(), 1)),
              K.FAILED_POSITIVE_COUNT: float((failed & (adv > 0)).sum()),
              # the policy's entropy falling step by step; a bf16 sampler's gap to the trainer
              K.ENTROPY_MEAN: 3.0 - 0.4 * rows["step"][0], K.ENTROPY_P10: 1.0 - 0.1 * rows["step"][0],
              K.MISMATCH_KL: 3e-4 + 1e-5 * rows["step"][0], K.MISMATCH_LOGP_DIFF_MEAN: 0.02}
    kept = [lab for lab, u in zip(group_labels, uniform) if not u]
    for label in labels.labels:
        record[K.per_label(K.LABEL_SHARE_INFORMATIVE, label)] = kept.count(label) / len(kept) if kept else 0.0
        record[K.per_label(K.LABEL_SHARE_DATA, label)] = 1 / labels.k
    if corpo:
        means = reward.reshape(-1, G).mean(axis=1)
        record[K.CORPO_CORRECTNESS_REGIME] = float((means < tau).mean())
        record[K.CORPO_PREFERENCE_REGIME] = 1 - record[K.CORPO_CORRECTNESS_REGIME]
    return record


def write_rl_arm(arm_dir: Path, labels: LabelSpace, seed: int, corpo: bool, steps: int = 5) -> None:
    from labelrl.rollout.log import write_step

    for step in range(1, steps + 1):
        rows = rollout_rows(labels, step, seed, corpo)
        write_step(arm_dir, step, rows)
        append_jsonl(arm_dir / "metrics.jsonl", step_metrics(rows, labels, corpo))
    atomic_write_json(arm_dir / "rl_summary.json", {"steps": steps, "model_dir": str(arm_dir / "model")})


def write_sft_arm(arm_dir: Path) -> None:
    for step in range(1, 9):
        record = {K.STEP: step, K.LOSS: 2.0 / step, K.LEARNING_RATE: 1e-4}
        if step % 4 == 0:
            record.update({K.EVAL_ACCURACY: 0.6 + 0.02 * step, K.EVAL_BALANCED_ACCURACY: 0.55 + 0.02 * step})
        append_jsonl(arm_dir / "sft_metrics.jsonl", record)
    atomic_write_json(arm_dir / "sft_summary.json", {"steps": 8, "best": {"step": 8}, "model_dir": str(arm_dir / "model")})


def arm_entry(task: str, arm: str, type_: str, status: str = "done", **extra) -> dict:
    return {"type": type_, "status": status, "depends_on": [], "dir": f"{task}/{arm}", "error": None,
            "seconds": 1.5, "config": {}, "val": None, "holdout": None, "holdout_repeat": False, "ood": {}, **extra}


def build_spam(run: Path, *, sweep_on: bool, distill: bool) -> dict:
    task = run / "spam"
    tstate: dict = {}
    split_noise = {name: {"n_rows": n, "n_duplicate_groups": g, "n_pairs": 2 * g, "disagreement_rate": d,
                          "disagreement_rate_ci": [0.0, 2 * d], "flip_rate": d / 2, "flip_rate_ci": [0.0, d],
                          "ceiling": 1 - d / 2, "ceiling_ci": [1 - d, 1.0]}
                   for name, n, g, d in (("train", 240, 20, 0.05), ("val", 30, 3, 0.0), ("holdout", 30, 2, 0.1))}
    atomic_write_json(task / "audit.json", {"n_rows": 300, "ceiling": 0.96, "ceiling_ci": [0.93, 0.99],
                                            "disagreement_rate": 0.08, "disagreement_rate_ci": [0.05, 0.11], "n_pairs": 120,
                                            "per_split": split_noise, "uniformity": {"p_value": 0.42}})
    preds = {arm: make_predictions(SPAM, N_VAL, skill, seed) for arm, skill, seed in
             (("sft", 0.5, 1), ("grpo", 0.45, 2), ("corpo", 0.5, 3), ("control", 0.4, 4), ("cot_sft", 0.3, 5))}
    arms = {}
    for arm, type_, preset in (("sft", "sft", None), ("grpo", "rl", "grpo"), ("corpo", "rl", "corpo")):
        repeat = arm == "corpo"
        arms[arm] = arm_entry("spam", arm, type_, preset=preset, val=write_eval(task, arm, "val", preds[arm]),
                              holdout=write_eval(task, arm, "holdout", make_predictions(SPAM, 40, 0.5, 9), repeat=repeat),
                              holdout_repeat=repeat)
    write_sft_arm(task / "sft")
    write_rl_arm(task / "grpo", SPAM, seed=1, corpo=False)
    write_rl_arm(task / "corpo", SPAM, seed=2, corpo=True)
    arms["random"] = arm_entry("spam", "random", "random_reward", "failed", error=FAILED_ERROR.splitlines()[0])
    (task / "random").mkdir(parents=True, exist_ok=True)
    (task / "random" / "error.txt").write_text(f"Traceback (most recent call last):\n{FAILED_ERROR.splitlines()[1]}\n"
                                               f"{FAILED_ERROR.splitlines()[0]}\n", encoding="utf-8")
    if distill:
        records = [{"id": f"t{i}", "label": SPAM.labels[i % 2], "kept": i % 3 != 0, "attempts_used": 1 + i % 3,
                    "trace": "because " * (i + 1)} for i in range(12)]
        atomic_write_json(task / "distill" / "traces.summary.json",
                          {**survival_summary(records), "teacher": "fake", "attempts": 3, "keep": "first"})
        arms["distill"] = arm_entry("spam", "distill", "distill")
        for arm, skill in (("control", 0.4), ("cot_sft", 0.2)):
            arms[arm] = arm_entry("spam", arm, arm, val=write_eval(task, arm, "val", preds[arm]),
                                  holdout=write_eval(task, arm, "holdout", make_predictions(SPAM, 40, skill, 11)))
        arms["cot_rl"] = arm_entry("spam", "cot_rl", "cot_rl", "skipped", error=SKIP_REASON)
        # the ladder decomposes on the holdout predictions
        held = {arm: read_predictions(task / "eval" / f"{arm}-holdout.parquet") for arm in ("sft", "control", "cot_sft")}
        atomic_write_json(task / "analysis" / "compare.json",
                          compare_models(held["sft"], held["control"], held["cot_sft"], names=("sft", "control", "cot_sft"), n_boot=40))
    for arm in ("grpo", "corpo"):
        arms[arm].update({"from": "sft", "train": {"failed_positive_frac": 0.1}})
    arms["relabel"] = arm_entry("spam", "relabel", "relabel", relabel={
        "n_items": 50, "n_changed": 4, "changed_rate": 0.08, "n_adjudicated": 6, "n_low_confidence": 6, "judge": "judge-x",
        "agreement_with_original": {"judge": {"n": 50, "agreement": 0.9, "kappa": 0.8, "per_class": {"ham": {"n": 30, "agreement": 0.93},
                                                                                                    "spam": {"n": 20, "agreement": 0.85}}},
                                    "final": {"n": 50, "agreement": 0.92, "kappa": 0.83, "per_class": {}}},
        "self_agreement": {"n_sample": 40, "n_compared": 40, "agreement": 0.95, "agreement_ci": [0.85, 1.0],
                           "kappa": 0.9, "kappa_ci": [0.7, 1.0]}})
    for arm, counts in (("sft", [0, 2, 4, 4, 1]), ("grpo", [1, 3, 4, 4, 0])):  # pass@2 of 4 samples on 5 val items
        arms[arm]["pass_at_k"] = pass_summary(counts, ["ham", "spam", "spam", "ham", "spam"], n=4, k=2, n_boot=50)
    if sweep_on:  # the derived baseline and the paired comparisons, by the ladder's own writers
        cfg = ThresholdConfig(out=task / "threshold", parent=task / "sft", n_boot=40)
        arms["threshold"] = arm_entry("spam", "threshold", "threshold", **{"from": "sft"},
                                      **evaluate_threshold_arm(task, "threshold", cfg, ["grpo", "corpo"], "spam"))
        done = {n: a for n, a in arms.items() if a["status"] == "done"}
        analysis = {"paired": paired_comparisons(task, done, 40)}
        tstate["verdict"] = task_verdict(done, analysis, {"success_threshold": None})
    if sweep_on:
        val = {arm: read_predictions(task / "eval" / f"{arm}-val.parquet") for arm in ("sft", "grpo", "corpo")}
        grpo_hard = Predictions(val["grpo"].table.drop_columns(["score"]), SPAM, val["grpo"].info)
        result = sweep(val["sft"], compare=[grpo_hard, val["corpo"]])
        atomic_write_json(task / "analysis" / "sweep.json", {**result, "arms": {"base": "sft", "compared": ["grpo", "corpo"]}})
        atomic_write_json(task / "analysis" / "route-grpo.json", {**route(val["sft"], val["grpo"]), "arms": {"a": "sft", "b": "grpo"}})
    order = ["relabel", "sft", "grpo", "corpo", "random", "distill", "control", "cot_sft", "cot_rl", "threshold"]
    return {"data": "sms-spam", "kind": "binary", "labels": list(SPAM.labels), "positive_label": "spam",
            "ceiling": 0.96, "ceiling_ci": [0.93, 0.99], "ceiling_source": "duplicates", "ood": [],
            "arm_order": [a for a in order if a in arms], "arms": arms, **tstate,
            "samples": {"holdout": {"split": "holdout", "seed": 0, "limit": 40, "n": 40, "n_split": 120,
                                    "label_counts": {"ham": 21, "spam": 19}, "split_label_counts": {"ham": 62, "spam": 58}}}}


def build_noisy_spam(run: Path) -> dict:
    """The spam task again with 20% of its training labels flipped (the label-noise section)."""
    task = run / "spam_noisy"
    arms = {arm: arm_entry("spam_noisy", arm, type_, holdout=write_eval(task, arm, "holdout", make_predictions(SPAM, 40, skill, 50 + i)))
            for i, (arm, type_, skill) in enumerate((("sft", "sft", 0.4), ("grpo", "rl", 0.3)))}
    return {"data": "sms-spam", "kind": "binary", "labels": list(SPAM.labels), "positive_label": "spam", "ood": [],
            "label_noise": 0.2, "arm_order": list(arms), "arms": arms}


def build_movies(run: Path, *, ood: bool, rl: bool) -> dict:
    task = run / "movies"
    atomic_write_json(task / "audit.json", {"n_rows": 500, "ceiling": 0.7, "ceiling_ci": None})
    arms = {}
    names = (("sft", "sft", None), ("grpo", "rl", "grpo"), ("corpo", "rl", "corpo")) if rl else (("sft", "sft", None),)
    for i, (arm, type_, preset) in enumerate(names):
        entry = arm_entry("movies", arm, type_, preset=preset,
                          val=write_eval(task, arm, "val", make_predictions(MOVIES, N_VAL, 0.6, 20 + i)),
                          holdout=write_eval(task, arm, "holdout", make_predictions(MOVIES, 40, 0.6, 30 + i)))
        if ood:
            entry["ood"] = {"vader-tweets": write_eval(task, arm, "ood-vader-tweets", make_predictions(MOVIES, 50, 0.3, 40 + i))}
        arms[arm] = entry
    if rl:
        arms["corpo"]["holdout_same_model_as"] = "grpo"
    write_sft_arm(task / "sft")
    if rl:
        write_rl_arm(task / "grpo", MOVIES, seed=3, corpo=False)
        write_rl_arm(task / "corpo", MOVIES, seed=4, corpo=True)
    return {"data": "vader-movies", "kind": "ordinal", "labels": list(MOVIES.labels), "positive_label": None,
            "ceiling": 0.7, "ceiling_ci": [0.6, 0.8], "ceiling_source": "rater split-half (aggregated label)",
            "ood": ["vader-tweets"] if ood else [], "arm_order": list(arms), "arms": arms,
            **({"analysis": {"sweep": {"note": SWEEP_NOTE}, "route": {"files": {}},
                             "compare": {"note": "needs finished control and cot_sft arms"}}} if rl else {})}


def build_ladder_run(root: Path, *, sweep: bool = True, distill: bool = True, ood: bool = True,
                     movies_rl: bool = True, noise: bool = True) -> Path:
    """Write the run directory described in the module docstring under ``root/run``; return it.
    ``movies_rl=False`` leaves the movies task with its SFT arm only (fewer figures to draw) and
    no analysis notes (as when the ladder stopped before the task's analyses)."""
    run = root / "run"
    tasks = {"spam": build_spam(run, sweep_on=sweep, distill=distill), "movies": build_movies(run, ood=ood, rl=movies_rl)}
    if noise:
        tasks["spam_noisy"] = build_noisy_spam(run)
    (run / "recipe.yaml").write_text("version: 1\nname: synthetic\n", encoding="utf-8")
    # the time per phase the ladder writes at the end (labelrl.ladder.phases)
    phases = [{"task": "spam", "phase": "train", "what": "sft (sft)", "seconds": 125.0},
              {"task": "spam", "phase": "train", "what": "grpo (rl)", "seconds": 61.4},
              {"task": "spam", "phase": "scoring", "what": "every arm's evaluations", "seconds": 42.0}]
    atomic_write_json(run / "ladder.json", {"format": 1, "recipe": "synthetic", "run_dir": str(run), "tasks": tasks,
                                            "task_order": list(tasks), "phases": phases,
                                            "seconds_last_invocation": 240.0})
    return run


@pytest.fixture(scope="session")
def ladder_run(tmp_path_factory) -> Path:
    """The full synthetic run (read-only: tests write their reports elsewhere)."""
    return build_ladder_run(tmp_path_factory.mktemp("ladder"))


@pytest.fixture(scope="session")
def bare_run(tmp_path_factory) -> Path:
    """The run without the optional parts: no sweep/route, no distill arms, no OOD, no RL on movies."""
    return build_ladder_run(tmp_path_factory.mktemp("bare"), sweep=False, distill=False, ood=False, movies_rl=False,
                            noise=False)


@pytest.fixture
def make_ladder_run():
    """``make_ladder_run(root, sweep=..., distill=..., ood=...)`` for tests that change the files."""
    return build_ladder_run

"""Replicate seeds in a ladder on tiny-random: one run per seed per replicated arm, one holdout look
each, the SFT + threshold baseline, mean/spread rows, and paired intervals that equal an
independent numpy paired bootstrap on the same predictions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from rich.console import Console
from sklearn.metrics import balanced_accuracy_score

from labelrl.cli.ladder import replicate_means
from labelrl.fileio import read_jsonl
from labelrl.ladder import Ladder, load_recipe
from labelrl.report import build_report

FRUIT, THINGS = ["grape", "mango", "apple"], ["chair", "table", "stone"]


def toy_rows(n: int = 80) -> list[dict]:
    words = FRUIT + THINGS
    return [{"id": f"t{i}", "text": f"item {i}: {words[i % 6]}", "label": "yes" if words[i % 6] in FRUIT else "no"}
            for i in range(n)]


def recipe(data: Path) -> dict:
    return {
        "version": 1, "name": "replicates", "model": "tiny-random",
        "defaults": {
            "sft": {"lora": False, "learning_rate": 3e-3, "max_steps": 2, "batch_size": 4, "eval_every": 2, "eval_limit": 8, "quiet": True},
            "rl": {"lora": False, "learning_rate": 1e-3, "steps": 1, "group_size": 2, "prompts_per_step": 2,
                   "max_new_tokens": 8, "checkpoint_every": 1, "quiet": True},
        },
        "tasks": {"toy": {"data": str(data), "limit": 16, "eval_limit": 8, "holdout_limit": 8, "n_boot": 200,
                          "seeds": [0, 1],
                          "arms": {"sft": {"type": "sft"}, "grpo": {"type": "rl", "from": "sft", "preset": "grpo"},
                                   "threshold": {"type": "threshold", "from": "sft"}}}},
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("replicates")
    data = root / "toy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in toy_rows()), encoding="utf-8")
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe(data)), encoding="utf-8")
    state = Ladder(load_recipe(path), root / "run", Console(quiet=True)).run()
    return root / "run", state


def test_each_replicated_arm_runs_once_per_seed_from_its_own_parent(run):
    run_dir, state = run
    arms = state["tasks"]["toy"]["arms"]
    assert set(arms) == {f"{a}@s{s}" for a in ("sft", "grpo", "threshold") for s in (0, 1)}
    assert all(a["status"] == "done" for a in arms.values()), {n: a.get("error") for n, a in arms.items()}
    for s in (0, 1):
        assert arms[f"sft@s{s}"]["config"]["seed"] == s and arms[f"grpo@s{s}"]["config"]["seed"] == s
        assert arms[f"grpo@s{s}"]["config"]["model"].endswith(f"toy/sft@s{s}")
        assert arms[f"threshold@s{s}"]["from"] == f"sft@s{s}" and arms[f"grpo@s{s}"]["replicate_of"] == "grpo"
    # the declared recipe (not the expanded runs) is saved, and is itself a valid recipe
    saved = yaml.safe_load((run_dir / "recipe.yaml").read_text())
    assert set(saved["tasks"]["toy"]["arms"]) == {"sft", "grpo", "threshold"}
    assert set(load_recipe(run_dir / "recipe.yaml").tasks["toy"].arms) == set(arms)


def test_one_holdout_look_per_model_and_the_threshold_is_derived(run):
    run_dir, state = run
    records = [r for r in read_jsonl(run_dir / "toy" / "ledger.jsonl") if r["split"] == "holdout"]
    looks = [r for r in records if not r["derived"] and not r.get("reading_of")]  # (generated answers: readings of a look)
    derived = [r for r in records if r["derived"]]
    assert not any(r["repeat"] for r in looks)
    trained = [n for n in state["tasks"]["toy"]["arms"] if not n.startswith("threshold")]
    shared = [n for n in trained if state["tasks"]["toy"]["arms"][n].get("holdout_same_model_as")]
    assert len(looks) + len(shared) == len(trained) == 4
    assert len({r["model_fingerprint"] for r in looks}) == len(looks)
    # each threshold run: its val-chosen rule and the one matched to its grpo run's recall, on the holdout
    assert len(derived) == 4 and {r["derived_from"].split("/")[-2] for r in derived} == {"sft@s0", "sft@s1"}


def test_mean_and_spread_over_seeds_in_the_console_table_and_the_report(run):
    run_dir, state = run
    means = replicate_means(state["tasks"]["toy"], ["balanced_accuracy"])
    assert set(means) == {"sft", "grpo", "threshold"} and all(m["n"] == 2 for m in means.values())
    values = [state["tasks"]["toy"]["arms"][f"grpo@s{s}"]["holdout"]["balanced_accuracy"] for s in (0, 1)]
    assert means["grpo"]["cells"][0] == f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f}"
    built = build_report(run_dir, run_dir / "report")
    md = built.markdown.read_text()
    assert "grpo (seeds 0, 1)" in md and "mean ± sd [min, max] over seeds" in md
    assert "## Verdict" in md and re.search(r"- grpo: .*vs sft: ", md)  # after any "no learning signal …" naming


def independent_bootstrap(a_files: list[Path], b_files: list[Path], n_boot: int, seed: int) -> tuple[float, list[float]]:
    """ΔBA (B − A, means over runs) and its 95% interval, by a plain loop with scikit-learn, from
    the draws labelrl.evaluate.paired documents."""
    a = [pd.read_parquet(f).set_index("id") for f in a_files]
    b = [pd.read_parquet(f).set_index("id") for f in b_files]
    ids = list(a[0].index)
    y = a[0].loc[ids, "label"].to_numpy()
    preds_a = [t.loc[ids, "prediction"].fillna("(none)").to_numpy() for t in a]
    preds_b = [t.loc[ids, "prediction"].fillna("(none)").to_numpy() for t in b]
    n, S, T = len(ids), len(a), len(b)
    rng = np.random.default_rng(seed)
    items = rng.integers(0, n, (n_boot, n))
    runs_a, runs_b = rng.integers(0, S, (n_boot, S)), rng.integers(0, T, (n_boot, T))

    def ba(pred, rows):
        return balanced_accuracy_score(y[rows], pred[rows])

    deltas = []
    for k in range(n_boot):
        rows = items[k]
        deltas.append(np.mean([ba(preds_b[j], rows) for j in runs_b[k]]) - np.mean([ba(preds_a[i], rows) for i in runs_a[k]]))
    every = np.arange(n)
    point = np.mean([ba(p, every) for p in preds_b]) - np.mean([ba(p, every) for p in preds_a])
    return float(point), [float(v) for v in np.percentile(deltas, [2.5, 97.5])]


def test_paired_intervals_equal_an_independent_numpy_bootstrap(run):
    run_dir, _ = run
    task = run_dir / "toy"
    comparisons = json.loads((task / "analysis" / "paired.json").read_text())
    kinds = {(c["kind"], c["b"]) for c in comparisons}
    assert {("vs_sft", "grpo"), ("vs_threshold", "grpo"), ("vs_recall_matched", "grpo"), ("curve_vs_sft", "grpo"),
            ("vs_majority", "grpo")} <= kinds
    for c in comparisons:
        # ROC-AUC, recall and precision: tests/evaluate/test_curve_point.py; the constant predictor
        # has no run files (built from the holdout's labels): tests/ladder/test_majority.py
        if c["kind"] in ("curve_vs_sft", "vs_majority"):
            continue
        result = c["result"]
        files = [[task / "eval" / f"{name}-holdout.parquet" for name in c[side]] for side in ("a_runs", "b_runs")]
        point, ci = independent_bootstrap(*files, n_boot=result["n_boot"], seed=result["seed"])
        assert result["n_runs"] == [2, 2]
        assert result["metrics"]["balanced_accuracy"]["delta"] == pytest.approx(point, abs=1e-12)
        assert result["metrics"]["balanced_accuracy"]["ci"] == pytest.approx(ci, abs=1e-12), c["kind"]
        assert len(result["mcnemar"]) == 2  # seed k against seed k

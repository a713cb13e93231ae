"""`labelrl ladder gpu --fast`: the GPU recipe's every arm type on tiny-qwen2 (the recipe model's
architecture) on a CPU, its rollouts through the real vLLM engine (vLLM's CPU build) as on a GPU
machine, its teacher and adjudicator the built-in SmolLM2 (no server, nothing set by hand), every
arm of both tasks finished, and every report section built from the files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest


@pytest.mark.slow
def test_gpu_recipe_fast_overlay_runs_every_arm_type(tmp_path):
    from labelrl.report import NOT_RUN, SECTIONS

    out = tmp_path / "gpu"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "160"}
    args = [sys.executable, "-m", "labelrl.cli.main", "ladder", "gpu", "--fast", "--out", str(out)]
    started = time.monotonic()
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3000)
    print(f"labelrl ladder gpu --fast: {time.monotonic() - started:.0f} s", flush=True)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((out / "ladder.json").read_text())
    spam = state["tasks"]["spam"]["arms"]
    assert {a["type"] for a in spam.values()} == {"relabel", "sft", "rl", "random_reward", "distill", "cot_sft", "cot_rl",
                                                  "control", "threshold"}
    # every arm of every task finished: none failed, skipped or collapsed
    assert {f"{t}/{n}": a["status"] for t, task in state["tasks"].items() for n, a in task["arms"].items()
            if a["status"] != "done"} == {}
    # the distillation chain ran from the recipe's own local teacher, on traces it kept by rejection
    survival = spam["distill"]["survival"]
    assert spam["distill"]["config"]["trace_format"] == "constrained" and 0 < survival["n_survived"] <= survival["n_items"]
    kept = [json.loads(line) for line in (out / "spam" / "distill" / "traces.jsonl").read_text().splitlines()]
    assert sum(r["kept"] for r in kept) == survival["n_kept_traces"] and spam["cot_sft"]["config"]["mode"] == "reasoning"
    assert (spam["cot_rl"]["config"]["truncation"], spam["cot_rl_mask"]["config"]["truncation"]) == ("zero", "mask")
    assert spam["dapo"]["config"]["truncation"] == "soft_penalty"
    relabel = spam["relabel"]["relabel"]
    assert relabel["adjudicator"] == "local:smollm2-135m-instruct" and relabel["n_adjudicated"] == relabel["n_low_confidence"] > 0
    rl_arms = {n: a for task in state["tasks"].values() for n, a in task["arms"].items() if "backend" in a["config"]}
    assert len(rl_arms) >= 8 and {a["config"]["backend"] for a in rl_arms.values()} == {"vllm"}
    assert spam["sft"]["config"]["model"] == "tiny-qwen2"
    grpo_dir = out / "spam" / "grpo"
    assert [json.loads(line)["step"] for line in (grpo_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    config = json.loads((grpo_dir / "model" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    for name in ("think_384", "think_1024"):  # reasoning-mode GRPO from the direct SFT model, scored at its cap
        assert spam[name]["config"]["mode"] == "reasoning" and spam[name]["eval_max_new_tokens"] == spam[name]["config"]["max_new_tokens"]
    assert spam["sft"]["answer_keys"]["relabel"]["holdout"]["n"] > 0 and spam["sft"]["pass_at_k"]["k"] == 2
    movies = state["tasks"]["movies"]["arms"]
    assert {a.get("replicate_of") for a in movies.values()} == {"sft", "grpo", "dr_grpo", "corpo", "threshold"}
    md = (out / "report" / "report.md").read_text()
    for key, title in SECTIONS:
        assert title in md
        if key != "noise":
            assert f"Not run: {NOT_RUN[key]}" not in md, key
    for text in ("the truncation tax among finished rollouts", "recall of each label", "relabelling by", "lenient parser",
                 "pass@2", "vs relabel", "holdout (generated)"):
        assert text in md, text

"""The memory preflight against the process's real peak, on SmolLM2 + LoRA and long-tailed texts
(slow): the prediction is not below what the run used, nor far above it, and a budget under the
plain pass's peak turns checkpointing on and keeps the run within it. On sms-spam's short messages,
a workload the heap-growth factors were not measured on, the prediction still brackets the peak.
RL's shared training pass, at 4 and 16 prompts per step, on sms-spam and vader-movies: the same.

Each run is its own process: the peak resident memory of a pytest worker holds every earlier test.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GIB_MB = 1024.0

RUN = """
import json, sys
from labelrl.fileio import read_jsonl
from labelrl.train.config import SFTConfig
from labelrl.train.sft import run_sft
options = json.loads(sys.argv[1])
base = dict(model="smollm2-135m-instruct", text_col=["text"], label_col="label", lora=True, batch_size=8,
            max_length=1400, eval_every=10_000, eval_limit=4, quiet=True, seed=0)
summary = run_sft(SFTConfig(**{**base, **options}))
peak = max(r["perf/peak_memory_mb"] for r in read_jsonl(options["out"] + "/sft_metrics.jsonl"))
print("RESULT " + json.dumps({"memory": summary["memory"], "peak_mb": peak}))
"""


def long_tailed_csv(path: Path, items: int) -> Path:
    """The benchmark's generated reviews (median ≈ 280 characters, a long tail to ~2,700)."""
    spec = importlib.util.spec_from_file_location("long_inputs", REPO / "benchmarks" / "long_inputs.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    module.make_reviews(path, items)
    return path


def sft_in_a_process(tmp_path: Path, name: str, data: Path, **options) -> dict:
    options = {"data": str(data), "out": str(tmp_path / name), "max_steps": 3, **options}
    done = subprocess.run([sys.executable, "-c", RUN, json.dumps(options)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.slow
def test_the_preflight_brackets_the_peak_and_a_budget_holds(tmp_path):
    data = long_tailed_csv(tmp_path / "reviews.csv", 400)
    plain = sft_in_a_process(tmp_path, "plain", data, gradient_checkpointing=False)
    predicted = plain["memory"]["predicted_peak_mb"]
    # not below what the run used (the budget decision would be unsafe), nor far above it
    assert plain["peak_mb"] <= predicted <= 1.5 * plain["peak_mb"], plain

    # a budget the plain pass exceeded but the checkpointed pass is predicted to fit: between the
    # checkpointed prediction and the plain run's measured peak
    budget_gib = 0.5 * (plain["peak_mb"] + plain["memory"]["predicted_peak_checkpointed_mb"]) / GIB_MB
    assert plain["peak_mb"] > budget_gib * GIB_MB, plain  # the plain pass would not have kept to it
    tight = sft_in_a_process(tmp_path, "tight", data, memory_budget=budget_gib)
    assert tight["memory"]["gradient_checkpointing"] is True and "budget" in tight["memory"]["reason"], tight
    assert tight["memory"]["fits"] is True
    assert tight["peak_mb"] <= budget_gib * GIB_MB, tight
    assert tight["peak_mb"] <= tight["memory"]["predicted_peak_checkpointed_mb"], tight


@pytest.mark.slow
def test_the_preflight_holds_on_a_workload_it_was_not_fitted_on(tmp_path):
    # The heap-growth factors were measured on the long-tailed reviews above; sms-spam's short
    # messages in batches of 16, whose items share most of their prompt (the system message runs
    # once per batch), are another shape of work: the prediction must still bracket the peak.
    plain = sft_in_a_process(tmp_path, "spam", "sms-spam", text_col=None, label_col=None, limit=400, batch_size=16,
                             gradient_checkpointing=False)
    assert plain["peak_mb"] <= plain["memory"]["predicted_peak_mb"] <= 1.5 * plain["peak_mb"], plain


RUN_RL = """
import json, sys
from labelrl.fileio import read_jsonl
from labelrl.train.config import RLConfig
from labelrl.train.rl import run_rl
options = json.loads(sys.argv[1])
base = dict(model="smollm2-135m-instruct", lora=True, group_size=4, max_new_tokens=12, steps=2, checkpoint_every=2,
            val_path=False, skip_uninformative=False, quiet=True, seed=0, limit=400)
summary = run_rl(RLConfig(**{**base, **options}))
peak = max(r["perf/peak_memory_mb"] for r in read_jsonl(options["out"] + "/metrics.jsonl"))
print("RESULT " + json.dumps({"memory": summary["memory"], "peak_mb": peak}))
"""


def rl_in_a_process(tmp_path: Path, name: str, **options) -> dict:
    options = {"out": str(tmp_path / name), **options}
    done = subprocess.run([sys.executable, "-c", RUN_RL, json.dumps(options)], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.slow
@pytest.mark.parametrize("data", ["sms-spam", "vader-movies"])
@pytest.mark.parametrize("prompts", [4, 16])
def test_the_rl_preflight_brackets_the_peak(tmp_path, data, prompts):
    # Every group trains (no skipping), so each step's training pass is the largest the plan
    # prices: B prompts × G = 4 completions of 12 tokens. The heap factor was chosen from these
    # four peaks on one machine (the middle of the range that keeps all four inside); another
    # CPU's kernels and allocator are the check. sms-spam's long tail makes 16 prompts the
    # loosest (the plan prices its longest prompts), vader-movies' 130-token prefix the tightest.
    run = rl_in_a_process(tmp_path, f"{data}-{prompts}", data=data, prompts_per_step=prompts)
    memory = run["memory"]
    assert run["peak_mb"] <= memory["predicted_peak_mb"] <= 1.5 * run["peak_mb"], run
    # the shared pass forwards each prompt once; the checkpointed plain pass G times: dearer here
    assert memory["predicted_peak_checkpointed_mb"] > memory["predicted_peak_mb"], run
    assert memory["gradient_checkpointing"] is False, run


@pytest.mark.slow
def test_the_rl_preflight_holds_on_a_workload_it_was_not_fitted_on(tmp_path):
    # The heap factor was chosen from the four runs above (sms-spam and vader-movies, G = 4);
    # vader-tweets' texts with G = 8 and 6 prompts a step are another shape of work: twice the
    # completions per prompt, another length distribution. The prediction must still bracket it.
    run = rl_in_a_process(tmp_path, "tweets-g8", data="vader-tweets", prompts_per_step=6, group_size=8)
    assert run["peak_mb"] <= run["memory"]["predicted_peak_mb"] <= 1.5 * run["peak_mb"], run

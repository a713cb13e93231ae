"""SmolLM2-135M-Instruct as teacher and as student on a slice of sms-spam (slow)."""

from __future__ import annotations

import json

import pytest

from labelrl.audit.judges import JudgeSpec, load_judge
from labelrl.data.load import load_dataset
from labelrl.data.sample import sample_examples
from labelrl.data.split import load_or_make_splits, select
from labelrl.distill.reject import survival_summary
from labelrl.distill.teacher import distill_paths, run_distill
from labelrl.fileio import read_jsonl
from labelrl.train.config import RLConfig, SFTConfig
from labelrl.train.rl import run_rl
from labelrl.train.sft import run_sft


@pytest.mark.slow
def test_smollm2_teacher_then_cot_sft_then_rl(tmp_path):
    dataset = load_dataset("sms-spam")
    splits = load_or_make_splits(dataset, tmp_path / "run")
    train = sample_examples(select(dataset, splits, "train"), 3, splits.seed)  # what SFT's limit=3 draws
    teacher = load_judge(JudgeSpec("smollm2-135m-instruct", flag="--teacher"), dataset.labels, None)
    paths = distill_paths(tmp_path / "traces.jsonl")
    records = run_distill(train, dataset.labels, None, teacher, paths, attempts=2, max_new_tokens=48, temperature=0.7)
    attempts = [r for r in read_jsonl(paths.journal) if r["kind"] == "attempt"]
    assert len(attempts) == sum(r["attempts_used"] for r in records) <= 6
    summary = survival_summary(records, attempts=attempts)
    assert summary["overall"]["n_items"] == 3 and summary["attempts_total"] == len(attempts)

    # The raw model rarely closes a trace, so the student trains on traces written here (each
    # ends in the item's own label, as a kept trace does).
    scripted = tmp_path / "scripted.jsonl"
    scripted.write_text("".join(
        json.dumps({"id": ex.id, "label": ex.label, "kept": True,
                    "trace": f"<think>The message reads like {ex.label}.</think><answer>{ex.label}</answer>"}) + "\n"
        for ex in train))
    sft = run_sft(SFTConfig(model="smollm2-135m-instruct", data="sms-spam", out=tmp_path / "run", limit=3,
                            mode="reasoning", traces=scripted, max_steps=2, batch_size=3, eval_every=2,
                            eval_limit=2, max_length=192, quiet=True))
    assert sft["train_items"] == 3
    rl = run_rl(RLConfig(model=str(tmp_path / "run"), data="sms-spam", mode="reasoning", out=tmp_path / "rl",
                         limit=4, steps=1, prompts_per_step=1, group_size=2, max_new_tokens=16, quiet=True))
    assert rl["steps_done"] == 1
    (record,) = read_jsonl(tmp_path / "rl" / "metrics.jsonl")
    assert "rollout/think_closed_frac" in record and "rollout/truncated_frac" in record

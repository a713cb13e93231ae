"""A file with a few over-long items: sft trains with the default (the texts cut to fit), names the
ids and saves them; `--on-long-item error` refuses with the count; rl and eval after sft fit the
same items into the model's context instead of failing on them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

LONG = {f"r{i}" for i in range(0, 42, 3)}  # ~400 tokens each; the rest ~10


def _labelrl(*args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "labelrl.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def long_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("long") / "reviews.csv"
    lines = ["id,text,label"]
    for i in range(42):
        word = "good" if i % 2 else "bad"
        repeat = 100 if f"r{i}" in LONG else 2
        lines.append(f"r{i},review {i}: {' '.join([f'it was {word}'] * repeat)},{'pos' if i % 2 else 'neg'}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def small_context_model(tmp_path_factory):
    """tiny-random with a stated context of 256 tokens, so that the long items exceed it."""
    from labelrl.models import load_model

    model, tokenizer = load_model("tiny-random")
    model.config.max_position_embeddings = 256
    out = tmp_path_factory.mktemp("small") / "model"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_sft_cuts_long_items_by_default_and_error_refuses_with_the_count(long_file, small_context_model, tmp_path):
    common = ["--model", str(small_context_model), "--data", str(long_file), "--max-length", "96", "--max-steps", "2",
              "--batch-size", "4", "--eval-every", "2", "--eval-limit", "4", "--quiet"]
    run = _labelrl("sft", *common, "--out", "sft", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    saved = json.loads((tmp_path / "sft" / "long_items_sft.json").read_text())
    train_ids = set(json.loads((tmp_path / "sft" / "splits.json").read_text())["splits"]["train"])
    assert saved["policy"] == "truncate" and set(saved["ids"]) == LONG & train_ids and saved["ids"]
    n = len(saved["ids"])
    assert f"{n} of {len(train_ids)} training items do not fit --max-length 96" in " ".join(run.stderr.split())
    assert "their text is cut to fit" in run.stderr and saved["ids"][0] in run.stderr
    assert (tmp_path / "sft" / "model").is_dir()

    refused = _labelrl("sft", *common, "--out", "sft-error", "--on-long-item", "error", cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    message = " ".join(refused.stderr.split())
    assert f"error: {n} of {len(train_ids)} training items do not fit --max-length 96" in message
    assert "--on-long-item truncate" in message and "raise --max-length" in message
    assert not (tmp_path / "sft-error" / "model").exists()


def test_rl_and_eval_after_sft_fit_the_context_instead_of_failing(long_file, small_context_model, tmp_path):
    from labelrl.evaluate.run import EvalConfig, run_eval
    from labelrl.train.config import RLConfig, SFTConfig
    from labelrl.train.rl import run_rl
    from labelrl.train.sft import run_sft

    sft = SFTConfig(model=str(small_context_model), data=str(long_file), out=tmp_path / "sft", max_length=96,
                    max_steps=1, batch_size=4, eval_every=1, eval_limit=2, quiet=True)
    run_sft(sft)
    rl = RLConfig(model=str(tmp_path / "sft"), data=str(long_file), out=tmp_path / "rl", steps=1, group_size=2,
                  prompts_per_step=2, max_new_tokens=16, quiet=True)
    run_rl(rl)
    rl_long = json.loads((tmp_path / "rl" / "long_items_rl.json").read_text())
    assert rl_long["ids"] and set(rl_long["ids"]) <= LONG and rl_long["budgets"] == [256 - 16] * len(rl_long["ids"])

    val_ids = json.loads((tmp_path / "rl" / "splits.json").read_text())["splits"]["val"]
    report = run_eval(EvalConfig(run_or_model=str(tmp_path / "rl"), split="val", n_boot=0))
    cut = report["info"]["long_items"]
    assert cut["policy"] == "truncate" and set(cut["ids"]) == LONG & set(val_ids) and cut["ids"]
    assert report["metrics"]["n"] == len(val_ids)  # every val item scored, the long ones cut

    skipped = run_eval(EvalConfig(run_or_model=str(tmp_path / "rl"), split="val", n_boot=0, on_long_item="skip"))
    assert skipped["metrics"]["n"] == len(val_ids) - len(cut["ids"])
    with pytest.raises(ValueError, match=rf"^{len(cut['ids'])} of {len(val_ids)} val items do not fit the model's context"):
        run_eval(EvalConfig(run_or_model=str(tmp_path / "rl"), split="val", n_boot=0, on_long_item="error"))


def test_rl_cuts_prompts_to_max_prompt_length_where_it_binds_before_the_context(long_file, small_context_model, tmp_path):
    """A 256-token context leaves 240 tokens for a prompt at 16 new tokens; --max-prompt-length 96
    binds first, as sft's --max-length does, so RL trains on texts cut as SFT's are."""
    from labelrl.train.config import RLConfig
    from labelrl.train.rl import run_rl

    common = dict(model=str(small_context_model), data=str(long_file), steps=1, group_size=2, prompts_per_step=2,
                  max_new_tokens=16, max_prompt_length=96, lora=False, quiet=True)
    run_rl(RLConfig(**common, out=tmp_path / "rl"))
    cut = json.loads((tmp_path / "rl" / "long_items_rl.json").read_text())
    train_ids = set(json.loads((tmp_path / "rl" / "splits.json").read_text())["splits"]["train"])
    assert cut["policy"] == "truncate" and set(cut["ids"]) == LONG & train_ids and cut["ids"]
    assert cut["budgets"] == [96] * len(cut["ids"]) and all(n > 96 for n in cut["prompt_tokens"])

    with pytest.raises(ValueError, match=rf"^{len(cut['ids'])} of {len(train_ids)} training items do not fit "
                                         r"--max-prompt-length 96 .*raise --max-prompt-length$"):
        run_rl(RLConfig(**common, out=tmp_path / "rl-error", on_long_item="error"))

"""Direct SFT: loss on assistant tokens only, best-on-val selection, saved and merged models."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from labelrl import metrics_keys as K
from labelrl.fileio import read_jsonl
from labelrl.models import load_model
from labelrl.train.config import SFTConfig
from labelrl.train.sft import SFTItem, run_sft, sft_loss

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numerics import assert_values_within, logit_bound, mean_logprob_bound  # noqa: E402


@pytest.mark.numerics
def test_sft_loss_covers_only_the_assistant_tokens():
    model, tok = load_model("tiny-random")
    pad = tok.pad_token_id
    a = SFTItem(input_ids=[5, 6, 7, 8, 9], n_prompt=3)
    b = SFTItem(input_ids=[11, 8, 9], n_prompt=1)
    # Changing a prompt token's target cannot matter, but the loss must equal the mean CE of
    # the 2 + 2 assistant tokens computed one sequence at a time.
    expected = []
    for item in (a, b):
        ids = torch.tensor([item.input_ids])
        logits = model(input_ids=ids).logits[0, :-1].float()
        ce = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
        expected.append(ce[item.n_prompt - 1 :])
    loss = sft_loss(model, [a, b], pad)
    # a padded batch against one sequence at a time: other kernels, a mean of log-probs' rounding bound
    targets = torch.cat(expected)
    bound = mean_logprob_bound(model, max(len(a.input_ids), len(b.input_ids)), len(targets), float(targets.mean()))
    assert_values_within(loss, targets.mean(), bound, "loss")


def test_sft_learns_the_task_and_keeps_the_best_model(toy_data, tmp_path):
    cfg = SFTConfig(model="tiny-random", data=str(toy_data), out=tmp_path / "sft", lora=False, learning_rate=3e-3,
                    max_steps=150, batch_size=8, eval_every=50, quiet=True)
    summary = run_sft(cfg)
    records = read_jsonl(tmp_path / "sft" / "sft_metrics.jsonl")
    assert [r[K.STEP] for r in records] == list(range(1, 151))
    evals = [r for r in records if K.EVAL_BALANCED_ACCURACY in r]
    assert [r[K.STEP] for r in evals] == [50, 100, 150]
    assert records[-1][K.LOSS] < records[0][K.LOSS] / 4
    best = max(r[K.EVAL_BALANCED_ACCURACY] for r in evals)
    assert summary["best"][K.EVAL_BALANCED_ACCURACY] == best
    assert best >= 0.9
    model, _ = load_model(tmp_path / "sft" / "model")
    assert sum(p.numel() for p in model.parameters()) > 1_000_000


def test_eval_every_0_scores_nothing_and_keeps_the_last_steps_model(toy_data, tmp_path, monkeypatch):
    # The ladder scores every SFT model on val right after training: an evaluation at the last
    # step alone would only score the same model again.
    from rich.console import Console

    from labelrl.cli.train import print_sft_summary
    from labelrl.train import sft as S

    options = dict(model="tiny-random", data=str(toy_data), lora=False, learning_rate=3e-3, max_steps=3, batch_size=4,
                   eval_limit=8, quiet=True)
    evaluated = run_sft(SFTConfig(out=tmp_path / "evaluated", eval_every=3, **options))  # one evaluation: the last step
    assert evaluated["best"]["step"] == 3 and K.EVAL_BALANCED_ACCURACY in evaluated["best"]
    monkeypatch.setattr(S, "evaluate_val", lambda *a, **k: pytest.fail("eval_every=0 evaluated on val"))
    cfg = SFTConfig(out=tmp_path / "last", eval_every=0, **options)
    summary = run_sft(cfg)
    assert summary["best"] == {"step": 3}
    assert not any(K.EVAL_BALANCED_ACCURACY in r for r in read_jsonl(tmp_path / "last" / "sft_metrics.jsonl"))
    last, _ = load_model(tmp_path / "last" / "model")
    kept, _ = load_model(tmp_path / "evaluated" / "model")  # the same seed and steps: the last step's weights
    for (name, a), (_, b) in zip(last.state_dict().items(), kept.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    console = Console(record=True, width=200)
    print_sft_summary(summary, cfg, console)
    assert "the last step's model kept (step 3" in console.export_text()


@pytest.mark.numerics
def test_lora_sft_saves_an_adapter_and_merged_weights(toy_data, tmp_path):
    cfg = SFTConfig(model="tiny-random", data=str(toy_data), out=tmp_path / "lora", max_steps=3, batch_size=4,
                    eval_every=3, eval_limit=8, merge=True, quiet=True)
    summary = run_sft(cfg)
    adapter = tmp_path / "lora" / "model"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "tiny-random" and config["r"] == 16 and config["lora_alpha"] == 32
    peft_model, tok = load_model(adapter)
    merged, _ = load_model(summary["merged_dir"])
    ids = torch.tensor([tok("<answer>yes</answer>", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():  # merged weights W + s·B·A round once more: inside the adapter chain's logit bound
        assert_values_within(peft_model(input_ids=ids).logits, merged(input_ids=ids).logits,
                             logit_bound(peft_model, ids.shape[1]), "logits")
    assert not (tmp_path / "lora" / "merged" / "adapter_config.json").exists()


def test_reasoning_mode_needs_traces(tmp_path):
    with pytest.raises(ValueError, match="pass --traces"):
        SFTConfig(data="sms-spam", out=tmp_path, mode="reasoning")


def test_skipped_bad_rows_are_reported_and_saved_in_the_run_dir(toy_data, tmp_path, capfd):
    data = tmp_path / "with_bad.jsonl"
    data.write_text(toy_data.read_text() + json.dumps({"id": "bad1", "text": "", "label": "yes"}) + "\n")
    cfg = SFTConfig(model="tiny-random", data=str(data), out=tmp_path / "run", on_bad_row="skip", max_steps=1,
                    batch_size=2, eval_every=1, eval_limit=2, lora=False, quiet=True)
    run_sft(cfg)
    skipped = read_jsonl(tmp_path / "run" / "skipped_rows.jsonl")
    assert len(skipped) == 1 and skipped[0]["reason"] == "empty text"
    assert "skipped 1 bad rows" in capfd.readouterr().err

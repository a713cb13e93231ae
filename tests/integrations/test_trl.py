"""Tests for labelrl.integrations.trl: CoRPOTrainer inside real TRL training, and the reward functions.

The trainer runs real TRL 1.16 training steps (generation, rewards, loss, optimizer) on a
tiny randomly initialised Llama (1 layer, hidden 16, 32-word vocabulary), as in
tests/losses/test_trl_parity.py. The reward function records every completion it scores,
in TRL's order (groups contiguous), and ``_compute_loss`` is wrapped to record the
advantages the loss receives; TRL shuffles the batch in between, so rows are matched back
by (prompt tokens, completion tokens).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# TRL is a declared dependency (the dev extra): a missing TRL fails these tests, it does not skip them.
import transformers  # noqa: E402
import trl  # noqa: E402

from labelrl import metrics_keys as K  # noqa: E402
from labelrl.advantages import compute_advantages  # noqa: E402
from labelrl.integrations.trl import (  # noqa: E402
    SUPPORTED_TRL,
    CoRPOTrainer,
    binary_reward,
    check_trl_version,
    format_reward,
    ordinal_reward,
)

G = 4
TAU = 0.75
PROMPTS = ["w1 w2", "w3 w4", "w5 w6", "w7 w8"]
ROOT = Path(__file__).resolve().parents[2]


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(29)]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def _model_dir(tmp_path, tokenizer) -> str:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    path = tmp_path / "tiny-llama"
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


class RecordingReward:
    """reward = (first completion token id mod 4) / 3 ∈ {0, 1/3, 2/3, 1}; records each row."""

    __name__ = "first_token_grade"

    def __init__(self):
        self.rows: list[tuple[str, tuple[int, ...], float]] = []

    def __call__(self, prompts, completions, completion_ids, **kwargs):
        rewards = [((ids[0] if ids else 0) % 4) / 3 for ids in completion_ids]
        self.rows += [(p, tuple(ids), r) for p, ids, r in zip(prompts, completion_ids, rewards)]
        return rewards


def _trainer(tmp_path, reward, **config):
    from datasets import Dataset

    tokenizer = _tokenizer()
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2 * G, num_generations=G,
        max_completion_length=6, use_cpu=True, bf16=False, report_to=[], logging_steps=1,
        save_strategy="no", max_steps=2, learning_rate=1e-2, seed=3, **{"scale_rewards": "none", **config},
    )
    dataset = Dataset.from_dict({"prompt": PROMPTS})
    return CoRPOTrainer(
        model=_model_dir(tmp_path, tokenizer), reward_funcs=[reward], args=args, train_dataset=dataset,
        processing_class=tokenizer, threshold=TAU,
    )


def _capture_loss_inputs(trainer) -> list[dict[str, torch.Tensor]]:
    seen: list[dict[str, torch.Tensor]] = []
    original = trainer._compute_loss

    def recording(model, inputs):
        seen.append({k: inputs[k].detach().clone() for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")})
        return original(model, inputs)

    trainer._compute_loss = recording
    return seen


def _rows(batch, tokenizer) -> list[tuple[str, tuple[int, ...], float]]:
    out = []
    for i in range(len(batch["advantages"])):
        prompt_ids = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
        completion = tuple(batch["completion_ids"][i][batch["completion_mask"][i].bool()].tolist())
        out.append((tokenizer.decode(prompt_ids), completion, float(batch["advantages"][i])))
    return out


def test_two_training_steps_use_corpo_advantages_and_log_them(tmp_path):
    reward = RecordingReward()
    trainer = _trainer(tmp_path, reward)
    seen = _capture_loss_inputs(trainer)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()

    assert len(seen) == 2 and len(reward.rows) == 2 * 2 * G  # 2 steps × 2 prompts × G
    logged = [h for h in trainer.state.log_history if K.FAILED_POSITIVE_FRAC in h]
    assert len(logged) == 2
    for step, batch in enumerate(seen):
        scored = reward.rows[step * 2 * G : (step + 1) * 2 * G]
        rewards = torch.tensor([r for _, _, r in scored])
        expected = compute_advantages(rewards, G, "corpo", threshold=TAU)
        by_row = {(p, ids): float(a) for (p, ids, _), a in zip(scored, expected)}
        used = _rows(batch, trainer.processing_class)
        # Every advantage the loss received is CoRPO's for that (prompt, completion).
        for prompt, ids, advantage in used:
            assert advantage == pytest.approx(by_row[(prompt, ids)], abs=1e-6)
        assert sorted(a for *_, a in used) == pytest.approx(sorted(expected.tolist()), abs=1e-6)
        # TRL's own (scale_rewards="none") advantage r − mean differs here: the replacement mattered.
        dr_grpo = compute_advantages(rewards, G, "dr_grpo")
        assert not torch.allclose(expected, dr_grpo)
        # Logged diagnostics describe these advantages: groups with mean < τ = 0.75 are in the
        # correctness regime, and CoRPO never gives a failed (r < τ) completion A > 0.
        means = rewards.view(-1, G).mean(dim=1)
        assert logged[step][K.CORPO_CORRECTNESS_REGIME] == pytest.approx((means < TAU).float().mean().item())
        assert logged[step][K.FAILED_POSITIVE_FRAC] == 0.0
        assert logged[step][K.ADV_MEAN] == pytest.approx(expected.mean().item(), abs=1e-6)
    assert any(not torch.equal(b, p) for b, p in zip(before, trainer.model.parameters()))  # it trained
    # The completions table shows the advantages used (the last generation batch's).
    assert sorted(trainer._logs["advantages"]) == pytest.approx(sorted(a for *_, a in _rows(seen[-1], trainer.processing_class)), abs=1e-6)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"scale_rewards": "group"}, "scale_rewards='group'"),
        ({"multi_objective_aggregation": "normalize_then_sum"}, "multi_objective_aggregation='normalize_then_sum'"),
    ],
)
def test_configs_that_break_corpo_are_refused(tmp_path, config, message):
    with pytest.raises(ValueError, match=message):
        _trainer(tmp_path, RecordingReward(), **config)


def test_non_finite_threshold_is_refused_before_building():
    with pytest.raises(ValueError, match="threshold=nan"):
        CoRPOTrainer(model="unused", reward_funcs=[], threshold=float("nan"))


@pytest.mark.parametrize("installed", ["1.15.2", "1.17.0", "2.0.0"])
def test_unsupported_trl_versions_are_named_with_the_range(installed):
    with pytest.raises(ImportError) as info:
        check_trl_version(installed)
    assert f"trl {installed} is installed" in str(info.value) and SUPPORTED_TRL in str(info.value)


def test_supported_trl_versions_pass():
    for installed in ("1.16.0", "1.16.5", trl.__version__):
        check_trl_version(installed)


def test_import_fails_clearly_under_another_trl_version():
    code = (
        "import importlib.metadata as m; real = m.version\n"
        "m.version = lambda name: '1.17.0' if name == 'trl' else real(name)\n"
        "import labelrl.integrations.trl\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0
    assert "ImportError: trl 1.17.0 is installed" in done.stderr and "pip install 'trl>=1.16,<1.17'" in done.stderr


def test_binary_reward_grades_gates_format_and_applies_the_truncation_policy():
    fn = binary_reward(["ham", "spam"], max_completion_length=4, truncation="mask", eos_token_ids=[0])
    completions = ["<answer>spam</answer>", "<answer>ham</answer>", "spam, I think", "<answer>sp"]
    ids = [[5, 0], [5, 0], [5, 6, 0], [5, 6, 7, 8]]  # the last hit the cap of 4 without EOS (id 0)
    rewards = fn(prompts=["p"] * 4, completions=completions, completion_ids=ids, label=["spam"] * 4)
    # right → 1, wrong → 0, prose fails the strict format gate → 0, truncated under mask → None
    assert rewards == [1.0, 0.0, 0.0, None]
    zero = binary_reward(["ham", "spam"], max_completion_length=4, eos_token_ids=[0])
    assert zero(prompts=["p"], completions=["<answer>sp"], completion_ids=[[5, 6, 7, 8]], label=["spam"]) == [0.0]


def test_ordinal_reward_gives_partial_credit_by_distance():
    fn = ordinal_reward(["1", "2", "3"], max_completion_length=8)
    texts = [f"<answer>{g}</answer>" for g in ("3", "2", "1")] + ["no answer"]
    rewards = fn(prompts=["p"] * 4, completions=texts, label=["3"] * 4)
    # exact → 1, one grade off of a 2-step range → 0.5, farthest → 0, unparseable → 0
    assert rewards == pytest.approx([1.0, 0.5, 0.0, 0.0])


def test_format_reward_pays_for_a_parseable_label_only():
    fn = format_reward(["ham", "spam"], value=0.5)
    messages = [[{"role": "assistant", "content": "<answer>ham</answer>"}]]
    assert fn(prompts=["p"] * 3, completions=["<answer>SPAM</answer>", "<answer>eggs</answer>", "ham"]) == [0.5, 0.0, 0.0]
    assert fn(prompts=["p"], completions=messages) == [0.5]


@pytest.mark.slow  # ~20 s: a fresh interpreter imports TRL and trains
def test_example_script_trains_tiny_random_with_corpo(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "trl_corpo.py"), "--steps", "2", "--prompts", "2",
         "--prompts-per-step", "1", "--group-size", "2", "--max-completion-length", "4", "--out", str(out)],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"')]
    steps = [r for r in records if K.FAILED_POSITIVE_FRAC in r]
    assert [r["step"] for r in steps] == [1, 2]
    for record in steps:
        assert record[K.FAILED_POSITIVE_FRAC] == 0.0
        share = record[K.CORPO_CORRECTNESS_REGIME]
        assert 0.0 <= share <= 1.0 and share + record[K.CORPO_PREFERENCE_REGIME] == pytest.approx(1.0)
        # With 0/1 rewards and τ = 0.5 a group's mean advantage is −0.5 (all wrong), between
        # −0.5 and 0 (correctness regime) or exactly 0 (preference regime = Dr. GRPO).
        assert -0.5 <= record[K.ADV_MEAN] <= 0.0
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert reloaded.config.num_hidden_layers == 2  # tiny-random's two layers, saved by the script
    from labelrl.models import load_model

    start = load_model("tiny-random")[0].state_dict()
    trained = reloaded.state_dict()
    assert any(not torch.equal(start[n], trained[n]) for n in start.keys() & trained.keys())  # it trained

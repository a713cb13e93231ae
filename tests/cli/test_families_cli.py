"""`labelrl sft`, `labelrl rl` and `labelrl export` through the real CLI, as subprocesses, on the
built-in Qwen2, Qwen3 and Gemma 3 models: SFT with LoRA in fp32, one RL step on from that run in
bf16 (random rewards, so the step's groups are informative and the training pass really runs),
and the RL adapter merged into a plain model that transformers loads as the family's class with
the trained logits. Gemma 3 (the family furthest from Llama) runs in the fast suite; the two
Qwen ones are slow (about a minute each on 2 cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from labelrl.fileio import read_jsonl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numerics import assert_values_within, logit_bound  # noqa: E402

CLASSES = {"tiny-qwen2": "Qwen2ForCausalLM", "tiny-qwen3": "Qwen3ForCausalLM", "tiny-gemma3": "Gemma3ForCausalLM"}
IDS = [[1, 42, 300, 7, 99, 5, 1200, 31, 8]]


def _labelrl(*args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "labelrl.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.numerics
@pytest.mark.parametrize("name", [
    pytest.param("tiny-qwen2", marks=pytest.mark.slow),
    pytest.param("tiny-qwen3", marks=pytest.mark.slow),
    "tiny-gemma3",
])
def test_family_sft_then_bf16_rl_then_export(name, toy_data, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from labelrl.models import load_model

    sft = _labelrl("sft", "--model", name, "--data", str(toy_data), "--out", "sft", "--max-steps", "2",
                   "--batch-size", "4", "--eval-every", "2", "--eval-limit", "4", "--precision", "fp32", "--quiet",
                   cwd=tmp_path)
    assert sft.returncode == 0, sft.stderr[-3000:]
    adapter = json.loads((tmp_path / "sft" / "model" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == name

    rl = _labelrl("rl", "--model", "sft", "--data", str(toy_data), "--out", "rl", "--steps", "1", "--group-size", "4",
                  "--prompts-per-step", "2", "--max-new-tokens", "9", "--random-reward", "--precision", "bf16",
                  "--seed", "0", "--quiet", cwd=tmp_path)
    assert rl.returncode == 0, rl.stderr[-3000:]
    [metrics] = read_jsonl(tmp_path / "rl" / "metrics.jsonl")
    assert metrics["train/token_passes"] > 0 and metrics["train/grad_norm"] > 0  # the training pass ran
    assert json.loads((tmp_path / "rl" / "rl_summary.json").read_text())["precision"] == "bf16"
    before = load_file(str(tmp_path / "sft" / "model" / "adapter_model.safetensors"))
    after = load_file(str(tmp_path / "rl" / "model" / "adapter_model.safetensors"))
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)

    export = _labelrl("export", "rl", "--merged", "merged", cwd=tmp_path)
    assert export.returncode == 0, export.stderr[-3000:]
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    trained, _ = load_model(tmp_path / "rl" / "model")
    assert type(merged).__name__ == CLASSES[name]
    with torch.no_grad():
        got, expected = merged(torch.tensor(IDS)).logits, trained(torch.tensor(IDS)).logits
        base = load_model(name)[0](torch.tensor(IDS)).logits
    # the RL-trained model, merged: W + s·B·A rounds once more, inside the adapter chain's logit bound
    bound = logit_bound(trained, len(IDS[0]))
    assert_values_within(got, expected, bound, "logits")
    assert (got - base).abs().max() > bound  # not the untouched base: SFT and RL moved it beyond rounding

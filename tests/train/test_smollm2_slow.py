"""SFT then a few RL steps of the real SmolLM2-135M-Instruct on sms-spam (slow)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from labelrl import metrics_keys as K
from labelrl.fileio import read_jsonl
from labelrl.rollout.log import ROLLOUT_SCHEMA
from labelrl.train.config import RLConfig, SFTConfig
from labelrl.train.rl import run_rl
from labelrl.train.sft import run_sft


@pytest.mark.slow
def test_smollm2_sft_then_rl_on_sms_spam(tmp_path):
    sft = run_sft(SFTConfig(model="smollm2-135m-instruct", data="sms-spam", out=tmp_path / "sft", limit=16,
                            max_steps=2, batch_size=4, eval_every=2, eval_limit=8, quiet=True))
    assert sft["best"]["step"] == 2 and K.EVAL_BALANCED_ACCURACY in sft["best"]
    assert (tmp_path / "sft" / "model" / "adapter_config.json").is_file()
    rl = run_rl(RLConfig(model=str(tmp_path / "sft"), data="sms-spam", out=tmp_path / "rl", limit=16, steps=2,
                         prompts_per_step=1, group_size=2, max_new_tokens=9, preset="grpo", quiet=True))
    assert rl["steps_done"] == 2
    for part in sorted((tmp_path / "rl" / "rollouts").glob("*.parquet")):
        assert pq.read_schema(part).remove_metadata() == ROLLOUT_SCHEMA
        assert pq.read_metadata(part).num_rows == 2
    records = read_jsonl(tmp_path / "rl" / "metrics.jsonl")
    assert [r[K.STEP] for r in records] == [1, 2]
    assert all(0.0 <= r[K.REWARD_MEAN] <= 1.0 and r[K.LENGTH_MAX] <= 9 for r in records)
    assert (tmp_path / "rl" / "model" / "adapter_config.json").is_file()

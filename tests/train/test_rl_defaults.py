"""RL's learning rate defaults to the measured value for its way of training, not SFT's."""

from __future__ import annotations

from labelrl.train.config import RL_LR_FULL, RL_LR_LORA, RLConfig, SFTConfig


def test_rl_learning_rate_defaults_by_lora_or_full_and_an_explicit_value_wins(tmp_path):
    lora = RLConfig(data="sms-spam", out=tmp_path / "a")
    full = RLConfig(data="sms-spam", out=tmp_path / "b", lora=False)
    given = RLConfig(data="sms-spam", out=tmp_path / "c", lora=False, learning_rate=2e-5)
    assert (lora.learning_rate, full.learning_rate, given.learning_rate) == (RL_LR_LORA, RL_LR_FULL, 2e-5)
    # SFT's default is not RL's: at SFT's rate GRPO drifted to one answer within 24 steps
    assert SFTConfig(data="sms-spam", out=tmp_path / "d").learning_rate > 10 * RL_LR_LORA > RL_LR_FULL
    # the resolved value is what a saved config records, so a run re-read from disk keeps it
    assert RLConfig.model_validate(lora.model_dump()).learning_rate == RL_LR_LORA

"""Every logged metric name, defined once.

Names follow ``area/quantity``; docs/metrics.md gives each one's formula. Code that logs
or reads a metric imports the constant, never spells the string.
"""

from __future__ import annotations

STEP = "step"

# reward/: graded rewards of all rollouts in the step (after format gate and truncation policy)
REWARD_MEAN = "reward/mean"
REWARD_STD = "reward/std"
ACCURACY = "reward/accuracy"  # share of rollouts whose parsed answer equals the label

# rollout/: completions sampled this step
LENGTH_MEAN = "rollout/length_mean"
LENGTH_P50 = "rollout/length_p50"
LENGTH_P90 = "rollout/length_p90"
LENGTH_MAX = "rollout/length_max"
TRUNCATED_FRAC = "rollout/truncated_frac"
THINK_CLOSED_FRAC = "rollout/think_closed_frac"
PARSE_FAIL_FRAC = "rollout/parse_fail_frac"
ANSWER_SHARE = "rollout/answer_share"  # + "/<label>": share of the step's parsed answers (collapse detector)
ANSWER_RECALL = "rollout/answer_recall"  # + "/<label>": share of the label's rollouts answering it (collapse detector)
TOKENS_PER_S = "rollout/tokens_per_s"
ENTROPY_MEAN = "rollout/entropy_mean"  # the policy's entropy per completion token (training pass), mean
ENTROPY_P10 = "rollout/entropy_p10"  # … and its 10th percentile

# mismatch/: the sampler's log-probs of its tokens against the training pass's (labelrl.losses.rollout_correction)
MISMATCH_KL = "mismatch/kl"  # k3 estimate of KL(sampler ‖ trainer) per token
MISMATCH_LOGP_DIFF_MEAN = "mismatch/logp_diff_mean"  # mean |log π − log q| per token
MISMATCH_LOGP_DIFF_MAX = "mismatch/logp_diff_max"  # largest |log π − log q|
MISMATCH_CLIPPED_FRAC = "mismatch/clipped_frac"  # *_truncate: share of tokens / sequences whose ratio was clipped
MISMATCH_MASKED_FRAC = "mismatch/masked_frac"  # *_mask: share of tokens / sequences dropped

# groups/: the skip rule and what it does to the label mix
UNIFORM_FRAC = "groups/uniform_frac"
SKIPPED = "groups/skipped"
TOKEN_PASSES_SAVED = "groups/token_passes_saved"
LABEL_SHARE_INFORMATIVE = "groups/label_share_informative"  # + "/<label>"
LABEL_SHARE_DATA = "groups/label_share_data"  # + "/<label>"

# adv/: advantage diagnostics
FAILED_POSITIVE_FRAC = "adv/failed_positive_frac"
FAILED_POSITIVE_COUNT = "adv/failed_positive_count"
CORPO_CORRECTNESS_REGIME = "adv/corpo_correctness_regime_frac"
CORPO_PREFERENCE_REGIME = "adv/corpo_preference_regime_frac"
ADV_MEAN = "adv/mean"
ADV_ABS_MEAN = "adv/abs_mean"

# train/: the update
LOSS = "train/loss"
GRAD_NORM = "train/grad_norm"
LEARNING_RATE = "train/lr"
KL = "train/kl"
NONFINITE_SKIPPED = "train/nonfinite_skipped"
STEP_SECONDS = "perf/step_seconds"
PEAK_MEMORY_MB = "perf/peak_memory_mb"
SAMPLE_SECONDS = "perf/sample_seconds"  # rl: prefill + decoding of the step's rollouts
UPDATE_SECONDS = "perf/update_seconds"  # rl: the training pass and optimizer step
VAL_SECONDS = "perf/val_seconds"  # rl: scoring the policy on the val sample (--val-path)
PADDING_SHARE = "perf/padding_share"  # sft: padding positions / all positions forwarded
TRAIN_TOKENS_PER_S = "perf/tokens_per_s"  # sft: the items' tokens (a shared prefix once per item) / step seconds

# eval/: validation during training
EVAL_ACCURACY = "eval/accuracy"
EVAL_BALANCED_ACCURACY = "eval/balanced_accuracy"


def per_label(prefix: str, label: str) -> str:
    """``groups/label_share_informative/spam``: one metric per reference label."""
    return f"{prefix}/{label}"

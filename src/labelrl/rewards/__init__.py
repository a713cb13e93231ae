"""Answer parsing, the one grader, truncation policies and the composite reward.

Pure Python (no torch): the trainer, evaluation and the TRL adapter all score completions
through these functions. docs/rewards.md states every rule with examples.
"""

from labelrl.rewards.grade import ClassReward, RewardScale, grade, is_correct, success_threshold
from labelrl.rewards.parse import PARSE_MODES, ParseResult, ParseStatus, label_lookup, parse_answer
from labelrl.rewards.reward_fn import (
    RewardBatch,
    RewardConfig,
    ScoredCompletion,
    completion_text,
    score_completions,
    trl_reward_func,
)
from labelrl.rewards.truncation import (
    TRUNCATION_POLICIES,
    TruncationResult,
    apply_truncation,
    overlong_penalty,
)

__all__ = [
    "ClassReward",
    "PARSE_MODES",
    "ParseResult",
    "ParseStatus",
    "RewardBatch",
    "RewardConfig",
    "RewardScale",
    "ScoredCompletion",
    "TRUNCATION_POLICIES",
    "TruncationResult",
    "apply_truncation",
    "completion_text",
    "grade",
    "is_correct",
    "label_lookup",
    "overlong_penalty",
    "parse_answer",
    "score_completions",
    "success_threshold",
    "trl_reward_func",
]

"""The composite reward: parse → format gate → grade → truncation policy.

``score_completions`` is what labelrl's trainer calls; ``trl_reward_func`` wraps the same
function in TRL's ``reward_funcs`` signature, so a TRL run and a labelrl run of one config
score every completion identically.

The format gate: a completion that fails parsing (strict by default) has no answer, and
``grade`` gives a missing answer the failure reward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from labelrl import metrics_keys as K
from labelrl.rewards.grade import ClassReward, RewardScale, grade, is_correct
from labelrl.rewards.parse import ParseResult, parse_answer
from labelrl.rewards.truncation import TRUNCATION_POLICIES, apply_truncation, overlong_penalty
from labelrl.types import LabelKind, LabelSpace

# Keys TRL adds to the reward kwargs that are not dataset columns.
_TRL_EXTRA_KWARGS = ("trainer_state", "log_extra", "log_metric", "environments")


class RewardConfig(BaseModel):
    """Everything that decides a completion's reward."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    labels: LabelSpace = Field(description="The declared labels: a LabelSpace, or label strings (then see kind).")
    kind: Optional[LabelKind] = Field(None, description="Kind of labels given as strings (default categorical); must agree with a LabelSpace.")
    reasoning: bool = Field(False, description="Completions think first: the answer is read after the last </think>.")
    parse_mode: Literal["strict", "lenient"] = Field("strict", description="Answer parser; lenient exists only to show what it does to the reward.")
    correct: float = Field(1.0, description="Reward of a correct answer (ordinal: of the exact grade).")
    incorrect: float = Field(0.0, description="Reward of a wrong answer (ordinal: of the farthest grade).")
    failure: Optional[float] = Field(None, description="Reward of an unparseable completion (format gate); defaults to the incorrect value of the reference's class.")
    per_class: Optional[dict[str, ClassReward]] = Field(None, description="Per reference label: {'correct': x, 'incorrect': y} overrides.")
    table: Optional[dict[str, dict[str, float]]] = Field(None, description="Full reward table table[ref][pred]; replaces correct/incorrect/per_class.")
    success_threshold: Optional[float] = Field(None, description="Ordinal only: lowest reward that counts as correct (default: exact grade).")
    truncation: str = Field("zero", description="Policy for completions that hit the cap: zero, mask or soft_penalty.")
    mask_in_baseline: bool = Field(False, description="mask policy: whether a masked completion's reward still counts in its group's baseline.")
    max_new_tokens: Optional[int] = Field(None, ge=1, description="Token cap per completion (L_max of the soft penalty; TRL truncation check).")
    cache_tokens: Optional[int] = Field(None, ge=1, description="soft_penalty: the penalty ramps from 0 to −1 over the last N tokens before the cap (L_cache).")

    _scale: RewardScale = PrivateAttr()

    @model_validator(mode="before")
    @classmethod
    def _labels_from_list(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("labels"), (list, tuple)):
            names = tuple(str(x) for x in data["labels"])
            data = {**data, "labels": LabelSpace(names, kind=data.get("kind") or "categorical")}
        return data

    @model_validator(mode="after")
    def _check(self) -> "RewardConfig":
        if self.kind is not None and self.kind != self.labels.kind:
            raise ValueError(f"kind={self.kind!r} contradicts the LabelSpace's kind {self.labels.kind!r}; drop kind")
        TRUNCATION_POLICIES.get(self.truncation)  # unknown names list the known ones
        if self.truncation == "soft_penalty":
            # Validates both numbers with the soft penalty's own message.
            overlong_penalty(0, self.max_new_tokens, self.cache_tokens)  # type: ignore[arg-type]
        self._scale = RewardScale(
            labels=self.labels, correct=self.correct, incorrect=self.incorrect, failure=self.failure,
            per_class=self.per_class, table=self.table, success_threshold=self.success_threshold,
        )
        return self

    def scale(self) -> RewardScale:
        """The validated RewardScale these settings define."""
        return self._scale


@dataclass(frozen=True)
class ScoredCompletion:
    """One completion's row of a RewardBatch."""

    parse: ParseResult
    reward: float
    loss_mask: bool
    baseline_mask: bool
    correct: bool
    truncated: bool


@dataclass(frozen=True)
class RewardBatch:
    """Per completion: how it parsed, its reward and where it counts.

    parses         # [N] ParseResult
    rewards        # [N] reward after the format gate and the truncation policy
    loss_mask      # [N] True: the completion enters the policy loss
    baseline_mask  # [N] True: its reward enters its group's baseline
    correct        # [N] the grader's verdict on the parsed answer (is_correct), before truncation
    truncated      # [N] the completion hit the token cap
    """

    parses: list[ParseResult]
    rewards: list[float]
    loss_mask: list[bool]
    baseline_mask: list[bool]
    correct: list[bool]
    truncated: list[bool]

    def __len__(self) -> int:
        return len(self.rewards)

    @property
    def items(self) -> list[ScoredCompletion]:
        """The same data one completion at a time."""
        columns = (self.parses, self.rewards, self.loss_mask, self.baseline_mask, self.correct, self.truncated)
        return [ScoredCompletion(*row) for row in zip(*columns)]


def score_completions(
    texts: Sequence[str],
    labels: Sequence[str],
    *,
    truncated: Sequence[bool] | None = None,
    lengths: Sequence[int] | None = None,
    config: RewardConfig,
) -> RewardBatch:
    """Score N completions against their reference labels.

    texts      # [N] completion texts (decoded without special tokens)
    labels     # [N] reference label of each completion's prompt
    truncated  # [N] hit the token cap (None: none did)
    lengths    # [N] completion lengths in tokens (needed by soft_penalty)
    """
    n = len(texts)
    flags = [False] * n if truncated is None else [bool(t) for t in truncated]
    if len(labels) != n or len(flags) != n:
        raise ValueError(
            f"{n} completions but {len(labels)} labels and {len(flags)} truncation flags: pass one per completion"
        )
    scale = config.scale()
    refs = [scale.reference(label) for label in labels]
    parses = [
        parse_answer(text, reasoning=config.reasoning, mode=config.parse_mode, labels=config.labels, truncated=cut)
        for text, cut in zip(texts, flags)
    ]
    graded = [grade(p.answer, ref, scale) for p, ref in zip(parses, refs)]
    result = apply_truncation(
        graded, lengths, flags, policy=config.truncation,
        failure_reward=[scale.failure_for(ref) for ref in refs],
        max_new_tokens=config.max_new_tokens, cache_tokens=config.cache_tokens,
        mask_in_baseline=config.mask_in_baseline,
    )
    correct = [is_correct(p.answer, ref, scale) for p, ref in zip(parses, refs)]
    return RewardBatch(parses, result.rewards, result.loss_mask, result.baseline_mask, correct, flags)


def trl_reward_func(
    config: RewardConfig,
    label_column: str = "label",
    *,
    max_completion_length: int | None = None,
    eos_token_ids: Sequence[int] | None = None,
) -> Callable[..., list[float | None]]:
    """A TRL ``reward_funcs`` entry: ``f(prompts, completions, completion_ids=None, **columns)``.

    * Completions may be strings or conversational message lists (the assistant messages'
      contents are joined; a ``reasoning_content``/``thinking`` field that a chat-template
      response parser split off is put back as ``<think>…</think>``).
    * Labels come from the dataset column ``label_column``.
    * Lengths are ``len(completion_ids[i])``; a completion is truncated when its length
      reaches ``max_completion_length`` (default ``config.max_new_tokens``) and, when
      ``eos_token_ids`` is given, its last id is not an EOS id.
    * TRL 1.16 turns a ``None`` reward into NaN, leaves it out of the group mean and std, and
      sets its advantage to 0. So a completion outside both the loss and the baseline
      (policy ``mask``, ``mask_in_baseline=False``) returns ``None``. With
      ``mask_in_baseline=True`` it returns its reward, and the loss mask must come from
      ``GRPOConfig(mask_truncated_completions=True)``.
    """
    cap = max_completion_length if max_completion_length is not None else config.max_new_tokens
    if cap is None:
        raise ValueError(
            "max_completion_length=None and config.max_new_tokens=None: truncation is judged against the "
            "token cap; pass max_completion_length=GRPOConfig.max_completion_length"
        )
    eos = None if eos_token_ids is None else set(eos_token_ids)

    def reward_func(prompts=None, completions=None, completion_ids=None, **columns) -> list[float | None]:
        if label_column not in columns:
            found = sorted(k for k in columns if k not in _TRL_EXTRA_KWARGS)
            raise ValueError(
                f"label_column={label_column!r} is not among the dataset columns {found}; "
                "pass label_column= naming the column that holds the label"
            )
        texts = [completion_text(c) for c in completions or []]
        labels = [str(x) for x in columns[label_column]]
        lengths = truncated = None
        if completion_ids is not None:
            lengths = [len(ids) for ids in completion_ids]
            truncated = [len(ids) >= cap and (eos is None or not ids or ids[-1] not in eos) for ids in completion_ids]
        batch = score_completions(texts, labels, truncated=truncated, lengths=lengths, config=config)
        _log_to_trl(batch, columns)
        return [r if (keep or base) else None
                for r, keep, base in zip(batch.rewards, batch.loss_mask, batch.baseline_mask)]

    reward_func.__name__ = f"labelrl_{config.labels.kind}_{config.parse_mode}"
    reward_func.__qualname__ = reward_func.__name__
    return reward_func


def completion_text(completion: Any) -> str:
    """The text of one TRL completion: a string, or a list of message dicts."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    parts = []
    for message in completion or []:
        if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
            continue
        thought = message.get("reasoning_content") or message.get("thinking")
        text = _content_text(message.get("content"))
        parts.append(f"<think>{thought}</think>{text}" if isinstance(thought, str) else text)
    return "\n".join(parts)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks: [{"type": "text", "text": ...}, ...]
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type", "text") == "text")
    return ""


def _log_to_trl(batch: RewardBatch, columns: dict[str, Any]) -> None:
    """Send parse statuses and failure rates to TRL's completions table and metrics."""
    log_extra, log_metric = columns.get("log_extra"), columns.get("log_metric")
    if callable(log_extra):
        log_extra("parse_status", [p.status.value for p in batch.parses])
    if callable(log_metric) and len(batch):
        log_metric(K.PARSE_FAIL_FRAC, sum(not p.ok for p in batch.parses) / len(batch))
        log_metric(K.TRUNCATED_FRAC, sum(batch.truncated) / len(batch))

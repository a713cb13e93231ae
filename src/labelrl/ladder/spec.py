"""One task and its arms as a recipe declares them (``TaskSpec``, ``ArmSpec``), validated field by
field; ``labelrl.ladder.recipe`` checks them together (parents, replicates, run order) and
``labelrl.ladder.tune_scope`` reads their ``tune`` keys.

Arm keys other than ``type``, ``from``, ``teacher``, ``seeds``, ``tune`` and ``labels_from`` are
options of the arm's command (``ArmSpec.options``); ``DATA_KEYS`` are the task keys that say which
data every arm of the task reads, and how.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from labelrl.data.options import parse_ratios, valid_encoding

DATA_KEYS = ("data", "text_col", "label_col", "labels", "kind", "on_bad_row", "delimiter", "encoding", "on_long_item", "limit",
             "train_sample", "split_seed", "split_ratios", "label_noise", "label_noise_seed", "rubric")


class ArmSpec(BaseModel):
    """One arm: its type, what it starts from, and options of its command."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    type: Literal["sft", "rl", "random_reward", "distill", "cot_sft", "cot_rl", "control", "threshold", "relabel"]
    from_: Optional[str] = Field(None, alias="from")
    teacher: Optional[str] = None
    seeds: Optional[list[int]] = Field(None, description="Replicates: one run per seed (named ARM@sSEED), overriding the task's seeds.")
    replicate_of: Optional[str] = Field(None, description="Set by the ladder on a replicate run: the arm it replicates.")
    tune: Optional[Any] = Field(None, description="Config field → values to try; the best on val becomes the arm (labelrl.ladder.tune). `{}`: no tuning.")
    tuned_by: Optional[str] = Field(None, description="Set by the ladder on a replicate run of a tuned arm: the run (its first seed's) whose val selection it uses.")
    labels_from: Optional[str] = Field(None, description="A relabel arm of the task: train on its final labels instead of the data's (the same training items; val and holdout keep their labels). That arm also becomes an answer key every evaluation is scored against.")

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class TaskSpec(BaseModel):
    """One dataset and its arms, sharing splits, audit and holdout ledger."""

    model_config = ConfigDict(extra="forbid")

    data: str
    text_col: Optional[list[str]] = None
    label_col: Optional[str] = None
    labels: Optional[str] = None
    kind: Optional[Literal["binary", "categorical", "ordinal"]] = None
    on_bad_row: Literal["error", "skip"] = "error"
    delimiter: Optional[str] = Field(None, description="CSV files only: the delimiter (sniffed from the header when omitted).")
    encoding: Optional[str] = Field(None, description="CSV and JSONL files: the text encoding, any Python codec name (utf-8 when omitted).")
    on_long_item: Literal["truncate", "skip", "error"] = Field("truncate", description="An item too long to fit: cut its text, leave it out, or stop.")
    limit: Optional[int] = Field(None, ge=1, description="Training items: a random sample stratified by label (or balanced: train_sample), the same for every arm.")
    train_sample: Literal["stratified", "balanced"] = Field("stratified", description="How limit draws the training sample: each label its share of the train split (stratified) or an equal share, all of a label's items when it has fewer (balanced; with prompt_sampling balanced a rare label then has many items, not a few repeated).")
    split_seed: int = 0
    split_ratios: str = Field("0.8,0.1,0.1", description="Shares of train, val and holdout (e.g. 0.7,0.1,0.2).")
    label_noise: float = Field(0.0, ge=0, lt=1, description="Flip this share of the training labels (val and holdout untouched).")
    label_noise_seed: Literal["split", "run"] = Field("split", description="What seeds the flips: split (the split seed: every run trains on the same wrong labels) or run (each run's seed: replicate runs ARM@sSEED train on different wrong labels, the training items staying the same).")
    rubric: Optional[Path] = None
    audit: bool = True
    seeds: Optional[list[int]] = Field(None, description="Replicates: every training arm runs once per seed (distill arms once).")
    success_threshold: Optional[float] = Field(None, description="Reward at or above which a rollout is correct, for every RL arm's diagnostics and the report (default: full credit).")
    eval_limit: Optional[int] = Field(None, ge=1, description="Val items scored per arm: a random sample stratified by label, the same for every arm (all when empty).")
    holdout_limit: Optional[int] = Field(None, ge=1, description="Holdout items scored per arm: a random sample stratified by label, the same for every arm (all when empty).")
    ood: list[str] = Field(default_factory=list, description="Other datasets each arm is also scored on (their holdout split).")
    ood_split_ratios: Optional[str] = Field(None, description="Shares of train, val and holdout of each OOD set's own split (default: split_ratios). Nothing trains or tunes on an OOD set, so a larger holdout share only buys items: 0.6,0.1,0.3 gives vader-tweets 1,260 holdout items instead of 420.")
    eval_max_new_tokens: Optional[int] = Field(None, ge=1, description="Token cap of generated evaluations (default: a reasoning arm's own cap, the one it trained or distilled at).")
    generate_eval: bool = Field(True, description="Also score direct RL arms by their own greedy generations parsed strictly (what a user without logit access gets).")
    on_collapse: Literal["continue", "stop"] = Field("continue", description="An RL arm flagged collapsed to one answer (labelrl.train.collapse): continue evaluates it as any arm and names the collapse in the verdict; stop marks it status collapsed, spends no holdout look on it and skips the arms that start from it.")
    score_train: Optional[bool] = Field(None, description="Score the training sample with the direct SFT model (difficulty for distillation survival and the ambiguous residue); default: when the task has distill arms.")
    eval_label_cols: list[str] = Field(default_factory=list, description="Other answer keys (label columns of the data, or a relabel arm's name): every evaluation is also scored against each, from the same predictions. A relabel arm some arm trains on (`labels_from`) is added.")
    pass_at_k: Optional[int] = Field(None, ge=1, description="Also report pass@k on val for the SFT and RL arms (k of --pass-samples sampled answers).")
    pass_samples: int = Field(8, ge=1, description="Answers sampled per val item for pass@k (n ≥ k).")
    positive_label: Optional[str] = None
    n_boot: int = Field(1000, ge=0)
    defaults: dict[str, dict[str, Any]] = Field(default_factory=dict)
    arms: dict[str, ArmSpec]

    _check_encoding = field_validator("encoding")(valid_encoding)

    @field_validator("split_ratios", mode="before")
    @classmethod
    def _ratios(cls, value: Any) -> Any:
        text = ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else value
        parse_ratios(text)
        return text

    @field_validator("ood_split_ratios", mode="before")
    @classmethod
    def _ood_ratios(cls, value: Any) -> Any:
        if value is None:
            return None
        return cls._ratios(value)

    @model_validator(mode="after")
    def _label_sources_are_answer_keys(self) -> "TaskSpec":
        """A relabel arm that some arm trains on is also an answer key: the four cells (trained on
        either labels × scored against either) need every arm scored against it."""
        for arm in self.arms.values():
            if arm.labels_from and arm.labels_from not in self.eval_label_cols:
                self.eval_label_cols = [*self.eval_label_cols, arm.labels_from]
        return self

    def data_options(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in DATA_KEYS if getattr(self, k) is not None}

"""The plain data a report is built from: ``RunData`` (a ladder run) holds a ``TaskData`` per
task, which holds an ``ArmData`` per arm, each with what its files hold.

``labelrl.report.collect`` fills them from a run directory; the report's section modules take
them as they are (and tests build them by hand).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from labelrl.ladder.kinds import RL_TYPES


@dataclass
class ArmData:
    """One arm of a task: its ladder.json entry plus what its files hold."""

    name: str
    type: str
    status: str
    dir: Path
    preset: str | None = None
    error: str | None = None
    seconds: float | None = None
    depends_on: list[str] = field(default_factory=list)
    val: dict | None = None
    holdout: dict | None = None
    holdout_repeat: bool = False
    ood: dict[str, dict] = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)  # metrics.jsonl records (RL), one per step
    sft_records: list[dict] = field(default_factory=list)  # sft_metrics.jsonl records
    rollout_steps: list[dict] = field(default_factory=list)  # collect.rollout_step_stats()
    length_buckets: list[dict] = field(default_factory=list)  # collect.length_buckets()
    distill_summary: dict | None = None
    same_model_as: str | None = None  # holdout result shared with this arm (identical weights)
    traceback: str | None = None  # ARM/error.txt of a failed arm
    replicate_of: str | None = None  # the arm this run replicates (runs named ARM@sSEED)
    seed: int | None = None
    parent: str | None = None  # the arm it starts from (``from``)
    config: dict = field(default_factory=dict)  # the resolved config the ladder ran it with
    algorithm: dict = field(default_factory=dict)  # RL arms: estimator, surrogate, aggregation, …
    rule: dict | None = None  # threshold arms: the decision rule chosen on val
    thin_val: dict = field(default_factory=dict)  # threshold arms: labels val held too few items of (label → count)
    matched: dict[str, dict] = field(default_factory=dict)  # threshold arms: recall-matched holdout metrics per RL arm
    failures: dict | None = None  # collect.failed_positive_breakdown() of its rollouts with the task's threshold
    recall_steps: list[dict] = field(default_factory=list)  # rollout_stats.recall_per_step
    tax: dict | None = None  # rollout_stats.think_length_tax (reasoning arms)
    residue: dict | None = None  # rollout_stats.residue_drift
    rescore: dict | None = None  # analysis/rescore-ARM.json (strict vs lenient parser)
    val_generate: dict | None = None  # a direct arm's greedy generations, parsed strictly
    holdout_generate: dict | None = None
    answer_keys: dict[str, dict] = field(default_factory=dict)  # other answer key → {val, holdout}
    pass_at_k: dict | None = None
    eval_max_new_tokens: int | None = None
    relabel: dict | None = None  # a relabel arm's summary (agreement with the original labels, self-agreement)
    collapse: dict | None = None  # RL arms: collapsed to one answer ({label, step, share, series}; labelrl.train.collapse)
    tune: dict | None = None  # labelrl.ladder.tune: the grid, each candidate's val metrics and the chosen values

    @property
    def is_rl(self) -> bool:
        """Trained by RL: it has (or should have) per-step RL metrics."""
        return self.type in RL_TYPES or bool(self.steps)

    @property
    def group(self) -> str:
        """The arm this run belongs to (itself unless it is a replicate)."""
        return self.replicate_of or self.name

    @property
    def label(self) -> str:
        """The name shown in legends: ``grpo``, ``grpo@s1`` (a replicate of ``grpo``), or
        ``arm2 (corpo)`` when the name is not the preset."""
        from labelrl.ladder.recipe import run_label

        return run_label(self.name, self.preset, self.group)


@dataclass
class TaskData:
    """One task (dataset) of the ladder with its arms and analyses."""

    name: str
    dir: Path
    kind: str | None = None
    labels: list[str] = field(default_factory=list)
    positive_label: str | None = None
    data: str | None = None
    ceiling: float | None = None
    ceiling_ci: list[float] | None = None
    ceiling_source: str | None = None
    ood_names: list[str] = field(default_factory=list)
    audit: dict | None = None
    arms: list[ArmData] = field(default_factory=list)
    sweep: dict | None = None  # the first of ``sweeps`` (analysis/sweep.json)
    sweeps: dict[str, dict] = field(default_factory=dict)  # SFT parent arm → its sweep (analysis/sweep*.json)
    routes: dict[str, dict] = field(default_factory=dict)  # arm name → route() result
    compare: dict | None = None
    analysis_notes: dict[str, str] = field(default_factory=dict)  # sweep/route/compare → why not made
    verdict: list[dict] = field(default_factory=list)  # analysis/verdict.json: one entry per RL arm
    paired: list[dict] = field(default_factory=list)  # analysis/paired.json: paired comparisons
    samples: dict = field(default_factory=dict)  # per split: the sample's label counts and the split's
    label_noise: float = 0.0
    success_threshold: float | None = None  # None: full credit
    ambiguous: dict[str, set] = field(default_factory=dict)  # kind → item ids (for the residue drift)
    train_ids: list[str] = field(default_factory=list)  # the training sample
    majority: dict | None = None  # analysis/majority.json: the majority-class predictor's label, val and holdout metrics
    stability: dict | None = None  # analysis/stability.json: figures over seeds and steps (labelrl.ladder.stability)

    def rl_arms(self) -> list[ArmData]:
        return [a for a in self.arms if a.is_rl]


@dataclass
class RunData:
    """Everything the report shows, read from ``run_dir``; ``problems`` lists unreadable files."""

    run_dir: Path
    recipe: str | None
    tasks: list[TaskData]
    problems: list[str] = field(default_factory=list)
    # where the last `labelrl ladder` spent its time (labelrl.ladder.phases), and its wall clock
    phases: list[dict] = field(default_factory=list)
    seconds_last_invocation: float | None = None

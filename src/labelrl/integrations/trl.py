"""labelrl inside TRL: CoRPO advantages in a ``GRPOTrainer``, labelrl's graders as reward functions.

``CoRPOTrainer`` is TRL 1.16's ``GRPOTrainer`` with one change: the group advantages are
CoRPO's, ``A_i = r_i − max(mean_group(r), τ)`` (Garg et al. 2025, arXiv:2511.04439, Eq. 3),
computed by ``labelrl.advantages.compute_advantages(..., estimator="corpo")``. TRL computes
its advantages inline in ``_generate_and_score_completions``, so the trainer keeps the
rewards TRL computed (``_calculate_rewards``), recomputes the advantages from them and
replaces the ``advantages`` entry of the batch TRL returns; that entry is what TRL's loss
reads. The completions table (``log_completions``) shows the replaced advantages too.

Reward functions (``binary_reward``, ``ordinal_reward``, ``format_reward``) have TRL's
``reward_funcs`` signature and score with labelrl's parser and grader, so a TRL run and a
labelrl run of one config give every completion the same reward.

Supported TRL: ``SUPPORTED_TRL`` (checked at import). The trainer overrides two private
methods whose contract changes between TRL minor versions.
"""

from __future__ import annotations

import math
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable, Sequence

from packaging.version import Version

SUPPORTED_TRL = ">=1.16,<1.17"
_SUPPORTED_RELEASE = (1, 16)

__all__ = [
    "SUPPORTED_TRL", "CoRPOTrainer", "binary_reward", "check_trl_version", "format_reward",
    "ordinal_reward", "trl_reward_func",
]


def check_trl_version(installed: str) -> None:
    """Raise ImportError unless ``installed`` is a TRL version in ``SUPPORTED_TRL``."""
    if Version(installed).release[:2] != _SUPPORTED_RELEASE:
        raise ImportError(
            f"trl {installed} is installed, but labelrl.integrations.trl supports trl{SUPPORTED_TRL}: "
            "CoRPOTrainer overrides GRPOTrainer internals that change between TRL minor versions; "
            f"install a supported version with pip install 'trl{SUPPORTED_TRL}'"
        )


def _installed_trl() -> str:
    try:
        return version("trl")
    except PackageNotFoundError:
        raise ImportError(
            f"labelrl.integrations.trl needs TRL, which is not installed; pip install 'trl{SUPPORTED_TRL}'"
        ) from None


check_trl_version(_installed_trl())

# Only after the version check, so an unsupported TRL fails fast with the message above.
import torch  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from labelrl.advantages import compute_advantages  # noqa: E402
from labelrl.advantages.diagnostics import advantage_diagnostics  # noqa: E402
from labelrl.rewards.parse import parse_answer  # noqa: E402
from labelrl.rewards.reward_fn import RewardConfig, completion_text, trl_reward_func  # noqa: E402
from labelrl.types import LabelSpace  # noqa: E402


class CoRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` with CoRPO's group advantages ``A = r − max(mean_group(r), τ)``.

    Extra arguments (keyword only), the rest go to ``GRPOTrainer`` unchanged:

    - ``threshold`` τ (required, reward units): the lowest baseline, e.g. 0.5 for 0/1 rewards.
    - ``success_threshold``: a completion with reward below it counts as failed in
      ``adv/failed_positive_frac`` (default τ).

    Rewards are TRL's: each reward function's output times ``reward_weights``, summed. A
    completion for which every reward function returned ``None`` is left out of its group's
    mean and gets advantage 0, as in TRL. The advantages are not divided by a std, so
    ``GRPOConfig(scale_rewards="none")`` is required, and ``multi_objective_aggregation``
    must be ``"sum_then_normalize"`` (the other mode rescales each reward and τ would lose
    its units). Any ValueError is raised after TRL has built the model.

    Logged per generation batch through TRL's metrics (``self._metrics[mode]``), from the
    advantages the loss uses: ``adv/failed_positive_frac`` (always 0 for CoRPO: it never
    rewards a failure), ``adv/failed_positive_count``, ``adv/corpo_correctness_regime_frac``,
    ``adv/corpo_preference_regime_frac``, ``adv/mean``, ``adv/abs_mean`` and
    ``groups/uniform_frac`` (definitions: ``labelrl.advantages.diagnostics``; a completion
    without a reward counts there as reward 0).
    """

    def __init__(self, *args: Any, threshold: float, success_threshold: float | None = None, **kwargs: Any):
        for name, value in (("threshold", threshold), ("success_threshold", success_threshold)):
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name}={value}: the CoRPO {name} must be a finite reward value, e.g. 0.5 for 0/1 rewards")
        super().__init__(*args, **kwargs)
        if self.scale_rewards != "none":
            raise ValueError(
                f"scale_rewards={self.scale_rewards!r}: CoRPO's advantage r − max(mean, τ) is not divided by a "
                "std (a group failing uniformly has std 0, so its push-down would become (r − τ)/1e-4); "
                "set GRPOConfig(scale_rewards='none')"
            )
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                f"multi_objective_aggregation={self.multi_objective_aggregation!r}: CoRPO compares the summed "
                "reward with τ in reward units; set GRPOConfig(multi_objective_aggregation='sum_then_normalize')"
            )
        self.threshold = float(threshold)
        self.success_threshold = float(threshold if success_threshold is None else success_threshold)
        self._rewards_per_func: torch.Tensor | None = None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # Keep TRL's rewards [N_all, n_funcs] (gathered over processes) for the advantages below.
        self._rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        return self._rewards_per_func

    def _generate_and_score_completions(self, inputs):
        self._rewards_per_func = None
        output = super()._generate_and_score_completions(inputs)
        assert self._rewards_per_func is not None, "TRL did not call _calculate_rewards"
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        if group_size < 2:  # eval with one completion per prompt: no group, no advantage to replace
            return output
        rewards, scorable = self._summed_rewards(self._rewards_per_func)
        advantages = compute_advantages(rewards, group_size, "corpo", mask=scorable, threshold=self.threshold)
        local = output["advantages"]
        start = self.accelerator.process_index * len(local)
        output["advantages"] = advantages[start : start + len(local)].to(device=local.device, dtype=local.dtype)
        self._replace_logged_advantages(advantages)
        self._log_diagnostics(mode, rewards, advantages, group_size)
        return output

    def _summed_rewards(self, rewards_per_func: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Weighted sum over reward functions ``[N]`` and which rows have any reward ``[N]``."""
        weights = self.reward_weights.to(rewards_per_func.device)
        scorable = ~torch.isnan(rewards_per_func).all(dim=1)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        # Unscorable rows get a finite placeholder; the mask keeps them out of every statistic.
        return torch.where(scorable, rewards, torch.zeros_like(rewards)), scorable

    def _replace_logged_advantages(self, advantages: torch.Tensor) -> None:
        logged = self._logs["advantages"]
        for _ in range(min(len(advantages), len(logged))):
            logged.pop()
        logged.extend(advantages.tolist())

    def _log_diagnostics(self, mode: str, rewards: torch.Tensor, advantages: torch.Tensor, group_size: int) -> None:
        stats = advantage_diagnostics(
            rewards, advantages, group_size, success_threshold=self.success_threshold, corpo_threshold=self.threshold
        )
        for key, value in stats.items():
            self._metrics[mode][key].append(value)


def binary_reward(
    labels: Sequence[str],
    *,
    max_completion_length: int,
    positive: str | None = None,
    truncation: str = "zero",
    eos_token_ids: Sequence[int] | None = None,
    label_column: str = "label",
    **settings: Any,
) -> Callable[..., list[float | None]]:
    """TRL reward function for a two-label task: correct 1, wrong 0, unparseable 0 (format gate).

    ``truncation`` is the policy for completions that reach ``max_completion_length``
    without EOS: ``zero``, ``mask`` or ``soft_penalty`` (``labelrl.rewards.truncation``).
    ``settings`` are further ``RewardConfig`` fields (``correct``, ``incorrect``, ``failure``,
    ``reasoning``, ``cache_tokens``, ...).
    """
    space = LabelSpace(tuple(labels), kind="binary", positive=positive)
    return _reward(space, max_completion_length, truncation, eos_token_ids, label_column, settings)


def ordinal_reward(
    grades: Sequence[str],
    *,
    max_completion_length: int,
    truncation: str = "zero",
    eos_token_ids: Sequence[int] | None = None,
    label_column: str = "label",
    **settings: Any,
) -> Callable[..., list[float | None]]:
    """TRL reward function for ordered grades (lowest first): partial credit by distance.

    The exact grade earns ``correct`` (1), the farthest ``incorrect`` (0), others in between
    (``labelrl.rewards.grade``); arguments as in ``binary_reward``.
    """
    space = LabelSpace(tuple(grades), kind="ordinal")
    return _reward(space, max_completion_length, truncation, eos_token_ids, label_column, settings)


def _reward(space, cap, truncation, eos_token_ids, label_column, settings) -> Callable[..., list[float | None]]:
    config = RewardConfig(labels=space, truncation=truncation, max_new_tokens=cap, **settings)
    return trl_reward_func(config, label_column, max_completion_length=cap, eos_token_ids=eos_token_ids)


def format_reward(
    labels: Sequence[str], *, reasoning: bool = False, value: float = 1.0
) -> Callable[..., list[float]]:
    """TRL reward function: ``value`` when the completion parses (strict) to a declared label, else 0.

    The correctness rewards above already gate on format; this one is for a separate,
    weighted format term (``GRPOConfig(reward_weights=[...])``).
    """
    names = tuple(labels)

    def format_gate(prompts=None, completions=None, **columns) -> list[float]:
        parses = [parse_answer(completion_text(c), reasoning=reasoning, labels=names) for c in completions or []]
        return [value if p.ok else 0.0 for p in parses]

    return format_gate

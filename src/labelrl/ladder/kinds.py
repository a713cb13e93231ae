"""The ladder's arm vocabulary: every arm type, the family each belongs to, and runs by arm.

``FAMILY`` maps an arm type to the command that trains it (``sft``, ``rl``, ``distill``) or to
what the ladder does instead (``threshold``, ``relabel``); ``RL_TYPES`` are the types trained by
RL. ``groups`` gathers a task's runs under their arm (replicates ``ARM@sSEED`` under the arm they
replicate), as ladder.json records them.

This module imports nothing, so the recipe, the arms, every analysis and the report (which reads
ladder.json without importing the rest of the ladder) share one definition.
"""

from __future__ import annotations

ARM_TYPES = ("sft", "rl", "random_reward", "distill", "cot_sft", "cot_rl", "control", "threshold", "relabel")
FAMILY = {"sft": "sft", "control": "sft", "cot_sft": "sft", "rl": "rl", "random_reward": "rl", "cot_rl": "rl",
          "distill": "distill", "threshold": "threshold", "relabel": "relabel"}
RL_TYPES = tuple(t for t, family in FAMILY.items() if family == "rl")  # rl, random_reward, cot_rl


def groups(arms: dict[str, dict]) -> dict[str, list[str]]:
    """Runs by arm (replicates under the arm they replicate), in run order."""
    out: dict[str, list[str]] = {}
    for name, st in arms.items():
        out.setdefault(st.get("replicate_of") or name, []).append(name)
    return out

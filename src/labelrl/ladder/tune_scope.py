"""Where an arm's tune grid is set, and which arms of a task tune: read with the recipe.

A grid may be set on an arm or in a ``defaults`` section (the recipe's or a task's, ``sft`` or
``rl``), so every arm of a family gets the same budget. The most specific one wins whole: the
arm's own ``tune``, else its task's ``defaults.FAMILY.tune``, else the recipe's; ``tune: {}``
turns tuning off for one arm. Only arms that train a model can tune (sft, control, cot_sft and
the RL arms). ``labelrl.ladder.tune_grid`` checks the grid's keys and values against the arm's
resolved config.
"""

from __future__ import annotations

from typing import Any

from labelrl.ladder.kinds import FAMILY
from labelrl.ladder.spec import TaskSpec

TUNABLE = ("sft", "rl")  # families whose arms train a model that val can choose between
EXAMPLE = "tune: {learning_rate: [1.0e-5, 5.0e-5]}"


def check_tune(tune: Any, where: str) -> dict[str, list] | None:
    """``tune`` as written: None when absent, else a mapping of field name → a non-empty list."""
    if tune is None:
        return None
    if not isinstance(tune, dict):
        raise ValueError(f"{where}: {tune!r} is not a mapping; write {EXAMPLE} (a config field → the values to try)")
    for key, values in tune.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"{where}.{key}: {values!r}: give a list of at least one value to try, e.g. {key}: [A, B]")
    return tune


def _refuse_family(family: str, where: str) -> None:
    if family not in TUNABLE:
        raise ValueError(f"{where}: a {family} arm trains no model to choose on val (sft, control, cot_sft and the RL "
                         "arms can tune); drop tune")


def resolve_tune(defaults: dict, task_name: str, task: TaskSpec, arm_name: str) -> tuple[str, dict] | None:
    """(where it was set, the grid as written) of an arm or run (module docstring); None without
    a grid, for ``tune: {}``, and for a replicate run ``tuned_by`` its first seed's run."""
    arm = task.arms[arm_name]
    if arm.tuned_by is not None:
        return None
    family = FAMILY[arm.type]
    scopes = ((f"tasks.{task_name}.arms.{arm.replicate_of or arm_name}.tune", arm.tune),
              (f"tasks.{task_name}.defaults.{family}.tune", (task.defaults.get(family) or {}).get("tune")),
              (f"defaults.{family}.tune", (defaults.get(family) or {}).get("tune")))
    for where, tune in scopes:
        if check_tune(tune, where) is not None:
            if not tune:
                return None
            _refuse_family(family, where)
            return where, tune
    return None


def tuned_arms(defaults: dict, task_name: str, task: TaskSpec) -> set[str]:
    """The declared arms of ``task`` that tune, after checking every ``tune`` of the recipe's and
    the task's defaults and of the arms."""
    for scope, sections in (("defaults", defaults), (f"tasks.{task_name}.defaults", task.defaults)):
        for family, section in sections.items():
            tune = check_tune((section or {}).get("tune"), f"{scope}.{family}.tune")
            if tune:
                _refuse_family(family, f"{scope}.{family}.tune")
    return {name for name in task.arms if resolve_tune(defaults, task_name, task, name) is not None}

"""The experiment ladder: recipes of arms (SFT, RL presets, distillation, controls) run in
dependency order on shared splits, each final model scored once on the holdout.

The public names are imported on first use, so that reading the arm vocabulary
(``labelrl.ladder.kinds``, which the report uses) does not import the recipe and the runner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from labelrl.lazy import lazy_exports

if TYPE_CHECKING:
    from labelrl.ladder.kinds import ARM_TYPES
    from labelrl.ladder.recipe import Recipe, load_recipe, run_order
    from labelrl.ladder.run import Ladder, read_state

_WHERE = {"ARM_TYPES": "kinds", "Recipe": "recipe", "load_recipe": "recipe", "run_order": "recipe", "Ladder": "run",
          "read_state": "run"}
__all__ = sorted(_WHERE)

__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())

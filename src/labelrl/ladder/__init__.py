"""The experiment ladder: recipes of arms (SFT, RL presets, distillation, controls) run in
dependency order on shared splits, each final model scored once on the holdout."""

from labelrl.ladder.recipe import ARM_TYPES, Recipe, load_recipe, run_order
from labelrl.ladder.run import Ladder, read_state

__all__ = ["ARM_TYPES", "Ladder", "Recipe", "load_recipe", "read_state", "run_order"]

"""Ladder recipes: versioned YAML naming the tasks (datasets) and the arms run on each.

A recipe is read, overlaid (``--fast`` applies its ``fast:`` section, ``--set a.b=v`` single
values), validated, and turned into one resolved config per arm (``SFTConfig``, ``RLConfig`` or
``DistillConfig``) before anything runs, so a typo in the last arm fails in the first second.

    version: 1
    name: demo
    model: smollm2-135m-instruct
    defaults: {sft: {...}, rl: {...}, distill: {...}}   # every task's arms of that family
    tasks:
      spam:
        data: sms-spam
        limit: 400                 # training items
        defaults: {rl: {...}}      # this task's arms of that family
        arms:
          sft:   {type: sft, max_steps: 48}
          grpo:  {type: rl, from: sft, preset: grpo}
          noise: {type: random_reward, from: sft}

Arm keys other than ``type``, ``from`` and ``teacher`` are options of the arm's command
(``labelrl sft|rl|distill --help``, docs/config.md).
"""

from __future__ import annotations

import copy
import importlib.resources
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

RECIPE_FORMAT = 1
ARM_TYPES = ("sft", "rl", "random_reward", "distill", "cot_sft", "cot_rl", "control")
# What each arm type starts from (its ``from``): None = nothing; a tuple = allowed parent types.
PARENT_TYPES: dict[str, tuple[str, ...] | None] = {
    "sft": None,
    "distill": None,
    "rl": ("sft", "control", "cot_sft"),
    "random_reward": ("sft", "control", "cot_sft"),
    "cot_sft": ("distill",),
    "control": ("distill",),
    "cot_rl": ("cot_sft",),
}
FAMILY = {"sft": "sft", "control": "sft", "cot_sft": "sft", "rl": "rl", "random_reward": "rl", "cot_rl": "rl",
          "distill": "distill"}
# Names an arm may not take: they are files or folders of the task directory.
RESERVED = {"eval", "analysis", "ood", "splits.json", "ledger.jsonl", "audit.json"}
DATA_KEYS = ("data", "text_col", "label_col", "labels", "kind", "on_bad_row", "limit", "split_seed", "rubric")


class ArmSpec(BaseModel):
    """One arm: its type, what it starts from, and options of its command."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    type: Literal["sft", "rl", "random_reward", "distill", "cot_sft", "cot_rl", "control"]
    from_: Optional[str] = Field(None, alias="from")
    teacher: Optional[str] = None

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
    limit: Optional[int] = Field(None, ge=1)
    split_seed: int = 0
    rubric: Optional[Path] = None
    audit: bool = True
    eval_limit: Optional[int] = Field(None, ge=1, description="Val items scored per arm (all when empty).")
    holdout_limit: Optional[int] = Field(None, ge=1, description="Holdout items scored per arm (all when empty).")
    ood: list[str] = Field(default_factory=list, description="Other datasets each arm is also scored on (their holdout split).")
    positive_label: Optional[str] = None
    n_boot: int = Field(1000, ge=0)
    defaults: dict[str, dict[str, Any]] = Field(default_factory=dict)
    arms: dict[str, ArmSpec]

    def data_options(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in DATA_KEYS if getattr(self, k) is not None}


class Recipe(BaseModel):
    """A whole ladder: tasks, arms, shared defaults."""

    model_config = ConfigDict(extra="forbid")

    version: int = RECIPE_FORMAT
    name: str
    description: str = ""
    model: str = "smollm2-135m-instruct"
    seed: int = 0
    precision: Literal["auto", "fp32", "bf16"] = Field("auto", description="Compute precision of every arm and evaluation (an arm may set its own).")
    defaults: dict[str, dict[str, Any]] = Field(default_factory=dict)
    fast: dict[str, Any] = Field(default_factory=dict, description="Overlay applied by --fast.")
    tasks: dict[str, TaskSpec]

    @model_validator(mode="after")
    def _check(self) -> "Recipe":
        if self.version != RECIPE_FORMAT:
            raise ValueError(f"version: {self.version}: this labelrl reads recipe format {RECIPE_FORMAT}; update the recipe")
        for scope, defaults in [("defaults", self.defaults)] + [(f"tasks.{t}.defaults", s.defaults) for t, s in self.tasks.items()]:
            unknown = sorted(set(defaults) - {"sft", "rl", "distill"})
            if unknown:
                raise ValueError(f"{scope}: unknown section(s) {unknown}; use sft, rl or distill")
        for task_name, task in self.tasks.items():
            _check_arms(task_name, task)
        return self


def _check_arms(task_name: str, task: TaskSpec) -> None:
    if not task.arms:
        raise ValueError(f"tasks.{task_name}.arms: empty; name at least one arm (e.g. sft: {{type: sft}})")
    for name, arm in task.arms.items():
        where = f"tasks.{task_name}.arms.{name}"
        if name in RESERVED or "/" in name or name.startswith("."):
            raise ValueError(f"{where}: {name!r} is not a usable arm name (reserved or a path); rename the arm")
        parents = PARENT_TYPES[arm.type]
        if parents is None:
            if arm.from_ is not None and arm.type != "distill":
                raise ValueError(f"{where}: a {arm.type} arm starts from the recipe's model; drop `from: {arm.from_}`")
            continue
        if arm.from_ is None:
            raise ValueError(f"{where}: a {arm.type} arm needs `from:` naming a {' or '.join(parents)} arm")
        parent = task.arms.get(arm.from_)
        if parent is None:
            raise ValueError(f"{where}: from: {arm.from_!r} is not an arm of task {task_name!r} (arms: {', '.join(task.arms)})")
        if parent.type not in parents:
            raise ValueError(f"{where}: from: {arm.from_!r} is a {parent.type} arm; a {arm.type} arm starts from a {' or '.join(parents)} arm")
    for name, arm in task.arms.items():
        if arm.type == "distill" and arm.teacher is None and arm.from_ is None:
            raise ValueError(f"tasks.{task_name}.arms.{name}: a distill arm needs `teacher:` (a model or endpoint URL) or `from:` an arm whose model teaches")


def dependencies(task: TaskSpec, arm_name: str) -> list[str]:
    """The arms this arm needs finished first: its ``from``, and a distill arm's teacher arm."""
    arm = task.arms[arm_name]
    deps = [arm.from_] if arm.from_ else []
    if arm.type == "distill" and arm.teacher in task.arms:
        deps.append(arm.teacher)
    return deps


def run_order(task: TaskSpec) -> list[str]:
    """Arms in dependency order (recipe order among independent arms); a cycle is an error."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, path: tuple[str, ...]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            raise ValueError(f"arms {' → '.join(path + (name,))}: the arms depend on each other in a cycle; break it")
        state[name] = "visiting"
        for dep in dependencies(task, name):
            visit(dep, path + (name,))
        state[name] = "done"
        order.append(name)

    for name in task.arms:
        visit(name, ())
    return order


def deep_merge(base: dict, overlay: dict) -> dict:
    """``overlay`` merged into a copy of ``base``: mappings merge key by key, other values replace."""
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_set(raw: dict, assignment: str) -> dict:
    """``--set tasks.spam.limit=2000``: one value (parsed as YAML) at a dotted path."""
    path, sep, text = assignment.partition("=")
    if not sep or not path.strip():
        raise ValueError(f"--set {assignment!r}: write KEY.PATH=VALUE, e.g. --set tasks.spam.limit=2000")
    value = yaml.safe_load(text)
    overlay: dict = {}
    node = overlay
    keys = [k.strip() for k in path.split(".")]
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return deep_merge(raw, overlay)


BUILTIN_RECIPES = ("demo", "gpu")


def recipe_text(source: str | Path) -> tuple[str, str, Path]:
    """(YAML text, where it came from, the directory relative paths in it start from) for a
    file path or a built-in recipe name."""
    path = Path(source)
    if path.is_file():
        return path.read_text(encoding="utf-8"), str(path), path.parent
    if str(source) in BUILTIN_RECIPES:
        folder = Path(str(importlib.resources.files("labelrl.recipes")))
        return (folder / f"{source}.yaml").read_text(encoding="utf-8"), f"built-in recipe {source!r}", folder
    raise ValueError(f"recipe {str(source)!r}: no such file and not a built-in recipe ({', '.join(BUILTIN_RECIPES)}); "
                     "give the path of a recipe YAML")


def load_recipe(source: str | Path, *, fast: bool = False, sets: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Read, overlay and validate a recipe; errors name the key and the fix."""
    text, where, folder = recipe_text(source)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{where}: not valid YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: a recipe is a YAML mapping with at least `name:` and `tasks:`")
    if fast:
        if not raw.get("fast"):
            raise ValueError(f"{where}: --fast needs a `fast:` section in the recipe (the overlay for a smoke run)")
        raw = deep_merge(raw, raw["fast"])
    for assignment in sets:
        raw = apply_set(raw, assignment)
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{where}: {loc}: {first['msg'].removeprefix('Value error, ')}") from None
    for task in recipe.tasks.values():  # a rubric path is relative to the recipe, not to where it is run
        if task.rubric is not None and not task.rubric.is_absolute():
            task.rubric = (folder / task.rubric).resolve()
    return recipe

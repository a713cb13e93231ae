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

Arm keys other than ``type``, ``from``, ``teacher``, ``seeds``, ``tune`` and ``labels_from`` (train
on a relabel arm's labels) are options of the arm's command (``labelrl sft|rl|distill --help``,
docs/config.md). The arm types and their families are ``labelrl.ladder.kinds``; one task and its
arms, field by field, ``labelrl.ladder.spec``; where a tune grid may be set, ``labelrl.ladder.tune_scope``.
"""

from __future__ import annotations

import copy
import importlib.resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from labelrl.ladder.kinds import FAMILY
from labelrl.ladder.spec import ArmSpec, TaskSpec
from labelrl.ladder.tune_scope import tuned_arms

RECIPE_FORMAT = 1
# What each arm type starts from (its ``from``): None = nothing; a tuple = allowed parent types.
PARENT_TYPES: dict[str, tuple[str, ...] | None] = {
    "sft": None,
    "distill": None,
    "rl": ("sft", "control", "cot_sft"),
    "random_reward": ("sft", "control", "cot_sft"),
    "cot_sft": ("distill",),
    "control": ("distill",),
    "cot_rl": ("cot_sft",),
    "threshold": ("sft", "control"),
    "relabel": None,
}
# Names an arm may not take: they are files or folders of the task directory.
RESERVED = {"eval", "analysis", "ood", "samples", "splits.json", "ledger.jsonl", "audit.json", "label_noise.json"}
# Arm types that train on the task's labels, so may take them from a relabel arm (``labels_from``).
LABELS_FROM_TYPES = ("sft", "control", "rl", "cot_rl")
# Replicate runs are named ARM@sSEED.
REPLICATE_MARK = "@s"


class Recipe(BaseModel):
    """A whole ladder: tasks, arms, shared defaults."""

    model_config = ConfigDict(extra="forbid")

    version: int = RECIPE_FORMAT
    name: str
    description: str = ""
    model: str = "smollm2-135m-instruct"
    seed: int = 0
    precision: Literal["auto", "fp32", "bf16"] = Field("auto", description="Compute precision of every arm and evaluation (an arm may set its own).")
    workers: int = Field(1, ge=1, description="Training runs side by side, each in its own process with cores/workers threads: tuning candidates, and replicate seeds once their parent is done (labelrl.ladder.side_by_side). 1: every run in the ladder's process. Each worker holds its own model and optimizer, so set it only where that many runs fit in memory.")
    defaults: dict[str, dict[str, Any]] = Field(default_factory=dict)
    fast: dict[str, Any] = Field(default_factory=dict, description="Overlay applied by --fast.")
    tasks: dict[str, TaskSpec]
    _declared_arms: dict[str, dict[str, ArmSpec]] = PrivateAttr(default_factory=dict)

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
            self._declared_arms[task_name] = dict(task.arms)
            task.arms = expand_replicates(task_name, task, tuned=tuned_arms(self.defaults, task_name, task))
        return self

    def as_written(self) -> dict:
        """The recipe as declared (replicates not expanded, no ``fast`` overlay section), with
        rubric paths resolved: what a ladder run saves as ``recipe.yaml`` and can be run again."""
        out = self.model_dump(mode="json", by_alias=True, exclude={"fast"}, exclude_none=True)
        for task_name, arms in self._declared_arms.items():
            out["tasks"][task_name]["arms"] = {name: arm.model_dump(mode="json", by_alias=True, exclude_none=True)
                                               for name, arm in arms.items()}
        return out


def _check_arms(task_name: str, task: TaskSpec) -> None:
    if not task.arms:
        raise ValueError(f"tasks.{task_name}.arms: empty; name at least one arm (e.g. sft: {{type: sft}})")
    for name, arm in task.arms.items():
        where = f"tasks.{task_name}.arms.{name}"
        if name in RESERVED or "/" in name or name.startswith("."):
            raise ValueError(f"{where}: {name!r} is not a usable arm name (reserved or a path); rename the arm")
        if REPLICATE_MARK in name and arm.replicate_of is None:
            raise ValueError(f"{where}: {REPLICATE_MARK!r} marks replicate runs (ARM@sSEED); rename the arm, and use "
                             "`seeds: [...]` for replicates")
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
        if arm.labels_from is not None:
            _check_labels_from(f"tasks.{task_name}.arms.{name}", task, arm)
        if arm.type == "distill" and arm.teacher is None and arm.from_ is None:
            raise ValueError(f"tasks.{task_name}.arms.{name}: a distill arm needs `teacher:` (a model or endpoint URL) or `from:` an arm whose model teaches")


def _check_labels_from(where: str, task: TaskSpec, arm: ArmSpec) -> None:
    source = task.arms.get(arm.labels_from)
    if arm.type not in LABELS_FROM_TYPES:
        raise ValueError(f"{where}: labels_from: a {arm.type} arm does not train on the task's labels; use it on a "
                         f"{', '.join(LABELS_FROM_TYPES)} arm")
    if source is None or source.type != "relabel":
        found = f"a {source.type} arm" if source else "not an arm of the task"
        relabels = [n for n, a in task.arms.items() if a.type == "relabel"]
        raise ValueError(f"{where}: labels_from: {arm.labels_from!r} is {found}; name a relabel arm of the task "
                         f"({', '.join(relabels) or 'none yet: add one, e.g. relabel: {type: relabel, judge: ...}'})")
    if task.label_noise > 0:
        raise ValueError(f"{where}: labels_from: {arm.labels_from!r} with label_noise={task.label_noise}: flipped labels "
                         "and another answer key are two controls; run them in separate tasks")


def _runs(name: str, arm: ArmSpec, seeds: list[int] | None) -> list[tuple[str, int | None]]:
    if not seeds:
        return [(name, None)]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{name}: seeds {seeds} repeat a seed; give each replicate its own")
    return [(name, seeds[0])] if len(seeds) == 1 else [(f"{name}{REPLICATE_MARK}{s}", s) for s in seeds]


def run_label(name: str, kind: str | None, replicate_of: str | None = None) -> str:
    """A run's name where tables and legends show it, with its ``kind`` (preset or type) where the
    name does not say it: ``grpo``, ``grpo@s1`` (a replicate of ``grpo``), ``arm2 (corpo)``."""
    return name if not kind or kind in (name, replicate_of) else f"{name} ({kind})"


def expand_replicates(task_name: str, task: TaskSpec, tuned: set[str] | frozenset[str] = frozenset()) -> dict[str, ArmSpec]:
    """The task's arms as concrete runs: an arm with several seeds (its own ``seeds``, else the
    task's; never a distill arm) becomes one run per seed, ``ARM@sSEED``, each with that
    ``seed``. A run's parent is its parent arm's run of the same seed when the parent is
    replicated, else the parent's single run; a threshold arm follows its parent's seeds.
    The runs of an arm in ``tuned`` after the first are ``tuned_by`` the first (only it tunes).
    Runs are listed in the recipe's arm order."""
    runs: dict[str, list[tuple[str, int | None]]] = {}
    specs: dict[str, list[ArmSpec]] = {}
    for name in run_order(task):  # parents before children
        arm, where = task.arms[name], f"tasks.{task_name}.arms.{name}"
        if arm.replicate_of is not None:  # already concrete (a recipe written by a ladder run)
            runs[name], specs[name] = [(name, arm.options().get("seed"))], [arm]
            continue
        if arm.type in ("distill", "relabel") and arm.seeds:
            raise ValueError(f"{where}: a {arm.type} arm runs once (its model samples with its own seeds); drop `seeds`")
        if arm.type == "distill" and arm.teacher in runs and len(runs[arm.teacher]) > 1:
            raise ValueError(f"{where}: its teacher {arm.teacher!r} runs once per seed; name one run (e.g. "
                             f"{runs[arm.teacher][0][0]!r}) as the teacher")
        seeds = arm.seeds if arm.seeds is not None else (task.seeds if arm.type not in ("distill", "relabel") else None)
        parent = runs.get(arm.from_) if arm.from_ else None
        if arm.type == "threshold":
            seeds = [s for _, s in parent] if parent and len(parent) > 1 else None
        runs[name] = _runs(name, arm, seeds)
        specs[name] = []
        first_run, first_seed = runs[name][0]
        for _, seed in runs[name]:
            extra = dict(arm.options()) | ({"seed": seed} if seed is not None and arm.type != "threshold" else {})
            fields = {"type": arm.type, "from": _parent_run(where, arm, parent, seed), "teacher": arm.teacher,
                      "replicate_of": name if len(runs[name]) > 1 else None, "tune": arm.tune, "labels_from": arm.labels_from,
                      "tuned_by": first_run if name in tuned and seed != first_seed else None}
            specs[name].append(ArmSpec.model_validate(fields | extra))
    return {run: spec for name in task.arms for (run, _), spec in zip(runs[name], specs[name])}


def _parent_run(where: str, arm: ArmSpec, parent: list[tuple[str, int | None]] | None, seed: int | None) -> str | None:
    if arm.from_ is None or parent is None:
        return arm.from_
    if len(parent) == 1:
        return parent[0][0]
    match = [run for run, s in parent if s == seed]
    if not match:
        seeds = ", ".join(str(s) for _, s in parent)
        raise ValueError(f"{where}: its parent {arm.from_!r} runs once per seed ({seeds}); give this arm seeds from that "
                         "list (each replicate starts from the parent's run of the same seed)")
    return match[0]


def requires(task: TaskSpec, arm_name: str) -> list[str]:
    """The arms this arm cannot run without: its ``from``, the run whose tuning it follows
    (``tuned_by``), a distill arm's teacher arm, and the relabel arm whose labels it trains on."""
    arm = task.arms[arm_name]
    deps = [arm.from_] if arm.from_ else []
    if arm.labels_from:
        deps.append(arm.labels_from)
    if arm.tuned_by:  # a replicate trains with the values its first seed's run chose on val
        deps.append(arm.tuned_by)
    if arm.type == "distill" and arm.teacher in task.arms:
        deps.append(arm.teacher)
    return deps


def dependencies(task: TaskSpec, arm_name: str) -> list[str]:
    """The arms to finish first: what it ``requires``; for a threshold arm every RL arm started
    from the same parent (their val recall picks the recall-matched thresholds; one that failed
    only drops its own matched threshold); for a distill arm the task's first direct SFT arm
    (its scores on the training items band the traces' survival by difficulty)."""
    deps = requires(task, arm_name)
    arm = task.arms[arm_name]
    if arm.type == "threshold":
        deps += [n for n, other in task.arms.items() if FAMILY[other.type] == "rl" and other.from_ == arm.from_]
    if arm.type == "distill" and task.score_train is not False:  # the SFT model's train scores band its survival
        deps += [n for n, other in task.arms.items() if other.type == "sft"][:1]
    if arm.type != "relabel":  # a relabel arm named as an answer key is scored against by every evaluation
        deps += [n for n in task.eval_label_cols if n in task.arms and task.arms[n].type == "relabel"]
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


BUILTIN_RECIPES = ("demo", "gpu", "noise", "reasoning")


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
    return recipe_from_dict(raw, where, folder, fast=fast, sets=sets)


def recipe_from_dict(raw, where: str, folder: Path, *, fast: bool = False, sets: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Overlay (``fast:``, ``--set``) and validate a recipe already read; relative rubric paths
    start from ``folder``."""
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

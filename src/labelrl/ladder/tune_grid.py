"""The grid of a tuned arm: which config values it tries, checked before anything runs.

``tune`` maps fields of an arm's config to the values to try, e.g.
``tune: {learning_rate: [2.0e-6, 1.0e-5, 5.0e-5]}``. The candidates are every combination of the
listed values, in the order listed (the first key varies slowest); ``labelrl.ladder.tune``
trains them and keeps the best on val.

Where a grid may be set, and which arms tune, is ``labelrl.ladder.tune_scope`` (read with the
recipe). Here the grid is checked against the arm's resolved config: only training options may
vary, not the seed (replicates are ``seeds:``), the task's data and samples (the same for every
arm) or a key the ladder wires.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from labelrl.data.options import DataOptions
from labelrl.ladder.arms import WIRED
from labelrl.ladder.kinds import FAMILY
from labelrl.ladder.recipe import Recipe
from labelrl.ladder.tune_scope import EXAMPLE, resolve_tune


@dataclass(frozen=True)
class Grid:
    """A run's checked grid."""

    where: str  # the recipe key it was set at, e.g. defaults.rl.tune
    grid: dict[str, list]  # field → values as the config reads them (JSON values: 1e-5 written as text is the number)
    candidates: list[dict]  # every combination, in order; ties between candidates go to the first


def with_values(cfg: BaseModel, values: dict, out: Path | None = None) -> BaseModel:
    """``cfg`` with ``values`` (and ``out``) set, validated as the config validates its fields; a
    field ``cfg`` resolved from others (``RLConfig.without_resolved``: e.g. the scale of its preset)
    is resolved again from the new values."""
    fields = cfg.without_resolved() if hasattr(cfg, "without_resolved") else cfg.model_dump()
    return type(cfg).model_validate(fields | values | ({"out": out} if out is not None else {}))


def _why_fixed(key: str, family: str) -> str | None:
    if key == "seed":
        return "the seed is not chosen on val; give replicates with `seeds: [...]`"
    if key in DataOptions.model_fields:
        return "the task's data, samples and answer mode are the same for every candidate"
    if key in WIRED[family]:
        return "set by the ladder from the arm's place in the recipe"
    return None


def _read(cfg: BaseModel, values: dict, where: str) -> BaseModel:
    try:
        return with_values(cfg, values)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"{where}: {first['msg']}; fix or drop the value") from None


def arm_grid(recipe: Recipe, task_name: str, arm_name: str, cfg: BaseModel) -> Grid | None:
    """The run's grid checked against its resolved config ``cfg``: every key a field of it that a
    grid may vary, every value and every combination a valid config, no value listed twice.
    None when the run does not tune."""
    task = recipe.tasks[task_name]
    found = resolve_tune(recipe.defaults, task_name, task, arm_name)
    if found is None:
        return None
    where, tune = found
    arm_type = task.arms[arm_name].type
    family = FAMILY[arm_type]
    read: dict[str, list] = {}
    for key, values in tune.items():
        if key not in type(cfg).model_fields:
            raise ValueError(f"{where}.{key}: not an option of a {arm_type} arm; tune options of "
                             f"`labelrl {family} --help`, e.g. {EXAMPLE}")
        why = _why_fixed(key, family)
        if why:
            raise ValueError(f"{where}.{key}: {why}; tune a training option such as learning_rate")
        read[key] = [_read(cfg, {key: v}, f"{where}.{key}: {v!r}").model_dump(mode="json")[key] for v in values]
        twice = sorted({str(v) for v in read[key] if read[key].count(v) > 1})
        if twice:
            raise ValueError(f"{where}.{key}: {', '.join(twice)} listed twice (as the config reads them); each value "
                             "is one candidate model: list it once")
    candidates = [dict(zip(read, combo)) for combo in itertools.product(*read.values())]
    for values in candidates:  # cross-field rules hold for every combination
        _read(cfg, values, f"{where}: the combination {values}")
    return Grid(where, read, candidates)


_ABSENT = object()  # a key one side lacks compares unequal to any value, None included


def config_changes(cfg: BaseModel, grid: Grid | None, old: dict, *, old_run_dir: str | Path | None = None,
                   run_dir: str | Path | None = None) -> list[str]:
    """What differs between a finished run's recorded grid and config (``old``, its ladder.json
    entry) and what the recipe now gives (the same grid, and ``cfg`` with the values it trained
    with): ``["train_sample: stratified → balanced", …]``, empty when nothing does.

    A run directory may be moved (copied elsewhere and re-run there): every string of the old
    config that is a path under ``old_run_dir`` (the state's recorded ``run_dir``) is compared
    relative to it, and every one of the new config under ``run_dir`` relative to that, so a
    finished run is recognised by what it computed, not where. Paths outside the run directory
    (the dataset, a model from the hub cache) must be the same strings.

    An option the recorded config lacks (added to labelrl after the run finished) matches when
    the recipe leaves it at its default: a new option's default is what labelrl did before it
    existed. Set to anything else, it is a changed config."""
    tune = old.get("tune") or {}
    if (grid.grid if grid is not None else None) != tune.get("grid"):
        return [f"tune: {tune.get('grid')} → {grid.grid if grid is not None else None}"]
    expected = (with_values(cfg, tune["chosen"]) if tune.get("chosen") else cfg).model_dump(mode="json")
    recorded = old.get("config") or {}
    fields = type(cfg).model_fields
    expected = relative_to_run({k: v for k, v in expected.items()
                                if k in recorded or k not in fields or v != fields[k].get_default(call_default_factory=True)},
                               run_dir)
    recorded = relative_to_run(recorded, old_run_dir)
    return [f"{k}: {recorded.get(k, '(not recorded)')} → {expected.get(k, '(none)')}"
            for k in sorted(set(recorded) | set(expected)) if recorded.get(k, _ABSENT) != expected.get(k, _ABSENT)]


RUN_DIR_MARK = "<run_dir>"  # a path under the run directory compares as <run_dir>/toy/sft/model


def relative_to_run(value: Any, run_dir: str | Path | None) -> Any:
    """``value`` (JSON: dicts, lists, strings, numbers) with every string that is an absolute
    path under ``run_dir`` (or ``run_dir`` itself) written ``<run_dir>/RELATIVE`` (POSIX
    separators); everything else unchanged. ``run_dir`` None: ``value`` unchanged."""
    if run_dir is None:
        return value
    if isinstance(value, dict):
        return {k: relative_to_run(v, run_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [relative_to_run(v, run_dir) for v in value]
    if isinstance(value, str) and Path(value).is_absolute() and Path(value).is_relative_to(run_dir):
        rel = Path(value).relative_to(run_dir).as_posix()
        return RUN_DIR_MARK if rel == "." else f"{RUN_DIR_MARK}/{rel}"
    return value


def moved_to_run(value: Any, old_run_dir: str | Path, run_dir: str | Path) -> Any:
    """``value`` with every path under ``old_run_dir`` moved to the same place under ``run_dir``:
    a moved run's finished entries then name their files where they now are."""
    if isinstance(value, dict):
        return {k: moved_to_run(v, old_run_dir, run_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [moved_to_run(v, old_run_dir, run_dir) for v in value]
    if isinstance(value, str) and Path(value).is_absolute() and Path(value).is_relative_to(old_run_dir):
        return str(Path(run_dir) / Path(value).relative_to(old_run_dir))
    return value

"""The one grader: the reward of an answer against its reference label.

Rewards and evaluation both call ``grade``, so the number a run optimises and the number it
reports cannot disagree. A ``RewardScale`` fixes every reward the grader can return as a
K×K table ``reward[ref][pred]`` plus a failure reward per reference label (for an answer
that did not parse):

* binary / categorical: ``correct`` on the diagonal, ``incorrect`` elsewhere;
* ordinal: linear partial credit, the standard linear-distance score
  ``incorrect + (correct − incorrect) · (1 − |pred − ref| / (K − 1))``, which is
  ``1 − |pred − ref| / (K − 1)`` with the default 1/0 values (K = 5, pred 2, ref 4 → 0.5);
* ``per_class[ref]`` overrides ``correct`` and/or ``incorrect`` for items whose reference is
  ``ref`` (so a missed positive can cost more than a false alarm);
* ``table[ref][pred]`` replaces all of the above with the user's own K×K values (any kind).

The failure reward defaults to the incorrect value of the reference's class (``incorrect``,
or its ``per_class`` override; with a ``table``, the lowest entry of the reference's row).
Each of these is at most the lowest reward a parsed answer can earn for that reference, so
breaking the answer format never pays better than answering.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from labelrl.types import LabelKind, LabelSpace

# is_correct compares floats computed two ways (0.75 from the table vs a typed 0.75).
_TOLERANCE = 1e-9


class ClassReward(BaseModel):
    """Per-class overrides of the correct / incorrect rewards (keyed by the reference label)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    correct: Optional[float] = Field(None, description="Reward of a correct answer when the reference is this class.")
    incorrect: Optional[float] = Field(None, description="Reward of a wrong answer when the reference is this class (ordinal: the farthest grade).")


def parse_class_rewards(text: str) -> dict[str, ClassReward]:
    """``"spam=2,ham=1/-0.5"`` → per reference label, the reward of a correct answer and
    (after ``/``) of a wrong one: steering precision against recall through the reward alone."""
    out: dict[str, ClassReward] = {}
    for part in (p.strip() for p in str(text).split(",") if p.strip()):
        label, sep, values = part.partition("=")
        try:
            if not sep or not label.strip():
                raise ValueError
            correct, _, incorrect = values.partition("/")
            out[label.strip()] = ClassReward(correct=float(correct), incorrect=float(incorrect) if incorrect else None)
        except ValueError:
            raise ValueError(f"--class-reward {part!r}: write LABEL=CORRECT or LABEL=CORRECT/INCORRECT, comma-separated, "
                             "e.g. spam=2,ham=1/-0.5") from None
    return out


def _label_loader():
    """YAML's safe loader without YAML 1.1 booleans: labels such as yes/no/on/off stay text
    (``{yes: 1.0}`` would otherwise name the label True)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return Loader


def read_reward_table(path) -> dict[str, dict[str, float]]:
    """A K×K reward table ``table[reference][prediction]`` from a YAML or JSON file."""
    import yaml
    from pathlib import Path

    _LabelLoader = _label_loader()
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--reward-table {path}: no such file; write a YAML mapping reference → prediction → reward")
    table = yaml.load(path.read_text(encoding="utf-8"), Loader=_LabelLoader)
    if not isinstance(table, dict) or not all(isinstance(row, dict) for row in table.values()):
        raise ValueError(f"--reward-table {path}: expected a mapping of reference label → {{prediction label: reward}}")
    return {str(ref): {str(p): float(r) for p, r in row.items()} for ref, row in table.items()}


class RewardScale(BaseModel):
    """Every reward the grader can return, validated once."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    labels: LabelSpace = Field(description="The declared labels; their kind (binary, categorical, ordinal) picks the formula.")
    correct: float = Field(1.0, description="Reward of a correct answer (ordinal: of the exact grade).")
    incorrect: float = Field(0.0, description="Reward of a wrong answer (ordinal: of the farthest grade).")
    failure: Optional[float] = Field(None, description="Reward of an unparseable answer; defaults to the reference class's incorrect value (with a table: the row's lowest entry).")
    per_class: Optional[dict[str, ClassReward]] = Field(None, description="Per reference label: {'correct': x, 'incorrect': y} overrides.")
    table: Optional[dict[str, dict[str, float]]] = Field(None, description="Full K×K table table[ref][pred] of rewards; replaces correct/incorrect/per_class.")
    success_threshold: Optional[float] = Field(None, description="Ordinal only: the lowest reward that counts as a success (default: the exact-grade reward).")

    _rewards: dict[tuple[str, str], float] = PrivateAttr(default_factory=dict)
    _failure: dict[str, float] = PrivateAttr(default_factory=dict)
    _threshold: dict[str, float] = PrivateAttr(default_factory=dict)

    @field_validator("labels", mode="before")
    @classmethod
    def _labels_from_list(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return LabelSpace(tuple(str(x) for x in value))
        return value

    @property
    def kind(self) -> LabelKind:
        return self.labels.kind

    @classmethod
    def from_labels(cls, labels: LabelSpace | Sequence[str], *, kind: LabelKind | None = None, **overrides: Any) -> "RewardScale":
        """A scale for ``labels`` (a LabelSpace, or label strings plus an optional ``kind``)."""
        if not isinstance(labels, LabelSpace):
            if isinstance(labels, str):
                raise ValueError(f"labels={labels!r} is a single string: pass a list such as ['ham', 'spam']")
            labels = LabelSpace(tuple(str(x) for x in labels), kind=kind or "categorical")
        elif kind is not None and kind != labels.kind:
            raise ValueError(f"kind={kind!r} contradicts the LabelSpace's kind {labels.kind!r}; drop kind or rebuild the LabelSpace")
        return cls(labels=labels, **overrides)

    @model_validator(mode="after")
    def _build(self) -> "RewardScale":
        _check_finite(self)
        if self.table is not None and self.per_class is not None:
            raise ValueError("table and per_class were both given: a table fixes every reward; pass one of them")
        if self.success_threshold is not None and self.kind != "ordinal":
            raise ValueError(
                f"success_threshold={self.success_threshold} with kind={self.kind!r}: only ordinal scales have "
                "partial credit, so success means the correct reward; drop success_threshold"
            )
        rows = self._table_rows() if self.table is not None else self._formula_rows()
        for ref, row in rows.items():
            _check_row(ref, row)
            self._rewards.update({(ref, pred): value for pred, value in row.items()})
            self._failure[ref] = self.failure if self.failure is not None else self._default_failure(ref, row)
            self._threshold[ref] = self._row_threshold(ref, row)
        return self

    def _formula_rows(self) -> dict[str, dict[str, float]]:
        overrides = {self._key(name, "per_class"): v for name, v in (self.per_class or {}).items()}
        names, k = self.labels.labels, self.labels.k
        rows: dict[str, dict[str, float]] = {}
        for i, ref in enumerate(names):
            extra = overrides.get(ref, ClassReward())
            right = self.correct if extra.correct is None else extra.correct
            wrong = self.incorrect if extra.incorrect is None else extra.incorrect
            if right <= wrong:
                raise ValueError(
                    f"reference {ref!r}: correct={right} ≤ incorrect={wrong}; a correct answer must earn more "
                    "than a wrong one, or RL learns to answer wrongly; raise correct or lower incorrect"
                )
            row = {}
            for j, pred in enumerate(names):
                if i == j:
                    row[pred] = right  # set exactly: wrong + (right − wrong) · 1 can round off
                elif self.kind == "ordinal":
                    # Linear partial credit: 1 − |pred − ref| / (K − 1), mapped onto [wrong, right].
                    row[pred] = wrong + (right - wrong) * (1.0 - abs(i - j) / (k - 1))
                else:
                    row[pred] = wrong
            rows[ref] = row
        return rows

    def _default_failure(self, ref: str, row: dict[str, float]) -> float:
        if self.table is not None:
            return min(row.values())
        for name, extra in (self.per_class or {}).items():
            if self.labels.normalise(name) == ref and extra.incorrect is not None:
                return extra.incorrect
        return self.incorrect

    def _table_rows(self) -> dict[str, dict[str, float]]:
        assert self.table is not None
        rows = {self._key(ref, "table"): {self._key(p, f"table[{ref!r}]"): v for p, v in row.items()}
                for ref, row in self.table.items()}
        names = self.labels.labels
        for ref in names:
            missing = [p for p in names if p not in rows.get(ref, {})]
            if missing:
                raise ValueError(
                    f"table[{ref!r}] lacks predictions {missing}: the table needs a reward for every "
                    f"(reference, prediction) pair of {list(names)}"
                )
        return {ref: {p: rows[ref][p] for p in names} for ref in names}

    def _row_threshold(self, ref: str, row: dict[str, float]) -> float:
        if self.success_threshold is None:
            return row[ref]
        lowest, best = min(row.values()), row[ref]
        if not lowest < self.success_threshold <= best:
            raise ValueError(
                f"success_threshold={self.success_threshold}: for reference {ref!r} rewards run from {lowest} "
                f"to {best}; choose a threshold above {lowest} and at most {best}"
            )
        return self.success_threshold

    def _key(self, name: str, where: str) -> str:
        declared = self.labels.normalise(name)
        if declared is None:
            raise ValueError(f"{where} names {name!r}, which is not one of the labels {list(self.labels.labels)}")
        return declared

    def reward_of(self, ref: str, pred: str) -> float:
        """The table entry reward[ref][pred] (both declared spellings)."""
        return self._rewards[(ref, pred)]

    def failure_for(self, ref: str) -> float:
        """The failure reward when the reference label is ``ref`` (declared spelling)."""
        return self._failure[ref]

    def reference(self, label: str) -> str:
        """The declared spelling of a reference label; ValueError when it is not a label."""
        declared = self.labels.normalise(str(label))
        if declared is None:
            raise ValueError(
                f"reference label {label!r} is not one of {list(self.labels.labels)}; "
                "fix the dataset row or declare the label with --labels"
            )
        return declared


def grade(answer: str | None, label: str, scale: RewardScale) -> float:
    """The reward of ``answer`` when the reference is ``label``.

    ``answer`` None (unparseable) or not a declared label earns the failure reward; a
    reference that is not a declared label raises ValueError.
    """
    ref = scale.reference(label)
    pred = scale.labels.normalise(answer) if answer is not None else None
    if pred is None:
        return scale.failure_for(ref)
    return scale.reward_of(ref, pred)


def success_threshold(scale: RewardScale, label: str | None = None) -> float:
    """The boundary between "correct" and "failed" rewards (the τ of threshold baselines).

    Binary/categorical: the correct reward. Ordinal: ``scale.success_threshold`` when set,
    else the exact-grade reward. With per-class values, pass ``label`` for that reference's
    boundary; without it the lowest boundary over all references is returned.
    """
    if label is not None:
        return scale._threshold[scale.reference(label)]
    return min(scale._threshold.values())


def is_correct(answer: str | None, label: str, scale: RewardScale) -> bool:
    """Whether ``answer`` earns at least the success threshold for reference ``label``."""
    if answer is None or scale.labels.normalise(answer) is None:
        return False
    return grade(answer, label, scale) >= success_threshold(scale, label) - _TOLERANCE


def _check_row(ref: str, row: dict[str, float]) -> None:
    others = [v for pred, v in row.items() if pred != ref]
    if any(v >= row[ref] for v in others):
        raise ValueError(
            f"table[{ref!r}]: the exact answer earns {row[ref]} but another prediction earns as much "
            f"({max(others)}); the correct answer must earn strictly the most in its row"
        )


def _check_finite(scale: RewardScale) -> None:
    values = [scale.correct, scale.incorrect, scale.failure, scale.success_threshold]
    values += [v for c in (scale.per_class or {}).values() for v in (c.correct, c.incorrect)]
    values += [v for row in (scale.table or {}).values() for v in row.values()]
    bad = [v for v in values if v is not None and not math.isfinite(v)]
    if bad:
        raise ValueError(f"reward values {bad} are not finite; every reward must be a finite number")

"""Dataclasses that cross package boundaries.

Only plain data lives here (no torch, no I/O), so every package may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, Mapping

LabelKind = Literal["binary", "categorical", "ordinal"]
AnswerMode = Literal["direct", "reasoning"]


@dataclass(frozen=True)
class LabelSpace:
    """The declared label set of a task.

    ``labels`` is ordered: for ordinal tasks the order is the grade order (lowest first);
    for binary tasks ``positive`` names the label whose probability is the score.
    """

    labels: tuple[str, ...]
    kind: LabelKind = "categorical"
    positive: str | None = None

    def __post_init__(self) -> None:
        if len(self.labels) < 2:
            raise ValueError(
                f"labels={list(self.labels)}: a task needs at least 2 labels; "
                "declare them with --labels a,b"
            )
        folded = [canonical_label(x) for x in self.labels]
        if len(set(folded)) != len(folded):
            raise ValueError(
                f"labels={list(self.labels)}: labels must differ after trimming, folding runs of whitespace and case-folding"
            )
        if self.kind == "binary" and len(self.labels) != 2:
            raise ValueError(
                f"labels={list(self.labels)}: a binary task has exactly 2 labels; "
                "use kind 'categorical' for more"
            )
        if self.positive is not None and self.positive not in self.labels:
            raise ValueError(
                f"positive={self.positive!r} is not one of the labels {list(self.labels)}"
            )

    @property
    def k(self) -> int:
        return len(self.labels)

    @property
    def positive_label(self) -> str:
        """The positive label of a binary task (declared, else the second label)."""
        if self.kind != "binary":
            raise ValueError(f"kind={self.kind!r}: only binary tasks have a positive label")
        return self.positive if self.positive is not None else self.labels[1]

    @cached_property
    def _positions(self) -> dict[str, int]:
        """Each label's canonical form → its position (a loader looks up every row's label)."""
        return {canonical_label(name): i for i, name in enumerate(self.labels)}

    def index(self, label: str) -> int:
        """Position of ``label`` (matched as ``canonical_label`` compares)."""
        position = self._positions.get(canonical_label(label))
        if position is None:
            raise ValueError(f"label {label!r} is not one of {list(self.labels)}")
        return position

    def normalise(self, label: str) -> str | None:
        """The declared spelling of ``label``, or None when it is not a label."""
        position = self._positions.get(canonical_label(label))
        return None if position is None else self.labels[position]


def canonical_label(text: str) -> str:
    """How labels are compared everywhere: trimmed, runs of whitespace as one space, case-folded
    ("Not  spam " is "not spam")."""
    return " ".join(str(text).split()).casefold()


@dataclass(frozen=True)
class Example:
    """One labelled item.

    ``text`` is the item as shown to the model (the text columns joined);
    ``fields`` keeps each text column separately for templates with several slots;
    ``meta`` carries extras such as per-rater scores (``ratings``) or a mean rating.
    """

    id: str
    text: str
    label: str
    fields: Mapping[str, str] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Dataset:
    """A loaded, validated labelled dataset."""

    name: str
    examples: tuple[Example, ...]
    labels: LabelSpace
    source: str = ""
    skipped_rows: tuple[dict, ...] = ()

    def __len__(self) -> int:
        return len(self.examples)

    @cached_property
    def memo(self) -> dict:
        """What has been computed from this dataset's content, kept with it (e.g. its splits'
        fingerprint, ``labelrl.data.split.splits_fingerprint``): the dataset never changes."""
        return {}

    def label_counts(self) -> dict[str, int]:
        counts = {name: 0 for name in self.labels.labels}
        for ex in self.examples:
            counts[ex.label] += 1
        return counts

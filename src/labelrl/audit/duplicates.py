"""Find groups of examples that hold the same item (duplicates) and compare their labels.

Two copies of one item should carry one label; when they do not, at least one copy is
mislabelled. The noise estimates in :mod:`labelrl.audit.noise` start from these groups.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from labelrl.data.split import group_key
from labelrl.types import Example


@dataclass(frozen=True)
class DuplicateGroup:
    """Examples sharing one key (two or more of them).

    ``key`` is the shared value of the key fields (after normalisation in normalised mode);
    ``ids``, ``labels`` and ``texts`` are aligned, one entry per copy, in dataset order.
    """

    key: tuple[str, ...]
    ids: tuple[str, ...]
    labels: tuple[str, ...]
    texts: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.ids)

    @property
    def n_pairs(self) -> int:
        """Unordered pairs of copies: n(n−1)/2."""
        return self.size * (self.size - 1) // 2

    @property
    def n_disagreeing_pairs(self) -> int:
        """Pairs whose two labels differ: all pairs minus those within each label."""
        same = sum(c * (c - 1) // 2 for c in Counter(self.labels).values())
        return self.n_pairs - same

    @property
    def conflicting(self) -> bool:
        return len(set(self.labels)) > 1

    def restrict(self, ids: set[str] | frozenset[str]) -> DuplicateGroup | None:
        """The copies whose id is in ``ids``, or None when fewer than two remain."""
        keep = [i for i, x in enumerate(self.ids) if x in ids]
        if len(keep) < 2:
            return None
        return DuplicateGroup(
            key=self.key,
            ids=tuple(self.ids[i] for i in keep),
            labels=tuple(self.labels[i] for i in keep),
            texts=tuple(self.texts[i] for i in keep),
        )


def _field_value(example: Example, name: str) -> str:
    """``name`` from the example's fields, then its meta, then the joined text."""
    if name in example.fields:
        return str(example.fields[name])
    if name in example.meta:
        return str(example.meta[name])
    if name == "text":
        return example.text
    known = sorted(set(example.fields) | set(example.meta) | {"text"})
    raise ValueError(
        f"key column {name!r} is missing from example {example.id!r}: "
        f"key columns must be text columns or metadata; available: {', '.join(known)}"
    )


def example_key(example: Example, key: Sequence[str] | None, normalise: bool) -> tuple[str, ...]:
    """The grouping key of one example: its text, or the named fields, each normalised or not."""
    parts = [example.text] if not key else [_field_value(example, name) for name in key]
    if normalise:
        parts = [group_key(p) if p.strip() else "" for p in parts]
    return tuple(parts)


def find_duplicate_groups(
    examples: Iterable[Example],
    *,
    key: Sequence[str] | str | None = None,
    normalise: bool = True,
) -> list[DuplicateGroup]:
    """Group examples by key; return the groups with two or more members.

    ``key`` None compares the example text; a list of names (or a comma-separated string
    such as ``"passage,driver"``) compares those fields, looked up in ``Example.fields``,
    then ``Example.meta``; the name ``text`` means the joined text. ``normalise=True``
    compares values by :func:`labelrl.data.split.group_key` (NFKC, case-folded, punctuation
    removed, whitespace collapsed; an all-punctuation value such as ":)" is compared as
    itself): the splitter's rule, so with the default key a group found here never
    straddles two splits. ``normalise=False`` requires byte-identical values (exact mode).

    Examples whose key is blank (every part empty or whitespace) are never grouped: an
    empty value says nothing about two items being the same. Groups come in order of
    their first member; members keep dataset order.
    """
    if isinstance(key, str):
        key = [k.strip() for k in key.split(",") if k.strip()]
        if not key:
            raise ValueError("key='': name at least one column, e.g. --key passage,driver")
    members: dict[tuple[str, ...], list[Example]] = {}
    for example in examples:
        k = example_key(example, key, normalise)
        if not any(part.strip() for part in k):
            continue
        members.setdefault(k, []).append(example)
    return [
        DuplicateGroup(
            key=k,
            ids=tuple(e.id for e in group),
            labels=tuple(e.label for e in group),
            texts=tuple(e.text for e in group),
        )
        for k, group in members.items()
        if len(group) >= 2
    ]

"""A small name → object registry.

Algorithms (advantage estimators, surrogates, aggregations, graders) live behind
registries so the trainer calls ``REGISTRY.get(name)`` and never special-cases one.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects; an unknown name lists the known ones."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@ESTIMATORS.register("grpo")``."""

        def add(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice; pick another name")
            self._items[name] = obj
            return obj

        return add

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise ValueError(
                f"unknown {self.kind} {name!r}: choose one of {known}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

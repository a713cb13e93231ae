"""Package exports imported on first use (PEP 562), so importing a package, or a CLI that only
lists commands, does not pay for the heavy modules behind it."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, where: dict[str, str], namespace: dict) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``where`` maps each public name to the
    submodule that defines it; ``namespace`` is the package's ``globals()``."""

    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__

"""A build-once directory cache under ``$LABELRL_CACHE`` (default ``~/.cache/labelrl``).

Converting the SmolLM2 GGUF takes ~30 s; the safetensors copy it leaves behind reloads in ~1 s.
Every cached directory is built in a temporary directory beside its target and renamed into
place in one step, with a marker file written last, so readers see either no directory or a
complete one. Several processes may build the same entry at once: the first rename wins, the
others discard their copy. A marker that does not match what the caller expects (a different
source file, other library versions, a half-deleted directory) makes the entry stale, and it
is rebuilt.

This module imports neither torch nor transformers.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

MARKER_NAME = "labelrl-cache.json"
# Bump when the layout of a cached directory changes, so old entries are rebuilt.
CACHE_FORMAT = 1
# Hashing the head of a file rather than all of it keeps the validity check to milliseconds;
# together with the size it tells apart every release of a weights file we know of.
HEAD_BYTES = 4 * 1024 * 1024
# A temporary directory older than this belongs to a killed build (a conversion takes ~30 s).
ABANDONED_AFTER_S = 3600.0


def cache_root() -> Path:
    """The cache root: ``$LABELRL_CACHE`` if set and non-empty, else ``~/.cache/labelrl``.

    Read on every call, so tests and users can point it elsewhere at run time.
    """
    configured = os.environ.get("LABELRL_CACHE", "").strip()
    return Path(configured or "~/.cache/labelrl").expanduser()


def file_identity(path: Path, head_bytes: int = HEAD_BYTES) -> dict[str, Any]:
    """Name, size in bytes and sha256 of the first ``head_bytes`` bytes of ``path``."""
    path = Path(path)
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        digest.update(handle.read(head_bytes))
    return {
        "name": path.name,
        "size_bytes": path.stat().st_size,
        f"sha256_first_{head_bytes}_bytes": digest.hexdigest(),
    }


def read_marker(directory: Path) -> dict[str, Any] | None:
    """The metadata stored in ``directory``'s marker file, or None if absent or unreadable."""
    try:
        return json.loads((Path(directory) / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_complete(directory: Path, metadata: dict[str, Any]) -> bool:
    """True if ``directory`` holds a marker whose content equals ``metadata`` (plus the format)."""
    return read_marker(directory) == _with_format(metadata)


def build_once(target: Path, metadata: dict[str, Any], fill: Callable[[Path], None]) -> Path:
    """Return ``target``, building it first with ``fill(tmp_dir)`` unless it is complete.

    ``metadata`` (JSON-serialisable) describes what the entry was built from; it is written
    to the marker file after ``fill`` returns, and an existing ``target`` whose marker differs
    is treated as stale and replaced. Safe against concurrent builders: each fills its own
    temporary directory beside ``target`` and renames it into place; a builder that finds a
    complete ``target`` already there discards its own copy. Temporary directories are removed
    on every path out, including exceptions raised by ``fill``.
    """
    target = Path(target)
    if is_complete(target, metadata):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        fill(tmp)
        _write_marker(tmp, metadata)
        tmp.chmod(0o755)  # mkdtemp makes it owner-only; a cache entry is ordinary readable data
        _install(tmp, target, metadata)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _with_format(metadata: dict[str, Any]) -> dict[str, Any]:
    # A JSON round trip, so tuples and lists (or int keys) compare equal to what was stored.
    return json.loads(json.dumps({"cache_format": CACHE_FORMAT, **metadata}, sort_keys=True))


def _write_marker(directory: Path, metadata: dict[str, Any]) -> None:
    text = json.dumps(_with_format(metadata), indent=2, sort_keys=True) + "\n"
    with open(directory / MARKER_NAME, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _install(tmp: Path, target: Path, metadata: dict[str, Any]) -> None:
    """Rename ``tmp`` to ``target``; if another builder got there first, keep theirs.

    A stale ``target`` is first renamed aside (a rename is atomic, a recursive delete is not)
    and then deleted. Two rounds suffice: a second loss means another builder installed a
    complete entry, or replaced the stale one at the same moment we did.
    """
    for _ in range(3):
        try:
            os.rename(tmp, target)
            return
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        if is_complete(target, metadata):
            return
        _move_aside_and_delete(target)
    raise RuntimeError(
        f"could not install cache entry {target}: it kept being replaced by other processes; "
        "remove it and retry"
    )


def _move_aside_and_delete(target: Path) -> None:
    aside = target.with_name(f".{target.name}.stale-{uuid.uuid4().hex}.tmp")
    try:
        os.rename(target, aside)
    except FileNotFoundError:
        return  # another builder moved it first
    shutil.rmtree(aside, ignore_errors=True)


def _remove_abandoned(target: Path) -> None:
    """Delete temporary siblings of ``target`` left by builds killed long ago."""
    cutoff = time.time() - ABANDONED_AFTER_S
    for sibling in target.parent.glob(f".{target.name}.*.tmp"):
        try:
            if sibling.stat().st_mtime < cutoff:
                shutil.rmtree(sibling, ignore_errors=True)
        except FileNotFoundError:
            continue

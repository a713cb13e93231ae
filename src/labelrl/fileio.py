"""Atomic file writes: every artifact is written to a temporary name, then renamed.

A reader (or a resumed run) therefore sees either the old file or the new one, never a torn one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Read once: os.umask can only be read by setting it, which would race with other threads.
UMASK = _read_umask()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~UMASK)  # mkstemp makes 0600; give the file the mode open() would
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def atomic_write_dir(path: Path, fill: Callable[[Path], None]) -> None:
    """Build a directory with ``fill(tmp_dir)`` beside ``path``, then swap it in.

    An existing ``path`` is replaced (renamed aside first, then removed), so a kill at any
    point leaves either the complete old directory or the complete new one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        tmp.chmod(0o777 & ~UMASK)  # mkdtemp makes 0700; give the directory the mode mkdir would
        fill(tmp)
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def jsonl_line(record: dict) -> str:
    return json.dumps(record, sort_keys=True, default=float) + "\n"


def atomic_write_jsonl(path: Path, records: list[dict]) -> None:
    """Replace a JSONL file as a whole (e.g. cutting a log back to a checkpoint's step)."""
    atomic_write_text(path, "".join(jsonl_line(r) for r in records))


def drop_torn_tail(path: Path) -> bool:
    """Cut a last line left unfinished by a kill (no closing newline), so the next append starts
    on a fresh line; True when something was cut. Reads only the file's last byte when the file
    is whole."""
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return False
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return False
        handle.seek(0)
        data = handle.read()
        handle.truncate(data.rfind(b"\n") + 1)
        return True


def append_jsonl(path: Path, record: dict) -> None:
    """Append one JSON line and flush it to disk (a kill loses at most the line in flight).

    A torn last line left by an earlier kill is cut first, so the new record never lands on the
    same line as a fragment (which would hide it and every later record from a reader). Both
    happen under an exclusive ``flock`` of the file: another process appending to it (a ladder's
    side-by-side workers share a task's holdout ledger) is never mid-line when the tail is read."""
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # released when the file closes
        drop_torn_tail(path)
        handle.write(jsonl_line(record))
        handle.flush()
        os.fsync(handle.fileno())


def read_jsonl(path: Path) -> list[dict]:
    """Read a JSONL file. A torn last line (a kill mid-append) is ignored; an unreadable line
    anywhere else is corruption, and a ValueError names the file and the line."""
    records = []
    path = Path(path)
    if not path.exists():
        return records
    lines = path.read_text(encoding="utf-8").splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i == last:
                break
            raise ValueError(f"{path}: line {i + 1} is not JSON ({exc.msg}) and is not the last line, so it is not a "
                             "torn write but corruption; restore the file from a copy, or remove that line knowingly") from None
    return records


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Delete the ``.NAME.*.tmp`` files and directories a killed writer left in ``run_dir``.

    Called by the directory's lock holder, so no live writer owns them. Sub-directories with
    their own ``.lock`` (another run's directory, e.g. a ladder's arms) are left to their own
    holder."""
    removed = []
    for root, dirs, files in os.walk(run_dir):
        here = Path(root)
        dirs[:] = [d for d in dirs if not (here / d / ".lock").exists()]
        for name in [*files, *dirs]:
            if name.startswith(".") and name.endswith(".tmp"):
                target = here / name
                shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
                removed.append(target)
        dirs[:] = [d for d in dirs if not (d.startswith(".") and d.endswith(".tmp"))]
    return removed


class RunLock:
    """One writer per run directory: ``with RunLock(run_dir, "rl"):``.

    An advisory ``flock`` on ``RUN_DIR/.lock`` (released by the OS when the process dies, so a
    killed run never leaves a stale lock); the holder's pid and command are written inside so
    a refused second writer can name it.
    """

    def __init__(self, run_dir: Path, command: str) -> None:
        self.path = Path(run_dir) / ".lock"
        self.command = command
        self._handle = None

    def __enter__(self) -> "RunLock":
        import fcntl

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(self.path, "a+", encoding="utf-8")
        except OSError as exc:
            raise ValueError(
                f"--out {self.path.parent}: cannot write there ({exc.strerror}); choose a writable directory"
            ) from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ValueError(
                f"{self.path.parent} is in use by {holder}; wait for it to finish, or write to another --out"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} (labelrl {self.command})")
        handle.flush()
        self._handle = handle
        remove_stale_temporaries(self.path.parent)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the descriptor releases the lock
            self._handle = None

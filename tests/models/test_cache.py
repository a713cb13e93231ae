"""Tests for labelrl.models.cache: build-once directories, staleness, and concurrent builders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from labelrl.models import cache


def _fill_with(text: str, calls: list[str]):
    def fill(out: Path) -> None:
        calls.append(str(out))
        (out / "data.txt").write_text(text)

    return fill


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_cache_root_reads_env_at_call_time(monkeypatch, tmp_path):
    monkeypatch.setenv("LABELRL_CACHE", str(tmp_path / "c"))
    assert cache.cache_root() == tmp_path / "c"
    monkeypatch.setenv("LABELRL_CACHE", "")
    assert cache.cache_root() == Path.home() / ".cache" / "labelrl"
    monkeypatch.delenv("LABELRL_CACHE")
    assert cache.cache_root() == Path.home() / ".cache" / "labelrl"


def test_build_once_builds_then_reuses(tmp_path):
    calls: list[str] = []
    target = tmp_path / "entries" / "thing"
    meta = {"source": {"name": "x", "size_bytes": 3}, "versions": ["1", "2"]}
    assert cache.build_once(target, meta, _fill_with("v1", calls)) == target
    assert (target / "data.txt").read_text() == "v1"
    # The marker holds the metadata plus the format; lists survive the JSON round trip.
    assert cache.read_marker(target) == {"cache_format": cache.CACHE_FORMAT, **meta}
    assert cache.is_complete(target, meta)
    cache.build_once(target, meta, _fill_with("v2", calls))
    assert len(calls) == 1 and (target / "data.txt").read_text() == "v1"
    assert _leftovers(target.parent) == []
    assert oct(target.stat().st_mode & 0o777) == "0o755"


@pytest.mark.parametrize("damage", ["other_metadata", "no_marker", "torn_marker"])
def test_stale_or_partial_entry_is_rebuilt(tmp_path, damage):
    calls: list[str] = []
    target = tmp_path / "thing"
    cache.build_once(target, {"v": 1}, _fill_with("old", calls))
    if damage == "no_marker":
        (target / cache.MARKER_NAME).unlink()
    if damage == "torn_marker":
        (target / cache.MARKER_NAME).write_text('{"cache_format": 1, "v"')
    new_meta = {"v": 2} if damage == "other_metadata" else {"v": 1}
    assert not cache.is_complete(target, new_meta)
    cache.build_once(target, new_meta, _fill_with("new", calls))
    assert len(calls) == 2
    assert (target / "data.txt").read_text() == "new"
    assert cache.is_complete(target, new_meta)
    assert _leftovers(tmp_path) == []  # the stale copy moved aside was deleted too


def test_failing_fill_leaves_nothing_behind(tmp_path):
    target = tmp_path / "thing"

    def fill(out: Path) -> None:
        (out / "half.bin").write_bytes(b"\0" * 10)
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        cache.build_once(target, {"v": 1}, fill)
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_abandoned_temp_dirs_are_removed_but_fresh_ones_kept(tmp_path):
    old = tmp_path / ".thing.abc.tmp"
    fresh = tmp_path / ".thing.def.tmp"
    other = tmp_path / ".other.ghi.tmp"
    for directory in (old, fresh, other):
        directory.mkdir()
    long_ago = time.time() - cache.ABANDONED_AFTER_S - 60
    os.utime(old, (long_ago, long_ago))
    os.utime(other, (long_ago, long_ago))
    cache.build_once(tmp_path / "thing", {"v": 1}, _fill_with("x", []))
    # A fresh one may belong to a build in progress in another process; another entry's are not ours.
    assert _leftovers(tmp_path) == [".other.ghi.tmp", ".thing.def.tmp"]


def test_file_identity_tracks_size_and_head(tmp_path):
    path = tmp_path / "w.gguf"
    path.write_bytes(b"a" * 100)
    first = cache.file_identity(path, head_bytes=10)
    assert first["name"] == "w.gguf" and first["size_bytes"] == 100
    path.write_bytes(b"b" + b"a" * 99)  # same size, different head
    assert cache.file_identity(path, head_bytes=10) != first
    path.write_bytes(b"a" * 101)  # same head, different size
    assert cache.file_identity(path, head_bytes=10) != first
    path.write_bytes(b"a" * 10 + b"z" * 90)  # differs only beyond the hashed head
    assert cache.file_identity(path, head_bytes=10) == first


# Each child fills its own temp dir, then waits until the other child has also started
# filling, so both are guaranteed to race for the rename.
_RACER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from labelrl.models import cache

    target, rendezvous, me = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]

    def fill(out):
        (out / "who.txt").write_text(me)
        (out / "payload.bin").write_bytes(me.encode() * 100_000)
        (rendezvous / me).touch()
        deadline = time.time() + 60
        while len(list(rendezvous.iterdir())) < 2:
            assert time.time() < deadline, "the other builder never arrived"
            time.sleep(0.01)

    cache.build_once(target, {"v": 1}, fill)
    print((target / "who.txt").read_text())
    """
)


def test_concurrent_builders_both_succeed_and_one_copy_wins(tmp_path):
    target = tmp_path / "cache" / "thing"
    rendezvous = tmp_path / "rendezvous"
    rendezvous.mkdir()
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(target), str(rendezvous), name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("A", "B")
    ]
    outputs = [child.communicate(timeout=120) for child in children]
    assert [child.returncode for child in children] == [0, 0], [err for _, err in outputs]
    assert sorted(os.listdir(rendezvous)) == ["A", "B"]  # both really filled at the same time
    winner = (target / "who.txt").read_text()
    # Both processes read the same installed copy, and that copy is whole (not a mix of the two).
    assert [out.strip() for out, _ in outputs] == [winner, winner]
    assert (target / "payload.bin").read_bytes() == winner.encode() * 100_000
    assert json.loads((target / cache.MARKER_NAME).read_text())["v"] == 1
    assert _leftovers(target.parent) == []

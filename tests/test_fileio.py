"""Atomic writes leave no temporary files and give files the mode a plain open() would."""

from __future__ import annotations

import stat

from labelrl.fileio import UMASK, atomic_write_dir, atomic_write_json, read_jsonl, append_jsonl


def test_atomic_files_and_dirs_get_the_usual_permissions(tmp_path):
    atomic_write_json(tmp_path / "a.json", {"x": 1})
    atomic_write_dir(tmp_path / "d", lambda d: (d / "f.txt").write_text("y"))
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o666 & ~UMASK
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o777 & ~UMASK
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "d"]  # no temporary names left


def test_taking_the_lock_removes_what_a_killed_writer_left(tmp_path):
    from labelrl.fileio import RunLock

    run = tmp_path / "run"
    (run / "checkpoints" / ".step_000002.abc.tmp").mkdir(parents=True)
    (run / ".metrics.json.x1.tmp").write_text("torn")
    (run / "arm" / ".lock").parent.mkdir()
    (run / "arm" / ".lock").write_text("")
    (run / "arm" / ".model.y.tmp").write_text("another run's")
    (run / "keep.tmp").write_text("not ours: no leading dot")
    with RunLock(run, "test"):
        left = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    assert left == [".lock", "arm", "arm/.lock", "arm/.model.y.tmp", "checkpoints", "keep.tmp"]


def test_append_jsonl_round_trips(tmp_path):
    for i in range(3):
        append_jsonl(tmp_path / "m.jsonl", {"step": i})
    assert [r["step"] for r in read_jsonl(tmp_path / "m.jsonl")] == [0, 1, 2]


def test_append_jsonl_waits_for_another_writer_mid_line(tmp_path):
    """A second process appending to the same file (a ladder's workers share a holdout ledger)
    holds the file's lock while its line is half written; an append meanwhile must wait for it,
    not cut the half line as a torn tail left by a kill."""
    import fcntl
    import json
    import threading

    path = tmp_path / "ledger.jsonl"
    append_jsonl(path, {"n": 0})
    with open(path, "a", encoding="utf-8") as other:
        fcntl.flock(other.fileno(), fcntl.LOCK_EX)
        other.write('{"n": 1, "half')
        other.flush()
        appender = threading.Thread(target=append_jsonl, args=(path, {"n": 2}))
        appender.start()
        appender.join(timeout=0.5)
        assert appender.is_alive()  # waiting for the lock, the half line untouched
        assert path.read_text(encoding="utf-8").endswith('"half')
        other.write('": true}\n')
        other.flush()
    appender.join(timeout=10)
    assert not appender.is_alive()
    assert [json.loads(line)["n"] for line in path.read_text(encoding="utf-8").splitlines()] == [0, 1, 2]

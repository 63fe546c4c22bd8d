"""A trace folder that fills up: colltrace steps aside with one warning, never faults the
program, and what it recorded before stays readable."""
from __future__ import annotations

import errno
import os

import pytest

from colltrace import config
from colltrace.rank.recorder import Recorder
from colltrace.tracefile import reader, ringfile, storage


class FakeGroup:
    pass


def describe(pg):
    return "0", "default_pg", [0, 1], "gloo", None


def make(tmp_path, **env):
    settings = config.load({"COLLTRACE": "1", "COLLTRACE_DIR": str(tmp_path), "COLLTRACE_POLL_S": "0.02", **env})
    return Recorder(settings, rank=0, world_size=2, backend="gloo")


def disk_full(fd: int) -> None:
    """From now on every write to fd fails with ENOSPC, as on a file system that just filled."""
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        os.dup2(full, fd)
    finally:
        os.close(full)


def collective(rec, group, op, shape):
    gs = rec.group_state(group, describe)
    sig = rec.sig_id((op, "allreduce", gs.id, (shape,), ("float32",), "SUM", -1, -1, False))
    ctx = rec.enter(gs, sig, None, 0)
    rec.exit(ctx, done=True)


def test_the_ring_is_allocated_before_it_is_mapped(tmp_path):
    w = ringfile.RingWriter(str(tmp_path / "rank-00000.ring"), 4096)
    st = os.stat(w.path)
    assert st.st_blocks * 512 >= st.st_size == ringfile.HEADER_SIZE + 4096 * ringfile.SLOT_SIZE   # no holes
    assert os.listdir(tmp_path) == ["rank-00000.ring"]
    w.close()


def test_no_room_for_the_ring_is_one_clear_error_and_no_files(tmp_path, monkeypatch):
    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(storage.StorageError) as info:
        make(tmp_path)
    assert str(info.value) == (f"cannot write traces to {tmp_path}: No space left on device; "
                               "tracing is off on rank 0, the job goes on untraced")
    assert os.listdir(tmp_path) == []


def test_a_definitions_file_that_fills_mid_run_stops_tracing_with_one_warning(tmp_path, capsys):
    rec = make(tmp_path)
    group = FakeGroup()
    collective(rec, group, "all_reduce", (4,))
    disk_full(rec.defs._fd)
    collective(rec, group, "all_reduce", (8,))   # a new signature: its definition cannot be written
    collective(rec, group, "all_reduce", (16,))
    rec._at_exit()                                # the exit record cannot be written either
    err = capsys.readouterr().err
    assert err.count("colltrace") == 1, err
    assert "No space left on device; tracing is off on rank 0, the job goes on untraced" in err
    assert rec.disabled
    # What was recorded before stays readable; the rank is no longer judged on its last record.
    tr = reader.load_traces(str(tmp_path))[0]
    recs = tr.all_records()
    assert [(r["op"], r["shapes"], r["state"]) for r in recs[:1]] == [("all_reduce", [[4]], "completed")]
    assert all(r["state"] == "completed" for r in recs)
    entry = tr.snapshot_entry()
    assert entry["status"] == "unreadable" and "trace folder is full" in entry["error"]
    rec.close()


def test_a_definition_cut_short_by_a_full_disk_is_skipped_by_the_reader(tmp_path):
    errors = []
    w = ringfile.DefsWriter(str(tmp_path / "d.jsonl"), 1 << 20, on_error=errors.append)
    assert w.write({"k": "code", "id": 1, "file": "a.py", "func": "f", "first": 1})
    with open(w.path, "ab") as f:       # what a write that ran out of space mid-line leaves
        f.write(b'{"k":"code","id":2,"fi')
    disk_full(w._fd)
    assert not w.write({"k": "code", "id": 3, "file": "b.py", "func": "g", "first": 2})
    assert not w.write({"k": "exit"})
    assert [e.errno for e in errors] == [errno.ENOSPC]   # reported once
    r = ringfile.DefsReader(w.path)
    assert [d["id"] for d in r.poll()] == [1] and r.bad_lines == 0
    w.close()

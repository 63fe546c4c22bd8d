"""The per-rank ring and definitions files, and reading them back without torch."""
from __future__ import annotations

import errno
import gc
import os
import weakref

import pytest

from colltrace.tracefile import reader, ringfile
from colltrace.tracefile.ringfile import COMPLETE, ENTER


def write_events(path, slots, n):
    w = ringfile.RingWriter(path, slots)
    for i in range(n):
        w.write(ENTER, 0, 1, 1, 1, 1, 0, i + 1, -1, float(i), i + 1)
    return w


def test_reader_sees_every_slot_written(tmp_path):
    path = str(tmp_path / "r.ring")
    w = write_events(path, 1024, 10)
    r = ringfile.RingReader(path)
    got = r.poll()
    assert [s[8] for s in got] == list(range(1, 11))   # seq field, in order
    w.write(COMPLETE, 0, 1, 0, 0, 0, 0, 10, 0, 11.0, 10)
    assert [s[0] for s in r.poll()] == [COMPLETE]      # incremental: only what is new
    assert r.lost == 0


def test_ring_wraps_and_counts_what_was_lost(tmp_path):
    path = str(tmp_path / "r.ring")
    write_events(path, 1024, 3000)
    r = ringfile.RingReader(path)
    got = r.poll()
    assert len(got) == 1024 and got[-1][8] == 3000 and r.lost == 3000 - 1024
    size = os.path.getsize(path)
    assert size == ringfile.HEADER_SIZE + 1024 * ringfile.SLOT_SIZE   # bounded, whatever was written


@pytest.mark.parametrize("content", [b"", b"garbage" * 10, b"CLTRACE1" + b"\0" * 5000])
def test_malformed_ring_is_one_clear_error(tmp_path, content):
    path = tmp_path / "rank-00000.ring"
    path.write_bytes(content)
    with pytest.raises(ringfile.RingFormatError) as e:
        ringfile.RingReader(str(path)).poll()
    assert "rank-00000.ring" in str(e.value)


def test_a_malformed_rank_is_unreadable_the_others_still_load(tmp_path):
    w = write_events(str(tmp_path / "rank-00000.ring"), 1024, 1)
    d = ringfile.DefsWriter(str(tmp_path / "rank-00000.defs.jsonl"), 1 << 20)
    d.write({"k": "meta", "rank": 0, "job": "j", "pid": 1, "started": 1.0})
    d.write({"k": "group", "id": 1, "name": "0", "desc": "default_pg", "ranks": [0, 1]})
    d.write({"k": "sig", "id": 1, "op": "barrier", "backend_op": "barrier", "group": 1, "shapes": [], "dtypes": []})
    (tmp_path / "rank-00001.ring").write_bytes(b"not a ring at all, truncated by a full disk")
    snap = reader.load_snapshot(str(tmp_path))
    assert snap["ranks"]["1"]["status"] == "unreadable" and "rank-00001.ring" in snap["ranks"]["1"]["error"]
    (rec,) = snap["ranks"]["0"]["records"]
    assert rec["op"] == "barrier" and rec["group"] == "0" and rec["state"] == "waiting"
    w.close()


def test_defs_reader_skips_bad_lines_and_keeps_partial_line(tmp_path):
    path = tmp_path / "x.defs.jsonl"
    path.write_bytes(b'{"k":"note","text":"a"}\nnot json\n[1,2]\n{"k":"note","te')
    r = ringfile.DefsReader(str(path))
    assert [d["text"] for d in r.poll()] == ["a"] and r.bad_lines == 2
    with open(path, "ab") as f:
        f.write(b'xt":"b"}\n')
    assert [d["text"] for d in r.poll()] == ["b"]


def test_defs_writer_is_bounded(tmp_path):
    w = ringfile.DefsWriter(str(tmp_path / "d.jsonl"), 200)
    results = [w.write({"k": "stack", "id": i, "frames": [[1, 2]] * 5}) for i in range(20)]
    assert results[0] and not results[-1]
    assert os.path.getsize(tmp_path / "d.jsonl") <= 200
    assert w.write({"k": "exit", "t": 1.0})   # the end-of-run record always fits


@pytest.mark.parametrize("compiled", [False, True], ids=["itertools-count", "compiled-counter"])
def test_python_and_compiled_writers_share_one_serial_and_lose_nothing(tmp_path, compiled):
    from colltrace.rank import fastpath

    if not fastpath.available():
        pytest.skip("the compiled hot path was not built here")
    serial = fastpath._fastpath.Counter(0) if compiled else None
    path = str(tmp_path / "r.ring")
    w = ringfile.RingWriter(path, 64, serial)
    for i in range(5):
        w.write(ENTER, 0, 1, 1, 1, 1, 0, 2 * i + 1, -1, float(i), i + 1)
        # the compiled poller loop writes a COMPLETE slot with the same counter, in between
        left = fastpath._fastpath.drain([(i + 1, 1, 2 * i + 2, object())], False, w._serial, w._mm, w.slots,
                                        type(None), lambda waitable: True, [])
        assert left == []
    got = ringfile.RingReader(path).poll()
    assert [s[8] for s in got] == list(range(1, 11))   # every slot, in the order written
    assert [s[0] for s in got] == [ENTER, COMPLETE] * 5
    assert next(w._serial) == 10


def test_a_failed_definitions_write_keeps_nothing_of_the_traced_program_alive(tmp_path, monkeypatch):
    # The write that hits a full disk runs inside a traced collective: its callers' frames hold
    # the program's objects (the process group). A group kept alive past destroy_process_group
    # makes gloo abort at interpreter exit.
    def full_disk(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    w = ringfile.DefsWriter(str(tmp_path / "defs.jsonl"), 1 << 20, on_error=lambda exc: None)
    monkeypatch.setattr(ringfile.os, "write", full_disk)

    class Group:
        pass

    def collective(group):   # the traced program's frame, holding its group
        return w.write({"k": "sig", "id": 1})

    group = Group()
    alive = weakref.ref(group)
    assert collective(group) is False and isinstance(w.failed, OSError)
    del group
    gc.collect()
    assert alive() is None

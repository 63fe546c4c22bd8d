"""The one builder of snapshots and the snapshot's JSON round trip (colltrace/model)."""
import json
import os

import pytest

from colltrace.model import build, schema
from colltrace.tracefile import reader
from helpers.paths import FIXTURES

FIXTURE = os.path.join(FIXTURES, "distill-checkpoint-barrier")


def rec(i, state, t, **kw):
    return dict({"id": i, "group": "0", "seq": i, "state": state, "entered_at": t, "p2p": False, "frames": []}, **kw)


def entry(status=schema.UNKNOWN, records=()):
    return build.rank_entry(3, {"pid": 42, "host": "h", "job": "j", "stall_s": 30.0}, status, None,
                            heartbeat=5.0, progress={"0": {"entered": 2, "completed": 1}}, records=list(records))


def test_a_rank_gone_without_a_trace_is_dead_with_the_note():
    e = build.host_entry(entry(), keep_records=64, died_at=12.5)
    assert e["status"] == schema.DEAD and e["died_at"] == 12.5
    assert e["exit"] == {"signal": None, "note": build.NO_TRACE_NOTE}
    assert build.host_entry(entry(), keep_records=64, died_at=None)["status"] == schema.ALIVE
    exited = build.host_entry(entry(status=schema.EXITED), keep_records=64, died_at=12.5)
    assert exited["status"] == schema.EXITED and exited["exit"] is None   # its own exit record stands


def test_a_live_stack_older_than_the_ranks_last_event_is_dropped():
    live = (10.0, [{"file": "a.py", "line": 1, "func": "f"}], "py-spy", None)
    fresh = build.host_entry(entry(), keep_records=64, died_at=None, live_stack=live, last_event_t=9.0)
    assert fresh["stack"] == live[1] and fresh["stack_via"] == "py-spy" and fresh["stack_at"] == 10.0
    stale = build.host_entry(entry(), keep_records=64, died_at=None, live_stack=live, last_event_t=11.0)
    assert stale["stack"] is None and "stack_via" not in stale
    failed = build.host_entry(entry(), keep_records=64, died_at=None,
                              live_stack=(0.0, None, None, {"py-spy": "refused"}), last_event_t=1.0)
    assert failed["stack_errors"] == {"py-spy": "refused"}


def test_trimming_keeps_every_open_record_and_the_recent_ones():
    recs = [rec(1, schema.WAITING, 1.0)] + [rec(i, schema.COMPLETED, float(i)) for i in range(2, 12)]
    e = build.host_entry(entry(records=recs), keep_records=3, died_at=None)
    assert [r["id"] for r in e["records"]] == [1, 9, 10, 11]


def test_compaction_keeps_pending_records_and_the_frames_around_the_users_own():
    user = [{"file": "/home/me/train.py", "line": i, "func": f"f{i}"} for i in range(30)]
    torch = [{"file": os.path.join(os.path.dirname(json.__file__), "x.py"), "line": i, "func": "lib"}
             for i in range(10)]
    recs = ([rec(1, schema.WAITING, 1.0, frames=user + torch)]
            + [rec(i, schema.COMPLETED, float(i)) for i in range(2, 12)])
    e = build.compact_entry(entry(records=recs))
    assert [r["id"] for r in e["records"]] == [1] + list(range(12 - build.RECENT_COMPLETED, 12))
    frames = e["records"][0]["frames"]
    assert len(frames) < 40 and frames[-1] == torch[-1]
    assert {"file": "/home/me/train.py", "line": 29, "func": "f29"} in frames   # the innermost user frame


def test_a_saved_live_view_supplies_liveness_but_not_over_an_ended_rank():
    files = {"0": entry(status=schema.UNKNOWN), "1": entry(status=schema.EXITED)}
    saved = {"taken_at": 100.0, "groups": {}, "ranks": {"0": {"status": schema.ALIVE, "stack": [{"file": "a.py"}]},
                                                          "1": {"status": schema.ALIVE}}}
    snap = build.from_files(files, {}, saved)
    assert snap["ranks"]["0"]["status"] == schema.ALIVE and snap["ranks"]["0"]["stack"] == [{"file": "a.py"}]
    assert snap["ranks"]["1"]["status"] == schema.EXITED
    assert snap["taken_at"] == 100.0


def test_a_recorded_snapshot_survives_the_json_round_trip():
    snap = reader.load_snapshot(FIXTURE)
    assert snap["ranks"] and schema.loads(schema.dumps(snap)) == json.loads(json.dumps(snap, default=str))


@pytest.mark.parametrize("text,words", [
    ("{", "not a readable snapshot"),
    ('{"groups": {}}', "no 'ranks' table"),
    ('{"ranks": {"x": {}}}', "not a rank number"),
    ('{"ranks": {"0": {"records": 3}}}', "'records' is not a list"),
    ('{"ranks": {}, "groups": []}', "'groups' is not a table"),
])
def test_malformed_snapshots_get_one_clear_error(text, words):
    with pytest.raises(schema.SnapshotError, match=words):
        schema.loads(text, where="snapshot.json")

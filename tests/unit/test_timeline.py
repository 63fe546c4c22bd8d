"""`colltrace export --perfetto`: the file is valid Chrome trace event JSON (checked strictly
against the format's rules, as Perfetto's JSON importer reads it) and draws what happened."""
from __future__ import annotations

import collections
import json
from pathlib import Path

from helpers import paths
from helpers.cli import run_cli

FIXTURES = Path(paths.FIXTURES)
METADATA = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}


def problems(doc) -> list[str]:
    """Everything in `doc` that breaks the trace event format (JSON Object Format)."""
    out = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["not an object with a traceEvents list"]
    if doc.get("displayTimeUnit") not in (None, "ms", "ns"):
        out.append("displayTimeUnit must be ms or ns")
    slices = collections.defaultdict(list)
    for i, e in enumerate(doc["traceEvents"]):
        ph = e.get("ph")
        if not isinstance(e.get("name"), str):
            out.append(f"{i}: no name")
        for k in ("pid", "tid"):
            if not isinstance(e.get(k), int) or isinstance(e.get(k), bool):
                out.append(f"{i}: {k} is not an integer")
        if "args" in e and not isinstance(e["args"], dict):
            out.append(f"{i}: args is not an object")
        if ph == "M":
            if e.get("name") not in METADATA or not isinstance(e.get("args"), dict):
                out.append(f"{i}: bad metadata event")
            continue
        if not isinstance(e.get("ts"), (int, float)) or e["ts"] < 0:
            out.append(f"{i}: ts missing or negative")
        if "cat" in e and not isinstance(e["cat"], str):
            out.append(f"{i}: cat is not a string")
        if ph == "X":
            if not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0:
                out.append(f"{i}: complete event without a duration")
            else:
                slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], i))
        elif ph in ("i", "I"):
            if e.get("s", "t") not in ("g", "p", "t"):
                out.append(f"{i}: instant scope must be g, p or t")
        elif ph == "C":   # a counter: each arg a series, its value a number
            if not e.get("args") or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                            for v in e["args"].values()):
                out.append(f"{i}: counter event without numeric args")
        else:
            out.append(f"{i}: phase {ph!r} is not used by colltrace")
    for track, ss in slices.items():   # slices of one thread must nest
        ss.sort(key=lambda s: (s[0], -s[1]))
        stack = []
        for start, end, i in ss:
            while stack and stack[-1] <= start:
                stack.pop()
            if stack and end > stack[-1]:
                out.append(f"{i}: slice on {track} overlaps its parent without nesting")
            stack.append(end)
    return out


def export(src, tmp_path, *extra) -> dict:
    out_file = tmp_path / "out.json"
    run = run_cli("export", src, "--perfetto", out_file, *extra)
    assert run.returncode == 0, run.stderr
    doc = json.loads(out_file.read_text())
    assert problems(doc) == []
    return doc


def xs(doc):
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def names(doc, ph="M", name="process_name"):
    return {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == ph and e["name"] == name}


def test_the_examples_hang_is_a_track_per_rank_with_its_unfinished_waits(tmp_path):
    """The distillation example's checkpoint_barrier hang (recorded by `colltrace run --on-hang
    abort`): ranks 0-2 in the barrier, rank 3 in the teacher's broadcast, none ever completed."""
    doc = export(FIXTURES / "distill-checkpoint-barrier", tmp_path)
    assert sorted(names(doc)) == [0, 1, 2, 3]
    assert names(doc)[0].startswith("rank 0 (culprit)") and "culprit" not in names(doc)[3]
    by_rank = {e["pid"]: e for e in xs(doc)}
    assert len(xs(doc)) == 4
    assert ([by_rank[r]["name"] for r in range(4)]
            == ["barrier #1 (never completed)"] * 3 + ["broadcast #1 (never completed)"])
    assert all(e["args"]["unfinished"] for e in xs(doc))
    # drawn to the moment the snapshot describes: all four end together
    assert len({round(e["ts"] + e["dur"], 0) for e in xs(doc)}) == 1
    finding = [e for e in doc["traceEvents"] if e["ph"] == "i" and e["s"] == "g"]
    assert [e["name"] for e in finding] == ["deadlock: group 0 #1"]
    assert doc["otherData"]["culprits"] == [0, 1, 2]


def test_flight_recorder_dumps_export_too(tmp_path):
    doc = export(FIXTURES / "fr-gloo" / "skipped", tmp_path)
    per_rank = collections.Counter(e["pid"] for e in xs(doc))
    assert per_rank == {0: 5, 1: 4, 2: 4}       # rank 1 skipped the last all_reduce
    unfinished = sorted((e["pid"], e["name"]) for e in xs(doc) if e["args"].get("unfinished"))
    assert unfinished == [(0, "all_reduce #4 (never completed)"), (2, "all_reduce #4 (never completed)")]
    assert doc["otherData"]["source"] == "flight_recorder" and doc["otherData"]["culprits"] == [1]


def test_nccl_dumps_export_every_entry_and_queued_work_nests(tmp_path):
    """NVIDIA's 16-rank dumps: one slice per recorder entry, none completed (the dumps hold only
    active work), all drawn to the end; work queued behind each other nests on one track."""
    import pickle

    d = FIXTURES / "nvrx-16rank" / "gpu_error_1st"   # NVIDIA's dumps, shipped with the tests
    doc = export(d, tmp_path)
    assert sorted(names(doc)) == list(range(16))
    entries = {r: pickle.loads((d / f"_dump_{r}").read_bytes())["entries"] for r in range(16)}
    assert collections.Counter(e["pid"] for e in xs(doc)) == {r: len(v) for r, v in entries.items() if v}
    assert all(e["args"]["unfinished"] for e in xs(doc))
    tracks = {(e["pid"], e["tid"]) for e in xs(doc)}
    threads = {(r, e["thread_name"]) for r, v in entries.items() for e in v}
    assert len(tracks) == len(threads)          # nested, not one track per op


def test_overlapping_async_work_goes_to_an_extra_track_of_the_thread():
    from colltrace.reporters import timeline

    def rec(i, t0, t1):
        return {"id": i, "group": "0", "seq": i, "op": "all_reduce", "state": "completed", "entered_at": t0,
                "completed_at": t1, "thread": "MainThread", "frames": []}
    snap = {"taken_at": 10.0, "ranks": {"0": {"records": [rec(1, 1.0, 3.0), rec(2, 2.0, 4.0), rec(3, 5.0, 6.0)]}}}
    doc = timeline.build(snap, [])
    assert problems(doc) == []
    tid = {e["name"]: e["tid"] for e in xs(doc)}
    assert tid["all_reduce #1"] == tid["all_reduce #3"] != tid["all_reduce #2"]
    assert ({e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
            == {"MainThread", "MainThread ·2"})


def test_each_members_arrival_lag_is_on_its_slice_and_on_a_counter_track():
    from colltrace.reporters import timeline

    def rec(rank, seq, t0):
        return {"id": seq, "rank": rank, "group": "0", "seq": seq, "op": "all_reduce", "state": "completed",
                "entered_at": t0, "completed_at": 10.0 + seq + 0.05, "thread": "MainThread", "frames": []}
    ranks = {str(r): {"rank": r, "records": [rec(r, s, 10.0 + s + (0.04 if r == 2 else 0.001 * r))
                                             for s in range(1, 4)]} for r in range(3)}
    snap = {"taken_at": 20.0, "groups": {"0": {"name": "0", "ranks": [0, 1, 2]}}, "ranks": ranks}
    doc = timeline.build(snap, [])
    assert problems(doc) == []
    late = [e["args"] for e in xs(doc) if e["pid"] == 2]
    assert [a["lag_ms"] for a in late] == [40.0, 40.0, 40.0] and all(a["last_to_arrive"] for a in late)
    assert [e["args"].get("lag_ms") for e in xs(doc) if e["pid"] == 1] == [1.0, 1.0, 1.0]
    assert not any(e["args"].get("last_to_arrive") for e in xs(doc) if e["pid"] != 2)
    counter = [e["args"]["lag"] for e in doc["traceEvents"] if e["ph"] == "C" and e["pid"] == 2]
    assert counter == [40.0, 40.0, 40.0]


def test_the_validator_rejects_what_perfetto_would_not_read():
    bad = {"traceEvents": [
        {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 5, "dur": 10},   # overlaps a, not nested
        {"ph": "X", "name": "c", "pid": "1", "tid": 1, "ts": 0},             # pid text, no dur
        {"ph": "i", "name": "d", "pid": 1, "tid": 1, "ts": 0, "s": "x"},
    ]}
    p = problems(bad)
    assert any("overlaps" in x for x in p) and any("pid" in x for x in p)
    assert any("duration" in x for x in p) and any("scope" in x for x in p)

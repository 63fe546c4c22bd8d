"""A trace folder copied from a cluster may arrive damaged: a file cut short, a line cut in two.
`colltrace analyze` judges it from what is readable, names each damaged file with its reason on
stderr and in --json's "warnings", exits 1 on findings and 2 only when nothing can be read; what
a damaged file still holds is used (tests/fixtures/recorded/deadlock: ranks 0-2 in a barrier, rank
3 in a gather on another group, recorded by a real job)."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from helpers.cli import run_cli
from helpers.paths import FIXTURES

RECORDED = os.path.join(FIXTURES, "recorded", "deadlock")
RING = "rank-00003.ring"


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(RECORDED, d)
    return d


def cut(path, size: int) -> None:
    with open(path, "rb") as f:
        data = f.read(size)
    with open(path, "wb") as f:
        f.write(data)


def analyzed(folder):
    """(exit code, the --json verdict, stderr's warning lines) of `colltrace analyze --json`."""
    out = run_cli("analyze", folder, "--json")
    doc = json.loads(out.stdout) if out.stdout else None
    return out.returncode, doc, [line for line in out.stderr.splitlines() if line.startswith("colltrace: warning: ")]


def damaged(doc) -> dict:
    return {os.path.basename(w["file"]): w for w in doc["warnings"] if w["kind"] == "damaged_file"}


def slots_written(path) -> int:
    from colltrace.tracefile import ringfile

    ring = ringfile.RingReader(str(path))
    n = len(ring.poll())
    ring.close()
    return n


def test_the_intact_folder_has_no_warning(folder):
    rc, doc, said = analyzed(folder)
    assert (rc, doc["culprits"], doc["warnings"], said) == (1, [0, 1, 2], [], [])


def test_a_snapshot_cut_short_beside_readable_rings_is_one_warning_and_the_same_verdict(folder):
    whole = analyzed(folder)[1]
    cut(folder / "snapshot.json", 3000)
    rc, doc, said = analyzed(folder)
    assert rc == 1 and doc["culprits"] == whole["culprits"] == [0, 1, 2]
    assert [f["kind"] for f in doc["findings"]] == ["deadlock"]
    w = damaged(doc)["snapshot.json"]
    assert "not a readable snapshot" in w["reason"] and w["message"].endswith("judged from the rank files alone")
    assert said == [f"colltrace: warning: {w['message']}"]


def test_a_ring_cut_short_after_its_written_slots_loses_nothing(folder):
    """A cut in the ring's unused tail (it is allocated whole, 1,024 slots here): every slot the
    rank wrote is read, the culprits are the same, and the cut is named."""
    os.unlink(folder / "snapshot.json")   # the rings alone: no live view to stand in for the cut one
    whole = analyzed(folder)[1]
    before = run_cli("dump", folder, "--json").stdout
    n = slots_written(folder / RING)
    cut(folder / RING, 4096 + 64 * (n + 3))
    rc, doc, said = analyzed(folder)
    assert (rc == 1 and doc["culprits"] == whole["culprits"]
            and doc["findings"][0]["kind"] == whole["findings"][0]["kind"])
    w = damaged(doc)[RING]
    assert w["rank"] == 3 and f"cut short ({4096 + 64 * (n + 3)} of 69632 bytes)" in w["reason"]
    assert (w["message"].endswith("every slot it had written is read")
            and said == [f"colltrace: warning: {w['message']}"])
    dumped = run_cli("dump", folder, "--json")
    assert dumped.returncode == 0 and dumped.stdout == before   # nothing recorded is lost
    assert dumped.stderr == f"colltrace: warning: {w['message']}\n"


def test_a_ring_cut_before_its_newest_slots_makes_that_rank_unreadable_not_stuck(folder):
    """Where the rank last was is lost: it is judged unreadable (never stuck at its last readable
    record), the others as they are, and the warning says so."""
    os.unlink(folder / "snapshot.json")
    cut(folder / RING, 4096 + 64)
    rc, doc, said = analyzed(folder)
    assert rc == 1
    (f,) = doc["findings"]
    assert f["ranks"]["3"]["state"] == "unreadable" and {f["ranks"][r]["state"] for r in "012"} == {"waiting"}
    w = damaged(doc)[RING]
    assert "1 of its 1024 slots are there" in w["reason"] and w["message"].endswith("rank 3 is judged unreadable")
    assert said == [f"colltrace: warning: {w['message']}"]


def test_a_ring_whose_header_is_cut_names_its_reason(folder):
    cut(folder / RING, 100)
    rc, doc, said = analyzed(folder)
    assert rc == 1 and doc["culprits"] == [0, 1, 2]   # the live view (snapshot.json) stands in for rank 3
    w = damaged(doc)[RING]
    assert w["reason"] == "too short to be a colltrace ring (100 bytes, its header alone is 4096)"
    assert said == [f"colltrace: warning: {w['message']}"]


def test_a_definitions_file_cut_mid_line_is_named_and_the_live_view_stands_in(folder):
    path = folder / "rank-00003.defs.jsonl"
    cut(path, 1000)
    rc, doc, said = analyzed(folder)
    assert rc == 1 and doc["culprits"] == [0, 1, 2]
    w = damaged(doc)["rank-00003.defs.jsonl"]
    assert "its last line is cut short" in w["reason"] and w["message"].endswith("rank 3 is judged unreadable")


def test_findings_jsonl_cut_mid_line_is_named_and_its_whole_lines_kept(folder):
    from colltrace.tracefile import damage

    with open(folder / "findings.jsonl") as f:
        line = f.readline()
    with open(folder / "findings.jsonl", "w") as f:
        f.write(line + line[:200])   # a second finding cut as it was written
    rc, doc, said = analyzed(folder)
    assert rc == 1 and doc["culprits"] == [0, 1, 2]
    w = damaged(doc)["findings.jsonl"]
    assert w["reason"] == "its last line is cut short (200 bytes, no line end)"
    assert (w["message"].endswith("the 1 complete line before it is read")
            and said == [f"colltrace: warning: {w['message']}"])
    kept, _ = damage.recorded_findings(str(folder))
    assert [f["key"] for f in kept] == [json.loads(line)["key"]]


def test_nothing_readable_is_exit_2_in_one_line(folder):
    for name in os.listdir(folder):
        if name.endswith(".ring"):
            cut(folder / name, 100)
    cut(folder / "snapshot.json", 10)
    out = run_cli("analyze", folder)
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith(f"colltrace: error: {folder}: nothing readable, every file is damaged (snapshot.json, ")
    assert line.endswith("rank-00000.ring: too short to be a colltrace ring (100 bytes, its header alone is 4096)")


def test_a_folder_colltrace_ended_is_judged_as_of_the_finding_it_acted_on(folder):
    """After COLLTRACE_ON_HANG=abort the ranks waited on only until colltrace ended them: that is
    its doing. The folder is judged when the live watchdog judged it (ended-<host>.json names the
    finding, findings.jsonl its time), so `analyze` says the waits the live paragraph said."""
    with open(folder / "findings.jsonl") as f:
        live = json.loads(f.readline())
    judged_later = analyzed(folder)[1]["findings"][0]
    assert judged_later["waited_s"] > live["waited_s"]   # without the ending: to the last thing seen
    pids = {}
    for r in range(4):
        with open(folder / f"rank-{r:05d}.defs.jsonl") as f:
            pids[str(r)] = next(d for d in map(json.loads, f) if d.get("k") == "meta")["pid"]
    (folder / "ended-vm.json").write_text(json.dumps({
        "by": "colltrace", "action": "abort", "why": "deadlock", "finding": live["key"],
        "at": live["detected_at"] + 0.3, "host": "vm", "ranks": pids}))
    rc, doc, said = analyzed(folder)
    (f,) = doc["findings"]
    assert (rc == 1 and f["key"] == live["key"]
            and (f["detected_at"], f["waited_s"]) == (live["detected_at"], live["waited_s"]))
    assert "(the longest has waited 0.6 s)" in live["summary"] and "(the longest has waited 0.6 s)" in f["summary"]


def test_a_ring_read_while_its_copy_arrives_is_read_again_whole(folder):
    """A reader that follows a folder as it is copied (the dashboard) sees a ring cut short, then
    whole: it reads it again, and loses nothing of what came later."""
    from colltrace.tracefile import reader

    with open(folder / RING, "rb") as f:
        whole = f.read()
    cut(folder / RING, 4096 + 64)
    tr = reader.RankTrace(str(folder), 3, window=None)
    tr.poll()
    assert tr.ring.cut and tr.ring.newest_lost and len(tr.all_records()) <= 1
    with open(folder / RING, "ab") as f:   # the rest of the copy arrives, in place
        f.write(whole[4096 + 64:])
    tr.poll()
    fresh = reader.RankTrace(str(folder), 3, window=None)
    fresh.poll()
    assert tr.ring.cut is None and not tr.ring.newest_lost
    assert tr.all_records() == fresh.all_records() and len(tr.all_records()) == 3

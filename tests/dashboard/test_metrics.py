"""/metrics scraped and parsed with prometheus-client's own parser."""
from __future__ import annotations

import copy
from collections import Counter

from fastapi.testclient import TestClient

from colltrace.model.finding import Stall
from colltrace.tracefile import reader
from colltrace_dashboard.app import create_app
from colltrace_dashboard.feed import Feed
from colltrace_dashboard.sources import FolderSource, Reading
from helpers.dashboard import StaticSource, scrape, synthetic_snapshot


def test_metrics_of_a_recorded_deadlock(recorded):
    with TestClient(create_app(FolderSource(recorded["deadlock"]))) as c:
        r = c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    m = scrape(r.text)
    assert all(name.startswith("colltrace_") for name in m)
    # every record of every rank, by group and op, as `colltrace dump` reads them
    expected = Counter()
    for tr in reader.load_traces(recorded["deadlock"]):
        for rec in tr.all_records():
            expected[(rec["group"], rec["op"])] += rec["count"] if rec["op"] == "untraced" else 1
    got = {(dict(k)["group"], dict(k)["op"]): v for k, v in m["colltrace_collectives_total"].items()}
    assert got == dict(expected)
    assert m["colltrace_findings_total"] == {frozenset({("kind", "deadlock")}): 1.0}
    assert m["colltrace_hang_suspected"] == {frozenset(): 1.0}
    assert set(m["colltrace_rank_alive"].values()) == {0.0}          # all ended by the abort
    assert m["colltrace_collectives_in_flight"][frozenset({("group", "0")})] == 3.0   # ranks 0-2 in the barrier
    assert m["colltrace_collectives_in_flight"][frozenset({("group", "2")})] == 1.0   # rank 3 in its gather
    assert m["colltrace_group_last_seq"][frozenset({("group", "0"), ("stage", "entered")})] == 3.0
    done = sum(1 for tr in reader.load_traces(recorded["deadlock"]) for rec in tr.all_records()
               if rec["state"] == "completed" and rec["op"] != "untraced")
    assert sum(m["colltrace_collective_duration_seconds_count"].values()) == done
    for tr in reader.load_traces(recorded["deadlock"]):
        last = max(t for rec in tr.all_records() for t in (rec["entered_at"], rec["returned_at"], rec["completed_at"])
                   if t)
        assert abs(m["colltrace_rank_last_progress_timestamp_seconds"][frozenset({("rank", str(tr.rank))})]
                   - last) < 1e-3


def _reading(snap, findings=()):
    return Reading(snap, list(findings), snap["taken_at"], "live")


def test_counters_count_each_record_and_finding_once():
    """Snapshots overlap (a sliding window of recent records): counters must not count twice."""
    snap = synthetic_snapshot(8, hang=False)
    first = copy.deepcopy(snap)
    for e in first["ranks"].values():
        e["records"] = e["records"][:40]                  # the window at the first read
    later = copy.deepcopy(snap)
    for e in later["ranks"].values():
        e["records"] = e["records"][20:]                  # later: the oldest 20 left the window
    finding = Stall(key="stall:0:7")
    feed = Feed(StaticSource(_reading(first, [finding]), _reading(later, [finding]), _reading(later)))
    for _ in range(4):
        feed.refresh()
    m = scrape(feed.metrics.text().decode())
    every = sum(1 for e in snap["ranks"].values() for r in e["records"])
    assert sum(m["colltrace_collectives_total"].values()) == every
    assert m["colltrace_findings_total"] == {frozenset({("kind", "stall")}): 1.0}
    assert m["colltrace_hang_suspected"] == {frozenset(): 0.0}   # the last reading has no finding


def test_a_failing_source_is_visible_and_keeps_the_last_values(tmp_path):
    feed = Feed(FolderSource(str(tmp_path / "gone")))
    feed.refresh()
    m = scrape(feed.metrics.text().decode())
    assert m["colltrace_source_up"] == {frozenset(): 0.0}
    assert feed.current()[1].endswith("no such folder")

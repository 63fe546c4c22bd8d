"""Who makes everyone wait, on the dashboard: the panel (page and /api/view) and the metrics."""
from __future__ import annotations

import copy

from fastapi.testclient import TestClient

from colltrace_dashboard.app import create_app
from colltrace_dashboard.feed import Feed
from colltrace_dashboard.sources import Reading
from helpers.dashboard import StaticSource, scrape

LOAD = {"file": "/job/train.py", "line": 88, "func": "load_batch", "origin": "user"}


def late_job(steps=150, late_rank=2, lag=0.04, step_s=0.1, world=4):
    t0 = 1000.0
    ranks = {}
    for r in range(world):
        records = [{"id": s, "rank": r, "group": "0", "seq": s + 1, "op": "all_reduce", "p2p": False,
                    "state": "completed", "entered_at": t0 + s * step_s + (lag if r == late_rank else 0.001 * r),
                    "returned_at": t0 + s * step_s + lag + 0.002, "completed_at": t0 + s * step_s + lag + 0.002,
                    "frames": [LOAD]} for s in range(steps)]
        ranks[str(r)] = {"rank": r, "status": "alive", "pid": 100 + r, "heartbeat": t0 + steps * step_s,
                         "progress": {"0": {"entered": steps, "completed": steps}}, "records": records}
    return {"groups": {"0": {"name": "0", "desc": "default_pg", "ranks": list(range(world))}}, "ranks": ranks,
            "taken_at": t0 + steps * step_s + 0.05}


def reading(snap):
    return Reading(snap, [], snap["taken_at"], "live")


def test_the_late_rank_is_in_the_panel_with_its_line_and_lags():
    with TestClient(create_app(StaticSource(reading(late_job())))) as c:
        view = c.get("/api/view").json()
        page = c.get("/").text
    st = view["stragglers"]
    [row] = st["rows"]
    assert row["rank"] == 2 and row["collectives"] == 150 and row["of"] == 150
    assert 38 <= row["lag_ms"] <= 42 and row["where"] == "train.py:88 (load_batch)"
    [lags] = st["lags"]
    assert lags["rank"] == 2 and len(lags["cells"]) == 120          # the latest 120 collectives
    assert all(38 <= ms <= 42 and shade == 3 for ms, shade in lags["cells"])   # 30-100 ms: class b3
    assert "Who makes everyone wait" in page and "train.py:88 (load_batch)" in page
    assert page.count('class="lag b3"') == 120


def test_an_even_job_shows_nobody():
    with TestClient(create_app(StaticSource(reading(late_job(lag=0.0))))) as c:
        view = c.get("/api/view").json()
        page = c.get("/").text
    assert view["stragglers"]["rows"] == []
    assert 'id="straggler-none" class="more">Nobody stands out.' in page




def test_wait_caused_and_arrival_lags_are_counted_once_per_collective():
    snap = late_job()
    first = copy.deepcopy(snap)
    for e in first["ranks"].values():
        e["records"] = e["records"][:100]
    later = copy.deepcopy(snap)
    for e in later["ranks"].values():
        e["records"] = e["records"][50:]                   # overlapping windows, as a live job's reads are
    first["taken_at"] -= 5.0
    feed = Feed(StaticSource(reading(first), reading(later), reading(later)))
    for _ in range(3):
        feed.refresh()
    m = scrape(feed.metrics.text().decode())
    caused = m["colltrace_wait_caused_seconds_total"]
    assert set(caused) == {frozenset({("rank", "2")})}
    # 150 collectives, rank 2 behind the three others each time: 40, 39 and 37 ms (ranks 0, 1 and 3)
    assert abs(caused[frozenset({("rank", "2")})] - 150 * (0.040 + 0.039 + 0.037)) < 0.01
    counts = {dict(k)["rank"]: v for k, v in m["colltrace_arrival_lag_seconds_count"].items()}
    assert counts == {"0": 150, "1": 150, "2": 150, "3": 150}
    under_50ms = {dict(k)["rank"]: v for k, v in m["colltrace_arrival_lag_seconds_bucket"].items()
                  if dict(k)["le"] == "0.02"}
    assert under_50ms == {"0": 150, "1": 150, "2": 0, "3": 150}

"""The store source on a real c10d TCPStore: nothing there yet, a job's summaries, a job whose
watchdogs stopped publishing, a store that went away."""
from __future__ import annotations

import time

import pytest

from colltrace.host import storelink
from colltrace.model.finding import Stall
from colltrace_dashboard.sources import SourceError, StoreSource
from helpers.dashboard import synthetic_snapshot


@pytest.fixture
def store():
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def publish(port: int, t: float) -> None:
    """What one node's watchdog writes: a summary of its ranks, and the leader's findings."""
    snap = synthetic_snapshot(8)
    link = storelink.StoreLink("127.0.0.1", port)
    link.publish_node({"host": "node0", "t": t, "groups": snap["groups"], "ranks": snap["ranks"]}, confirm=True)
    link.publish_findings([Stall(key="stall:0:1", summary="reported by the leader")])


def test_empty_store_then_a_jobs_state(store):
    source = StoreSource(f"127.0.0.1:{store.port}", stall_s=30)
    with pytest.raises(SourceError, match="holds no colltrace state yet"):
        source.read()
    publish(store.port, time.time())
    reading = source.read()
    assert reading.mode == "live" and reading.note is None
    assert sorted(map(int, reading.snap["ranks"])) == list(range(8))
    assert [f.kind for f in reading.findings] == ["stall"]         # analyzed here, from the summaries
    assert [f.summary for f in reading.reported] == ["reported by the leader"]


def test_watchdogs_that_stopped_publishing_are_noted(store):
    publish(store.port, time.time() - 60)
    reading = StoreSource(f"127.0.0.1:{store.port}").read()
    assert "last published 60 s ago" in reading.note


def test_a_store_that_goes_away_keeps_the_last_state(store, monkeypatch):
    publish(store.port, time.time())
    source = StoreSource(f"127.0.0.1:{store.port}")
    first = source.read()

    def gone(*a, **k):
        raise storelink.StoreError(f"store at 127.0.0.1:{store.port}: Connection reset by peer")

    monkeypatch.setattr(source._link, "node_summaries", gone)
    later = source.read()
    assert later.snap is first.snap and "Connection reset by peer" in later.note
    assert "showing the state last read at" in later.note


def test_unreachable_store_is_one_line():
    source = StoreSource("127.0.0.1:1", timeout_s=1)
    with pytest.raises(SourceError, match="cannot reach the job's store at 127.0.0.1:1"):
        source.read()

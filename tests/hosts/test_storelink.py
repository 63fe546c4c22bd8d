"""Node summaries through a real c10d TCPStore, as the watchdogs use it."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from colltrace.host import storelink


@pytest.fixture
def store():
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def summary(host, ranks):
    return {"host": host, "t": 1.0, "groups": {"0": {"name": "0", "desc": "default_pg", "ranks": [0, 1, 2, 3]}},
            "ranks": {str(r): {"rank": r, "status": "alive", "records": [], "progress": {"0": {"entered": 3}}}
                      for r in ranks}}


def test_leader_reads_every_other_node(store):
    a = storelink.StoreLink("127.0.0.1", store.port)
    b = storelink.StoreLink("127.0.0.1", store.port)
    a.publish_node(summary("a", [0, 1]), confirm=True)
    b.publish_node(summary("b", [2, 3]), confirm=True)
    b.publish_node(summary("b", [2, 3]), confirm=True)  # republishing reuses the node's key
    others = a.node_summaries(skip=a.node_index)
    assert [s["host"] for s in others] == ["b"] and sorted(others[0]["ranks"]) == ["2", "3"]
    assert len(a.node_summaries()) == 2


def test_a_bad_value_hides_nothing_else(store):
    a = storelink.StoreLink("127.0.0.1", store.port)
    a.publish_node(summary("a", [0]), confirm=True)
    store.add(storelink.PREFIX + "nodes", 1)
    store.set(storelink.PREFIX + "node/2", b"\x00not zlib")
    store.add(storelink.PREFIX + "nodes", 1)     # a node registered, its key not written yet
    assert [s["host"] for s in a.node_summaries()] == ["a"]


def test_hang_and_wanted_stacks_round_trip(store):
    leader = storelink.StoreLink("127.0.0.1", store.port)
    node = storelink.StoreLink("127.0.0.1", store.port)
    assert node.hang_reported() is None and node.wanted_stacks() == set()
    leader.set_wanted_stacks({7, 3})
    leader.report_hang("deadlock")
    # visible to another client as soon as the writes return (c10d's set() alone does not wait:
    # unconfirmed, about one read in ten missed the value here)
    assert node.wanted_stacks() == {3, 7} and node.hang_reported() == "deadlock"
    for i in range(300):   # a key written for the first time, the case a reader misses most
        leader._set(f"{storelink.PREFIX}probe/{i}", b"x")
        assert node._get(f"{storelink.PREFIX}probe/{i}") == b"x", i


def test_dump_from_store_writes_a_snapshot(store, tmp_path):
    storelink.StoreLink("127.0.0.1", store.port).publish_node(summary("a", [0, 1]), confirm=True)
    out = subprocess.run([sys.executable, "-m", "colltrace.cli", "dump", str(tmp_path / "snap"), "--from-store",
                          f"127.0.0.1:{store.port}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "colltrace analyze" in out.stderr   # the next command to type
    snap = json.loads((tmp_path / "snap" / "snapshot.json").read_text())
    assert sorted(snap["ranks"]) == ["0", "1"] and snap["groups"]["0"]["ranks"] == [0, 1, 2, 3]


def test_dump_from_a_store_without_colltrace_state(store, tmp_path):
    out = subprocess.run([sys.executable, "-m", "colltrace.cli", "dump", str(tmp_path), "--from-store",
                          f"127.0.0.1:{store.port}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no colltrace state" in out.stderr


@pytest.mark.parametrize("text", ["nohost", "host:", ":80", "h:99999", "h:x"])
def test_bad_address(text):
    with pytest.raises(storelink.StoreError):
        storelink.parse_address(text)


@pytest.mark.parametrize("env, expected", [
    ({"MASTER_ADDR": "node0", "MASTER_PORT": "29500", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, ("node0", 29500)),
    ({"MASTER_ADDR": "node0", "MASTER_PORT": "29500", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}, None),   # one host
    ({"MASTER_ADDR": "node0", "MASTER_PORT": "29500", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8",
      "COLLTRACE_STORE": "node0:29500"}, ("node0", 29500)),                                                # asked for
    ({"MASTER_ADDR": "node0", "MASTER_PORT": "29500", "COLLTRACE_STORE": "off"}, None),
    ({}, None),
])
def test_which_store_the_watchdogs_meet_in(env, expected):
    assert storelink.address_from_env(env) == expected


@pytest.mark.parametrize("env, told, expected", [
    ({"MASTER_ADDR": "node0", "MASTER_PORT": "29500"}, "node1:4000", ("node1", 4000)),   # the job's own TCPStore
    ({"MASTER_ADDR": "node0", "MASTER_PORT": "29500"}, "off", None),                     # a FileStore or HashStore
    ({"MASTER_ADDR": "node0", "MASTER_PORT": "29500", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}, "node1:4000", None),
    ({"COLLTRACE_STORE": "node2:5000"}, "off", ("node2", 5000)),                          # asked for
])
def test_the_rank_that_starts_the_watchdog_says_which_store_the_job_has(env, told, expected):
    """A stale MASTER_ADDR/MASTER_PORT (an earlier test's) is never the store the watchdogs meet in."""
    assert storelink.address_from_env(env, job_store=told) == expected


def test_a_hung_nodes_summary_is_written_and_decoded_once_its_heartbeats_stay_fresh(store, monkeypatch):
    monkeypatch.setattr(storelink, "BEATS_EVERY_S", 0.0)   # every read takes the beats (the next test: less often)
    node = storelink.StoreLink("127.0.0.1", store.port)
    leader = storelink.StoreLink("127.0.0.1", store.port)
    s = summary("a", [0, 1])
    for t in (1.0, 2.0, 3.0):   # a hung node: only its time and heartbeats move
        s = dict(s, t=t, ranks={r: dict(e, heartbeat=t + 0.5) for r, e in s["ranks"].items()})
        node.publish_node(s, confirm=True)
        (got,) = leader.node_summaries()
        assert got["t"] == t and {e["heartbeat"] for e in got["ranks"].values()} == {t + 0.5}
        assert got["groups"]["0"]["ranks"] == [0, 1, 2, 3]
    assert len(leader._decoded) == 1
    first = leader._decoded[f"{storelink.PREFIX}node/1"][1]
    s["ranks"]["1"]["status"] = "dead"   # a real change is read
    node.publish_node(s, confirm=True)
    (got,) = leader.node_summaries()
    assert got["ranks"]["1"]["status"] == "dead" and leader._decoded[f"{storelink.PREFIX}node/1"][1] is not first


def test_a_reader_takes_the_beats_every_beats_every_s_and_the_summaries_every_round(store, monkeypatch):
    monkeypatch.setattr(storelink, "BEATS_EVERY_S", 0.3)
    node = storelink.StoreLink("127.0.0.1", store.port)
    leader = storelink.StoreLink("127.0.0.1", store.port)
    s = summary("a", [0, 1])
    node.publish_node(dict(s, t=1.0, ranks={r: dict(e, heartbeat=1.5) for r, e in s["ranks"].items()}), confirm=True)
    (got,) = leader.node_summaries()
    assert got["t"] == 1.0 and got["ranks"]["0"]["heartbeat"] == 1.5
    s = dict(s, ranks={r: dict(e, heartbeat=2.5) for r, e in s["ranks"].items()})
    s["ranks"]["1"]["status"] = "dead"
    node.publish_node(dict(s, t=2.0), confirm=True)
    (got,) = leader.node_summaries()   # within BEATS_EVERY_S: the change is read, the beat is the last one read
    assert got["ranks"]["1"]["status"] == "dead" and got["ranks"]["0"]["heartbeat"] == 1.5 and got["t"] == 1.0
    time.sleep(0.35)
    (got,) = leader.node_summaries()
    assert got["t"] == 2.0 and {e["heartbeat"] for e in got["ranks"].values()} == {2.5}


def test_the_leader_meets_on_its_own_server_and_takes_its_one_key_back(store, tmp_path):
    """The job's store gets one key (the leader's address) and loses it at the end; the state
    lives on the leader's server, where `dump --from-store JOB_STORE` and the dashboard find it."""
    from colltrace.host import meeting

    before = sorted(store.list_keys())
    mp = meeting.MeetingPoint("127.0.0.1", store.port)
    mp.announce()
    assert sorted(store.list_keys()) == sorted(before + [meeting.LEADER_KEY])
    assert meeting.find_leader("127.0.0.1", store.port) == mp.address
    storelink.StoreLink(*meeting.find_leader("127.0.0.1", store.port)).publish_node(summary("b", [2, 3]), confirm=True)
    storelink.StoreLink(*mp.address).publish_node(summary("a", [0, 1]), confirm=True)
    assert sorted(store.list_keys()) == sorted(before + [meeting.LEADER_KEY])
    out = subprocess.run([sys.executable, "-m", "colltrace.cli", "dump", str(tmp_path / "snap"), "--from-store",
                          f"127.0.0.1:{store.port}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    snap = json.loads((tmp_path / "snap" / "snapshot.json").read_text())
    assert sorted(snap["ranks"]) == ["0", "1", "2", "3"]
    mp.withdraw()
    assert sorted(store.list_keys()) == before and store.num_keys() == len(before)

"""Calls that synchronize ranks without being collectives (colltrace/rank/setup.py): group creation,
init_process_group's rendezvous, store waits. The analyzer on synthetic snapshots of them (as
tests/unit/test_analysis.py builds them), the recorder's records of them without torch, and a
torchrun worker's trace from its interpreter's start."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from colltrace import config
from colltrace.rank import early, setup
from colltrace.rank.recorder import Recorder
from colltrace.tracefile import reader
from helpers import environ
from helpers.synthetic import STALL, SyntheticJob, T, analyze, frames, only


def made(job: SyntheticJob, ranks, seq, op="new_group", state="completed", members=None, group="setup", backend_op=None,
         detail=None, at="setup.py:12", func="make_groups", t=None):
    """A group creation (or store wait) record as rank/setup.py writes it."""
    job.op(ranks, group, seq, op, state, at=at, func=func, t=t, backend_op=backend_op or op)
    for r in [ranks] if isinstance(ranks, int) else ranks:
        rec = job.entries[r]["records"][-1] if job.entries[r]["records"][-1]["seq"] == seq else next(
            x for x in job.entries[r]["records"] if x["group"] == group and x["seq"] == seq)
        rec.update(setup=True, shapes=[], dtypes=[])
        if members is not None:
            rec["members"] = list(members)
        if detail is not None:
            rec["detail"] = detail
    return job


def job_of(n: int, **groups) -> SyntheticJob:
    job = SyntheticJob(n)
    job.groups["setup"] = {"name": "setup", "desc": "group creation: every rank of the job", "ranks": list(range(n))}
    for name, g in groups.items():
        job.groups[name] = g
    made(job, range(n), 1, "init_process_group", at="train.py:5", func="main")
    return job


# -- the analyzer ------------------------------------------------------------------------------
def test_a_member_that_never_makes_the_group_is_a_stall_past_the_threshold_only():
    """The issue's shape: ranks 0-2 wait in new_group(range(4)); rank 3 serves instead."""
    job = job_of(4)
    made(job, range(3), 2, state="waiting", t=T)
    job.set(3, stack=frames("serve.py:40", "serve")[:2])
    assert analyze(job.snap(), STALL, T + 5) == []   # still arriving, as far as anyone can tell
    f = only(analyze(job.snap(), STALL, T + 31), "stall")
    assert (f.group["name"], f.seq, f.missing_ranks) == ("setup", 2, [3])
    assert f.summary.startswith("Stall: ranks 0-2 have waited 31.0 s in new_group #2 (ranks 0-3) at setup.py:12")
    assert "for rank 3, which has not entered it" in f.summary and "serve.py:40 (serve)" in f.summary
    assert "never reaches new_group #2 (ranks 0-3)" in f.advice


def test_a_rank_that_never_reached_init_process_group_is_named_where_it_is():
    job = SyntheticJob(2)
    job.groups["setup"] = {"name": "setup", "desc": "", "ranks": [0, 1]}
    made(job, 0, 1, "init_process_group", state="waiting", at="train.py:5", func="main", t=T)
    job.set(1, stack=frames("data.py:7", "load")[:2])   # a trace, no record: seen since its start
    assert analyze(job.snap(), STALL, T + 20) == []
    f = only(analyze(job.snap(), STALL, T + 31), "stall")
    assert (f.seq, f.missing_ranks) == (1, [1]) and "in init_process_group #1 (ranks 0-1)" in f.summary
    assert "data.py:7 (load)" in f.summary


def test_ranks_that_make_different_groups_at_one_number_are_a_mismatch_at_once():
    """Rank 1, no member, skipped new_group([0]) and made the next one: certain, no threshold."""
    job = job_of(2)
    made(job, 0, 2, members=[0], at="setup.py:20", func="solo", t=T - 1)
    made(job, 0, 3, state="waiting", at="setup.py:21", func="pair", t=T)
    made(job, 1, 2, state="waiting", at="setup.py:21", func="pair", t=T)
    f = only(analyze(job.snap(), STALL, T + 1), "mismatch")
    assert (f.group["name"], f.seq, f.differs) == ("setup", 2, ["members"])
    assert [(c["ranks"], c["members"]) for c in f.classes] == [([0], [0]), ([1], None)]
    assert f.summary.startswith("Mismatch: group creation #2 of the job is not the same call on every rank: "
                                "rank 0 called new_group of rank 0 at setup.py:20 (solo); rank 1 called new_group of "
                                "every rank at setup.py:21 (pair). They differ in the ranks asked for.")


def test_where_the_ranks_parted_both_calls_returned_and_the_wait_is_later():
    """Rank 0 made a mesh of itself (#2, returned); rank 1 made new_group(ranks 0-1) there and
    returned too (gloo read the other group's keys), then exited: rank 0 waits in #3 for it. One
    finding, at the number where they parted: the exit is its consequence."""
    job = job_of(2)
    made(job, 0, 2, "DeviceMesh", members=[0], backend_op="new_group", at="mesh.py:8", func="build", t=T - 2)
    made(job, 0, 3, state="waiting", at="setup.py:21", func="pair", t=T)
    made(job, 1, 2, at="setup.py:21", func="pair", t=T - 1)
    job.set(1, status="exited", exit={"code": 0}, died_at=T + .5)
    f = only(analyze(job.snap(), STALL, T + 1), "mismatch")
    assert f.seq == 2 and [(c["op"], c["backend_op"]) for c in f.classes] == [("DeviceMesh", "new_group"),
                                                                            ("new_group", "new_group")]
    assert "rank 0 called DeviceMesh (its new_group of rank 0) at mesh.py:8 (build)" in f.summary


def test_each_rank_making_a_group_of_itself_alone_is_no_mismatch():
    """new_group(ranks=[get_rank()]) on every rank (Megatron's single-rank groups): no two collide."""
    job = job_of(3)
    for r in range(3):
        made(job, r, 2, members=[r], state="waiting", t=T)
    assert analyze(job.snap(), STALL, T + 1) == []


def test_a_local_group_waits_for_its_members_alone():
    """new_group([0, 1], use_local_synchronization=True): rank 2 never makes it and is not waited for."""
    job = job_of(3, **{"setup:0-1": {"name": "setup:0-1", "desc": "", "ranks": [0, 1]}})
    made(job, 0, 1, group="setup:0-1", members=[0, 1], state="waiting", t=T)
    job.set(1, stack=frames("eval.py:3", "evaluate")[:2])
    f = only(analyze(job.snap(), STALL, T + 31), "stall")
    assert f.missing_ranks == [1] and "new_group #1 among ranks 0-1 alone (ranks 0-1)" in f.summary


def test_a_group_creation_and_a_collective_waiting_on_each_other_are_a_deadlock_at_once():
    job = job_of(2)
    made(job, 0, 2, members=[0, 1], state="waiting", t=T)
    job.op(1, "0", 1, "barrier", "waiting", at="ckpt.py:30", func="save", t=T)
    f = only(analyze(job.snap(), STALL, T + 1), "deadlock")
    assert f.summary.startswith("Deadlock across group 0 and group creation #2 of the job: ")
    assert "new_group #2 (ranks 0-1) at setup.py:12" in f.summary


def store_job(get_at: float, barrier_at: float) -> SyntheticJob:
    job = job_of(2, **{"store:ready": {"name": "store:ready", "desc": "", "ranks": [0, 1], "any_of": True}})
    made(job, 0, 1, "store.get", group="store:ready", backend_op="store_wait", detail="ready", state="waiting",
         at="sync.py:9", func="wait_ready", t=get_at)
    job.op(1, "0", 1, "barrier", "waiting", at="ckpt.py:30", func="save", t=barrier_at)
    return job


def test_a_store_wait_is_one_stall_past_the_threshold_with_the_wait_on_its_rank():
    """Rank 0 waits for a key nobody sets; rank 1 waits for rank 0 in a barrier (a moment earlier):
    any rank might still set the key, so no cycle is certain; past the threshold one finding, the
    store wait's, not the barrier's."""
    job = store_job(get_at=T, barrier_at=T - 1)
    assert analyze(job.snap(), STALL, T + 1) == []
    assert analyze(job.snap(), STALL, T + 29.5) == []   # the barrier, past the threshold, waits on the store wait
    f = only(analyze(job.snap(), STALL, T + 30.5), "stall")
    assert f.key == "stall:store:ready:1"
    assert f.summary.startswith("Stall: rank 0 has waited 30.5 s in store.get('ready') on the job's store at "
                                "sync.py:9 (wait_ready) for a key no rank has set. Rank 1 is in barrier #1 on group 0")
    assert f.look_first["reason"] == "store_key" and "which rank was to set it" in f.advice


def test_a_wait_behind_a_young_store_wait_is_named_by_itself_past_twice_the_threshold():
    job = store_job(get_at=T + 50, barrier_at=T)
    assert analyze(job.snap(), STALL, T + 55) == []
    f = only(analyze(job.snap(), STALL, T + 61), "stall")
    assert f.group["name"] == "0"


# -- the recorder, without torch -----------------------------------------------------------------
class FakeStore:
    """A store: get() waits until its key is set (by another thread), or until its timeout."""

    def __init__(self, timeout=5.0):
        self.keys, self.timeout = {}, timeout

    def get(self, key):
        end = time.time() + self.timeout
        while key not in self.keys:
            if time.time() > end:
                raise RuntimeError(f"Timeout waiting for key {key}")
            time.sleep(0.01)
        return self.keys[key]


class OtherStore(FakeStore):
    pass


@pytest.fixture
def rec(tmp_path, monkeypatch):
    settings = config.load({"COLLTRACE": "1", "COLLTRACE_DIR": str(tmp_path), "COLLTRACE_POLL_S": "0.02",
                            "COLLTRACE_STALL_S": "0.4"})
    r = Recorder(settings, rank=1, world_size=4, backend="")
    r.lasting = setup.lasting
    r.store_id = "FakeStore"   # identity.store_id of a FakeStore: its type's name
    state = {"init": False}
    c10d = SimpleNamespace(is_initialized=lambda: state["init"], get_world_size=lambda: 4, get_rank=lambda: 1,
                           _world=SimpleNamespace(default_pg=None), state=state)
    monkeypatch.setattr(setup, "_c10d", c10d)
    monkeypatch.setattr(setup, "_shim", SimpleNamespace(recorder=r))
    yield r
    r.close()


def records(rec) -> list[tuple]:
    tr = reader.RankTrace(rec.settings.dir, rec.rank)
    tr.poll()
    return [(r["group"], r["seq"], r["op"], r["backend_op"], r.get("members"), r["state"]) for r in tr.all_records()]


def test_group_creations_are_numbered_per_rank_with_what_they_ask_for(rec):
    given = []

    def new_group(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization=False):
        given.append(list(ranks))
        return "pg"

    def init_process_group(backend=None, world_size=-1, rank=-1, store=None):
        rec_c10d.state["init"] = True

    rec_c10d = setup._c10d
    wrapped = setup._make_new_group(new_group)
    init = setup.wrap_init(init_process_group, lambda a, k: rec, lambda: None)
    wrapped([0, 1])           # before init_process_group: torch's error, nothing of colltrace's
    # init_device_mesh without a default group makes it, then its groups
    setup._make_api(lambda: (init("gloo"), wrapped([0, 1])), "init_device_mesh")()
    wrapped(iter(range(4)))   # an iterator: torch reads it, colltrace does not
    wrapped(list(range(4)))   # every rank of the job: asked for as None
    wrapped([1, 2], use_local_synchronization=True)
    wrapped([2, 3], use_local_synchronization=True)   # not a member: torch returns at once, nothing recorded
    assert records(rec) == [
        ("setup", 1, "init_process_group", "init_process_group", None, "completed"),
        ("setup", 2, "init_device_mesh", "new_group", [0, 1], "completed"),
        ("setup", 3, "new_group", "new_group", None, "completed"),
        ("setup", 4, "new_group", "new_group", None, "completed"),
        ("setup:1-2", 1, "new_group", "new_group", [1, 2], "completed")]
    tr = reader.RankTrace(rec.settings.dir, rec.rank)
    tr.poll()
    assert tr.all_records()[2]["detail"] == "ranks: range_iterator" and not rec.disabled
    assert given[2] == [0, 1, 2, 3]   # the iterator reached torch whole


def test_a_split_and_a_store_based_barrier_of_the_job_are_its_group_creations(rec):
    """split_group of the default group: every rank of the job enters it, its split compared; a
    direct _store_based_barrier of every rank too (one of some ranks is left to the store waits)."""
    setup._c10d.state["init"] = True

    def split_group(parent_pg=None, split_ranks=None, timeout=None, pg_options=None, group_desc=None):
        return None

    def _store_based_barrier(rank, store, group_name, rendezvous_count, timeout):
        return None

    split = setup._make_split_group(split_group)
    barrier = setup._make_store_barrier(_store_based_barrier)
    split(split_ranks=[[0, 1], [2, 3]])
    barrier(1, None, "ckpt", 4, None)
    barrier(1, None, "pair", 2, None)
    tr = reader.RankTrace(rec.settings.dir, rec.rank)
    tr.poll()
    assert [(r["group"], r["seq"], r["op"], r.get("detail")) for r in tr.all_records()] == [
        ("setup", 1, "split_group", "[[0, 1], [2, 3]]"), ("setup", 2, "_store_based_barrier", "ckpt")]


def test_only_store_waits_that_last_on_the_jobs_store_are_recorded(rec):
    store, other = FakeStore(), OtherStore()
    get = setup._make_store_wait(FakeStore.get, "store.get")
    store.keys["now"] = b"1"
    assert get(store, "now") == b"1"   # at once: nothing written
    threading.Timer(0.6, lambda: store.keys.__setitem__("later", b"2")).start()
    t0 = time.time()
    assert get(store, "later") == b"2"   # lasted past lasting_s (0.2 s here): recorded from its start
    threading.Timer(0.6, lambda: other.keys.__setitem__("x", b"3")).start()
    assert get(other, "x") == b"3"       # another store than the job's: not recorded
    store.timeout = 0.5
    with pytest.raises(RuntimeError, match="Timeout"):
        get(store, "never")
    time.sleep(0.1)
    tr = reader.RankTrace(rec.settings.dir, rec.rank)
    tr.poll()
    got = [(r["group"], r["seq"], r["op"], r.get("detail"), r["state"]) for r in tr.all_records()]
    assert got == [("store:later", 1, "store.get", "later", "completed"),
                   ("store:never", 1, "store.get", "never", "failed")]
    later = tr.all_records()[0]
    assert abs(later["entered_at"] - t0) < 0.05 and later["frames"][-1]["func"].startswith("test_only_store_waits")
    assert "Timeout waiting for key never" in tr.all_records()[1]["error"]
    assert tr.groups and any(g.get("any_of") for g in tr.groups.values())


# -- a torchrun worker, from its interpreter's start ------------------------------------------------
def test_torchrun_rank_reads_torchruns_environment():
    env = {"TORCHELASTIC_RUN_ID": "r", "RANK": "3", "WORLD_SIZE": "4"}
    assert early.torchrun_rank(env) == (3, 4)
    assert early.torchrun_rank(dict(env, RANK="4")) is None and early.torchrun_rank(dict(env, RANK="")) is None
    assert early.torchrun_rank({"RANK": "0", "WORLD_SIZE": "2"}) is None   # not torchrun's: from init_process_group on


CHILD = """import subprocess, sys
from colltrace.rank import early
print("parent", early.recorder() is not None, "torch" in sys.modules, flush=True)
subprocess.run([sys.executable, "-c", "import sys; from colltrace.rank import early; "
                "print('child', early.recorder() is not None, flush=True)"], check=True)
"""


def test_a_torchrun_worker_is_traced_from_its_start_without_torch_and_its_children_are_not(tmp_path):
    env = environ.clean("TORCHELASTIC")
    env.update(COLLTRACE="1", COLLTRACE_DIR=str(tmp_path), COLLTRACE_WATCHDOG="off", TORCHELASTIC_RUN_ID="job7",
               RANK="1", WORLD_SIZE="2", MASTER_ADDR="10.0.0.1", MASTER_PORT="29500")
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["parent True False", "child False"]
    with open(tmp_path / "rank-00001.defs.jsonl") as f:
        defs = [json.loads(line) for line in f]
    assert defs[0]["k"] == "meta" and (defs[0]["rank"], defs[0]["world_size"]) == (1, 2)
    assert defs[0]["job"] == "job7@tcp:10.0.0.1:29500"   # what the job's store says once it exists
    assert ({"k": "group", "name": "setup", "ranks": [0, 1]}.items()
            <= next(d for d in defs if d["k"] == "group").items())
    assert [d for d in defs if d["k"] == "exit"]

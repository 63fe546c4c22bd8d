"""Groups made through DeviceMesh and new_subgroups, FSDP2's collectives and torch.compile."""
from __future__ import annotations

import json

import pytest

from colltrace.tracefile import reader
from helpers.jobs import markers, native, user_line

NATIVE = native()


@pytest.fixture(scope="module")
def groups_job(module_gloo_job):
    job = module_gloo_job("groups_and_fsdp.py", 4, env={"COLLTRACE_WATCHDOG": "off"})
    assert job.wait(240) == [0] * 4, job.stderr(0)[-3000:]
    return job


def reported(job, rank):
    line = [out for out in job.stdout(rank).splitlines() if out.startswith("COUNTS ")][-1]
    return json.loads(line[len("COUNTS "):])


def test_each_group_has_one_name_and_its_global_ranks_on_every_member(groups_job):
    traces = reader.load_traces(groups_job.dir)
    seen = {}  # group name -> set of (ranks) as each member recorded it
    for tr in traces:
        truth = reported(groups_job, tr.rank)
        for key in ("dp", "tp", "sub", "world"):
            name = truth["names"][key]
            g = next(g for g in tr.groups.values() if g["name"] == name)
            assert g["ranks"] == truth["groups"][key]["ranks"], (tr.rank, key)
            seen.setdefault(name, set()).add(tuple(g["ranks"]))
    assert all(len(v) == 1 for v in seen.values()), seen
    assert len(seen) == 1 + 2 + 2 + 2   # world, two dp groups, two tp groups, two subgroups


def test_mesh_and_subgroup_collectives_land_on_their_group(groups_job):
    lines = markers("groups_and_fsdp.py")
    for tr in reader.load_traces(groups_job.dir):
        truth = reported(groups_job, tr.rank)["names"]
        got = {user_line(r, "groups_and_fsdp.py"): r for r in tr.all_records()}
        assert got[lines["mesh_dp"]]["group"] == truth["dp"] and got[lines["mesh_dp"]]["seq"] == 1
        assert got[lines["mesh_tp"]]["group"] == truth["tp"]
        assert got[lines["subgroup"]]["group"] == truth["sub"] and got[lines["subgroup"]]["op"] == "barrier"


def test_a_group_of_two_backends_numbers_each_backends_ops_by_its_own_counter(groups_job):
    lines = markers("groups_and_fsdp.py")
    for tr in reader.load_traces(groups_job.dir):
        truth = reported(groups_job, tr.rank)
        name = truth["names"]["mixed"]
        assert {g["name"]: g["backend"] for g in tr.groups.values() if g["name"] in (name, name + ":cpu")} == \
            {name: "sidegloo", name + ":cpu": "gloo"}   # CUDA ops keep the group's name; CPU ops are its "cpu" lane
        got = {user_line(r, "groups_and_fsdp.py"): r for r in tr.all_records() if r["group"].startswith(name)}
        seqs = [(got[lines[k]]["group"], got[lines[k]]["seq"], got[lines[k]]["seq_end"])
                for k in ("mixed_reduce", "mixed_objects", "mixed_barrier")]
        assert seqs == [(name + ":cpu", 1, 1), (name + ":cpu", 2, 3), (name + ":cpu", 4, 4)], seqs
        assert truth["mixed"] == {"cpu": 4, "cuda": 0}    # in step with gloo's own counter
        assert not [r for r in tr.all_records() if r["group"].startswith(name) and r["op"] == "untraced"]


def test_fsdp2_collectives_are_recorded_from_the_training_step(groups_job):
    lines = markers("groups_and_fsdp.py")
    recs = reader.load_traces(groups_job.dir)[0].all_records()
    fsdp = [r for r in recs if r["op"] in ("all_gather_single", "reduce_scatter_single")]
    assert len([r for r in fsdp if r["op"] == "reduce_scatter_single"]) >= 4  # 2 steps x 2 sharded layers
    # the user's own line (forward / backward call) is in each stack
    assert all(user_line(r, "groups_and_fsdp.py") in (lines["fsdp_forward"], lines["fsdp_forward"] + 1) for r in fsdp)


def test_torch_compile_runs_and_its_collective_is_counted_not_lost(groups_job):
    lines = markers("groups_and_fsdp.py")
    for tr in reader.load_traces(groups_job.dir):
        truth = reported(groups_job, tr.rank)
        assert truth["compiled"] == [9.0] * 4        # the compiled function's result is right
        world = [r for r in tr.all_records() if r["group"] == truth["names"]["world"] and not r["p2p"]]
        last = world[-1]
        assert user_line(last, "groups_and_fsdp.py") == lines["after_compile"]
        assert last["seq_end"] == truth["groups"]["world"]["seq"]   # in step with the backend
        if NATIVE:   # torch >= 2.14: the compiled code's all-reduce is a record, from the user's call
            assert world[-2]["op"] == "allreduce" and world[-2]["seq"] == last["seq"] - 1
            assert lines["compiled"] in [f["line"] for f in world[-2]["frames"]
                                         if f["file"].endswith("groups_and_fsdp.py")]
        else:
            assert world[-2]["op"] == "untraced" and world[-2]["count"] == 1

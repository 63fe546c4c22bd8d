"""The exchange's tree on paper (colltrace/host/tree.py): who is whose parent, what a subtree
sends up, which groups the root asks details of, and when it judges. Plain data: no store."""
from __future__ import annotations

from colltrace.host import tree
from colltrace.model.build import suspects
from colltrace.testing import simhosts


def test_every_host_but_the_root_has_one_parent_and_is_its_parents_child():
    hosts, fan = 2048, 32
    seen = set()
    for i in range(2, hosts + 1):
        t = tree.Topology(i, hosts, fan)
        assert i in tree.Topology(t.parent, hosts, fan).children
        seen.add(i)
    assert seen == set(range(2, hosts + 1))
    assert tree.Topology(1, hosts, fan).parent is None
    assert max(tree.Topology(i, hosts, fan).depth for i in range(1, hosts + 1)) == 3   # 2,048 hosts: 3 hops up


def test_torchruns_environment_places_the_host_and_a_job_started_by_hand_joins_the_star():
    env = {"GROUP_RANK": "3", "WORLD_SIZE": "64", "LOCAL_WORLD_SIZE": "8"}
    assert tree.host_index(env) == (4, 8)
    assert tree.host_index({}) is None
    assert tree.host_index({"GROUP_RANK": "x", "WORLD_SIZE": "64", "LOCAL_WORLD_SIZE": "8"}) is None


def _entries(job, index, now):
    return {str(r): job.entry(r, index, now) for r in job.host_ranks(index)}


def test_a_healthy_subtree_sends_vitals_unless_the_root_wants_everything():
    job = simhosts.Job(64, t0=0.0, hang_at=None)
    ranks = _entries(job, 2, now=10.0)
    slim = tree.slim(ranks, tree.want_of({"stacks": [], "groups": [], "all": False}), now=10.0)
    assert all(not tree.detailed(e) for e in slim.values())
    assert all(set(e) <= set(tree.VITAL) | {"vital"} for e in slim.values())
    assert tree.slim(ranks, tree.want_of(None), now=10.0) == ranks   # nothing said: all in full


def test_a_rank_waiting_past_the_suspect_time_goes_up_in_full_before_the_root_asks():
    job = simhosts.Job(64, t0=0.0, hang_at=10.0)
    want = tree.want_of({"stacks": [], "groups": [], "all": False})
    early = tree.slim(_entries(job, 2, now=10.1), want, now=10.1)
    assert all(not tree.detailed(e) for e in early.values()), "a wait this short is any collective's"
    late = tree.slim(_entries(job, 2, now=11.0), want, now=11.0)
    assert all(tree.detailed(e) for e in late.values())


def test_the_root_asks_for_a_stuck_group_at_once_and_forgets_it_once_it_moves():
    job = simhosts.Job(64, t0=0.0, hang_at=10.0)
    s = tree.Suspicion()
    healthy = {"groups": {}, "ranks": {r: tree.vital(e) for i in range(1, 9) for r, e in _entries(job, i, 5.0).items()}}
    assert s.update(healthy, 5.0) == set()
    # vitals alone: a collective entered by some and completed by none must stay unmoved a while
    vitals = {"groups": {}, "ranks": {r: tree.vital(e) for i in range(1, 9) for r, e in _entries(job, i, 11.0).items()}}
    assert s.update(vitals, 11.0) == set()
    assert "0" in s.update(vitals, 11.0 + tree.SUSPECT_AFTER_S)
    # details that already show a long wait: wanted in the same round they arrive
    fresh = tree.Suspicion()
    full = {"groups": {}, "ranks": {r: e for i in range(1, 9) for r, e in _entries(job, i, 11.0).items()}}
    assert {"0", simhosts.PAIR} <= fresh.update(full, 11.0)
    moved = {"groups": {}, "ranks": {r: tree.vital(e) for i in range(1, 9)
                                     for r, e in _entries(simhosts.Job(64, 0.0, None), i, 12.0).items()}}
    assert fresh.update(moved, 12.0) == set()


def test_counted_per_host_the_root_asks_for_what_counting_every_rank_asks_for():
    """The root reuses the tally of a host whose summary did not change (the same ranks table):
    round by round, through the healthy job, the hang and its details, it asks for the same
    groups as counting the merged ranks anew, and a host's changed table is counted again."""
    job = simhosts.Job(64, t0=0.0, hang_at=10.0)
    whole, per_host = tree.Suspicion(), tree.Suspicion()
    tables: dict = {}
    for now in (5.0, 9.9, 10.2, 10.4, 10.8, 11.0, 11.5, 12.0):
        parts = []
        for i in range(1, 9):
            entries = {r: e if now >= 10.8 else tree.vital(e) for r, e in _entries(job, i, now).items()}
            if tables.get(i) != entries:   # a host publishes a new table only when it changed
                tables[i] = entries
            parts.append({"ranks": tables[i]})
        snap = {"groups": {}, "ranks": {r: e for p in parts for r, e in p["ranks"].items()}}
        assert per_host.update(snap, now, parts) == whole.update(snap, now), now
    assert {"0", simhosts.PAIR} <= per_host.groups
    # a rank twice (a lost leader's stale copy): the parts do not add up, the merge is counted
    twice = parts + [{"ranks": {"0": parts[0]["ranks"]["0"]}}]
    assert per_host.update(snap, 12.5, twice) == whole.update(snap, 12.5)


def test_the_root_sums_the_tallies_its_children_send_and_asks_for_what_counting_every_rank_asks_for():
    """Each host sends its count of what it publishes (tree.subtree_tally, over its residues and
    their classes); the root sums those instead of counting every rank it unfolded: round by
    round, through the healthy job, the hang and its details, it asks for the same groups."""
    job = simhosts.Job(64, t0=0.0, hang_at=10.0)
    whole, summed = tree.Suspicion(), tree.Suspicion()
    for now in (5.0, 9.9, 10.2, 10.4, 10.8, 11.0, 11.5, 12.0):
        parts = []
        for i in range(1, 9):
            entries = {r: e if now >= 10.8 else tree.vital(e) for r, e in _entries(job, i, now).items()}
            folded, classes = tree.fold(entries)
            sent = {"ranks": folded, "classes": classes, "tally": tree.subtree_tally(folded, classes)}
            parts.append({"ranks": tree.unfold(sent["ranks"], sent["classes"]), "tally": sent["tally"]})
        snap = {"groups": {}, "ranks": {r: e for p in parts for r, e in p["ranks"].items()}}
        # a root that counted nothing itself: every table's tally is its host's
        counted = [tree.tally_of(p["tally"]) for p in parts]
        assert all(c is not None for c in counted)
        assert counted == [tree._tally(p["ranks"]) for p in parts], now
        assert summed.update(snap, now, parts) == whole.update(snap, now), now
    assert {"0", simhosts.PAIR} <= summed.groups


def test_a_tally_that_is_not_what_a_host_writes_is_counted_again_by_the_root():
    for bad in (None, [], {"hi": {"0": "3"}, "lo": {}, "dead": [], "pending": [], "since": {}},
                {"hi": {}, "lo": {}, "dead": "0", "pending": [], "since": {}}, {"hi": {}}):
        assert tree.tally_of(bad) is None
    ranks = {"0": {"rank": 0, "status": "alive", "progress": {"0": {"entered": 4, "completed": 3}}, "vital": True}}
    s = tree.Suspicion()
    s.update({"groups": {}, "ranks": ranks}, 1.0, [{"ranks": ranks, "tally": {"hi": "x"}}])
    assert s.update({"groups": {}, "ranks": ranks}, 1.6, [{"ranks": ranks, "tally": {"hi": "x"}}]) == {"0"}


def test_the_root_judges_only_when_every_member_of_a_wanted_group_is_in_full():
    job = simhosts.Job(16, t0=0.0, hang_at=10.0)
    groups = {**job.groups(1), **job.groups(2)}
    full = {r: e for i in (1, 2) for r, e in _entries(job, i, 11.0).items()}
    part = dict(full, **{"9": tree.vital(full["9"])})
    assert tree.judged({"groups": groups, "ranks": part}, {"0"}, now=11.0) is None
    got = tree.judged({"groups": groups, "ranks": full}, {"0"}, now=11.0)
    assert set(got["ranks"]) == set(full)
    # a member whose host stopped publishing long ago is judged dead, its host named
    gone = dict(part, **{"9": dict(tree.vital(full["9"]), heartbeat=11.0 - tree.HOST_LOST_S - 1)})
    got = tree.judged({"groups": groups, "ranks": gone}, {"0"}, now=11.0)
    assert got["ranks"]["9"]["status"] == "dead" and "node2" in got["ranks"]["9"]["exit"]["note"]


def test_on_a_job_whose_hosts_all_publish_slowly_only_the_host_that_stopped_is_lost():
    """Loaded machines: every host's beats are about 4 s old (its watchdog's rounds come slowly),
    which a fixed HOST_LOST_S of 5 s would take, now and then, for lost hosts; the one host that
    stopped publishing 30 s ago is still judged lost, and only its ranks."""
    job = simhosts.Job(64, t0=0.0, hang_at=10.0)
    groups, ranks = {}, {}
    for i in range(1, 9):
        groups.update(job.groups(i))
        for r, e in _entries(job, i, 50.0).items():
            ranks[r] = dict(tree.vital(e) if i in (3, 8) else e, heartbeat=50.0 - 3.0 - 0.25 * (int(r) % 8))
    slow = {"groups": groups, "ranks": ranks}
    assert tree.lost_after(slow, 50.0) > 12.0
    assert tree.judged(slow, {"0"}, now=50.0) is None   # hosts 3 and 8: slow, not lost: wait for them
    for r in job.host_ranks(8):
        ranks[str(r)] = dict(ranks[str(r)], heartbeat=20.0)
    for r in job.host_ranks(3):
        ranks[str(r)] = dict(_entries(job, 3, 50.0)[str(r)], heartbeat=47.0)   # its details came
    got = tree.judged(slow, {"0"}, now=50.0)
    dead = sorted(int(r) for r, e in got["ranks"].items() if e["status"] == "dead")
    assert dead == job.host_ranks(8)
    # a healthy job's beats are fresh: the threshold stays HOST_LOST_S
    fresh = {"groups": groups, "ranks": {r: dict(e, heartbeat=49.9) for r, e in ranks.items()}}
    assert tree.lost_after(fresh, 50.0) == tree.HOST_LOST_S


def _suspects_per_waiter(snap, now):
    """The rule as first written: every waiting rank's record looked at on its own."""
    from colltrace.model.build import ALIVE, PENDING, SUSPECT_AFTER_S, UNKNOWN, WAITING

    out = set()
    for entry in snap["ranks"].values():
        for r in entry.get("records") or []:
            if r.get("state") not in PENDING or now - (r.get("entered_at") or now) < SUSPECT_AFTER_S:
                continue
            for m in snap["groups"].get(r.get("group"), {}).get("ranks", []):
                other = snap["ranks"].get(str(m))
                if other is None or other.get("status") not in (ALIVE, UNKNOWN):
                    continue
                if (other.get("progress") or {}).get(r["group"], {}).get("entered", 0) >= r["seq"]:
                    continue
                if not any(x.get("state") == WAITING for x in other.get("records") or []):
                    out.add(int(m))
    return out


def test_suspects_looks_at_each_collective_once_and_finds_what_looking_per_waiter_found():
    job = simhosts.Job(64, t0=0.0, hang_at=10.0)
    groups = {}
    ranks = {}
    for i in range(1, 9):
        groups.update(job.groups(i))
        ranks.update(_entries(job, i, 11.0))
    # two ranks left their wait (busy elsewhere, in no collective): the ones others wait for
    for r in ("5", "40"):
        ranks[r] = dict(ranks[r], records=[x for x in ranks[r]["records"] if x["state"] == "completed"],
                        progress=dict(ranks[r]["progress"], **{"0": ranks["0"]["progress"]["0"] | {"entered": 0}}))
    snap = {"groups": groups, "ranks": ranks}
    assert suspects(snap, 11.0) == _suspects_per_waiter(snap, 11.0) == {5, 40}


def test_past_two_levels_of_32_the_tree_stays_two_levels_and_no_parent_holds_more_than_its_fanout():
    from colltrace.host.tree import Topology, fanout

    for hosts in (1058, 2048, 12_500):           # 8k, 16k and 100k ranks in hosts of 8
        fan = fanout(hosts, environ={})
        topo = [Topology(i, hosts, fan) for i in range(1, hosts + 1)]
        assert max(t.depth for t in topo) == 2
        # the root's children have leaves only: none holds more than fan hosts below it (at 2,048
        # hosts with 32 a parent, the root's first child held 1,055)
        assert all(len(t.children) <= fan and all(not Topology(c, hosts, fan).children for c in t.children)
                   for t in topo if t.depth == 1)
    assert fanout(100, environ={}) == 32
    assert fanout(12_500, environ={"COLLTRACE_FANOUT": "16"}) == 16     # the user's choice wins

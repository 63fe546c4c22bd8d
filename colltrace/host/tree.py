"""The shape of the watchdogs' exchange on a large job, and what travels up it.

On a job of a few hosts every host publishes its summary to the leader's meeting point, and the
leader reads them all each round (host/leader.py, host/storelink.py). That costs the leader in
proportion to the ranks, and one c10d store server serving thousands of hosts connects them
slowly. So hosts are arranged in a tree of FANOUT children per parent, numbered as torchrun
numbers them (node rank + 1; the host of rank 0 is 1, the root): the parent of host i is
(i - 2) // FANOUT + 1. A host with children serves a c10d TCPStore of its own (as the leader
does) and announces it by one key in the job's store; its children publish to it exactly as
they would to the leader. Each round it reads its children's summaries, merges them with its
own into one subtree summary and publishes that to its parent; what the root writes for
everyone (the ranks it wants details and stacks of, the hang, the end) it copies down to its
own store. A job of FANOUT + 1 hosts or fewer is the leader's star of today, unchanged.

What travels up is small unless the root asks: on a job of more than DETAIL_ALL_RANKS ranks a
rank's entry is its vitals (status, each group's last entered and completed number, the beat),
a few bytes a rank; its records and stacks go up only for the ranks of the groups the root
names in `want` (a collective waited on for SUSPECT_AFTER_S with its numbers unmoved, a rank
that died), and for ranks that are not alive. The root judges only the ranks it has in full.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from typing import cast

from colltrace import config
from colltrace.model import arrivals
from colltrace.model.build import clock_offsets
from colltrace.model.schema import ALIVE, PENDING, UNKNOWN, Snapshot

FANOUT = 32               # children per parent: a store server serves at most this many hosts
DETAIL_ALL_RANKS = 512    # up to this many ranks every rank's entry travels in full, every round
SUSPECT_AFTER_S = 0.5     # a collective waited on this long with nothing moving: its group's details
HOST_LOST_S = 5.0         # a rank whose heartbeat (its poller thread beats while it waits) is this old: its host
                          # stopped publishing
LOST_FACTOR = 4.0         # ... or this many times the job's typical beat age, where hosts publish slowly
BEAT_SAMPLE = 1024        # ranks whose beats tell the typical age

VITAL = ("rank", "status", "host", "pid", "progress", "heartbeat", "exit", "died_at", "stall_s")


def fanout(hosts: int = 0, environ=os.environ) -> int:
    """Children per parent: COLLTRACE_FANOUT where given; else FANOUT, or on a job of more hosts
    than two levels of FANOUT hold (1,057), the square root of the hosts: two levels, each parent
    a like share. A third level would add a round to every verdict, and filled breadth first it
    puts half the job under the root's first child (at 2,048 hosts: 8,448 ranks merged there)."""
    given = config.value("fanout", environ)
    if given:
        return given
    if hosts > 1 + FANOUT + FANOUT * FANOUT:
        return math.isqrt(hosts - 2) + 1
    return FANOUT


class Topology:
    """Host `index` (1-based; 1 is the root) of `hosts`, FANOUT children a parent."""

    def __init__(self, index: int, hosts: int, fan: int = FANOUT):
        self.index, self.hosts, self.fan = index, max(hosts, index), fan

    @property
    def parent(self) -> int | None:
        return None if self.index == 1 else (self.index - 2) // self.fan + 1

    @property
    def children(self) -> range:
        first = self.fan * (self.index - 1) + 2
        return range(first, min(self.hosts, first + self.fan - 1) + 1)

    @property
    def interior(self) -> bool:
        """Serves a store for children of its own (the root always does: it is the meeting point)."""
        return self.index == 1 or len(self.children) > 0

    @property
    def depth(self) -> int:
        d, i = 0, self.index
        while i != 1:
            i, d = (i - 2) // self.fan + 1, d + 1
        return d


def host_index(environ=os.environ) -> tuple[int, int] | None:
    """(this host's index, the number of hosts) from torchrun's environment, which the ranks'
    watchdog inherits: GROUP_RANK (the node rank) and WORLD_SIZE / LOCAL_WORLD_SIZE. None where
    it is not known (a job started by hand): then the host joins the leader's star."""
    g, w, lw = (environ.get(k, "").strip() for k in ("GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"))
    if not (g.isdigit() and w.isdigit() and lw.isdigit()) or int(lw) == 0:
        return None
    hosts = -(-int(w) // int(lw))
    return (int(g) + 1, hosts) if int(g) < hosts else None


# ---- what a subtree summary carries ------------------------------------------------------------

def want_of(raw) -> dict:
    """The root's `want`, read leniently: {"stacks": set, "groups": set, "all": bool, "sample": set}
    ("sample": the ranks whose hosts ask them for stack samples: stragglers). A plain
    list (what a leader wrote before the tree) is the stacks it wants, and everything in full."""
    if isinstance(raw, list):
        return {"stacks": {int(r) for r in raw if isinstance(r, int) or str(r).isdigit()}, "groups": set(), "all": True,
                "sample": set()}
    if not isinstance(raw, dict):
        return {"stacks": set(), "groups": set(), "all": True, "sample": set()}
    stacks = {int(r) for r in raw.get("stacks") or [] if isinstance(r, int) or str(r).isdigit()}
    groups = {str(g) for g in raw.get("groups") or []}
    sample = {int(r) for r in raw.get("sample") or [] if isinstance(r, int) or str(r).isdigit()}
    return {"stacks": stacks, "groups": groups, "all": bool(raw.get("all", True)), "sample": sample}


def want_from(raw: bytes | None) -> dict:
    """want_of the key's stored bytes (absent or unreadable: everything in full)."""
    try:
        return want_of(json.loads(raw) if raw is not None else None)
    except (ValueError, TypeError):
        return want_of(None)


def vital(entry: dict) -> dict:
    e = {k: entry[k] for k in VITAL if k in entry}
    e["vital"] = True
    return e


def detailed(entry: dict) -> bool:
    return not entry.get("vital")


def slim(ranks: dict, want: dict, now: float) -> dict:
    """The entries a subtree sends up: in full where the root wants them (every rank on a small
    job, the ranks of the groups it names), for any rank that is not alive, and for a rank
    waiting in a collective for SUSPECT_AFTER_S already (what a verdict reads: sent before the
    root asks, which saves the hang's verdict a trip down the tree and back); else the vitals."""
    if want["all"]:
        return ranks
    groups = want["groups"]
    out = {}
    for r, e in ranks.items():
        if not isinstance(e, dict) or not detailed(e) or (e.get("status") not in (ALIVE, UNKNOWN)
                                                           or groups.intersection(e.get("progress") or ())
                                                           or _waits(e, now) or _int(r) in want["sample"]):
            out[r] = e
        else:
            out[r] = vital(e)
    return out


def _int(r) -> int | None:
    return int(r) if str(r).isdigit() else None


def _waits(entry: dict, now: float) -> bool:
    if "cls" in entry:   # a residue (fold): its earliest pending entry
        w = entry.get("w")
        return isinstance(w, (int, float)) and now - w >= SUSPECT_AFTER_S
    for rec in entry.get("records") or ():
        if rec.get("state") in PENDING and now - (rec.get("entered_at") or now) >= SUSPECT_AFTER_S:
            return True
    return False


# ---- folding: ranks in the same state travel as one class ----------------------------------------
# On a job judged from vitals, a hang makes every member of the suspect groups travel in full: on a
# world group that is every rank, and each parent would decode, merge and encode its whole
# subtree's entries every round. But ranks waiting in one collective differ only in a few numbers:
# their rank, their records' ids and times. A host sends each detailed entry as its vitals plus a
# class (the rest of the entry, records without those numbers, named by a hash of its JSON) and
# the numbers; a parent passes residues and classes up as they came, uniting equal classes of its
# children; the root unfolds them back into the entries it judges, lossless. What travels grows
# with the ranks' vitals and the job's distinct states, not with ranks x records.

OWN = ("rank", "id", "entered_at", "returned_at", "completed_at")   # a record's numbers of its own


def _template(entry: dict) -> dict:
    t = {k: v for k, v in entry.items() if k not in VITAL}
    t["records"] = [{k: v for k, v in r.items() if k not in OWN} for r in entry.get("records") or ()]
    return t


def fold(ranks: dict, classes: dict | None = None) -> tuple[dict, dict]:
    """(ranks with every detailed entry as a residue, the classes they name). Entries already
    folded (a child's) and vitals pass as they are; `classes`: a child's, kept."""
    classes = dict(classes or {})
    out = {}
    for r, e in ranks.items():
        if not isinstance(e, dict) or not detailed(e) or "cls" in e or not isinstance(e.get("records"), list):
            out[r] = e
            continue
        t = _template(e)
        key = hashlib.blake2b(json.dumps(t, sort_keys=True, separators=(",", ":"), default=str).encode(),
                              digest_size=8).hexdigest()
        classes.setdefault(key, t)
        res = {k: e[k] for k in VITAL if k in e}
        res["cls"] = key
        res["rt"] = [[rec.get(k) for k in OWN[1:]] for rec in e["records"]]
        waits = [rec.get("entered_at") for rec in e["records"] if rec.get("state") in PENDING]
        res["w"] = min((w for w in waits if isinstance(w, (int, float))), default=None)
        out[r] = res
    used = {e["cls"] for e in out.values() if isinstance(e, dict) and "cls" in e}
    return out, {k: v for k, v in classes.items() if k in used}


def unfold(ranks: dict, classes: dict) -> dict:
    """The entries `fold` made residues of, whole again; a residue whose class is missing (a torn
    summary) becomes its vitals."""
    out = {}
    for r, e in ranks.items():
        if not isinstance(e, dict) or "cls" not in e:
            out[r] = e
            continue
        t = classes.get(e["cls"]) if isinstance(classes, dict) else None
        rt = e.get("rt")
        times = rt if isinstance(rt, list) else []
        base = {k: v for k, v in e.items() if k not in ("cls", "rt", "w")}
        if not isinstance(t, dict) or len(times) != len(t.get("records") or ()):
            base["vital"] = True
            out[r] = base
            continue
        records = [dict(rec, rank=e.get("rank"), id=n[0], entered_at=n[1], returned_at=n[2], completed_at=n[3])
                   for rec, n in zip(t["records"], times, strict=True) if isinstance(n, list) and len(n) == 4]
        out[r] = {**t, **base, "records": records}
    return out


def merge_subtree(own: dict, children: list[dict], now: float) -> dict:
    """This host's summary and its children's, as one summary for its parent: one host name
    (this one), every rank of the subtree, every group any of them knows. Where one rank comes
    twice (a grandchild that moved up to the root when its parent died still sits in a stale
    copy), the entry with the newer heartbeat wins."""
    ranks = dict(own.get("ranks") or {})
    groups = dict(own.get("groups") or {})
    classes = dict(own.get("classes") or {})
    for s in children:
        groups.update(s.get("groups") or {})
        classes.update(s.get("classes") or {})
        for r, e in (s.get("ranks") or {}).items():
            have = ranks.get(r)
            if have is None or _beat(e) >= _beat(have):
                ranks[r] = e
    out = dict(own, t=now, ranks=ranks, groups=groups, classes=classes,
               hosts=1 + sum(int(s.get("hosts") or 1) for s in children),
               clocks=clock_offsets(own.get("host"), children))
    if "arrivals" in own or any("arrivals" in s for s in children):   # on this host's clock
        out["arrivals"] = arrivals.unite(own.get("arrivals"), children)
    return out


def _beat(e) -> float:
    hb = e.get("heartbeat") if isinstance(e, dict) else None
    return float(hb) if isinstance(hb, (int, float)) else 0.0


# ---- the root: which groups to ask details of ---------------------------------------------------

class Suspicion:
    """On a job judged from vitals: the groups whose members' numbers show a collective entered
    by some and not completed by all, unmoved for SUSPECT_AFTER_S; every group of a rank that is
    not alive; and, once details came, the groups of every pending record they show (so that
    what is judged is whole). Kept until the job moves on."""

    def __init__(self):
        self._seen: dict[str, tuple] = {}    # group -> (its numbers, since when unmoved)
        self.groups: set[str] = set()
        self._tallies: dict[int, tuple] = {}  # id(a summary's ranks table) -> (the table, its tally)

    def update(self, snap: Snapshot, now: float, parts: list[dict] | None = None) -> set[str]:
        """parts: the summaries snap merged, where the caller has them. A summary whose bytes did
        not change since the last round keeps its ranks table (host/storelink.py), whose tally is
        then reused: the root's round costs per host that changed, not per rank."""
        tallies = None
        if parts is not None and sum(len(p.get("ranks") or ()) for p in parts) == len(snap["ranks"]):
            tallies, keep = [], {}
            for p in parts:   # no rank twice (a stale copy of a lost leader's): their sum is the merge
                table = p.get("ranks") or {}
                have = self._tallies.get(id(table))
                if have is None or have[0] is not table:
                    # a subtree's summary carries its parent's count of it (subtree_tally): what
                    # the root reads per round grows with its children, not with the ranks below
                    have = (table, tally_of(p.get("tally")) or _tally(table))
                keep[id(table)] = have
                tallies.append(have[1])
            self._tallies = keep
        hi_entered, lo_done, dead, pending, since = _combine(tallies if tallies is not None
                                                             else [_tally(snap["ranks"])])
        stuck = {g for g, t in since.items() if now - t >= SUSPECT_AFTER_S}
        waiting = set()
        for g, hi in hi_entered.items():
            sig = (hi, lo_done.get(g, 0))
            if hi <= sig[1]:
                self._seen.pop(g, None)
                continue
            have = self._seen.get(g)
            if have is None or have[0] != sig:
                self._seen[g] = (sig, now)
            if g in stuck or now - self._seen[g][1] >= SUSPECT_AFTER_S:
                # a member's own record says it waited that long (its host sent it unasked: tree.slim)
                waiting.add(g)
        # Groups whose collectives moved again are forgotten; the rest stay wanted.
        self.groups = {g for g in self.groups if g in waiting or g in dead or g in pending} | waiting | dead
        if self.groups:
            self.groups |= pending
        return self.groups


def subtree_tally(ranks: dict, classes: dict) -> dict:
    """_tally of the entries a host publishes (residues read through their classes), in the JSON
    its summary carries as "tally": the root sums its children's instead of counting every rank
    (at 16,384 ranks that was 60 % of the root's round)."""
    hi, lo, dead, pending, since = _tally(ranks, classes)
    return {"hi": hi, "lo": lo, "dead": sorted(dead), "pending": sorted(pending), "since": since}


def tally_of(raw) -> tuple | None:
    """A summary's "tally" as _tally's tuple; None where it is absent or not what subtree_tally
    writes (the root then counts the table itself)."""
    if not isinstance(raw, dict):
        return None
    hi, lo, dead, pending, since = (raw.get(k) for k in ("hi", "lo", "dead", "pending", "since"))
    if not (isinstance(hi, dict) and isinstance(lo, dict) and isinstance(dead, list) and isinstance(pending, list)
            and isinstance(since, dict)):
        return None
    if not (all(type(v) is int for v in hi.values()) and all(type(v) is int for v in lo.values())
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in since.values())):
        return None
    return hi, lo, set(map(str, dead)), set(map(str, pending)), since


def _tally(ranks: dict, classes: dict | None = None) -> tuple:
    """One ranks table, counted: per group its highest entered and lowest completed number, the
    groups of ranks not alive, the groups of pending records and, per group, the earliest entry
    among its pending records (which `now` turns into "stuck"). classes: where the table holds
    residues (fold), their records' classes."""
    hi_entered: dict[str, int] = {}
    lo_done: dict[str, int] = {}
    dead: set[str] = set()
    pending: set[str] = set()
    since: dict[str, float] = {}
    for e in ranks.values():
        if not isinstance(e, dict):
            continue
        prog = e.get("progress") or {}
        if e.get("status") not in (ALIVE, UNKNOWN):
            dead.update(prog)
        for g, p in prog.items():
            if not isinstance(p, dict):
                continue
            ent, done = p.get("entered") or 0, p.get("completed") or 0
            if ent > hi_entered.get(g, -1):
                hi_entered[g] = ent
            if done < lo_done.get(g, 1 << 62):
                lo_done[g] = done
        if not detailed(e):
            continue
        if "cls" in e:   # a residue: its records' states and groups are its class's, their times its own
            t_recs = (classes or {}).get(e["cls"], {}).get("records") or ()
            rt = e.get("rt")
            times = rt if isinstance(rt, list) else []
            recs = [(r, n[1] if isinstance(n, list) and len(n) == 4 else None)
                    for r, n in zip(t_recs, times, strict=False)]
        else:
            recs = [(r, r.get("entered_at")) for r in e.get("records") or ()]
        for r, t in recs:
            if r.get("state") in PENDING and r.get("group") is not None:
                g = str(r["group"])
                pending.add(g)
                if isinstance(t, (int, float)) and t and t < since.get(g, float("inf")):
                    since[g] = t
    return hi_entered, lo_done, dead, pending, since


def _combine(tallies: list[tuple]) -> tuple:
    hi_entered: dict[str, int] = {}
    lo_done: dict[str, int] = {}
    dead: set[str] = set()
    pending: set[str] = set()
    since: dict[str, float] = {}
    for hi, lo, d, p, s in tallies:
        for g, v in hi.items():
            if v > hi_entered.get(g, -1):
                hi_entered[g] = v
        for g, v in lo.items():
            if v < lo_done.get(g, 1 << 62):
                lo_done[g] = v
        dead |= d
        pending |= p
        for g, t in s.items():
            if t < since.get(g, float("inf")):
                since[g] = t
    return hi_entered, lo_done, dead, pending, since


def lost_after(snap: Snapshot, now: float) -> float:
    """How old a rank's beat may be before its host counts as lost: HOST_LOST_S, or on a job whose
    hosts publish slowly (loaded machines: the watchdog yields its cores to the ranks) LOST_FACTOR
    times the typical age of the job's beats, so that a slow host is waited for and a dead one,
    whose beat alone keeps ageing, is still found. The typical age: the median of up to
    BEAT_SAMPLE ranks' (a dead host's few ranks do not move it)."""
    entries = list(snap["ranks"].values())
    step = max(1, len(entries) // BEAT_SAMPLE)
    ages = sorted(now - _beat(e) for e in entries[::step] if isinstance(e, dict) and _beat(e) > 0)
    typical = ages[len(ages) // 2] if ages else 0.0
    return max(HOST_LOST_S, LOST_FACTOR * typical)


def judged(snap: Snapshot, groups: set[str], now: float) -> Snapshot | None:
    """What the root judges on a job seen from vitals: the ranks it has in full, once every
    member of every wanted group is among them (else None: wait for the next round). A member
    whose host stopped publishing (its beat older than lost_after()) will never send its details:
    it is judged dead, its host named."""
    ranks = {r: e for r, e in snap["ranks"].items() if isinstance(e, dict) and detailed(e)}
    if not ranks:
        return None
    table = snap.get("groups") or {}
    lost = None
    for g in groups:
        for m in (table.get(g) or {}).get("ranks") or []:
            r = str(m)
            e = snap["ranks"].get(r)
            if r in ranks or not isinstance(e, dict):
                continue
            if lost is None:
                lost = lost_after(snap, now)
            if now - _beat(e) < lost:
                return None
            ranks[r] = dict(e, status="dead", died_at=_beat(e), records=[], vital=False,
                            exit={"signal": None, "note": f"its host ({e.get('host')}) stopped answering"})
    return cast(Snapshot, dict(snap, ranks=ranks))

"""Whether what ranks entered agrees with what their peers entered.

Collectives: every member entering number N on a group must run the same backend op with
compatible arguments; the API names may differ (all_gather_object and all_gather both run
allgather). p2p: a send numbered n between two ranks needs the peer's recv numbered n.
"""
from __future__ import annotations

import bisect
import operator
from typing import cast

from colltrace.analysis.view import MATCHING_OP, UNEVEN_OPS, JobView, Rec, is_object_op
from colltrace.model.parts import MismatchClass

FIELDS = ("op", "shapes", "dtypes", "reduce_op", "root", "members", "detail")


class Disagreement:
    """Members that entered (group, seq) and disagree. `classes`: ranks that did the same."""

    __slots__ = ("group", "seq", "differs", "classes", "records", "not_entered", "key")

    def __init__(self, group, seq, differs, classes, records, not_entered):
        self.group = group
        self.seq = seq
        self.differs = differs          # fields that differ, in FIELDS order
        self.classes: list[MismatchClass] = classes   # ranks alike in the op and every differing field
        self.records = records          # rank -> raw record at (group, seq)
        self.not_entered = not_entered  # members that have not reached it
        self.key: str | None = None     # the wait it explains, where that is at a later number (a group creation)


def _signature(raw: dict) -> tuple:
    op = str(raw.get("op") or "unknown")
    bop = raw.get("backend_op")
    # "allgather_base" (ours) and "_allgather_base" (the Flight Recorder's) are one op
    bop = (str(bop) if bop and bop != "unknown" else op).replace("_", "")
    shapes = tuple(tuple(s) if isinstance(s, (list, tuple)) else (s,) for s in (raw.get("shapes") or ()))
    dtypes = tuple(str(d) for d in (raw.get("dtypes") or ()))
    redop = raw.get("reduce_op")
    # a group creation's ranks and what else it asks for (rank/setup.py): None for a collective
    members = raw.get("members")
    members = tuple(members) if isinstance(members, list) else members
    sig: tuple = (op, bop, shapes, dtypes, None if redop is None else str(redop), raw.get("root"), members,
                  raw.get("detail"))
    try:
        hash(sig)
    except TypeError:  # a malformed shape (a table, say): compare its text
        sig = (op, bop, (repr(raw.get("shapes")),), dtypes, sig[4], sig[5], repr(members), repr(sig[7]))
    return sig


_ALIKE = operator.itemgetter("op", "backend_op", "shapes", "dtypes", "reduce_op", "root", "seq")


def _all_alike(raws) -> bool:
    """The common case, at C speed: every record has the very same op and arguments."""
    try:
        vals = list(map(_ALIKE, raws))
    except KeyError:
        return False  # a record without one of the fields (another tool's): the careful path below
    if vals and vals.count(vals[0]) != len(vals):
        return False
    first = next(iter(raws), None)
    if first is not None and first.get("setup"):   # a group creation: the ranks it asks for too
        asked = [(r.get("members"), r.get("detail")) for r in raws]
        return asked.count(asked[0]) == len(asked)
    return True


def _alone(raw: dict, rank: int) -> bool:
    return raw.get("members") == [rank]


def check_collective(snap: JobView, group: str, seq: int, at_hand: list[tuple[int, dict]]) -> Disagreement | None:
    """Compare what the members that entered (group, seq) called. `at_hand`: (rank, raw record)
    already known (the pending ones), so that only the other members' records are looked up."""
    known, keys, _ = snap.arrivals(group)
    i = bisect.bisect_left(keys, seq)
    not_entered = [m for _, m in known[:i]]
    records: dict[int, dict] = dict(at_hand)
    if len(known) - i > len(records):   # members that entered and are not at hand: look them up
        for _, m in known[i:]:
            if m not in records:
                r = snap.ranks[m].record_at(group, seq)
                if r is not None:
                    records[m] = r
    if _all_alike(records.values()):
        return None
    # Only traced records that start at this number are comparable: a counted (untraced) op
    # is never blamed, and one spanning several numbers started at an earlier one.
    by_sig: dict[tuple, list[int]] = {}
    for rank, raw in records.items():
        if raw.get("op") == "untraced" or raw["seq"] != seq:
            continue
        by_sig.setdefault(_signature(raw), []).append(rank)
    if len(by_sig) < 2:
        return None
    sigs = list(by_sig)
    differs = []
    if len({s[1] for s in sigs}) > 1:
        differs.append("op")
    tensor_sigs = [s for s in sigs if not is_object_op(s[0])]
    if len({s[2] for s in tensor_sigs if s[2] and s[1] not in UNEVEN_OPS}) > 1:
        differs.append("shapes")
    if len({s[3] for s in tensor_sigs if s[3]}) > 1:
        differs.append("dtypes")
    if len({s[4] for s in sigs if s[4] is not None}) > 1:
        differs.append("reduce_op")
    if len({s[5] for s in sigs if s[5] is not None}) > 1:
        differs.append("root")
    if len({s[6] for s in sigs}) > 1:
        differs.append("members")
    if len({s[7] for s in sigs}) > 1:
        differs.append("detail")
    if not differs:
        return None
    if differs == ["members"] and all(len(rs) == 1 and _alone(records[rs[0]], rs[0]) for rs in by_sig.values()):
        return None   # each rank made a group of itself alone (new_group([get_rank()])): no two collide
    # Classes: ranks alike in the API op and every differing field.
    classes: dict[str, MismatchClass] = {}
    for sig, ranks in by_sig.items():
        op, bop, shapes, dtypes, redop, root, members, detail = sig
        proj = {"op": op, "backend_op": bop}
        if records[ranks[0]].get("setup"):   # a group creation: the ranks it asks for say which one
            proj["backend_op"] = str(records[ranks[0]].get("backend_op") or op)
            proj["members"] = list(members) if isinstance(members, tuple) else members
            if detail is not None:
                proj["detail"] = detail
        if "shapes" in differs:
            proj["shapes"] = [list(s) for s in shapes]
        if "dtypes" in differs:
            proj["dtypes"] = list(dtypes)
        if "reduce_op" in differs:
            proj["reduce_op"] = redop
        if "root" in differs:
            proj["root"] = root
        if "detail" in differs:
            proj["detail"] = detail
        key = repr(sorted(proj.items()))
        c = classes.setdefault(key, cast(MismatchClass, dict(proj, ranks=[])))
        c["ranks"].extend(ranks)
    out: list[MismatchClass] = []
    for c in classes.values():
        c["ranks"].sort()
        if any(records[r].get("untraced") for r in c["ranks"]):
            c["untraced"] = True   # named by the Flight Recorder: the trace did not see it
        out.append(c)
    out.sort(key=lambda c: c["ranks"][0])
    kept = {r: records[r] for c in out for r in c["ranks"]}
    return Disagreement(group, seq, differs, out, kept, sorted(not_entered))


def p2p_status(snap: JobView, rec: Rec) -> tuple[str, int | None]:
    """("posted" | "missing" | "unknown", the peer's count of matching ops toward this rank).

    "missing" is claimed only when the peer's records prove it: its matching ops toward this
    rank are in its window (newer ones always are, the window being the recent end), or its
    window reaches back to its first record."""
    opp = MATCHING_OP.get(rec.backend_op)
    if rec.peer is None or opp is None:
        return "unknown", None
    peer = snap.ranks.get(rec.peer)
    if peer is None:
        return "unknown", None
    if rec.per_pair_seq:
        n = peer.posted(opp, rec.rank)
        if n is None:
            return "unknown", None
        return ("posted" if n >= rec.seq else "missing"), n
    # Object p2p (send_object_list & co) carry no per-pair number: match by time instead.
    for p in peer.pending:
        if p.backend_op == opp and p.peer == rec.rank:
            return "posted", None
    since = peer.posted_since(opp, rec.rank, rec.entered_at)
    if since is None:
        return "unknown", None
    return ("posted" if since else "missing"), None

"""A made-up job for the analyzer's tests: ranks with records and progress, turned into a
snapshot (no torch, no process, no trace folder), and the analyzer's findings as a user gets them."""
from __future__ import annotations

import copy

from colltrace import analysis
from colltrace.reporters.text import summarize

T = 1_000.0            # when the stuck collectives were entered
STALL = 30.0
TORCH = {"file": "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", "line": 4000,
         "func": "barrier"}
COLLTRACE = {"file": "/venv/lib/python3.11/site-packages/colltrace/rank/shim.py", "line": 200, "func": "wrapper"}
# Where the ranks' torch, stdlib and packages are, as each rank records it (colltrace/origins.py).
ROOTS = {"stdlib": ["/usr/lib/python3.11"], "site": ["/venv/lib/python3.11/site-packages"],
         "torch": ["/venv/lib/python3.11/site-packages/torch"],
         "colltrace": ["/venv/lib/python3.11/site-packages/colltrace"], "user_packages": []}



def analyze(snap, stall_s, now) -> list[dict]:
    """The findings as every caller that shows them gets them: the analyzer's facts, then the
    reporter's paragraph and advice (the analyzer itself says no sentence: see below)."""
    return summarize(analysis.analyze(snap, stall_s, now))


# -- snapshot builders ----------------------------------------------------------------------
def frames(where: str, func: str = "f", outer: str = "train.py:900:main") -> list[dict]:
    """"checkpoint.py:302" -> a user stack, innermost last, ending inside torch and colltrace."""
    f, line = where.split(":")
    of, oline, ofunc = outer.split(":")
    return [{"file": f"/job/{of}", "line": int(oline), "func": ofunc},
            {"file": f"/job/{f}", "line": int(line), "func": func}, COLLTRACE, TORCH]


class SyntheticJob:
    """Ranks with records and progress, turned into a snapshot by .snap(): no process, no trace folder."""

    def __init__(self, n: int, groups: dict | None = None):
        self.n = n
        self.groups = {"0": {"name": "0", "desc": "default_pg", "ranks": list(range(n))}}
        for name, (desc, ranks) in (groups or {}).items():
            self.groups[name] = {"name": name, "desc": desc, "ranks": list(ranks)}
        self.entries = {r: {"rank": r, "pid": 100 + r, "host": "node0", "status": "alive", "exit": None,
                            "died_at": None, "heartbeat": T + 100, "error": None, "progress": {}, "records": [],
                            "stack": None, "stack_at": None, "fault": None, "roots": ROOTS} for r in range(n)}
        self.ids = {r: 0 for r in range(n)}

    def op(self, ranks, group, seq, op, state="completed", at="train.py:10", func="step", t=None, backend_op=None,
           shapes=((4,),), dtypes=("float32",), reduce_op=None, root=None, p2p=False, peer=None, thread="MainThread",
           seq_end=None, count=1):
        backend = backend_op or {"all_reduce": "allreduce", "all_gather": "allgather", "all_gather_object": "allgather",
                                 "gather": "gather", "broadcast": "broadcast", "send": "send", "recv": "recv",
                                 "isend": "send", "irecv": "recv", "untraced": "untraced",
                                 "batch_isend_irecv": "batch_p2p"}.get(op, op)
        for r in ([ranks] if isinstance(ranks, int) else ranks):
            self.ids[r] += 1
            t0 = T - 100 + self.ids[r] if t is None else t
            rec = {"id": self.ids[r], "rank": r, "group": group, "seq": seq, "seq_end": seq_end or seq, "op": op,
                   "backend_op": backend, "p2p": p2p, "peer": peer, "state": state, "async": state == "in_flight",
                   "entered_at": t0, "returned_at": t0 if state != "waiting" else None,
                   "completed_at": t0 if state == "completed" else None,
                   "shapes": ([list(s) for s in shapes] if op not in ("barrier", "untraced") and "object" not in op
                              else []),
                   "dtypes": list(dtypes) if op not in ("barrier", "untraced") and "object" not in op else [],
                   "reduce_op": reduce_op, "root": root, "count": count, "thread": thread,
                   "frames": [] if op == "untraced" else frames(at, func)}
            e = self.entries[r]
            e["records"].append(rec)
            e["records"].sort(key=lambda x: (x["entered_at"], x["id"]))
            if not p2p:
                p = e["progress"].setdefault(group, {"entered": 0, "completed": 0})
                p["entered"] = max(p["entered"], seq_end or seq)
                if state == "completed":
                    p["completed"] = max(p["completed"], seq_end or seq)
        return self

    def history(self, group, upto, ranks=None, op="all_reduce"):
        """Completed collectives 1..upto on the group, by its members (or `ranks`)."""
        members = ranks if ranks is not None else self.groups[group]["ranks"]
        for seq in range(1, upto + 1):
            self.op(members, group, seq, op)
        return self

    def set(self, rank, **fields):
        self.entries[rank].update(fields)
        return self

    def snap(self) -> dict:
        return {"version": 1, "taken_at": T + 50, "groups": copy.deepcopy(self.groups),
                "ranks": {str(r): copy.deepcopy(e) for r, e in self.entries.items()}}


def only(findings, kind=None):
    """The one finding (of that kind)."""
    assert len(findings) == 1, [f.key for f in findings]
    if kind:
        assert findings[0].kind == kind, findings[0].summary
    return findings[0]

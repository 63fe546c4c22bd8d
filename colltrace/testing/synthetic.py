"""A synthetic job's snapshot of any size, shaped like what the watchdog sends: for the
analyzer's scale benchmark (benchmarks/scale.py) and tests that need a large job without
starting one. Plain data, no torch."""
from __future__ import annotations

from colltrace.model.schema import COMPLETED

T0 = 1_700_000_000.0
TORCH_FRAME = {"file": "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", "line": 2501,
               "func": "all_reduce"}


def _frames(line: int, func: str) -> list[dict]:
    return [{"file": "/job/train.py", "line": 900, "func": "main"},
            {"file": "/job/model.py", "line": line, "func": func}, TORCH_FRAME]


def _layout(n_ranks: int, groups_per_rank: int) -> tuple[dict, list[list[str]]]:
    """Groups: "0" is the world; then alternately contiguous blocks (8, 64, 512, …) and strided
    sets (stride 8, 64, …), so every rank is in `groups_per_rank` groups."""
    groups = {"0": {"name": "0", "desc": "default_pg", "ranks": list(range(n_ranks))}}
    of_rank = [["0"] for _ in range(n_ranks)]
    next_id = 1
    for level in range(1, groups_per_rank):
        size = 8 ** ((level + 1) // 2)
        contiguous = level % 2 == 1
        if size >= n_ranks:
            size = max(2, n_ranks // 2)
        if contiguous:
            parts = [list(range(s, min(s + size, n_ranks))) for s in range(0, n_ranks, size)]
        else:
            parts = [list(range(o, n_ranks, size)) for o in range(size)]
        for members in parts:
            name = str(next_id)
            next_id += 1
            groups[name] = {"name": name, "desc": f"level{level}", "ranks": members}
            for r in members:
                of_rank[r].append(name)
    return groups, of_rank


def synthetic_snapshot(n_ranks: int, groups_per_rank: int, hang: bool = True, records: int = 64) -> dict:
    groups, of_rank = _layout(n_ranks, groups_per_rank)
    culprit = n_ranks // 2 + 3 if n_ranks > 4 else n_ranks - 1
    ranks = {}
    shared_frames = {g: _frames(100 + i, f"layer{i}") for i, g in enumerate(sorted(groups, key=int)[:64])}
    for rank in range(n_ranks):
        mine = of_rank[rank]
        seqs = {g: 100 for g in mine}
        recs = []
        t = T0
        for i in range(records - 2):
            g = mine[i % len(mine)]
            seqs[g] += 1
            t += 0.01
            recs.append({"id": 1000 + i, "rank": rank, "group": g, "seq": seqs[g], "seq_end": seqs[g],
                         "op": "all_reduce", "backend_op": "allreduce", "p2p": False, "peer": None,
                         "state": COMPLETED, "async": False, "entered_at": t, "returned_at": t + 0.001,
                         "completed_at": t + 0.002, "shapes": [[1024]], "dtypes": ["bfloat16"], "reduce_op": "SUM",
                         "root": None, "count": 1, "thread": "MainThread",
                         "frames": shared_frames.get(g) or _frames(7, "x")})
        stack = None
        if hang and rank == culprit:
            stack = _frames(512, "load_batch")   # busy in user code: never reaches the all_reduce
        elif hang:
            # the main thread blocked for 40 s in a world all_reduce the culprit never enters
            seqs["0"] += 1
            recs.append({"id": 1000 + records, "rank": rank, "group": "0", "seq": seqs["0"], "seq_end": seqs["0"],
                         "op": "all_reduce", "backend_op": "allreduce", "p2p": False, "peer": None, "state": "waiting",
                         "async": False, "entered_at": T0 + 80.0, "returned_at": None, "completed_at": None,
                         "shapes": [[1]], "dtypes": ["float32"], "reduce_op": "SUM", "root": None, "count": 1,
                         "thread": "MainThread", "frames": _frames(250, "sync_metrics")})
        # a young async op in flight on the rank's second group, from a communication thread,
        # entered by all its members: healthy, must give nothing
        g = mine[1 % len(mine)]
        seqs[g] += 1
        t = T0 + 119.0
        recs.append({"id": 1001 + records, "rank": rank, "group": g, "seq": seqs[g], "seq_end": seqs[g],
                     "op": "all_reduce", "backend_op": "allreduce", "p2p": False, "peer": None, "state": "in_flight",
                     "async": True, "entered_at": t, "returned_at": t, "completed_at": None, "shapes": [[64]],
                     "dtypes": ["float32"], "reduce_op": "SUM", "root": None, "count": 1, "thread": "comm",
                     "frames": _frames(300, "overlap")})
        progress = {gg: {"entered": s, "completed": s} for gg, s in seqs.items()}
        progress[g]["completed"] = seqs[g] - 1
        if hang and rank != culprit:
            progress["0"]["completed"] = seqs["0"] - 1
        ranks[str(rank)] = {"rank": rank, "pid": 10000 + rank, "host": f"node{rank // 8}", "status": "alive",
                            "exit": None, "died_at": None, "heartbeat": t + 60, "error": None, "progress": progress,
                            "records": recs, "stack": stack, "stack_at": t + 59 if stack else None, "fault": None}
    return {"version": 1, "taken_at": T0 + 120, "groups": groups, "ranks": ranks}

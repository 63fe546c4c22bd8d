"""The names of a trace folder's files, each spelled here once: a rank's files
(rank-00003.ring, rank-00003.defs.jsonl, ...), the watchdog's findings and snapshot."""
from __future__ import annotations

import os
import re

FINDINGS = "findings.jsonl"    # the watchdog's findings, one JSON object a line
SNAPSHOT = "snapshot.json"     # the watchdog's last view of the job (liveness, live stacks)
RINGS = "rank-*.ring"          # every rank's ring: a trace folder has one per rank
_RING = re.compile(r"rank-(\d+)\.ring$")


def rank_base(directory: str, rank: int) -> str:
    """The path every file of one rank starts with ("DIR/rank-00003")."""
    return os.path.join(directory, f"rank-{rank:05d}")


def ring_rank(path: str) -> int | None:
    """The rank whose ring this path is (None: not a ring's name)."""
    m = _RING.search(path)
    return int(m.group(1)) if m else None


def rank_file(directory: str, rank: int, suffix: str) -> str:
    """One of a rank's files: rank_file(d, 3, "ring") is "d/rank-00003.ring"."""
    return f"{rank_base(directory, rank)}.{suffix}"

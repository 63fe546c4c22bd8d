"""How long the analysis takes on a large job's snapshot (no torch, no processes).

    python benchmarks/scale.py [--ranks 16384] [--groups 4] [--records 64] [--no-hang] [--repeat 3]

Builds a synthetic snapshot shaped like what the watchdog sends (every rank in the world group
plus tensor-parallel-like contiguous groups and data-parallel-like strided groups, 64 recent
records per rank, each rank with an async op in flight), and with --hang (the default) every
rank but one waiting in a world all_reduce that the missing rank, busy in user code, never
enters. Prints ranks, groups, records, findings and the seconds analyze() took (best of N).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from colltrace.analysis import analyze  # noqa: E402
from colltrace.testing.synthetic import synthetic_snapshot  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=16384)
    p.add_argument("--groups", type=int, default=4, help="groups per rank (the world included)")
    p.add_argument("--records", type=int, default=64, help="records per rank (the watchdog sends 64)")
    p.add_argument("--no-hang", action="store_true")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    t = time.perf_counter()
    snap = synthetic_snapshot(args.ranks, args.groups, hang=not args.no_hang, records=args.records)
    built = time.perf_counter() - t
    n_records = sum(len(e["records"]) for e in snap["ranks"].values())
    best = float("inf")
    findings: list = []
    for _ in range(max(1, args.repeat)):
        t = time.perf_counter()
        findings = analyze(snap, stall_s=30.0, now=snap["taken_at"])
        best = min(best, time.perf_counter() - t)
    kinds = ", ".join(f"{f.kind} {f.key}" for f in findings[:5]) or "none"
    if len(findings) > 5:
        kinds += f", … ({len(findings)} in all)"
    print(f"ranks {args.ranks}  groups {len(snap['groups'])} ({args.groups} per rank)  records {n_records}  "
          f"built in {built:.2f} s")
    print(f"analyze: {best:.3f} s (best of {max(1, args.repeat)})  findings: {kinds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

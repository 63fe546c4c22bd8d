"""What sampling a straggler's stack costs it: the sampler thread's CPU per second of sampling
(colltrace/rank/sampler.py, as a rank runs it when its host asks), with the main thread in a
deep Python stack, once sleeping (a loader waiting on its disk) and once computing in Python
(the worst case: the sampler competes with it for the interpreter), and the main thread's own
slow-down in the second case, side by side with no sampling in the same run.

    python benchmarks/sampler.py [--seconds 5] [--depth 40]
Last line:
    sampler: X ms of CPU per second sampled (N samples/s), main thread's Python work at R of its unsampled rate
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def nest(depth: int, fn):
    return fn() if depth == 0 else nest(depth - 1, fn)


def compute(seconds: float) -> int:
    """Python work for `seconds`; how many loop turns it did."""
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            n += 1
    return n


def burst(d: str, rank: int, seconds: float, depth: int, work) -> tuple[float, float, int, object]:
    """One asked burst of sampling while the main thread runs `work` at `depth` frames; (wall s,
    sampler CPU s, samples, work's result)."""
    from colltrace.rank.sampler import Sampler
    from colltrace.tracefile import samples

    s = Sampler(d, rank)
    samples.ask(d, rank, seconds)
    s.poll()
    got = nest(depth, work)
    s.stop()
    log = samples.SampleLog(samples.samples_path(d, rank))
    log.poll()
    return log.cpu[0], log.cpu[1], len(log.samples), got


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--depth", type=int, default=40, help="Python frames under the sampled one")
    args = ap.parse_args(argv)
    d = tempfile.mkdtemp(prefix="ct-sampler-")
    wall, cpu, n, _ = burst(d, 1, args.seconds, args.depth, lambda: time.sleep(args.seconds))
    print(f"main thread sleeping: {1000 * cpu / wall:.2f} ms of CPU per second sampled, {n / wall:.0f} samples/s")
    plain = nest(args.depth, lambda: compute(args.seconds))
    wall2, cpu2, n2, busy = burst(d, 2, args.seconds, args.depth, lambda: compute(args.seconds))
    rate = busy / plain if plain else float("nan")
    print(f"main thread computing: {1000 * cpu2 / wall2:.2f} ms of CPU per second sampled, {n2 / wall2:.0f} samples/s; "
          f"its work {plain:,} turns unsampled, {busy:,} sampled")
    print(f"sampler: {1000 * cpu / wall:.2f} ms of CPU per second sampled ({n / wall:.0f} samples/s), "
          f"main thread's Python work at {rate:.3f} of its unsampled rate")
    return 0


if __name__ == "__main__":
    sys.exit(main())

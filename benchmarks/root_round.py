"""The root's own round on a large job, every host present: what the leader's watchdog spends per
round, healthy and in a hang left hanging (COLLTRACE_ON_HANG=warn), apart from how fast simulated
hosts can bring it their state (benchmarks/scale_live.py measures that whole path).

    python benchmarks/root_round.py --ranks 16384 [--hung-s 20]

Every host of the job (8 ranks each, colltrace/testing/simhosts.py's synthetic states) runs its
real watchdog round in this one process along host/tree.py's tree, over real c10d TCPStores.
Healthy: each root round comes after every other host stepped (all their tables new: the root's
worst case; on a real job a parent publishes every PUBLISH_S). Hung: the hang spreads for 4
rounds, then the root alone steps every 0.1 s, as on a job whose state no longer changes.
Measured: the root's step in its own thread's CPU time (the stores' server threads apart).
Last line, exactly:
    root round: N ranks: healthy X.X ms a round; hung Y% of a core (round median Z.Z ms)
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument("--hung-s", type=float, default=20.0, help="seconds the root alone steps in the hang")
    args = ap.parse_args(argv)
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    from torch.distributed import TCPStore

    from colltrace.host import tree
    from colltrace.testing import simhosts

    hosts = -(-args.ranks // simhosts.RANKS_PER_HOST)
    fan = tree.fanout(hosts)
    job = simhosts.Job(args.ranks, time.time(), None)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    sink = io.StringIO()
    wds = {i: simhosts.host_watchdog(job, i, ("127.0.0.1", store.port), tempfile.mkdtemp(prefix="ct-root-"), sink, fan)
           for i in range(1, hosts + 1)}
    root = wds[1]
    # leaves first, then their parents, the root last: each round brings the root the tree's state
    order = [i for i in sorted(wds, key=lambda i: -tree.Topology(i, hosts, fan).depth) if i != 1]

    def others() -> None:
        for i in order:
            wds[i].step()

    t0 = time.time()
    while time.time() - t0 < 300:
        others()
        root.step()
        view = root.view()
        if view is not None and len(view.snapshot["ranks"]) >= args.ranks:
            break
        time.sleep(0.05)
    else:
        print("root_round: the root did not see every rank within 300 s", file=sys.stderr)
        return 1
    for _ in range(3):
        others()
        root.step()
    healthy = []
    for _ in range(8):
        others()
        t = time.thread_time()
        root.step()
        healthy.append(time.thread_time() - t)
    job.hang_at = time.time()
    for _ in range(4):
        others()
        root.step()
    # a dict before findings were typed
    said = [f.kind if hasattr(f, "kind") else f.get("kind") for f in root.findings]
    rounds, start, cpu0 = [], time.time(), time.thread_time()
    while time.time() - start < args.hung_s:
        t = time.thread_time()
        root.step()
        rounds.append(time.thread_time() - t)
        time.sleep(0.1)
    share = (time.thread_time() - cpu0) / (time.time() - start)
    healthy.sort()
    rounds.sort()
    print(f"{args.ranks} ranks as {hosts} hosts, tree of fanout {fan}; set up in {time.time() - t0:.0f} s; "
          f"the root's findings in the hang: {said}; {len(rounds)} hung rounds, the longest {1000 * rounds[-1]:.0f} ms "
          f"(judging the unchanged hang again)")
    print(f"root round: {args.ranks} ranks: healthy {1000 * healthy[len(healthy) // 2]:.1f} ms a round; "
          f"hung {100 * share:.0f}% of a core (round median {1000 * rounds[len(rounds) // 2]:.1f} ms)")
    return 0 if "deadlock" in said else 1


if __name__ == "__main__":
    sys.exit(main())

"""Load on the job's TCPStore from 1,024 simulated ranks, as colltrace's watchdogs use it.

    python benchmarks/store_load.py [--ranks 1024] [--per-node 8] [--seconds 10]

One TCPStore server (torchrun's agent hosts it in a real job) and one client per node: each of
the ranks/per-node node watchdogs publishes its compacted summary every PUBLISH_S (0.25 s), as
colltrace does; the leader reads every node's summary each round (0.1 s) and merges them. The
summaries are those of a synthetic hung 1,024-rank job (benchmarks/scale.py: every rank with 64
recent records, four groups per rank, all but one waiting in a world all_reduce).
Prints: bytes per node summary, the cost to build it, publish latency, the leader's round time,
total store traffic, and for comparison what one store write per collective per rank would be.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from scale import synthetic_snapshot  # noqa: E402

from colltrace.host import storelink  # noqa: E402
from colltrace.model.build import compact_entry, merge  # noqa: E402


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


NODES_PER_PROCESS = 16   # c10d refuses more than ~24 store clients in one process


def publisher(port: int, nodes: list, go, seconds: float, total_nodes: int, results) -> None:
    """One worker process: publishes each of its nodes' summaries every PUBLISH_S, staggered."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    clients = [(TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60), wait_for_workers=False),
                f"{storelink.PREFIX}node/{i + 1}", data, other) for i, data, other in nodes]
    for c, key, (data, groups, _, beat), _ in clients:
        c.add(storelink.PREFIX + "nodes", 1)
        c.set(key + "/groups", groups)   # once: it changes only when groups are made
        c.set(key, data)
        c.set(key + "/beat", beat)
    results.put("connected")
    while not go.value:
        time.sleep(0.01)
    start_at = go.value
    lat, sent = [], 0
    due = [start_at + (i / total_nodes) * storelink.PUBLISH_S for i, _, _ in nodes]
    flip = [0] * len(clients)
    end = start_at + seconds
    while True:
        j = min(range(len(clients)), key=due.__getitem__)
        if due[j] >= end:
            break
        delay = due[j] - time.time()
        if delay > 0:
            time.sleep(delay)
        c, key, a, b = clients[j]
        flip[j] ^= 1
        data, _, _, beat = b if flip[j] else a
        t0 = time.perf_counter()
        if a is not b:      # as publish_node: the summary only when it changed, the beat always
            c.set(key, data)
            sent += len(data)
        c.set(key + "/beat", beat)
        lat.append(time.perf_counter() - t0)
        sent += len(beat)
        due[j] += storelink.PUBLISH_S
    results.put((lat, sent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--per-node", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--changing", action="store_true",
                    help="every publish differs (a healthy job); default: only the beat does (a hung job)")
    args = ap.parse_args(argv)
    from torch.distributed import TCPStore

    snap = synthetic_snapshot(args.ranks, 4)
    nodes = (args.ranks + args.per_node - 1) // args.per_node
    t = time.perf_counter()
    payloads = []
    for n in range(nodes):
        ranks = {str(r): compact_entry(snap["ranks"][str(r)])
                 for r in range(n * args.per_node, min(args.ranks, (n + 1) * args.per_node))}
        payloads.append({"host": f"node{n}", "t": time.time(), "groups": snap["groups"], "ranks": ranks})
    encoded = [storelink.node_payload(p) for p in payloads]   # (summary, group table, crc, beat)
    if args.changing:   # a healthy job: every publish differs, the leader decodes each one
        variants = [storelink.node_payload(dict(p, ranks={r: dict(e, error="x") for r, e in p["ranks"].items()}))
                    for p in payloads]
    else:               # a hung job: only the beat changes, the leader decodes each summary once
        variants = encoded
    build_ms = (time.perf_counter() - t) / nodes * 1e3

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    # Publishers in worker processes (a node watchdog per node in a real job; a process holds at
    # most NODES_PER_PROCESS clients), the leader here.
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    start_at = time.time() + 3600.0   # set below, once every publisher has connected
    go = ctx.Value("d", 0.0)
    chunks = [list(range(i, min(nodes, i + NODES_PER_PROCESS))) for i in range(1, nodes, NODES_PER_PROCESS)]
    procs = [ctx.Process(target=publisher, args=(server.port, [(i, encoded[i], variants[i]) for i in chunk], go,
                                                  args.seconds, nodes, results)) for chunk in chunks]
    for p in procs:
        p.start()
    leader = storelink.StoreLink("127.0.0.1", server.port)
    leader.publish_node(payloads[0])   # node 1: the leader's own host
    for _ in procs:
        assert results.get(timeout=300) == "connected"
    start_at = go.value = time.time() + 0.5
    while time.time() < start_at + storelink.PUBLISH_S:
        time.sleep(0.05)
    rounds: list[float] = []
    counts: list[int] = []
    while time.time() < start_at + args.seconds:
        t0 = time.perf_counter()
        summaries = leader.node_summaries()
        merge(summaries, time.time())
        rounds.append(time.perf_counter() - t0)
        counts.append(len(summaries))
        time.sleep(0.1)
    publish_s: list[float] = []   # per publish: the summary (if changed) and the beat
    sent = 0
    for _ in procs:
        lat, nbytes = results.get(timeout=120)
        publish_s.extend(lat)
        sent += nbytes
    for p in procs:
        p.join(timeout=30)

    size = statistics.median(len(e[0]) for e in encoded)
    gsize = statistics.median(len(e[1]) for e in encoded)
    print(f"{args.ranks} ranks as {nodes} nodes x {args.per_node}; {args.seconds:.0f} s; one store server; "
          + ("every summary changing (healthy job)" if args.changing
             else "summaries unchanged but for the beat (hung job)"))
    print(f"node summary: median {size / 1024:.1f} KiB compressed ({size / args.per_node / 1024:.2f} KiB per rank), "
          f"built in {build_ms:.1f} ms per node (compact + encode); its group table {gsize / 1024:.1f} KiB, "
          f"written once")
    print(f"publish (set): {len(publish_s)} writes, {len(publish_s) / args.seconds:.0f}/s, median "
          f"{1e3 * statistics.median(publish_s):.2f} ms, p99 {1e3 * pct(publish_s, 0.99):.2f} ms")
    print(f"leader round (read {nodes} summaries + decode + merge): median {1e3 * statistics.median(rounds):.0f} ms, "
          f"p99 {1e3 * pct(rounds, 0.99):.0f} ms over {len(rounds)} rounds; saw {min(counts)}-{max(counts)} nodes")
    print(f"store traffic: {sent / args.seconds / 1e6:.2f} MB/s in from the nodes; the leader reads "
          f"{sum(len(e[0]) for e in encoded) * len(rounds) / args.seconds / 1e6:.2f} MB/s")
    print(f"for comparison, one store write per collective per rank at 1,000 collectives/s each would be "
          f"{args.ranks * 1000:,} writes/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

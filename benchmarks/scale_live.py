"""The live verdict on a large job: the watchdogs' real exchange, a hang injected, how soon the
leader names it and what that costs it.

    python benchmarks/scale_live.py --ranks 16384 [--fanout 32] [--warm 6] [--workers N] [--flat]

Hosts of 8 ranks each run the real watchdog round (host/watchdog.py's step: host/leader.py's
exchange along host/tree.py's tree, real c10d TCPStores, the leader's real analysis) on synthetic
rank states (colltrace/testing/simhosts.py) instead of trace files. The leader (host 1) runs in a
process of its own, whose CPU is measured; the other hosts share --workers processes (each steps
its hosts in turn, at a lower priority than the leader's, as if the leader had a machine of its
own; on this 2-core machine their rounds come slower than a real host's 0.1 s, which makes the
figures pessimistic; the median round is printed). After --warm seconds of healthy all_reduces, the seeds'
hang: every rank but one enters a world all_reduce, the missing one waits in a broadcast on a
group of two: a certain deadlock from that instant. --flat: every host publishes to the leader
directly (the exchange before the tree: fanout larger than the job). --compare: the flat exchange
first, then the tree, in one run (the last line is the tree's).
SCALE_LIVE_PROFILE=FILE: the leader's cProfile stats (CPU time, over the measured window) into FILE;
SCALE_LIVE_PROFILE_WORKERS=PREFIX: each worker's, from the hang on, into PREFIX.PID; SCALE_LIVE_TRACE=1: the
leader's rounds from the hang to the verdict, one line each on stderr.
Last line, exactly:
    scale: N ranks as H hosts: verdict X.XX s after the hang, root CPU Y% of a core, Z MB/s
(root CPU: the leader's process, its store server included, from the hang until AFTER_S after
it or the verdict, whichever is later; Z: payload bytes written to and read from every store,
per second, from the hang until the run ends.)
"""
from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

WAIT_FOR_VERDICT_S = 30.0
REPORTED = -1.0
AFTER_S = 5.0     # the leader's CPU is measured from the hang until this long after it (or the verdict)


def _traffic(wds) -> int:
    """Payload bytes through every store link these hosts hold (StoreLink.traffic)."""
    n = 0
    for wd in wds:
        for link in (wd.exchange.link, wd.exchange.below):
            n += getattr(link, "traffic", 0) if link is not None else 0
    return n


def _median(xs) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def _all_hung(snap: dict, ranks: int) -> bool:
    """Every rank's entry in the root's view shows it waiting in a collective (the hang's state has
    reached the root from every host: from here, the verdict is colltrace's own latency)."""
    got = snap.get("ranks") or {}
    if len(got) < ranks:
        return False
    return all(any((p or {}).get("entered", 0) > (p or {}).get("completed", 0)
                   for p in (e.get("progress") or {}).values()) for e in got.values())


def _job(ranks, t0, hang_at):
    from colltrace.testing import simhosts

    return simhosts.Job(ranks, t0, hang_at)


def worker(indices, ranks, fan, port, t0, hang_at, ready, done, results, period) -> None:
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    # The leader is one host on a machine of its own in a real job; here it shares 2 cores with
    # thousands of simulated hosts, which yield to it (their rounds come slower instead).
    os.nice(10)
    from colltrace.testing import simhosts

    job = _job(ranks, t0, hang_at.value or None)
    sink = io.StringIO()
    d = tempfile.mkdtemp(prefix="ct-scale-")
    wds = [simhosts.host_watchdog(job, i, ("127.0.0.1", port), d, sink, fan) for i in indices]
    first, base, rounds = True, None, []
    prof = None
    while not done.value:
        if os.environ.get("SCALE_LIVE_PROFILE_WORKERS") and base is not None and prof is None:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        start = time.time()
        job.hang_at = hang_at.value or None
        if job.hang_at and base is None:
            base = _traffic(wds)
        for wd in wds:
            try:
                wd.step()
            except Exception as exc:  # a host's bad round is said, the others go on
                print(f"scale_live: host {wd.node.index}: {exc!r}", file=sys.stderr)
        if first and all(wd.exchange.link is not None or wd.exchange.took_over for wd in wds):
            first = False
            ready.put(len(wds))
        if base is not None:
            rounds.append(time.time() - start)
        time.sleep(max(0.0, period - (time.time() - start)))
    if prof is not None:
        prof.disable()
        prof.dump_stats(f"{os.environ['SCALE_LIVE_PROFILE_WORKERS']}.{os.getpid()}")
    results.put(("traffic", _traffic(wds) - (base or 0), rounds))


class _Clocked(io.StringIO):
    """The leader's stderr: when the verdict's paragraph ("Deadlock: ...") was first written."""
    first_said = None

    def write(self, text):
        if self.first_said is None and "Deadlock" in text:
            self.first_said = time.time()
        return super().write(text)


def _trace_round(wd, view, since_hang: float, took: float, new: list) -> None:
    """SCALE_LIVE_TRACE: one line a leader round from the hang to the verdict: what it held in
    full, the groups it asked for, what it judged."""
    from colltrace.host import tree

    ranks = view.snapshot["ranks"] if view is not None else {}
    full = sum(1 for e in ranks.values() if isinstance(e, dict) and tree.detailed(e))
    last = wd._judged.last
    judged = "not judgeable" if last is None or last[2] is None else [f.kind for f in last[2]]
    if last is not None and last[1] is not None:
        ids = last[1][2]
        prev = getattr(_trace_round, "ids", ())
        _trace_round.ids = ids
        judged = (f"{judged} ({sum(1 for a, b in zip(ids, prev, strict=False) if a != b)} of {len(ids)} tables new, "
                  f"at {last[0] % 100:.2f})")
    print(f"scale_live: root +{since_hang:.2f} s, round {took * 1000:.0f} ms: {len(ranks)} ranks, {full} in full, "
          f"asked {sorted(wd.exchange.wants.groups)}, judged {judged}, new {[f.kind for f in new]}",
          file=sys.stderr, flush=True)


def root(ranks, fan, port, t0, hang_at, ready, done, results, period) -> None:
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    import psutil

    from colltrace.testing import simhosts

    job = _job(ranks, t0, None)
    d = tempfile.mkdtemp(prefix="ct-scale-root-")
    stream = _Clocked()
    wd = simhosts.host_watchdog(job, 1, ("127.0.0.1", port), d, stream, fan)
    me = psutil.Process()
    prof = None
    verdict, cpu0, t_cpu0, said, base, certain = None, None, None, False, None, None
    trace = bool(os.environ.get("SCALE_LIVE_TRACE"))
    while not done.value:
        start = time.time()
        job.hang_at = hang_at.value or None
        if job.hang_at and cpu0 is None:   # the measured window: the hang and AFTER_S after it
            if os.environ.get("SCALE_LIVE_PROFILE"):   # where the leader's time goes in it: pstats into this file
                import cProfile
                prof = cProfile.Profile(time.process_time)
                prof.enable()
            c = me.cpu_times()
            cpu0, t_cpu0, base = c.user + c.system, time.time(), _traffic([wd])
        try:
            new = wd.step()
        except Exception as exc:
            print(f"scale_live: leader: {exc!r}", file=sys.stderr)
            new = []
        view = wd.view()
        if trace and job.hang_at and start >= job.hang_at and verdict is None:
            _trace_round(wd, view, start - job.hang_at, time.time() - start, new)
        if job.hang_at and certain is None and view is not None and _all_hung(view.snapshot, ranks):
            certain = min(time.time(), stream.first_said or float("inf")) - job.hang_at   # the verdict's round held it
        if not said and wd.exchange.link is not None:
            said = True
            ready.put(1)
        if verdict is None and any(f.kind == "deadlock" for f in new) and job.hang_at:
            # when its paragraph reached the job's stderr (the files after it take longer)
            verdict = (stream.first_said or time.time()) - job.hang_at
            text = [f"{f.kind} {f.key}, {len(f.ranks)} ranks named" for f in new]
        if verdict is not None and cpu0 not in (None, REPORTED) and time.time() >= job.hang_at + max(verdict, AFTER_S):
            if prof is not None:
                prof.disable()
            c = me.cpu_times()
            results.put(("verdict", verdict, (c.user + c.system - cpu0) / (time.time() - t_cpu0), text,
                         certain if certain is not None else verdict))
            cpu0 = REPORTED
        time.sleep(max(0.0, period - (time.time() - start)))
    if prof is not None:
        prof.disable()
        prof.dump_stats(os.environ["SCALE_LIVE_PROFILE"])
    results.put(("traffic", _traffic([wd]) - (base or 0), []))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument("--fanout", type=int, default=None, help="children per parent (default: colltrace's)")
    ap.add_argument("--flat", action="store_true", help="every host publishes to the leader (no tree)")
    ap.add_argument("--compare", action="store_true", help="the flat exchange, then the tree, in one run")
    ap.add_argument("--warm", type=float, default=6.0, help="seconds of healthy job after every host connected")
    ap.add_argument("--workers", type=int, default=None, help="processes for the hosts other than the leader")
    ap.add_argument("--period", type=float, default=None, help="seconds between a simulated host's rounds")
    ap.add_argument("--wait", type=float, default=WAIT_FOR_VERDICT_S, help="seconds to wait for the verdict")
    args = ap.parse_args(argv)
    if args.compare:
        flat = run(args, flat=True)
        print(f"flat: {flat}" if flat else "flat: no verdict (above)", flush=True)
        return 0 if run(args, flat=False) else 1
    return 0 if run(args, args.flat) else 1


def run(args, flat: bool) -> str | None:
    """One measured run; its `scale:` line (also printed), or None where it gave no verdict."""
    from torch.distributed import TCPStore

    from colltrace.host import tree
    from colltrace.testing import simhosts

    hosts = -(-args.ranks // simhosts.RANKS_PER_HOST)
    fan = hosts + 1 if flat else (args.fanout or tree.fanout(hosts))
    workers = args.workers or max(1, min(16, (hosts - 1 + 127) // 128))
    period = args.period or 0.1   # a real host's round (host/watchdog.py); here as fast as the cores allow
    job_store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    hang_at, done = ctx.Value("d", 0.0), ctx.Value("b", 0)
    t0 = time.time()
    others = list(range(2, hosts + 1))
    # Whole subtrees a worker (a child of the root and everything under it), dealt out so that every
    # worker holds a like share of the parents: a worker stepping all the parents in turn (hosts
    # 2-46 of a 2,048-host tree) made every level's merge wait for the slowest process.
    subtrees: dict[int, list[int]] = {}
    for i in others:
        top = i
        while tree.Topology(top, hosts, fan).parent not in (None, 1):
            top = tree.Topology(top, hosts, fan).parent
        subtrees.setdefault(top, []).append(i)
    chunks: list[list[int]] = [[] for _ in range(workers)]
    for members in sorted(subtrees.values(), key=len, reverse=True):   # the largest first, to the least held
        min(chunks, key=len).extend(members)
    chunks = [sorted(c) for c in chunks if c]
    procs = [ctx.Process(target=root, args=(args.ranks, fan, job_store.port, t0, hang_at, ready, done, results,
                                            0.1), daemon=True)]
    procs += [ctx.Process(target=worker, args=(c, args.ranks, fan, job_store.port, t0, hang_at, ready, done, results,
                                               period), daemon=True) for c in chunks]
    for p in procs:
        p.start()
    got, deadline = 0, time.time() + 600
    try:
        while got < hosts and time.time() < deadline:
            try:
                got += ready.get(timeout=5)
            except Exception:
                if not all(p.is_alive() for p in procs):
                    print("scale_live: a simulated host's process died", file=sys.stderr)
                    return None
        if got < hosts:
            print(f"scale_live: only {got} of {hosts} hosts connected in 600 s", file=sys.stderr)
            return None
        connected = time.time() - t0
        print(f"scale_live: {hosts} hosts connected in {connected:.1f} s", file=sys.stderr, flush=True)
        time.sleep(args.warm)
        hang_at.value = time.time()
        try:
            kind, verdict, cpu, text, certain = results.get(timeout=args.wait)
        except Exception:
            print(f"scale_live: no verdict within {args.wait:.0f} s of the hang", file=sys.stderr)
            return None
        time.sleep(1.0)
    finally:
        done.value = 1
        window = time.time() - (hang_at.value or time.time())
        traffic, rounds = 0, []
        for _ in procs:
            try:
                _, moved, took = results.get(timeout=30)
            except Exception:
                break
            traffic += moved
            rounds += took
        traffic /= max(window, 1e-6)
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    print(f"{args.ranks} ranks, {hosts} hosts of {simhosts.RANKS_PER_HOST}, "
          f"{'flat (every host to the leader)' if flat else f'tree of fanout {fan}'}; "
          f"{len(chunks)} worker processes, a host's round every {period:.2f} s at most "
          f"({_median(rounds):.2f} s measured after the hang, the median); all connected in {connected:.1f} s")
    for t in text:
        print("  verdict: " + t.replace("\n", " ")[:300])
    print(f"  the root's view held every rank's hung state {certain:.2f} s after the hang (the simulated hosts' "
          f"rounds bring it); the verdict came {verdict - certain:.2f} s after that")
    line = (f"scale: {args.ranks} ranks as {hosts} hosts: verdict {verdict:.2f} s after the hang, "
            f"root CPU {100 * cpu:.0f}% of a core, {traffic / 1e6:.2f} MB/s")
    print(line, flush=True)
    return line


if __name__ == "__main__":
    sys.exit(main())

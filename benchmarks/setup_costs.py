"""What seeing calls that are not collectives costs (colltrace/rank/setup.py, rank/early.py).

    python benchmarks/setup_costs.py [--runs 15] [--calls 2000]

1. A store's get on the job's own TCPStore (one process, the key already set: a round trip to a
   server on this host, the cheapest a get can be), untraced and through colltrace's wrapper with
   a live recorder, in alternating blocks: what every Store.get / Store.wait from Python pays. A
   wait is written to the trace only if it lasts (Recorder.lasting_s), by the recorder's poller.
2. A torchrun worker's interpreter start (`python -c pass`, torchrun's environment) with
   COLLTRACE=1, without and with the early recorder (TORCHELASTIC_RUN_ID removed / present; the
   watchdog off, started once per host): what seeing a rank before it joins costs each worker.
Prints medians. Group creation itself (a few calls per job) is not measured: one record each.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def store_get(calls: int, rounds: int) -> None:
    from types import SimpleNamespace

    from torch.distributed import TCPStore

    from colltrace import config
    from colltrace.rank import setup
    from colltrace.rank.recorder import Recorder

    with tempfile.TemporaryDirectory() as d:
        settings = config.load({"COLLTRACE": "1", "COLLTRACE_DIR": d})
        rec = Recorder(settings, 0, 1, "")
        rec.lasting = setup.lasting
        setup._shim = SimpleNamespace(recorder=rec)
        store = TCPStore("127.0.0.1", 0, 1, True)
        rec.store_id = f"tcp:127.0.0.1:{store.port}"
        store.set("k", "v")
        orig = type(store).get
        wrapped = setup._make_store_wait(orig, "store.get")
        per = {"untraced": [], "traced": []}
        for _ in range(rounds):
            for mode, fn in (("untraced", orig), ("traced", wrapped)):
                t = time.perf_counter()
                for _ in range(calls):
                    fn(store, "k")
                per[mode].append((time.perf_counter() - t) / calls * 1e6)
        u, w = statistics.median(per["untraced"]), statistics.median(per["traced"])
        print(f"store.get on the job's TCPStore: untraced median {u:.1f} us, traced {w:.1f} us "
              f"({w - u:+.2f} us, {w / u:.3f}x; {rounds} blocks of {calls} calls each)")

        class Bare:   # the wrapper's own work, without a store's round trip to hide in
            def get(self, key):
                return key

        bare, bare_wrapped = Bare.get, setup._make_store_wait(Bare.get, "store.get")
        b, n = Bare(), calls * 20
        own = {"untraced": [], "traced": []}
        for _ in range(rounds):
            for mode, fn in (("untraced", bare), ("traced", bare_wrapped)):
                t = time.perf_counter()
                for _ in range(n):
                    fn(b, "k")
                own[mode].append((time.perf_counter() - t) / n * 1e6)
        print(f"the wrapper's own work per call (a get that returns at once): "
              f"{statistics.median(own['traced']) - statistics.median(own['untraced']):.2f} us")
        rec.close()


def interpreter_start(runs: int) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COLLTRACE", "TORCHELASTIC")) and k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as cache:
        # bytecode cached as an installed package has it (a warm-up run writes it)
        base = dict(env, COLLTRACE="1", COLLTRACE_DIR=d, COLLTRACE_WATCHDOG="off", RANK="0", WORLD_SIZE="8",
                    LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", PYTHONPYCACHEPREFIX=cache)
        for program, n in (("pass", runs), ("import torch.distributed", max(3, runs // 3))):
            subprocess.run([sys.executable, "-c", program], env=dict(base, TORCHELASTIC_RUN_ID="bench"), check=True)
            times: dict[str, list] = {"late": [], "early": []}
            cpu: dict[str, list] = {"late": [], "early": []}
            for _ in range(n):
                for mode in ("late", "early"):
                    e = dict(base, TORCHELASTIC_RUN_ID="bench") if mode == "early" else base
                    c0 = _children_cpu()
                    t = time.perf_counter()
                    subprocess.run([sys.executable, "-c", program], env=e, check=True)
                    times[mode].append((time.perf_counter() - t) * 1e3)
                    cpu[mode].append((_children_cpu() - c0) * 1e3)
            late, early = statistics.median(times["late"]), statistics.median(times["early"])
            late_c, early_c = statistics.median(cpu["late"]), statistics.median(cpu["early"])
            print(f"a worker's `python -c '{program}'`, COLLTRACE=1: recorder at init_process_group median "
                  f"{late:.0f} ms ({late_c:.0f} ms of CPU); recorder from the start (torchrun's environment) "
                  f"{early:.0f} ms ({early_c:.0f} ms of CPU): {early - late:+.0f} ms, {early_c - late_c:+.0f} ms of "
                  f"CPU ({n} runs each)")


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    store_get(args.calls, args.runs)
    interpreter_start(args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Wall-clock cost per traced call, world of 1, in one process: untraced, the compiled hot path
and the Python wrappers, in alternating blocks (the same process, the same moment).

    python benchmarks/percall.py [--blocks 30] [--calls 1000]

A world of 1 (gloo, HashStore, no watchdog) takes the peers and the scheduler of a 2-core
ping-pong out of the figure: what is left is the CPU time colltrace adds to a 1-element
all_reduce. Prints the median microseconds per call of each route and what each adds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

LOOP = r"""
import dataclasses, json, os, statistics, sys, time
import torch, torch.distributed as dist
import colltrace; colltrace.install()
blocks, calls = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
from colltrace.rank import hooks, shim
native = hooks.supported(dist.group.WORLD)   # torch >= 2.14: untraced means colltrace's c10d hooks off too

def route(name):
    if native:
        hooks.detach_all() if name == "untraced" else hooks.attach(dist.group.WORLD, shim)
compiled = dist.all_reduce
orig = compiled.__colltrace_original__
shim._state.settings = dataclasses.replace(shim._state.settings, pure=True)
python = shim._make_c10d_wrapper("all_reduce", orig)   # the same wrapper, the compiled path off
routes = [("untraced", orig), ("python", python)]
if getattr(compiled, "__colltrace_plan__", None) is not None:
    routes.insert(1, ("compiled", compiled))
x = torch.ones(1)
for name, f in routes:
    route(name)
    for _ in range(500):
        f(x)
res = {name: [] for name, _ in routes}
for b in range(blocks):
    for name, f in routes[b % len(routes):] + routes[:b % len(routes)]:
        route(name)
        t = time.perf_counter()
        for _ in range(calls):
            f(x)
        res[name].append((time.perf_counter() - t) / calls * 1e6)
route("traced")
dist.destroy_process_group()
print(json.dumps({k: statistics.median(v) for k, v in res.items()}))
"""


def measure(blocks: int, calls: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("COLLTRACE", "TORCH_FR"))}
        env.update(OMP_NUM_THREADS="1", COLLTRACE_WATCHDOG="off", COLLTRACE_DIR=os.path.join(tmp, "trace"))
        out = subprocess.run([sys.executable, "-c", LOOP, str(blocks), str(calls)], env=env, capture_output=True,
                             text=True, timeout=900)
        if out.returncode != 0:
            raise RuntimeError((out.stderr.strip().splitlines() or ["?"])[-1])
        return json.loads(out.stdout.strip().splitlines()[-1])


def report(us: dict[str, float]) -> str:
    base = us["untraced"]
    lines = ["microseconds per 1-element all_reduce, world of 1, one process (median of blocks):"]
    for name in ("untraced", "compiled", "python"):
        if name in us:
            lines.append(f"  {name:<10} {us[name]:8.2f} us   ({us[name] / base:5.2f}x, {us[name] - base:+6.2f} us)")
    if "compiled" not in us:
        lines.append("  compiled   not built here (see hatch_build.py)")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--calls", type=int, default=1000)
    args = ap.parse_args()
    try:
        print(report(measure(args.blocks, args.calls)))
    except RuntimeError as exc:
        print(f"percall: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

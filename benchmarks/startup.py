"""What the start-up hook adds to every interpreter start.

    python benchmarks/startup.py [--runs 30]

1. The hook's own cost with COLLTRACE off: the installed colltrace.pth line, executed the way
   site.py executes it, timed in-process (what every Python start on the machine pays).
2. Whole interpreter starts (`python -c pass`), alternating COLLTRACE unset / COLLTRACE=1
   (the latter imports colltrace._boot and arranges the patch; torch is not imported).
Prints medians; the goal is < 2 ms added with COLLTRACE off.
"""
from __future__ import annotations

import argparse
import os
import site
import statistics
import subprocess
import sys
import time


def pth_line() -> str:
    for d in site.getsitepackages():
        path = os.path.join(d, "colltrace.pth")
        if os.path.exists(path):
            with open(path) as f:
                return next(line for line in f if line.startswith("import"))
    raise SystemExit("colltrace.pth is not installed in site-packages (pip install -e . first)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    line = pth_line()
    env = {k: v for k, v in os.environ.items() if k != "COLLTRACE"}
    os.environ.pop("COLLTRACE", None)
    code = compile(line, "colltrace.pth", "exec")
    n = 20000
    t = time.perf_counter()
    for _ in range(n):
        exec(code, {})
    hook_us = (time.perf_counter() - t) / n * 1e6
    print(f"hook with COLLTRACE off: {hook_us:.2f} us per interpreter start (in-process, {n} runs)")
    times = {"off": [], "on": []}
    for _ in range(args.runs):
        for mode in ("off", "on"):
            e = dict(env, COLLTRACE="1") if mode == "on" else env
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], env=e, check=True)
            times[mode].append((time.perf_counter() - t) * 1e3)
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(f"python -c pass, COLLTRACE unset: median {off:.1f} ms")
    print(f"python -c pass, COLLTRACE=1:     median {on:.1f} ms  "
          f"(+{on - off:.1f} ms: imports colltrace._boot, no torch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

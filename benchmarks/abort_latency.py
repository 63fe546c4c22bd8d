"""How soon COLLTRACE_ON_HANG=abort ends a deadlocked job: from the finding to the launcher's exit.

    python benchmarks/abort_latency.py [--ranks 4 16] [--repeats 3]

Each run is the cross-group deadlock of a checkpoint barrier and a teacher (tests/integration/jobs/scenarios.py
deadlock: every rank but 3 in a default-group barrier, rank 3 in a gather on another group) on N gloo ranks
under torchrun, traced with COLLTRACE_ON_HANG=abort and default timeouts. For each run:
  kill:  the time colltrace ended the ranks (ended-<host>.json) minus the finding's detected_at;
  exit:  the time torchrun exited minus the finding's detected_at (what a user waits for).
Prints one line per rank count: the median and the range of both over the repeats.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "tests", "integration", "jobs", "scenarios.py")


def one(n: int, tmp: str) -> tuple[float, float]:
    d = tempfile.mkdtemp(dir=tmp)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLLTRACE")}
    env.update(COLLTRACE="1", COLLTRACE_DIR=d, COLLTRACE_ON_HANG="abort", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", SCRIPT, "deadlock"]
    subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    exited = time.time()
    with open(os.path.join(d, "findings.jsonl")) as f:
        (finding,) = [x for x in map(json.loads, f) if x["kind"] == "deadlock"]
    (ended,) = [n for n in os.listdir(d) if n.startswith("ended-")]
    with open(os.path.join(d, ended)) as f:
        killed = json.load(f)["at"]
    return killed - finding["detected_at"], exited - finding["detected_at"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="colltrace-abort-")
    try:
        for n in args.ranks:
            runs = [one(n, tmp) for _ in range(args.repeats)]
            kill = [k for k, _ in runs]
            exit_ = [e for _, e in runs]
            print(f"abort on {n} gloo ranks: ranks ended {statistics.median(kill):.2f} s after the finding "
                  f"({min(kill):.2f}-{max(kill):.2f}), torchrun exited {statistics.median(exit_):.2f} s after it "
                  f"({min(exit_):.2f}-{max(exit_):.2f}), {args.repeats} runs", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

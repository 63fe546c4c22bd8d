"""How fast colltrace names a hang, beside what PyTorch alone does on the same scenario.

    python benchmarks/detection.py [--repeats 3] [--stall-s 2] [--pytorch-timeout-s 20]

For each scenario of tests/integration/jobs/scenarios.py (4 gloo ranks under torchrun), and
`run_ahead` (tests/integration/jobs/async_shapes.py, SHAPE=cross: NCCL's shape made on gloo, ranks
0-2 enqueue an all_reduce with async_op=True that rank 3 never calls, run ahead through two more
calls and park in Work.wait(); rank 3 parks in its own gather's wait):
  colltrace: COLLTRACE=1, default process-group timeouts, COLLTRACE_ON_HANG=abort. Latency is
    detected_at minus the moment the hang became certain: the last involved rank entering its
    collective (mismatch, deadlock, stall), the last rank parking in a wait (run_ahead), or the
    rank's death (dead_rank: its faulthandler file's time).
  PyTorch alone: untraced; gloo's default timeout is 30 minutes, too long to wait here, so the
    same job runs with the timeout shortened to --pytorch-timeout-s to show what it prints then,
    and again with TORCH_DISTRIBUTED_DEBUG=DETAIL (which checks op and shapes before each
    collective): how long until PyTorch says something, and its first line.
Prints one table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS = os.path.join(HERE, "..", "tests", "integration", "jobs")
SCRIPT = os.path.join(JOBS, "scenarios.py")
SCENARIOS = ["mismatch", "deadlock", "dead_rank", "stall", "run_ahead"]
# a scenario of another job: (its script, its environment)
OTHER_JOBS = {"run_ahead": (os.path.join(JOBS, "async_shapes.py"), {"SHAPE": "cross"})}
GLOO_DEFAULT_TIMEOUT_S = 1800


def torchrun(scenario: str, env: dict, timeout: float) -> tuple[int, str, float]:
    script, extra = OTHER_JOBS.get(scenario, (SCRIPT, None))
    args = [] if extra else [scenario]
    env = dict(env, **(extra or {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", script, *args]
    t0 = time.time()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stderr, time.time() - t0


def base_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLLTRACE", "TORCH_DISTRIBUTED_DEBUG"))}
    env.update(OMP_NUM_THREADS="1")
    return env


def certain_at(finding: dict, directory: str) -> float:
    if finding["kind"] == "dead_rank":
        dead = [r for r, info in finding["ranks"].items() if info.get("state") == "dead"]
        path = os.path.join(directory, f"rank-{int(dead[0]):05d}.fault.txt")
        return os.path.getmtime(path)
    # a rank parked in a wait for an async call (or a blocking call queued behind it) is certain
    # from its park on, one in a blocking collective from its entry
    entered = [(info.get("parked") or {}).get("since") or info["entered_at"]
               for info in finding["ranks"].values() if info.get("entered_at")]
    return max(entered)


def run_colltrace(scenario: str, stall_s: float, tmp: str) -> dict:
    d = tempfile.mkdtemp(dir=tmp)
    env = dict(base_env(), COLLTRACE="1", COLLTRACE_DIR=d, COLLTRACE_ON_HANG="abort", COLLTRACE_STALL_S=str(stall_s))
    rc, err, wall = torchrun(scenario, env, timeout=300)
    path = os.path.join(d, "findings.jsonl")
    findings = []
    if os.path.exists(path):
        with open(path) as f:
            findings = [json.loads(line) for line in f]
    if not findings:
        return {"latency": None, "kind": None, "wall": wall, "rc": rc}
    f = findings[0]
    return {"latency": f["detected_at"] - certain_at(f, d), "kind": f["kind"], "wall": wall, "rc": rc,
            "summary": f["summary"]}


def run_pytorch(scenario: str, timeout_s: float, detail: bool = False) -> dict:
    env = dict(base_env(), PG_TIMEOUT_S=str(timeout_s))
    if detail:
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    rc, err, wall = torchrun(scenario, env, timeout=timeout_s * 4 + 120)
    lines = [line for line in err.splitlines() if "rror" in line or "imeout" in line or "Signal" in line]
    first = next((line for line in lines if "Traceback" not in line), "(nothing)")
    return {"wall": wall, "rc": rc, "said": first.strip()[:200]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stall-s", type=float, default=2.0)
    ap.add_argument("--pytorch-timeout-s", type=float, default=20.0)
    ap.add_argument("--scenario", action="append", choices=SCENARIOS)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in args.scenario or SCENARIOS:
            runs = [run_colltrace(scenario, args.stall_s, tmp) for _ in range(args.repeats)]
            lat = [r["latency"] for r in runs if r["latency"] is not None]
            torch_alone = run_pytorch(scenario, args.pytorch_timeout_s)
            detail = run_pytorch(scenario, args.pytorch_timeout_s, detail=True)
            rows.append((scenario, runs, lat, torch_alone, detail))
            med = f"{statistics.median(lat):.2f} s" if lat else "not detected"
            print(f"{scenario:<10} colltrace: {runs[0]['kind']}, median {med} over {len(lat)}/{len(runs)} runs "
                  f"(job ended in {statistics.median(r['wall'] for r in runs):.1f} s, exit {runs[0]['rc']})",
                  flush=True)
            print(f"{'':<10} PyTorch alone: default timeout {GLOO_DEFAULT_TIMEOUT_S} s (gloo); shortened to "
                  f"{args.pytorch_timeout_s:.0f} s it ended after {torch_alone['wall']:.1f} s "
                  f"(exit {torch_alone['rc']}) "
                  f"saying: {torch_alone['said']}", flush=True)
            print(f"{'':<10} DETAIL: ended after {detail['wall']:.1f} s (exit {detail['rc']}) saying: {detail['said']}",
                  flush=True)
    print()
    print(f"| scenario | colltrace finding | detection latency (median of {args.repeats}) | PyTorch alone "
          f"(timeout shortened to {args.pytorch_timeout_s:.0f} s) | TORCH_DISTRIBUTED_DEBUG=DETAIL (same timeout) |")
    print("|---|---|---|---|---|")
    for scenario, runs, lat, torch_alone, detail in rows:
        med = f"{statistics.median(lat):.2f} s" if lat else "not detected"
        extra = f" (threshold {args.stall_s:.0f} s)" if scenario == "stall" else ""
        print(f"| {scenario} | {runs[0]['kind']} | {med}{extra} | after {torch_alone['wall']:.0f} s: "
              f"`{torch_alone['said'][:110]}` | after {detail['wall']:.0f} s: `{detail['said'][:110]}` |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

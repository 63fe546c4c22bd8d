"""The shipped distillation trainer under colltrace: what each switch's finding says, how soon,
and what tracing costs a training step.

    python benchmarks/distill.py [--bugs all] [--rounds 5] [--steps 60] [--no-hooks]

1. Every switch of examples/distill (4 gloo ranks under torchrun, default process-group timeouts,
   COLLTRACE_ON_HANG=abort, COLLTRACE_STALL_S=10; COLLTRACE_DIGEST=1 for loader_before_pg): the
   finding's paragraph and the time from the hang becoming certain to the finding (the last
   involved rank entering its collective; a dead rank's faulthandler file; for duplicate data,
   the call that made the pattern).
2. Step time of the correct trainer, untraced and traced (COLLTRACE=1, watchdog on), alternating
   round by round so that drift hits both alike; the trainer prints the median step of its run.
Prints a markdown table and the step-time medians.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "examples", "distill", "train.py")
sys.path.insert(0, os.path.join(HERE, "..", "examples", "distill"))
import bugs  # noqa: E402


def torchrun(args: list, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", TRAIN, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def base_env(tmp: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLLTRACE", "TORCH_DISTRIBUTED_DEBUG"))}
    env.update(OMP_NUM_THREADS="1", DISTILL_DUMP_DIR=tempfile.mkdtemp(dir=tmp))
    return env


def certain_at(f: dict, directory: str) -> float:
    if f["kind"] == "dead_rank":
        return os.path.getmtime(os.path.join(directory, f"rank-{int(f['rank']):05d}.fault.txt"))
    if f["kind"] == "duplicate_data":
        return max(e["entered_at"] for e in f["ranks"].values())
    return max(e["entered_at"] for e in f["ranks"].values() if e.get("entered_at"))


def run_bug(bug: str, tmp: str) -> dict:
    d = tempfile.mkdtemp(dir=tmp)
    env = dict(base_env(tmp), COLLTRACE="1", COLLTRACE_DIR=d, COLLTRACE_ON_HANG="abort", COLLTRACE_STALL_S="10")
    if bug == "loader_before_pg":
        env["COLLTRACE_DIGEST"] = "1"
    t0 = time.time()
    p = torchrun(["--bug", bug], env)
    wall = time.time() - t0
    path = os.path.join(d, "findings.jsonl")
    findings = []
    if os.path.exists(path):
        with open(path) as f:
            findings = [json.loads(line) for line in f]
    if not findings:
        return {"bug": bug, "kind": None, "latency": None, "summary": "(no finding)", "rc": p.returncode, "wall": wall}
    f = findings[0]
    return {"bug": bug, "kind": f["kind"], "latency": f["detected_at"] - certain_at(f, d), "summary": f["summary"],
            "rc": p.returncode, "wall": wall}


def step_ms(out: str) -> float:
    m = re.search(r"median step ([\d.]+) ms", out)
    if not m:
        raise RuntimeError("the trainer printed no median step time:\n" + out[-2000:])
    return float(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bugs", default="all", help="comma-separated switches, or all")
    ap.add_argument("--rounds", type=int, default=5, help="untraced/traced pairs for the step time (0: skip)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--no-hooks", action="store_true",
                    help="trace the step-time runs with COLLTRACE_HOOKS=0 (torch >= 2.14: no c10d hooks, "
                         "the wrappers alone)")
    args = ap.parse_args()
    names = list(bugs.SWITCHES) if args.bugs == "all" else [b for b in args.bugs.split(",") if b]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for bug in names:
            r = run_bug(bug, tmp)
            rows.append(r)
            lat = f"{r['latency']:.2f} s" if r["latency"] is not None else "-"
            print(f"{bug:<22} {r['kind']}  {lat}  (job ended after {r['wall']:.1f} s, exit {r['rc']})", flush=True)
        times = {"untraced": [], "traced": []}
        for i in range(args.rounds):
            order = ("untraced", "traced") if i % 2 == 0 else ("traced", "untraced")
            for mode in order:
                env = base_env(tmp)
                if mode == "traced":
                    env.update(COLLTRACE="1", COLLTRACE_DIR=tempfile.mkdtemp(dir=tmp))
                    if args.no_hooks:
                        env["COLLTRACE_HOOKS"] = "0"
                p = torchrun(["--steps", str(args.steps), "--ckpt-every", "0"], env)
                if p.returncode != 0:
                    raise RuntimeError(f"{mode} run failed: {p.stderr[-2000:]}")
                times[mode].append(step_ms(p.stdout))
                print(f"round {i + 1}/{args.rounds} {mode:<8} median step {times[mode][-1]:.2f} ms", flush=True)
    print()
    print("| switch | finding | what colltrace printed | hang → finding |")
    print("|---|---|---|---|")
    for r in rows:
        lat = f"{r['latency']:.2f} s" if r["latency"] is not None else "-"
        print(f"| `{r['bug']}` | `{r['kind']}` | {r['summary']} | {lat} |")
    if args.rounds:
        u, t = statistics.median(times["untraced"]), statistics.median(times["traced"])
        print(f"\nstep time, median of {args.rounds} runs x {args.steps} steps: untraced {u:.2f} ms, "
              f"traced {t:.2f} ms, ratio {t / u:.3f} ({100 * (t / u - 1):+.1f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

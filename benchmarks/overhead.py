"""Cost of tracing per collective, side by side in one run.

    python benchmarks/overhead.py [--rounds 5] [--iters 2000] [--steps 100]

Two gloo ranks on this machine, measured three ways:

1. In-process A/B (the precise figure): one pair of traced processes alternates blocks of
   1-element all_reduce calls through colltrace's wrapper and through the original function,
   and likewise whole DDP training steps (forward, backward with DDP's C++ all-reduces, step,
   and one metrics all_reduce as trainers do). Same processes, same sockets, same moment:
   the ratio is the wrapper's cost and nothing else. On torch >= 2.14 a third route, the
   original function with colltrace's c10d hooks on (the native route), and "untraced" has
   them off; and a fourth, "floor": untraced with a builtin registered as both c10d hooks,
   what c10d itself spends on a group that has Python hooks, so that traced/floor is colltrace's
   own share in wall clock too. Where `colltrace build-hooks` built its C++ module (any torch),
   "traced" uses it (its counter and tensor readers; on torch >= 2.14 its c10d hooks) and another route,
   "pyhooks", is the Python route a rank takes without the build: counters read through pybind,
   hooks registered from Python; the floor then compares with that one.
2. Separate processes: untraced, traced (COLLTRACE=1 path, everything on), PyTorch's Flight
   Recorder (TORCH_FR_BUFFER_SIZE=2000) and TORCH_DISTRIBUTED_DEBUG=DETAIL, alternating round
   by round so drift hits all alike. Noisier (each pair of processes lands differently on 2
   cores), but it is what a user runs.
3. Wall clock per call, world of 1, one process (benchmarks/percall.py): untraced, the
   compiled hot path and the Python wrappers in alternating blocks, without the peers and the
   scheduler of a 2-core ping-pong: the CPU time colltrace adds.
4. Instructions per call (benchmarks/instructions.py, valgrind's callgrind, world of 1): the
   deterministic figure, untraced / traced (the compiled hot path where it was built) / the
   Python wrappers alone (COLLTRACE_PURE=1) / Flight Recorder (skipped with a note if valgrind
   is not installed, or with --no-instructions).
DETAIL with DDP on gloo segfaults in torch 2.13 even for a correct program: not measured.
Prints medians, ratios and the added microseconds per collective.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from torch.distributed import TCPStore

WORKER = r"""
import json, os, sys, time, statistics
import torch, torch.distributed as dist
mode, n, steps, blocks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if mode in ("traced", "ab"):
    import colltrace; colltrace.install()
dist.init_process_group("gloo")
rank = dist.get_rank()
native = False
if mode == "ab":   # torch >= 2.14: orig() goes through c10d's hooks, colltrace's native route
    from colltrace.rank import hooks, shim
    native = hooks.supported(dist.group.WORLD) and os.environ.get("COLLTRACE_HOOKS") != "0"

FLOOR_ID = 7   # c10d's toll for any hooks: a builtin registered as both, under an id of its own

cxx = False   # `colltrace build-hooks`' C++ module is in use (known once the first traced call described the group)

def route(name):   # untraced and floor: our hooks off; traced (the wrapper), hook (the native route): on;
    if cxx:        # pyhooks: the Python route, as without a build: counters read through pybind,
        fastpath.use_readers(None if name == "pyhooks" else hooks._compiled[0])
    if native:     # and our hooks registered from Python
        pg = dist.group.WORLD
        hooks.detach_all()
        if name not in ("untraced", "floor"):
            built = hooks._compiled[:]
            if name == "pyhooks":
                hooks._compiled[:] = [None]
            hooks.attach(pg, shim)
            hooks._compiled[:] = built
        if name == "floor":
            pg.register_pre_hook(FLOOR_ID, id); pg.register_post_hook(FLOOR_ID, id)
        else:
            pg.unregister_pre_hook(FLOOR_ID); pg.unregister_post_hook(FLOOR_ID)
wrapped = dist.all_reduce
orig = getattr(wrapped, "__colltrace_original__", wrapped)
x = torch.ones(1)
if mode != "detail":  # DDP under DETAIL segfaults on gloo in torch 2.13
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    data = torch.randn(32, 256)

def allreduce_block(f, count):
    times = []
    for _ in range(count):
        t = time.perf_counter(); f(x); times.append(time.perf_counter() - t)
    return statistics.median(times)

def step_block(f, count):
    times = []
    for _ in range(count):
        t = time.perf_counter()
        opt.zero_grad(); loss = ddp(data).pow(2).mean(); loss.backward(); opt.step()
        f(loss.detach().clone())   # a metrics all_reduce per step
        times.append(time.perf_counter() - t)
    return statistics.median(times)

for _ in range(200): orig(x)
if mode == "ab":
    wrapped(x)   # the group described: build-hooks' module loaded, where there is one
    from colltrace.rank import fastpath
    cxx = hooks.compiled_in_use()
if mode != "detail":
    step_block(orig, 10)
out = {}
if mode == "ab":
    routes = ([("untraced", orig), ("traced", wrapped)] + ([("hook", orig), ("floor", orig)] if native else [])
              + ([("pyhooks", wrapped)] if cxx else []))
    res = {k: {name: [] for name, _ in routes} for k in ("allreduce", "ddp_step")}
    for b in range(blocks):
        order = routes[b % len(routes):] + routes[:b % len(routes)]
        for name, f in order:
            route(name)
            res["allreduce"][name].append(allreduce_block(f, n // blocks))
        for name, f in order:
            route(name)
            res["ddp_step"][name].append(step_block(f, max(2, steps // blocks)))
    out = {k: {m: statistics.median(v) * 1e6 for m, v in d.items()} for k, d in res.items()}
    out["blocks"] = {k: {m: [t * 1e6 for t in v] for m, v in d.items()} for k, d in res.items()}
else:
    out = {"allreduce": allreduce_block(wrapped, n) * 1e6}
    if mode != "detail":
        out["ddp_step"] = step_block(wrapped, steps) * 1e6
dist.barrier()
if rank == 0:
    print(json.dumps(out), flush=True)
if mode != "detail":   # a group that outlives destroy_process_group can make gloo abort at exit
    del ddp, opt, model
dist.destroy_process_group()
"""


def run_pair(mode: str, args, script: str, trace_dir: str) -> dict:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLLTRACE", "TORCH_DISTRIBUTED_DEBUG"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), WORLD_SIZE="2",
               TORCHELASTIC_USE_AGENT_STORE="True", OMP_NUM_THREADS="1")
    env = {k: v for k, v in env.items() if not k.startswith("TORCH_FR")}
    if mode == "detail":
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    if mode == "flightrec":
        env["TORCH_FR_BUFFER_SIZE"] = "2000"
    if mode in ("traced", "ab"):
        env.update(COLLTRACE_DIR=trace_dir, COLLTRACE_WATCHDOG="off")
        if args.no_hooks:
            env["COLLTRACE_HOOKS"] = "0"
    if mode == "traced":
        env["COLLTRACE"] = "1"
        env["COLLTRACE_WATCHDOG"] = "auto"   # the whole product: the watchdog runs beside the job
    argv = [sys.executable, script, mode, str(args.iters), str(args.steps), str(args.blocks)]
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        if p.returncode != 0 and not _exit_abort_after_results(p.returncode, err, outs[0][0]):
            raise RuntimeError(f"{mode} rank failed (exit {p.returncode}): {err.strip().splitlines()[-1:]}")
    _stop_watchdogs(trace_dir)
    return json.loads(outs[0][0].strip().splitlines()[-1])


def _exit_abort_after_results(returncode: int, err: str, out: str) -> bool:
    """gloo's abort at interpreter exit (torch's race, see the README's FAQ), after rank 0 printed
    its figures: the round's measurements stand."""
    aborted = returncode == -6 and "terminate called without an active exception" in err
    if aborted and out.strip():
        print("  (a rank hit gloo's abort at interpreter exit after the round was measured; figures kept)",
              flush=True)
    return aborted and bool(out.strip())


def _stop_watchdogs(directory: str) -> None:
    import psutil

    for p in psutil.process_iter(["cmdline"]):
        if "colltrace.host" in (p.info.get("cmdline") or []) and directory in p.info["cmdline"]:
            try:
                p.wait(timeout=10)
            except psutil.TimeoutExpired:
                p.kill()


def paired(blocks: list, kind: str, route: str, base: str) -> tuple[float, list[float]]:
    """The A/B ratio as a paired design reads it: in each round, each block of `route` over the
    `base` block beside it (the same processes, moments apart), their median; then the median over
    rounds. A round's level moves by ±10 % on a shared 2-core machine; a ratio of medians taken
    over rounds carries that, a paired one does not. Returns (ratio, the rounds' ratios)."""
    rounds = [statistics.median(a / b for a, b in zip(r[kind][route], r[kind][base], strict=False)) for r in blocks]
    return statistics.median(rounds), rounds


def line(label: str, med: float, base: float, unit: str, base_name: str = "untraced", ratio=None) -> str:
    """One A/B figure: the paired ratio (`ratio`: paired()'s), else the ratio of the medians."""
    r, rounds = ratio if ratio is not None else (med / base, None)
    spread = f"; rounds {min(rounds):.3f} to {max(rounds):.3f}" if rounds and len(rounds) > 1 else ""
    return (f"{label:<42} {r:6.3f}   ({med:9.1f} us vs {base:9.1f} us {base_name}; "
            f"added {med - base:+8.1f} us per {unit}{spread})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=2000, help="all_reduce calls per rank per round")
    ap.add_argument("--steps", type=int, default=100, help="DDP training steps per round")
    ap.add_argument("--blocks", type=int, default=10, help="A/B blocks per round (in-process mode)")
    ap.add_argument("--no-instructions", action="store_true", help="skip the callgrind count")
    ap.add_argument("--ab-only", action="store_true", help="only the in-process A/B (a quick run)")
    ap.add_argument("--no-hooks", action="store_true",
                    help="trace with COLLTRACE_HOOKS=0 (torch >= 2.14: no c10d hooks, the wrappers alone)")
    args = ap.parse_args()
    res: dict = {}
    blocks: list = []   # per A/B round: {kind: {route: [per-block median us]}}
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        for rnd in range(args.rounds):
            for mode in ("ab",) if args.ab_only else ("ab", "untraced", "traced", "flightrec", "detail"):
                out = run_pair(mode, args, script, os.path.join(tmp, f"trace-{mode}-{rnd}"))
                if mode == "ab":
                    blocks.append(out.pop("blocks"))
                    for kind, d in out.items():
                        for m, v in d.items():
                            res.setdefault(("ab", kind, m), []).append(v)
                else:
                    for kind, v in out.items():
                        res.setdefault(("sep", kind, mode), []).append(v)
                print(f"round {rnd + 1}/{args.rounds} {mode:<8} {json.dumps(out)}", flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"\nmedians over {args.rounds} rounds (2 gloo ranks, 1-element all_reduce; DDP step of a 256-512-256 MLP)")
    print("ratio to untraced (in-process A/B: paired, each block over the untraced block beside it):")

    def ab(label, kind, route, base="untraced"):
        unit = "collective" if kind == "allreduce" else "step"
        print(line(label, med[("ab", kind, route)], med[("ab", kind, base)], unit, base_name=base,
                   ratio=paired(blocks, kind, route, base)))

    ab("in-process A/B, all_reduce traced", "allreduce", "traced")
    ab("in-process A/B, DDP step traced", "ddp_step", "traced")
    pyhooks = ("ab", "allreduce", "pyhooks") in med   # build-hooks' C++ module: traced used it
    if pyhooks:
        ab("in-process A/B, all_reduce traced, Python route", "allreduce", "pyhooks")
    if ("ab", "allreduce", "floor") in med:   # torch >= 2.14: what c10d spends on Python hooks, and ours beyond it
        ab("in-process A/B, all_reduce, c10d Python-hook floor", "allreduce", "floor")
        ab(f"in-process A/B, all_reduce traced{', Python route,' if pyhooks else ''} over floor", "allreduce",
           "pyhooks" if pyhooks else "traced", base="floor")
    if ("ab", "allreduce", "hook") in med:   # torch >= 2.14
        ab("in-process A/B, all_reduce via hook", "allreduce", "hook")
        ab("in-process A/B, DDP step, hooks on", "ddp_step", "hook")
    if args.ab_only:
        return 0
    print(line("separate processes, all_reduce traced", med[("sep", "allreduce", "traced")],
               med[("sep", "allreduce", "untraced")], "collective"))
    print(line("separate processes, all_reduce Flight Rec.", med[("sep", "allreduce", "flightrec")],
               med[("sep", "allreduce", "untraced")], "collective"))
    print(line("separate processes, all_reduce DETAIL", med[("sep", "allreduce", "detail")],
               med[("sep", "allreduce", "untraced")], "collective"))
    print(line("separate processes, DDP step traced", med[("sep", "ddp_step", "traced")],
               med[("sep", "ddp_step", "untraced")], "step"))
    print(line("separate processes, DDP step Flight Rec.", med[("sep", "ddp_step", "flightrec")],
               med[("sep", "ddp_step", "untraced")], "step"))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import percall

    try:
        print("\n" + percall.report(percall.measure(30, 1000)))
    except RuntimeError as exc:
        print(f"\nper-call wall clock, world of 1: not measured ({exc})")
    if not args.no_instructions:
        import instructions

        try:
            print("\n" + instructions.report(instructions.per_call(100, 500)))
        except RuntimeError as exc:
            print(f"\ninstructions per call: not counted ({exc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

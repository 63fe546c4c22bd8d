"""Instructions per traced collective, counted by valgrind's callgrind: a deterministic figure.

    python benchmarks/instructions.py [--small 100] [--large 500] [--modes untraced hooks] [--step]

Wall-clock ratios on a shared 2-core machine move by ±5 % from run to run; an instruction count
does not. One process, a world of 1 (gloo, HashStore, no watchdog), a loop of 1-element
all_reduce calls; callgrind counts only inside the loop (instrumentation switched on and off
around it with callgrind_control). Each mode runs twice, with `--small` and `--large` calls, and
the difference divided by the difference in calls is the cost of one call, with the fixed cost of
switching the counter on and off cancelled out. Modes: untraced, traced (colltrace.install():
the compiled hot path where it was built, else the Python wrappers), traced-python (the Python
wrappers alone, COLLTRACE_PURE=1), flightrec (PyTorch's Flight Recorder, TORCH_FR_BUFFER_SIZE=2000),
and on torch >= 2.14 hooks (the original function: c10d's per-group hooks record it, colltrace's
route for what no wrapper sees) and hooks-floor (untraced, with a builtin registered as both c10d
hooks: what c10d itself spends on every collective of a group that has hooks, which a traced call
pays too where its hooks are Python ones; traced-pyhooks minus hooks-floor is colltrace's own share)
and traced-nohooks (COLLTRACE_HOOKS=0: the wrappers alone, as on 2.13); on any torch where
`colltrace build-hooks` built its C++ module (which traced and hooks use: its counter and tensor readers, and
its c10d hooks on torch >= 2.14), traced-pyhooks (COLLTRACE_HOOKS=python: the Python route, hooks
registered from Python and counters read through pybind); by name only, hooks-floor-cxx (torch >= 2.14; it first
builds a torch C++ extension, so it needs a compiler and ninja): the same floor for no-op hooks registered
from C++, which c10d calls without taking the GIL or making Python argument objects.
--step counts a whole DDP training step instead (world of 1: DDP's bucket all-reduce, the hook route
on torch >= 2.14, and one metrics all_reduce through the wrapper): the share of a training step that
tracing costs, without a 2-core machine's scheduling noise.
Needs valgrind (apt-get install valgrind).
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

LOOP = r"""
import os, subprocess, sys
mode, n, workload = sys.argv[1], int(sys.argv[2]), sys.argv[3]
import torch, torch.distributed as dist
if mode.startswith("traced") or mode == "hooks":
    import colltrace; colltrace.install()
torch.manual_seed(0)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
x = torch.ones(1)
f = dist.all_reduce
if workload == "step":   # a DDP training step (the MLP of overhead.py) and one metrics all_reduce, as trainers do
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    data = torch.randn(32, 256)
    def f(_):
        opt.zero_grad(); loss = ddp(data).pow(2).mean(); loss.backward(); opt.step()
        dist.all_reduce(loss.detach())
if mode == "hooks-floor":   # torch >= 2.14: the cheapest hooks there are (a builtin), what c10d spends to call any
    dist.group.WORLD.register_pre_hook(1, id)
    dist.group.WORLD.register_post_hook(1, id)
if mode == "hooks-floor-cxx":   # the same floor for hooks written in C++ (no GIL, no Python argument objects)
    sys.path.insert(0, os.environ["CT_CXX_DIR"]); import ct_hook_floor; ct_hook_floor.attach(dist.group.WORLD)
if mode == "hooks":   # torch >= 2.14: the original function, recorded by colltrace's c10d hooks alone
    f = f.__colltrace_original__
for _ in range(50 if workload == "allreduce" else 5):   # warm: every stack and signature interned, every cache filled
    f(x)
def toggle(on):
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
toggle(True)
for _ in range(n):
    f(x)
toggle(False)
if workload == "step":   # a group that outlives destroy_process_group can make gloo abort at exit
    del ddp, opt, model, f
dist.destroy_process_group()
"""

MODES = ("untraced", "traced", "traced-python", "flightrec")
# torch >= 2.14 only: the hook route, c10d's floor, and the wrappers without hooks.
HOOK_MODES = ("hooks", "hooks-floor", "traced-nohooks", "traced-pyhooks")
# Asked for by name only (--modes): it compiles a torch C++ extension first (a compiler and ninja).
OPT_IN = ("hooks-floor-cxx",)

# No-op pre/post hooks registered from C++ (torch >= 2.14's ProcessGroup::registerPreHook): what
# c10d's hook dispatch costs when the hooks are not Python callables, beside hooks-floor's builtin.
CXX_HOOKS = r"""
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
static thread_local long depth = 1;   // as a gate's test of colltrace's thread-local depth
void attach(const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  pg->registerPreHook(7, [](const c10d::PreHookArgs&) { if (depth) return; });
  pg->registerPostHook(7, [](const c10d::PostHookArgs&) { if (depth) return; });
}
"""


def cxx_hooks(tmp: str) -> str:
    """The folder of the built no-op C++ hooks module (ct_hook_floor), built once per run."""
    out = os.path.join(tmp, "cxx")
    if not os.path.isdir(out):
        os.makedirs(out)
        from torch.utils.cpp_extension import load_inline

        load_inline("ct_hook_floor", cpp_sources=[CXX_HOOKS], functions=["attach"], build_directory=out)
    return out


def count(mode: str, calls: int, tmp: str, workload: str = "allreduce") -> int:
    """Instructions callgrind counted inside the loop of `calls` calls (or training steps)."""
    script = os.path.join(tmp, "loop.py")
    if not os.path.exists(script):
        with open(script, "w") as f:
            f.write(LOOP)
    out_dir = tempfile.mkdtemp(dir=tmp)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLLTRACE", "TORCH_FR", "TORCH_NCCL_TRACE"))}
    env.update(OMP_NUM_THREADS="1", PYTHONHASHSEED="0", COLLTRACE_DIR=os.path.join(out_dir, "trace"),
               COLLTRACE_WATCHDOG="off")
    if mode == "flightrec":
        env["TORCH_FR_BUFFER_SIZE"] = "2000"
    if mode == "traced-python":
        env["COLLTRACE_PURE"] = "1"
    if mode == "traced-nohooks":
        env["COLLTRACE_HOOKS"] = "0"
    if mode == "traced-pyhooks":
        env["COLLTRACE_HOOKS"] = "python"
    if mode == "hooks-floor-cxx":
        env["CT_CXX_DIR"] = cxx_hooks(tmp)
    # sys.executable, not a launcher script (pyenv's shims are shell scripts valgrind would trace instead).
    # A step is counted on the main thread alone: colltrace's poller wakes by the clock, not by the
    # step, and under valgrind's ~50x slowdown it would be counted ~50x too often per step.
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
           f"--separate-threads={'yes' if workload == 'step' else 'no'}",
           f"--callgrind-out-file={out_dir}/cg.%p", sys.executable, script, mode, str(calls), workload]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} x{calls} failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    total = 0
    for path in glob.glob(os.path.join(out_dir, "cg.*-01" if workload == "step" else "cg.*")):
        with open(path) as f:
            for line in f:
                if line.startswith("totals:"):
                    total += int(line.split()[1])
    if not total:
        raise RuntimeError(f"{mode} x{calls}: callgrind counted nothing (is callgrind_control on PATH?)")
    return total


def modes() -> tuple[str, ...]:
    """MODES, and on torch >= 2.14 "hooks": what no wrapper sees (DDP's reducer, pg.allreduce),
    recorded by c10d's per-group hooks, measured on the same call."""
    import torch.distributed as dist

    from colltrace.rank import hooks

    if hooks.supported(dist.ProcessGroup):
        return MODES + HOOK_MODES + OPT_IN
    # torch < 2.14: where build-hooks built its readers, traced uses them and traced-pyhooks does not
    return MODES + (("traced-pyhooks",) if compiled_hooks() else ())


def per_call(small: int, large: int, only=None, workload: str = "allreduce") -> dict[str, float]:
    """{mode: instructions per call}, measured as the slope between `small` and `large` calls
    (workload "step": per DDP training step)."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise RuntimeError("valgrind is not installed (apt-get install valgrind)")
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes():
            if (only and mode not in only) or (not only and mode in OPT_IN):
                continue
            if workload == "step" and mode == "hooks":
                continue   # the original all_reduce recorded by hooks: a per-call figure, not a step's
            a, b = count(mode, small, tmp, workload), count(mode, large, tmp, workload)
            out[mode] = (b - a) / (large - small)
    return out


def report(figures: dict[str, float], workload: str = "allreduce") -> str:
    base = figures["untraced"]
    what = ("1-element all_reduce" if workload == "allreduce"
            else "DDP training step (256-512-256 MLP, batch 32, SGD, one metrics all_reduce), main thread")
    lines = [f"instructions per {what} (callgrind, world of 1, gloo):"]
    for mode in figures:
        v = figures[mode]
        lines.append(f"  {mode:<13} {v:12,.0f}   ({v / base:6.3f}x, {v - base:+10,.0f} beyond untraced)")
    compiled = compiled_hooks()
    used = ("the C++ module `colltrace build-hooks` built (counter and tensor readers"
            + (", c10d hooks)" if hooks_here() else ")") if compiled
            else "the Python route (no build-hooks build for this torch)")
    lines.append(f"  traced used {used}")
    # c10d's toll for Python hooks (hooks-floor) is paid by the traced call that registers its hooks from Python
    py = "traced-pyhooks" if "traced-pyhooks" in figures else "traced" if not compiled else None
    if py in figures and "hooks-floor" in figures:
        floor = figures["hooks-floor"] - base
        lines.append(f"  of the {py} {'call' if workload == 'allreduce' else 'step'}'s {figures[py] - base:+,.0f}: "
                     f"c10d's dispatch of two Python hooks "
                     f"{floor:+,.0f}, colltrace's own {figures[py] - figures['hooks-floor']:+,.0f}")
    return "\n".join(lines)


def compiled_hooks() -> bool:
    """Whether `colltrace build-hooks` built its C++ module for this torch: the traced modes use it
    (its readers; on torch >= 2.14 its c10d hooks too), traced-pyhooks does not."""
    from colltrace.rank import hookbuild

    return hookbuild.built() is not None


def hooks_here() -> bool:
    from colltrace.rank import hookbuild

    return hookbuild.supported()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, help="calls in the short run (default 100; with --step, steps: 5)")
    ap.add_argument("--large", type=int, help="calls in the long run (default 500; with --step, steps: 20)")
    ap.add_argument("--modes", nargs="+", metavar="MODE",
                    help="run only these modes (untraced is the baseline: keep it)")
    ap.add_argument("--step", action="store_true", help="count a DDP training step instead of one all_reduce")
    args = ap.parse_args()
    workload = "step" if args.step else "allreduce"
    if args.small is None:
        args.small = 5 if args.step else 100
    if args.large is None:
        args.large = 20 if args.step else 500
    if args.modes and "untraced" not in args.modes:
        ap.error("--modes needs untraced (the baseline)")
    unknown = sorted(set(args.modes or ()) - set(MODES + HOOK_MODES + OPT_IN))
    if unknown:
        ap.error(f"unknown mode(s): {', '.join(unknown)}")
    if not 0 < args.small < args.large:
        ap.error("need 0 < --small < --large")
    try:
        figures = per_call(args.small, args.large, args.modes, workload)
    except RuntimeError as exc:
        print(f"instructions: {exc}", file=sys.stderr)
        return 2
    print(report(figures, workload))
    return 0


if __name__ == "__main__":
    sys.exit(main())

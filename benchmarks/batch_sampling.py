"""What sampling the batches a DDP model is fed costs per training step (duplicate_data, issue 30).

    python benchmarks/batch_sampling.py [--small 10] [--large 110] [--loader]

Beside `instructions.py --step`, with its loop and its callgrind count (deterministic: the
instructions of the main thread per DDP training step, a world of 1, gloo), in four modes:
untraced; traced with COLLTRACE_BATCHES=0 (everything but the sampling); traced-unsampled (no
step sampled: what a step that is not sampled pays, the count alone); traced with every step
sampled (the digest of a strided sample of the batch and its line in the defs file). The
default's cost per step is the unsampled step's plus 1/EVERY of a sampled step's extra. A step's
count moves by a few thousand instructions from run to run (where the allocator puts things):
hence the long slope, 100 steps.
--loader: each step's batch comes from a DataLoader (whose iterator colltrace also wraps).
Needs valgrind (apt-get install valgrind).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import instructions  # noqa: E402

LOOP = r"""
import os, subprocess, sys
mode, n, workload = sys.argv[1], int(sys.argv[2]), sys.argv[3]
loader = os.environ.get("CT_BENCH_LOADER") == "1"
if mode == "traced-batches-off":
    os.environ["COLLTRACE_BATCHES"] = "0"
import torch, torch.distributed as dist
if mode.startswith("traced"):
    import colltrace; colltrace.install()
if mode == "traced-every-step":
    from colltrace.rank import batches; batches.EVERY = 1
if mode == "traced-unsampled":
    from colltrace.rank import batches; batches.FIRST_STEPS = 0; batches.EVERY = 1 << 40
torch.manual_seed(0)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
data = torch.randn(32, 256)
if loader:
    ds = torch.utils.data.TensorDataset(torch.randn(32 * 64, 256))
    dl = torch.utils.data.DataLoader(ds, batch_size=32)
    batches = iter(dl)
def f():
    global batches, data
    if loader:
        try:
            (data,) = next(batches)
        except StopIteration:
            batches = iter(dl)
            (data,) = next(batches)
    opt.zero_grad(); loss = ddp(data).pow(2).mean(); loss.backward(); opt.step()
    dist.all_reduce(loss.detach())
for _ in range(10):   # warm
    f()
def toggle(on):
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
toggle(True)
for _ in range(n):
    f()
toggle(False)
del ddp, opt, model, f
dist.destroy_process_group()
"""

MODES = ("untraced", "traced-batches-off", "traced-unsampled", "traced-every-step")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=10, help="steps in the short run")
    ap.add_argument("--large", type=int, default=110, help="steps in the long run")
    ap.add_argument("--loader", action="store_true", help="take each step's batch from a DataLoader")
    args = ap.parse_args()
    if args.loader:
        os.environ["CT_BENCH_LOADER"] = "1"   # instructions.count passes the environment on (but COLLTRACE_*)
    if not 0 < args.small < args.large:
        ap.error("need 0 < --small < --large")
    from colltrace.rank import batches

    fig = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "loop.py"), "w") as f:
                f.write(LOOP)   # instructions.count runs tmp/loop.py: this one
            for mode in MODES:
                a = instructions.count(mode, args.small, tmp, "step")
                b = instructions.count(mode, args.large, tmp, "step")
                fig[mode] = (b - a) / (args.large - args.small)
    except RuntimeError as exc:
        print(f"batch_sampling: {exc}", file=sys.stderr)
        return 2
    base, off = fig["untraced"], fig["traced-batches-off"]
    counted, sampled = fig["traced-unsampled"] - off, fig["traced-every-step"] - off
    per_step = counted + (sampled - counted) / batches.EVERY
    print("instructions per DDP training step (256-512-256 MLP, batch 32, SGD, one metrics all_reduce"
          + (", the batch from a DataLoader" if args.loader else "") + "), main thread (callgrind, world of 1, gloo):")
    for mode in MODES:
        print(f"  {mode:<19} {fig[mode]:12,.0f}   ({fig[mode] / base:6.3f}x)")
    print(f"  an unsampled step's hook {counted:+,.0f}; a sampled step {sampled:+,.0f}; one step in "
          f"{batches.EVERY} sampled: {per_step:+,.0f} per step = {100 * per_step / base:.4f} % of an untraced step")
    return 0


if __name__ == "__main__":
    sys.exit(main())

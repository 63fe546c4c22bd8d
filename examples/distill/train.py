"""A teacher/student distillation trainer in the shape of a real team's job (lingua's
apps/main/train.py with a distillation rank), small enough for CPU and gloo.

    torchrun --standalone --nproc-per-node 4 examples/distill/train.py [--bug NAME] [--steps 30] [--resume]

Ranks 0..N-2 train a student, data parallel (DDP or FSDP2) over their own group; rank N-1
serves a teacher. Every step the training ranks gather their token batches to the teacher, it
runs a forward pass and scatters its logits back; the student trains on a distillation loss.
Metrics are averaged with all_reduce, checkpoints go through torch.distributed.checkpoint, a
probe folder is made behind a barrier, and a preemption signal (SIGUSR2) triggers a save.
`--bug NAME` turns on one of that job's mistakes (see bugs.py and README.md); default: none.
`--straggler teacher` slows the teacher's forward pass (a throttled GPU): the job runs, slower.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import bugs
from checkpoint import CheckpointManager
from data import MarkovTokens, build_loader, transition_matrix
from distributed import (STOP, InterProcessComm, agree_on_flag, dist_mean_dict, init_signal_handler,
                         setup_torch_distributed)
from model import BigramTeacher, Student, distillation_loss, entropy_floor

logger = logging.getLogger("distill")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bug", action="append", default=[], choices=sorted(bugs.SWITCHES),
                   help="turn on one of the reported mistakes (repeatable); default: none")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--parallel", choices=("ddp", "fsdp2"), default="ddp", type=parallel_mode)
    p.add_argument("--log-freq", type=int, default=5)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--probe-freq", type=int, default=10, help="0: no probe folder")
    p.add_argument("--preempt-at-step", type=int, default=None,
                   help="rank 0 receives SIGUSR2 at this step, as from the scheduler before preemption")
    p.add_argument("--dump-dir", default=os.environ.get("DISTILL_DUMP_DIR", "distill-out"),
                   help="checkpoints and the probe folder (default: distill-out, ignored by git)")
    p.add_argument("--resume", action="store_true",
                   help="resume from the newest checkpoint in --dump-dir; without it a run starts at step 0 and "
                        "replaces the checkpoints an earlier run left there")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--setup-s", type=float, default=0.0,
                   help="the training ranks compute this many seconds building their model first, as a large "
                        "model's set-up does (the teacher is ready at once); default: 0")
    p.add_argument("--straggler", choices=("teacher",), default=None,
                   help="the teacher rank is slow: each batch's forward pass takes --straggler-ms longer, as on "
                        "a throttled GPU (not a hang: colltrace names it as a straggler, with its line)")
    p.add_argument("--straggler-ms", type=float, default=40.0)
    args = p.parse_args(argv)
    for name in args.bug:
        bugs.enable(name)
    if bugs.on("preempt_one_rank") and args.preempt_at_step is None:
        args.preempt_at_step = 7
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO, format=f"[rank{rank}] %(asctime)s %(message)s", stream=sys.stderr)
    torch.set_num_threads(1)
    dataset = MarkovTokens(4096, args.seq_len, args.vocab, seed=args.seed)
    loader = None
    if bugs.on("loader_before_pg"):
        # The team's race: the loader is made before the process group exists, so it gets no
        # DistributedSampler and every rank draws the same batches.
        world = int(os.environ.get("WORLD_SIZE", "1"))
        loader = build_loader(dataset, args.batch_size, rank, world - 1, seed=args.seed)  # bug: loader_before_pg
    ipc = setup_torch_distributed()
    preempted = {"flag": False}
    init_signal_handler(lambda: preempted.update(flag=True))
    try:
        if ipc.is_training:
            train(args, ipc, dataset, loader, preempted)
        else:
            serve_teacher(args, ipc)
    finally:
        dist.destroy_process_group()
    return 0


def serve_teacher(args, ipc: InterProcessComm) -> None:
    """The teacher rank: load the model, say so, then answer one gather per training step."""
    teacher = BigramTeacher(transition_matrix(args.vocab, args.seed))   # "loading the model"
    logger.info("teacher ready")
    # Without the handshake the teacher is in its loop's gather while the training ranks are
    # still setting up (and then wait in the handshake for it).
    if not bugs.on("teacher_early"):  # bug: teacher_early
        ipc.sync_model_loaded()  # line: teacher_ready
    shape = (args.batch_size, args.seq_len)
    out = torch.empty(*shape, args.vocab)
    served = 0
    while True:
        batches = ipc.gather_batch_to_teacher(torch.zeros(shape, dtype=torch.long))  # line: teacher_gather
        if all(bool((b == STOP).all()) for b in batches):
            break
        ipc.scatter_logits_from_teacher(out, teacher_forward(teacher, batches, args))
        served += 1
    logger.info("teacher served %d steps", served)


def teacher_forward(teacher, batches: list, args) -> list:
    """The teacher's logits for every training rank's batch; with --straggler teacher, slower."""
    logits = [teacher(b) for b in batches]
    if args.straggler == "teacher":
        time.sleep(args.straggler_ms / 1000 * len(batches))  # line: teacher_slow
    return logits


def wrap(model: torch.nn.Module, args, ipc: InterProcessComm) -> torch.nn.Module:
    if args.parallel == "fsdp2":
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(ipc.train_group, "cpu")
        for block in (model.mlp, model.head):
            fully_shard(block, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    return DDP(model, process_group=ipc.train_group)


def build_time(seconds: float) -> None:
    """A large model's set-up, in miniature: busy for `seconds` (no random numbers drawn, nothing
    kept), while the teacher already waits for the training ranks."""
    end = time.monotonic() + seconds
    x = torch.ones(128, 128)
    while time.monotonic() < end:
        x = torch.tanh(x @ x / 128)


def train(args, ipc: InterProcessComm, dataset, loader, preempted: dict) -> None:
    torch.manual_seed(args.seed)
    student = Student(args.vocab, args.seq_len)
    build_time(args.setup_s)  # line: setup
    if bugs.on("segfault") and ipc.train_rank == 1:
        student.crash_on_call = 3
    model = wrap(student, args, ipc)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    checkpoint = CheckpointManager.instance(args.dump_dir, ipc, resume=args.resume)  # line: ckpt_setup
    start = checkpoint.load(model, optimizer) if args.resume else 0
    if loader is None:
        loader = build_loader(dataset, args.batch_size, ipc.train_rank, len(ipc.training_ranks), seed=args.seed)
    logger.info("waiting for the teacher")
    ipc.sync_model_loaded()  # line: wait_for_teacher
    if args.probe_freq:
        probe_dir = Path(args.dump_dir) / "probe"
        if ipc.is_master:
            os.makedirs(probe_dir, exist_ok=True)
        group = None if bugs.on("probe_barrier") else ipc.train_group
        torch.distributed.barrier(group=group)  # bug: probe_barrier

    floor = entropy_floor(dataset.P)
    shape = (args.batch_size, args.seq_len)
    batches = iter(loader)
    times, losses = [], []
    step = start
    for step in range(start + 1, args.steps + 1):
        t0 = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            batches = iter(loader)
            batch = next(batches)
        inputs, targets = batch[:, :-1].contiguous(), batch[:, 1:]   # torch 2.4's gloo gather sends a view's storage
        ipc.gather_batch_to_teacher(inputs)  # line: send_batch
        teacher_logits = ipc.scatter_logits_from_teacher(torch.empty(*shape, args.vocab))
        logits = model(inputs)  # line: forward
        loss, ce, kl = distillation_loss(logits, teacher_logits, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - t0)
        losses.append((loss.item(), ce, kl))

        if step % args.log_freq == 0:
            recent = losses[-args.log_freq:]
            m = dist_mean_dict({k: statistics.fmean(x[i] for x in recent) for i, k in enumerate(("loss", "ce", "kl"))},
                               ipc)  # line: metrics
            if ipc.is_master:
                print(f"step {step:4d}  loss {m['loss']:.4f}  (ce {m['ce']:.4f}, best possible {floor:.4f}; "
                      f"kl to teacher {m['kl']:.4f})  {1000 * statistics.median(times[-args.log_freq:]):.1f} ms/step",
                      flush=True)
        if args.ckpt_every and step % args.ckpt_every == 0:
            checkpoint.save(model, optimizer, step)
        if step == args.preempt_at_step and ipc.is_master:
            os.kill(os.getpid(), signal.SIGUSR2)   # the scheduler's warning reaches this rank only
        stop = preempted["flag"]
        if not bugs.on("preempt_one_rank"):
            stop = agree_on_flag(stop, ipc)   # one rank warned: all of them save, together
        if stop:  # bug: preempt_one_rank -- without the agreement rank 0 saves on its own
            logger.info("preempted at step %d: saving", step)
            checkpoint.save(model, optimizer, step, {"preempted": True})  # line: preempt_save
            break
    ipc.send_stop(shape)
    if ipc.is_master and times:
        print(f"done: {step} steps, loss {losses[0][0]:.4f} -> {losses[-1][0]:.4f}, "
              f"median step {1000 * statistics.median(times):.2f} ms", flush=True)


def parallel_mode(name: str) -> str:
    """--parallel's check, on every rank before any group exists: FSDP2's `fully_shard` is public
    from torch 2.6 (torch 2.4 has a private one that makes CUDA streams even on a CPU mesh)."""
    import torch.distributed.fsdp

    if name == "fsdp2" and not hasattr(torch.distributed.fsdp, "fully_shard"):
        raise argparse.ArgumentTypeError(f"fsdp2 needs torch 2.6 or newer (torch.distributed.fsdp.fully_shard); "
                                         f"this is torch {torch.__version__}: use --parallel ddp")
    return name


if __name__ == "__main__":
    sys.exit(main())

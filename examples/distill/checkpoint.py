"""Checkpoints with torch.distributed.checkpoint, on the training group (lingua's
CheckpointManager in miniature: a folder per step, made by one rank behind a barrier)."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import bugs

logger = logging.getLogger("distill")


class CheckpointManager:
    def __init__(self, dump_dir: str, ipc, keep: int = 2):
        self.root = Path(dump_dir) / "checkpoints"
        self.ipc = ipc
        self.keep = keep

    @classmethod
    def instance(cls, dump_dir: str, ipc, resume: bool = False) -> CheckpointManager:
        mgr = cls(dump_dir, ipc)
        if not resume and ipc.is_master:
            # A new run: what an earlier run saved here is replaced, never resumed unasked (the
            # other ranks read the folder only after the barrier below).
            shutil.rmtree(mgr.root, ignore_errors=True)
        mgr.instantiate_and_make_dir(mgr.root)
        return mgr

    def instantiate_and_make_dir(self, path: Path) -> Path:
        """One rank makes the folder; the others wait until it exists."""
        if self.ipc.is_master:
            path.mkdir(parents=True, exist_ok=True)
        group = None if bugs.on("checkpoint_barrier") else self.ipc.train_group
        dist.barrier(group=group)  # bug: checkpoint_barrier
        return path

    def folders(self) -> list[Path]:
        if not self.root.exists():
            return []
        return sorted((p for p in self.root.iterdir() if p.name.startswith("step_")
                       and (p / "train_state.json").exists()), key=lambda p: int(p.name[5:]))

    def save(self, model, optimizer, step: int, extra: dict | None = None) -> Path:
        path = self.instantiate_and_make_dir(self.root / f"step_{step:06d}")
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path), process_group=self.ipc.train_group)
        if self.ipc.is_master:
            (path / "train_state.json").write_text(json.dumps({"step": step, **(extra or {})}))
            for old in self.folders()[:-self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        dist.barrier(group=self.ipc.train_group)
        logger.info("saved checkpoint %s", path)
        return path

    def load(self, model, optimizer) -> int:
        """Resume from the newest checkpoint; returns the step to start from (0 when none)."""
        folders = self.folders()
        if not folders:
            return 0
        path = folders[-1]
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(path), process_group=self.ipc.train_group)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        step = json.loads((path / "train_state.json").read_text())["step"]
        logger.info("resumed from %s (step %d)", path, step)
        return step

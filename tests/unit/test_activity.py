"""Whether a rank others wait for moves (colltrace/host/activity.py): a rank spinning in a device
sync (NCCL: the CPU ran ahead and parked in .item() or torch.cuda.synchronize()) is blocked,
not computing, however busy its CPU (audit D8)."""
from __future__ import annotations

from colltrace.host import activity


def procs(cpu_per_s: float, n: int = 6, dt: float = 0.2) -> list[dict]:
    return [{"t": 100 + i * dt, "cpu": 10 + i * dt * cpu_per_s, "io": 0, "state": "running"} for i in range(n)]


def stacks(*tops, n: int = 6, dt: float = 0.2) -> list[tuple]:
    out = []
    for i in range(n):
        frames = tops[i % len(tops)]
        out.append((100 + i * dt, tuple((f["file"], f["line"], f["func"]) for f in frames), frames))
    return out


def user_line(tmp_path, text: str) -> list[dict]:
    src = tmp_path / "train.py"
    src.write_text("import torch\n" + text + "\n")
    return [{"file": str(src), "line": 2, "func": "train"}]


def test_a_busy_cpu_parked_at_an_item_call_is_blocked_on_the_device(tmp_path):
    a = activity.classify(procs(1.0), stacks(user_line(tmp_path, "    loss_value = loss.item()")))
    assert (a["state"], a["how"]) == ("frozen", "device_sync")


def test_torch_cuda_synchronize_is_a_device_sync():
    top = [{"file": "/venv/lib/python3.12/site-packages/torch/cuda/__init__.py", "line": 1080, "func": "synchronize"}]
    a = activity.classify(procs(1.0), stacks(top))
    assert (a["state"], a["how"]) == ("frozen", "device_sync")


def test_a_busy_cpu_elsewhere_is_computing(tmp_path):
    a = activity.classify(procs(1.0), stacks(user_line(tmp_path, "    y = model(x) @ w")))
    assert (a["state"], a["how"]) == ("progressing", "busy")


def test_a_stack_that_moves_is_progressing_even_through_a_sync(tmp_path):
    sync = user_line(tmp_path, "    loss_value = loss.item()")
    other = [{"file": sync[0]["file"], "line": 1, "func": "train"}]
    a = activity.classify(procs(1.0), stacks(sync, other))
    assert a["state"] == "progressing"

"""A small snapshot of a rank dead in native code while another waits for it (plain data): for the
tests of how native frames are said, without a job."""
from __future__ import annotations

T0 = 1_700_000_000.0
NATIVE = [{"object": "libc.so.6", "symbol": "memset", "offset": "0x1c", "path": "/usr/lib/libc.so.6"},
          {"object": "libtorch_cpu.so", "symbol": "at::native::fill_(at::Tensor&, c10::Scalar const&)",
           "offset": "0x2a0", "path": "/venv/torch/lib/libtorch_cpu.so"},
          {"object": "libffi.so.8", "symbol": "ffi_call", "offset": "0xcd", "path": "/usr/lib/libffi.so.8"},
          {"object": "libpython3.11.so.1.0", "symbol": "_PyEval_EvalFrameDefault", "offset": "0x2e53",
           "path": "/usr/lib/libpython3.11.so.1.0"}]
STACK = [{"file": "/job/train.py", "line": 12, "func": "main"},
         {"file": "/job/model.py", "line": 44, "func": "fused_mlp"}]


def _record(rank, seq, op, state, t):
    return {"id": rank * 100 + seq, "rank": rank, "group": "0", "seq": seq, "seq_end": seq, "op": op,
            "backend_op": op.replace("_", ""), "p2p": False, "peer": None, "state": state, "async": False,
            "entered_at": t, "returned_at": t + 0.01 if state == "completed" else None,
            "completed_at": t + 0.01 if state == "completed" else None, "shapes": [[2]], "dtypes": ["float32"],
            "reduce_op": None, "root": None, "count": 1, "thread": "MainThread",
            "frames": [{"file": "/job/train.py", "line": 20 + seq, "func": "main"}]}


def dead_in_native(exception: dict | None = None, alive: bool = False) -> dict:
    """Rank 0 waits in barrier #2; rank 1 died of SIGSEGV in native code (or, alive, is parked in
    native code, in no collective)."""
    r0 = {"rank": 0, "pid": 10, "host": "h", "status": "alive", "exit": None, "died_at": None, "heartbeat": T0 + 60,
          "progress": {"0": {"entered": 2, "completed": 1}}, "stack": None, "stack_at": None, "fault": None,
          "records": [_record(0, 1, "all_reduce", "completed", T0), _record(0, 2, "barrier", "waiting", T0 + 1)]}
    r1 = {"rank": 1, "pid": 11, "host": "h", "progress": {"0": {"entered": 1, "completed": 1}},
          "records": [_record(1, 1, "all_reduce", "completed", T0)], "native_frames": NATIVE, "stack": STACK,
          "heartbeat": T0 + 60, "fault": None}
    if alive:
        r1.update(status="alive", exit=None, died_at=None, stack_at=T0 + 59, stack_via="in-process")
    else:
        r1.update(status="dead", exit={"signal": "SIGSEGV", "code": -11}, died_at=T0 + 2, stack_at=None)
    if exception:
        r1["native_exception"] = exception
    return {"version": 1, "taken_at": T0 + 60, "groups": {"0": {"name": "0", "desc": "default_pg", "ranks": [0, 1]}},
            "ranks": {"0": r0, "1": r1}}

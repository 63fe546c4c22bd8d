"""Progress over a stall from samples (plain data), and what COLLTRACE_ON_HANG=abort may end."""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

from colltrace.host import actions, activity, probes
from colltrace.model.finding import Deadlock, DeadRank, Stall
from colltrace.reporters import activity as report
from colltrace.tracefile import asks

EVAL = {"file": "/job/eval.py", "line": 40, "func": "long_eval"}
NAP = {"file": "/job/train.py", "line": 12, "func": "nap"}


def procs(*points, state="sleeping", io=0):
    return [{"t": t, "cpu": cpu, "io": io, "state": state} for t, cpu in points]


def stacks(*frames_at):
    return [(t, tuple((f["file"], f["line"], f["func"]) for f in fr), fr) for t, fr in frames_at]


def test_cpu_time_over_the_window_is_busy():
    a = activity.classify(procs((0.0, 1.0), (9.0, 9.7)), stacks((0.0, [EVAL]), (9.0, [EVAL])))
    assert a["state"] == "progressing" and a["how"] == "busy" and a["cpu_s"] == 8.7 and a["window_s"] == 9.0
    assert (report.activity_text(0, {"activity": a})
            == "rank 0: busy, 8.7 s of CPU in eval.py:40 (long_eval) over the last 9.0 s")


def test_a_moving_stack_without_cpu_is_progress():
    moved = dict(EVAL, line=41)
    a = activity.classify(procs((0.0, 1.0), (4.0, 1.05)), stacks((0.0, [EVAL]), (4.0, [moved])))
    assert a["state"] == "progressing" and a["how"] == "moving"


def test_neither_cpu_nor_stack_is_frozen():
    a = activity.classify(procs((0.0, 1.0), (4.0, 1.01)), stacks((0.0, [NAP]), (2.0, [NAP]), (4.0, [NAP])))
    assert a["state"] == "frozen"
    assert "frozen, 0.0 s of CPU and the same stack in train.py:12 (nap)" in report.activity_text(3, {"activity": a})


def test_waiting_for_data_is_blocked_in_io(tmp_path):
    src = tmp_path / "fetch.py"
    src.write_text("def fetch(sock):\n    return sock.recv(4096)\n")
    at = {"file": str(src), "line": 2, "func": "fetch"}
    a = activity.classify(procs((0.0, 1.0), (4.0, 1.0)), stacks((0.0, [at]), (4.0, [at])))
    assert a["state"] == "blocked_io"
    disk = activity.classify(procs((0.0, 1.0), (4.0, 1.0), state="disk-sleep"), stacks((0.0, [NAP])))
    assert disk["state"] == "blocked_io"


def test_too_short_a_window_tells_nothing():
    assert activity.classify(procs((0.0, 1.0), (0.2, 1.0)), [])["state"] == "unknown"
    assert activity.classify(procs((0.0, 1.0)), [])["state"] == "unknown"


def stall(*states, waited=5.0):
    ranks = {"0": {"state": "waiting"}}
    for i, s in enumerate(states, 1):
        ranks[str(i)] = {"state": "not_in_collective", **({"activity": {"state": s}} if s else {})}
    return Stall(stage="arrival", missing_ranks=list(range(1, len(states) + 1)), waited_s=waited, ranks=ranks)


def test_abort_ends_a_stall_only_when_every_missing_rank_is_frozen():
    assert actions.act_on(stall("frozen", "frozen"), "abort") == (True, "stall: ranks 1,2 frozen")
    assert not actions.act_on(stall("frozen", "progressing"), "abort")[0]
    assert not actions.act_on(stall("blocked_io"), "abort")[0]
    assert not actions.act_on(stall("unknown"), "abort")[0]          # not sampled long enough yet
    assert actions.act_on(stall(None), "abort")[0]                    # not observable at all: as before
    assert actions.act_on(stall("progressing", waited=61), "abort", abort_stall_s=60)[0]
    assert not actions.act_on(stall("progressing", waited=59), "abort", abort_stall_s=60)[0]
    assert actions.act_on(stall("progressing"), "dump")[0]            # dump only writes stacks
    assert actions.act_on(Deadlock(missing_ranks=[3]), "abort")[0]


def test_the_rank_answers_a_stack_request_from_its_own_thread(tmp_path):
    code = ("import time, threading\n"
            "from colltrace.tracefile import asks\n"
            f"r = asks.StackResponder({str(tmp_path)!r}, 0)\n"
            "def serve():\n"
            "    while True:\n"
            "        r.poll(); time.sleep(0.02)\n"
            "threading.Thread(target=serve, daemon=True).start()\n"
            "def nap():\n"
            "    time.sleep(60)\n"
            "print('up', flush=True)\n"
            "nap()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "up"
        time.sleep(0.2)
        got = probes.live_stacks(str(tmp_path), {0: (p.pid, {})}, py_spy_ok=False)
    finally:
        p.kill()
        p.wait()
    frames, route, _, _ = got[0]
    assert route == "in-process" and frames[-1]["func"] == "nap"


def test_faulthandler_answers_by_signal_while_the_gil_is_held(tmp_path):
    code = ("import json, re, sys\n"
            "from colltrace.tracefile import asks\n"
            f"meta, f = asks.install_signal({str(tmp_path)!r}, 0)\n"
            "print(json.dumps(meta), flush=True)\n"
            "def spin():\n"
            "    re.match(r'(a+)+$', 'a' * 40 + 'b')\n"
            "spin()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        import json

        meta = json.loads(p.stdout.readline())
        assert meta["stack_signal"] == signal.SIGRTMIN + asks.SIGNAL_OFFSET
        time.sleep(0.3)
        got = probes.live_stacks(str(tmp_path), {0: (p.pid, meta)}, py_spy_ok=False)
        assert p.poll() is None   # the signal did not end it
    finally:
        p.kill()
        p.wait()
    frames, route, why, native_frames = got[0]
    assert route == "signal" and frames[-1]["func"] == "match" and frames[-2]["func"] == "spin", why
    assert os.path.exists(asks.stack_signal_path(str(tmp_path), 0))


def test_a_signal_ignored_since_the_parent_retired_it_is_registered(tmp_path):
    """A rank retires the signal at its exit (ignored from then on); a process it starts then, or
    a test session that traced in-process, hands SIG_IGN on across exec: ignored is not handled."""
    code = ("import json, signal\n"
            "from colltrace.tracefile import asks\n"
            "print(signal.getsignal(asks.stack_signal()) == signal.SIG_IGN)\n"
            f"meta, f = asks.install_signal({str(tmp_path)!r}, 0)\n"
            "print(json.dumps(meta))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         preexec_fn=lambda: signal.signal(asks.stack_signal(), signal.SIG_IGN)).stdout
    inherited, meta = out.splitlines()
    assert inherited == "True" and f'"stack_signal": {int(asks.stack_signal())}' in meta


def test_a_signal_the_program_handles_is_left_to_it(tmp_path):
    code = ("import json, signal\n"
            "from colltrace.tracefile import asks\n"
            "signal.signal(asks.stack_signal(), lambda *a: None)\n"
            f"meta, f = asks.install_signal({str(tmp_path)!r}, 0)\n"
            "print(json.dumps(meta))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert '"stack_signal": null' in out and "handles signal" in out


def test_abort_stall_s_setting():
    from colltrace import config

    assert config.load({"COLLTRACE_ABORT_STALL_S": "600"}).abort_stall_s == 600.0
    assert config.load({}).abort_stall_s == 0.0
    bad = config.load({"COLLTRACE_ABORT_STALL_S": "soon"})
    assert bad.abort_stall_s == 0.0 and "COLLTRACE_ABORT_STALL_S" in bad.warnings[0]


def test_a_rank_dead_at_interpreter_exit_is_acted_on_only_once_someone_waits_for_it():
    dead = DeadRank(rank=1, exit={"signal": "SIGABRT", "code": -6, "at_exit": True})
    assert not actions.act_on(dead, "abort")[0] and not actions.act_on(dead, "dump")[0]
    waited = dataclasses.replace(dead, waiting=[{"ranks": [0], "group": "0", "seq": 3}], missing_ranks=[1])
    assert actions.act_on(waited, "abort")[0]
    # died mid-run
    assert actions.act_on(dataclasses.replace(dead, exit={"signal": "SIGABRT", "code": -6}), "abort")[0]


def test_a_rank_asked_for_its_stack_while_it_exits_keeps_its_own_exit_code(tmp_path):
    """The watchdog may ask (by colltrace's real-time signal) while a rank that resolved its stall
    exits; Python's finalization puts back the signal's default action, which ends the process.
    Asked without pause from its first collective to its end, the rank still exits 0."""
    from helpers import environ

    code = ("import sys, torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo', init_method=sys.argv[1], rank=0, world_size=1)\n"
            "dist.all_reduce(torch.ones(2))\n"
            "print('up', flush=True)\n"
            "dist.destroy_process_group()\n")
    env = dict(environ.clean(), COLLTRACE="1", COLLTRACE_DIR=str(tmp_path / "trace"), OMP_NUM_THREADS="1")
    p = subprocess.Popen([sys.executable, "-c", code, f"file://{tmp_path / 'store'}"], env=env,
                         stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert p.stdout.readline().strip() == "up"
        asked, deadline = 0, time.monotonic() + 60
        while p.poll() is None and time.monotonic() < deadline:
            try:
                os.kill(p.pid, asks.stack_signal())
                asked += 1
            except ProcessLookupError:
                break
            time.sleep(0.002)
        assert p.wait(timeout=60) == 0 and asked > 10
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()

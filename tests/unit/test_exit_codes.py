"""How a rank ends, told as it was: real processes with a recorder (no torch) ending each way a
program ends, read back with their code and line; the reading of an exit record beside the exit
status; the analysis that names an ended rank as the cause of the collectives that failed without
it; the words. The same on real gloo ranks: tests/integration/test_endings.py."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from colltrace.model import build
from colltrace.rank import exits
from colltrace.tracefile import reader
from helpers import environ
from helpers.synthetic import STALL, SyntheticJob, T, analyze, only

PROGRAM = textwrap.dedent('''\
    import ctypes, os, signal, sys, threading
    from colltrace import config
    from colltrace.rank.recorder import Recorder

    how = sys.argv[2]
    rec = Recorder(config.load({"COLLTRACE": "1", "COLLTRACE_DIR": sys.argv[1]}), rank=0, world_size=1,
                   backend="gloo", job="j")


    def launcher(fn):   # multiprocessing's way: catch SystemExit, end with its code
        try:
            fn()
        except SystemExit as e:
            os._exit(e.code)


    def load_shard():
        if how == "sys_exit":
            sys.exit(3)  # line: sys_exit
        if how == "message":
            sys.exit("no shard 1")  # line: message
        if how == "exit":
            exit(5)  # line: exit
        if how == "raise":
            raise SystemExit(6)
        if how == "os_exit":
            os._exit(4)  # line: os_exit
        if how == "error":
            raise ValueError("bad shard")  # line: error
        if how == "interrupt":
            # Ctrl-C as Python takes it, even run from a shell that ignores SIGINT (a background job)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.raise_signal(signal.SIGINT)  # line: interrupt
        if how == "native":
            ctypes.CDLL(None).exit(9)
        if how == "caught":
            try:
                sys.exit(3)
            except SystemExit:
                pass
        if how == "launcher":
            launcher(lambda: sys.exit(2))  # line: launcher
        if how == "fork":
            pid = os.fork()
            if pid == 0:
                os._exit(11)   # a child of the rank (a DataLoader worker): not the rank's ending
            os.waitpid(pid, 0)


    load_shard()
''')


def lines() -> dict[str, int]:
    return {line.split("# line: ")[1]: i for i, line in enumerate(PROGRAM.splitlines(), 1) if "# line: " in line}


@pytest.fixture(scope="module")
def ended(tmp_path_factory):
    """Every way, each its own process, all at once: {way: (exit code, its rank's trace)}."""
    base = tmp_path_factory.mktemp("endings")
    script = base / "job.py"
    script.write_text(PROGRAM)
    ways = ["sys_exit", "message", "exit", "raise", "os_exit", "error", "interrupt", "native", "caught", "launcher",
            "fork", "return"]
    env = environ.clean()
    procs = {w: subprocess.Popen([sys.executable, str(script), str(base / w), w], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for w in ways}
    out = {}
    for w, p in procs.items():
        try:
            p.communicate(timeout=60)
        finally:
            p.kill()
        [tr] = reader.load_traces(str(base / w))
        out[w] = (p.returncode, tr)
    return out


@pytest.mark.parametrize("way, code, how, line", [
    ("sys_exit", 3, "sys.exit", "sys_exit"), ("message", 1, "sys.exit", "message"), ("exit", 5, "exit()", "exit"),
    ("os_exit", 4, "os._exit", "os_exit"), ("launcher", 2, "sys.exit", "launcher"), ("raise", 6, "SystemExit", None),
    ("error", 1, "exception", "error"), ("native", 9, "native", None), ("caught", 0, "return", None),
    ("return", 0, "return", None), ("fork", 0, "return", None)])
def test_each_way_a_process_ends_is_read_back_with_its_code_and_line(ended, way, code, how, line):
    returncode, tr = ended[way]
    status, info = tr.status()
    assert returncode == code and status == "exited"
    assert (info["code"], info["how"]) == (code, how), info
    assert "pending" not in info   # every process here wrote its status before it went
    stack = tr.snapshot_entry()["stack"] or []
    if line is None:
        assert all(f["file"] != str(tr.directory) for f in stack)
    else:
        assert stack[-1]["line"] == lines()[line] and stack[-1]["file"].endswith("job.py"), stack
    if way == "message":
        assert info["message"] == "no shard 1"


def test_a_keyboard_interrupt_is_the_signal_it_ends_with(ended):
    returncode, tr = ended["interrupt"]
    status, info = tr.status()
    assert returncode == -2 and status == "exited"
    assert info["signal"] == "SIGINT" and info["exception"] == "KeyboardInterrupt" and "code" not in info
    assert tr.snapshot_entry()["stack"][-1]["line"] == lines()["interrupt"]


def test_an_exit_call_is_passed_on_unchanged():
    """The wrappers call the original as called: the same SystemExit, nothing noted off the main
    thread, bad arguments still the original's error."""
    exits.install()
    try:
        with pytest.raises(SystemExit) as e:
            sys.exit(("a", 1))
        assert e.value.code == ("a", 1) and exits.last_call()["code"] == 1
        with pytest.raises(TypeError):
            sys.exit(1, 2)
        with pytest.raises(SystemExit) as e:
            exit()
        assert e.value.code is None and exits.last_call()["how"] == "exit()" and exits.last_call()["code"] == 0
        with pytest.raises(SystemExit) as e:
            quit(7)
        assert e.value.code == 7 and exits.last_call()["how"] == "quit()"
        exits.forget()

        def elsewhere():   # ends this thread only
            try:
                sys.exit(4)
            except SystemExit:
                pass

        t = threading.Thread(target=elsewhere)
        t.start()
        t.join()
        assert exits.last_call() is None
    finally:
        exits.uninstall()
    assert not hasattr(sys.exit, "__colltrace_original__") and not hasattr(os._exit, "__colltrace_original__")


def ending(exit_rec=None, status=None, exception=None):
    return reader.ending_of(exit_rec, status, exception)[0]


def test_the_exit_status_is_believed_over_what_python_knew():
    call = {"k": "exit", "t": 5.0, "how": "sys.exit", "code": 3, "frames": [{"file": "a.py", "line": 1, "func": "f"}],
            "status_follows": True}
    assert ending(call, {"code": 3}) == {"code": 3, "how": "sys.exit", "at": 5.0}
    assert ending(call) == {"code": 3, "how": "sys.exit", "at": 5.0}   # the call's own code until then
    assert ending(call, {"code": 0}) == {"code": 0, "how": "return", "at": 5.0}   # caught; it went on
    back = {"k": "exit", "t": 5.0, "how": "return", "code": 0, "status_follows": True}
    assert ending(back) == {"code": 0, "how": "return", "at": 5.0, "pending": True}
    assert ending(back, {"code": 6}) == {"code": 6, "how": "SystemExit", "at": 5.0}
    assert ending(dict(back, status_follows=False)) == {"code": 0, "how": "return", "at": 5.0}
    assert ending(None, {"code": 9, "t": 6.0}) == {"code": 9, "how": "native", "at": 6.0}
    assert ending({"k": "exit", "t": 5.0, "clean": True}) == {"code": 0, "at": 5.0}   # an older trace
    exc = {"type": "ValueError", "message": "bad"}
    assert (ending({"k": "exit", "t": 5.0, "how": "exception", "code": 1}, {"code": 1}, exc)["exception"]
            == "ValueError: bad")
    assert ending(None, None, exc) == {"code": 1, "how": "exception", "at": None, "exception": "ValueError: bad"}
    assert ending(None, None, None) is None


def test_an_earlier_process_still_shutting_down_does_not_end_the_rank_that_took_its_file_over(tmp_path):
    """A restarted rank truncates its definitions file; the process before it, still finalizing,
    writes its status into the new file: not this process's ending."""
    from colltrace.tracefile import ringfile

    ringfile.RingWriter(str(tmp_path / "rank-00000.ring"), 64).close()
    defs = ringfile.DefsWriter(str(tmp_path / "rank-00000.defs.jsonl"), 1 << 20)
    defs.write({"k": "meta", "rank": 0, "pid": 200, "job": "j"})
    defs.write({"k": "status", "t": 1.0, "code": 3, "pid": 100})
    [tr] = reader.load_traces(str(tmp_path))
    assert tr.status() == ("unknown", None)
    defs.write({"k": "exit", "t": 2.0, "how": "sys.exit", "code": 0, "pid": 200, "status_follows": True})
    defs.write({"k": "status", "t": 2.1, "code": 0, "pid": 200})
    tr.poll()
    assert tr.status() == ("exited", {"code": 0, "how": "sys.exit", "at": 2.0})


def test_a_pending_status_is_taken_as_it_stands_once_the_process_is_gone():
    e = {"status": "exited", "exit": {"code": 0, "how": "return", "pending": True}, "records": [], "stack": None}
    assert "pending" in build.host_entry(dict(e), keep_records=8, died_at=None)["exit"]
    assert build.host_entry(dict(e), keep_records=8, died_at=7.0)["exit"] == {"code": 0, "how": "return"}
    snap = build.from_files({"1": dict(e, rank=1)}, {}, {"version": 1, "taken_at": 1.0, "groups": {},
                                                        "ranks": {"1": {"status": "exited", "exit": {"code": 0}}}})
    assert snap["ranks"]["1"]["exit"] == {"code": 0, "how": "return"}   # the files' ending, settled


# -- the analysis and its words -------------------------------------------------------------------
def failed_without(job, rank, error="RuntimeError: Connection closed by peer [10.0.0.2]:6566", at=T + 0.4):
    """Rank 0's all_reduce #4 failed: `rank` never entered it."""
    job.history("0", 3)
    job.op(0, "0", 4, "all_reduce", "waiting", at="train.py:5", func="train", t=T)
    job.entries[0]["records"][-1].update(state="failed", returned_at=at, error=error)
    job.set(0, status="exited", exit={"code": 1, "how": "exception", "exception": error})
    return job


def exited(job, rank, stack=None, **ex):
    job.set(rank, status="exited", exit=dict(ex, at=T + 0.1), stack=stack)
    return job


def test_a_rank_whose_exit_failed_the_others_collective_is_named_after_the_fact():
    """os._exit(4) on rank 1, and gloo fails rank 0's all_reduce at once: nobody was ever seen
    waiting, and the folder said "no problems found"."""
    job = failed_without(SyntheticJob(2), 1)
    at = [{"file": "/job/train.py", "line": 14, "func": "load_shard"}]
    exited(job, 1, stack=at, code=4, how="os._exit")
    f = only(analyze(job.snap(), STALL, T + 50), "dead_rank")
    assert f.rank == 1 and f.failed[0]["ranks"] == [0] and f.look_first["reason"] == "exit"
    assert "Dead rank: rank 1 (on node0) exited with code 4 at train.py:14 (load_shard), called os._exit." in f.summary
    assert "Rank 0 failed in all_reduce #4" in f.summary and "Connection closed by peer" in f.summary
    assert f.advice.startswith("Look first at train.py:14 (load_shard), where rank 1 called os._exit(4) on its own")
    assert "OOM" not in f.advice


@pytest.mark.parametrize("ex, words, advice", [
    ({"code": 0, "how": "return"}, "exited with code 0 (its program returned)", "program ended while the others"),
    ({"code": 6, "how": "SystemExit"}, "exited with code 6 (raise SystemExit(6)", "raises SystemExit(6)"),
    ({"code": 9, "how": "native"}, "exited with code 9 (exit() called in native code",
     "a native library called exit(9)"),
    ({"signal": "SIGINT", "how": "signal", "exception": "KeyboardInterrupt"}, "was interrupted by SIGINT",
     "what sent rank 1 SIGINT"),
])
def test_each_ending_is_told_as_it_was_with_advice_that_fits(ex, words, advice):
    job = failed_without(SyntheticJob(2), 1)
    exited(job, 1, **ex)
    f = only(analyze(job.snap(), STALL, T + 50), "dead_rank")
    assert words in f.summary and advice in f.advice and "OOM" not in f.advice


def test_a_return_waits_for_its_exit_status_a_while():
    """Its program returned and rank 0 waits: until the status comes, a return cannot be told
    from `raise SystemExit(6)`."""
    job = SyntheticJob(2)
    job.history("0", 3)
    job.op(0, "0", 4, "all_reduce", "waiting", at="train.py:5", t=T)
    job.set(1, status="exited", exit={"code": 0, "how": "return", "pending": True, "at": T + 1})
    assert analyze(job.snap(), STALL, T + 2) == []
    f = only(analyze(job.snap(), STALL, T + 7), "dead_rank")   # it never came: said as it stands
    assert "its exit code was not written yet" in f.summary
    job.set(1, exit={"code": 6, "how": "SystemExit", "at": T + 1})
    f = only(analyze(job.snap(), STALL, T + 2), "dead_rank")
    assert "exited with code 6" in f.summary and "rank 0 waiting forever in all_reduce #4" in f.summary


def test_a_failure_before_a_rank_ended_is_not_its_doing():
    """Rank 0's all_reduce timed out a minute before rank 1 called sys.exit: no dead rank made it fail."""
    job = failed_without(SyntheticJob(2), 1, error="RuntimeError: Timed out waiting 1800000ms", at=T - 60)
    exited(job, 1, code=3, how="sys.exit")
    assert [f.kind for f in analyze(job.snap(), STALL, T + 50)] != ["dead_rank"]


def test_ranks_that_all_end_cleanly_are_nothing():
    job = SyntheticJob(2)
    job.history("0", 3)
    for r in (0, 1):
        exited(job, r, code=0, how="sys.exit")
    assert analyze(job.snap(), STALL, T + 50) == []

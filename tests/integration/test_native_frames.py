"""A crash's native frames, kept by the dying rank itself (colltrace/rank/_crash.c), named from the
objects' own symbols after it died: 2 gloo ranks, rank 1 dies in native code while rank 0 waits
for it (tests/integration/jobs/native_crash.py), in a small library built here with symbols
(tests/integration/jobs/victim.cpp). The exit status, the signal and the
core dump are what they are untraced; a program's own SIGSEGV handler still runs and keeps it going."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers.cli import run_cli
from helpers.jobs import findings, loc, wait_finding
from helpers.paths import JOBS

pytestmark = pytest.mark.slow
SCRIPT = "native_crash.py"

# kind -> (signal, the object and function the verdict names). SIGSEGV in libc's memset through
# ctypes is the example's segfault switch (test_distill_example.py), native_crash.py's "libc" by hand.
CASES = {
    "segv": (signal.SIGSEGV, "libvictim.so", "write_through_null"),
    "fpe": (signal.SIGFPE, "libvictim.so", "divide_by_zero"),
    # g++ calls std::terminate from the throw itself when a noexcept caller would end it: the
    # thrower's frame (a C++ function: its name demangled) is still there, and is named
    "throw": (signal.SIGABRT, "libvictim.so", "thrower(char const*)"),
}


@pytest.fixture(scope="session")
def victim_lib(tmp_path_factory):
    """The small native library, built once per session with symbols, in a temp folder."""
    out = tmp_path_factory.mktemp("victim") / "libvictim.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-g", "-O1", "-o", str(out), os.path.join(JOBS, "victim.cpp")],
                   check=True, timeout=120)
    return str(out)


@pytest.mark.parametrize("kind", list(CASES))
def test_a_rank_dead_in_native_code_is_named_by_its_native_frames(gloo_job, victim_lib, kind):
    sig, obj, func = CASES[kind]
    # the fpe job keeps to the Python wrappers: native frames come with either path
    pure = {"COLLTRACE_PURE": "1"} if kind == "fpe" else {}
    job = gloo_job(SCRIPT, 2, args=[kind], env={"VICTIM_LIB": victim_lib, "COLLTRACE_STALL_S": "60", **pure})
    f = wait_finding(job, "dead_rank", shown_rank=1)
    codes = job.wait(60)   # rank 0's barrier fails once rank 1 is gone: it ends by itself
    assert codes[1] == -sig, job.stderr(1)[-3000:]   # the signal it would have died of untraced

    r1 = f["ranks"]["1"]
    assert f["rank"] == 1 and f["exit"]["signal"] == sig.name and r1["state"] == "dead"
    native = r1["native_frames"]   # innermost first
    assert {"object", "symbol", "offset"} <= set(native[0])
    assert any(fr["object"] == obj and fr["symbol"] == func for fr in native), native[:12]
    if kind != "throw":   # the innermost frame is the faulting function itself (an abort's is abort()'s)
        assert (native[0]["object"], native[0]["symbol"]) == (obj, func), native[:4]
    # the paragraph: the signal, the native function, the Python line that called into it
    assert f"died of {sig.name}" in f["summary"]
    assert f"in {obj} ({func}), called from {loc(kind, SCRIPT)} (fused_mlp)" in f["summary"], f["summary"]
    if kind == "throw":
        assert r1["native_exception"] == {"type": "std::runtime_error", "what": "bad shape 7"}
        assert "(an uncaught std::runtime_error: bad shape 7)" in f["summary"]
        # libstdc++'s own words still
        assert "terminate called after throwing an instance of 'std::runtime_error'" in job.stderr(1)
    assert "Fatal Python error" in job.stderr(1) or os.path.getsize(os.path.join(job.dir, "rank-00001.fault.txt"))

    if kind == "segv":   # every output of the folder, once: report.txt, analyze --json, dump, Perfetto
        with open(os.path.join(job.dir, "report.txt")) as fh:
            report = fh.read()
        assert f"#0 {obj} ({func}+0x" in report and "Native frames of rank 1 when it died" in report
        got = run_cli("analyze", job.dir, "--json")
        (dead,) = [x for x in json.loads(got.stdout)["findings"] if x["kind"] == "dead_rank"]
        assert dead["ranks"]["1"]["native_frames"] == native and dead["ranks"]["1"]["frames"]
        dump = run_cli("dump", job.dir, "--json")
        assert json.loads(dump.stdout)["faults"]["1"]["native_frames"] == native
        text = run_cli("dump", job.dir).stdout
        assert f"#0 {obj} ({func}+0x" in text
        trace = os.path.join(job.dir, "trace.json")
        assert run_cli("export", job.dir, "--perfetto", trace).returncode in (0, 1)
        with open(trace) as fh:
            events = json.load(fh)["traceEvents"]
        died = [e for e in events if "native_frames" in (e.get("args") or {})]
        assert died and f"{obj} ({func}+0x" in died[0]["args"]["native_frames"][0]


def test_a_programs_own_sigsegv_handler_still_runs_and_keeps_it_going(gloo_job, victim_lib):
    job = gloo_job(SCRIPT, 2, args=["own_handler"], env={"VICTIM_LIB": victim_lib, "COLLTRACE_STALL_S": "60"})
    assert job.wait(90) == [0, 0], job.stderr(1)[-3000:]
    assert "RECOVERED 1" in job.stdout(1) and "DONE" in job.stdout(1)
    # colltrace's handler saw the fault and passed it on to the program's, which took it
    with open(os.path.join(job.dir, "rank-00001.native.txt")) as fh:
        assert "begin crash sig=11" in fh.read()
    assert not [x for x in findings(job.dir) if x["kind"] == "dead_rank"]
    got = run_cli("analyze", job.dir, "--json")
    assert got.returncode == 0 and json.loads(got.stdout)["findings"] == [], got.stdout[-2000:]


CORE_JOB = """
import ctypes, os, resource, sys
resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
if sys.argv[1] == "traced":
    from colltrace import config
    from colltrace.rank.recorder import Recorder
    Recorder(config.load({"COLLTRACE": "1", "COLLTRACE_DIR": sys.argv[3]}), rank=0, world_size=1)
how = sys.argv[2]
if how == "segv":
    ctypes.memset(0, 0, 64)
elif how == "fpe":
    ctypes.CDLL(os.environ["VICTIM_LIB"]).divide_by_zero(1)
elif how == "abort":
    os.abort()
"""


@pytest.mark.parametrize("how", ["segv", "fpe", "abort"])
def test_exit_status_signal_and_core_dump_are_those_of_the_untraced_program(tmp_path, victim_lib, how):
    script = tmp_path / "crash.py"
    script.write_text(CORE_JOB)
    seen = {}
    for mode in ("plain", "traced"):
        cwd = tmp_path / mode
        cwd.mkdir()
        p = subprocess.Popen([sys.executable, str(script), mode, how, str(tmp_path / "trace")], cwd=cwd,
                             env={**os.environ, "VICTIM_LIB": victim_lib}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        _, status = os.waitpid(p.pid, 0)
        p.returncode = 0   # reaped here
        cores = [n for n in os.listdir(cwd) if n.startswith("core")]
        for n in cores:
            os.unlink(cwd / n)
        seen[mode] = (os.WIFSIGNALED(status) and signal.Signals(os.WTERMSIG(status)).name, os.WCOREDUMP(status),
                      bool(cores))
    assert seen["traced"] == seen["plain"], seen
    assert seen["plain"][0] == {"segv": "SIGSEGV", "fpe": "SIGFPE", "abort": "SIGABRT"}[how]
    with open(tmp_path / "trace" / "rank-00000.native.txt") as fh:
        assert "begin crash" in fh.read()


def test_a_rank_hung_in_a_native_lock_is_placed_there_by_its_native_frames(gloo_job, victim_lib):
    # rank 1 never reaches the barrier: it waits on a lock it holds, in native code, with the GIL
    # released; the rank's own thread signals it for its native frames once a stall is near
    job = gloo_job(SCRIPT, 2, args=["lock"], env={"VICTIM_LIB": victim_lib, "COLLTRACE_STALL_S": "1.5"})
    f = wait_finding(job, "stall", shown_rank=1)
    job.kill()
    job.wait(30)
    r1 = f["ranks"]["1"]
    assert f["missing_ranks"] == [1] and r1["state"] == "not_in_collective" and r1["stack_via"] == "in-process"
    assert any(fr["object"] == "libvictim.so" and fr["symbol"] == "take_lock_twice" for fr in r1["native_frames"])
    assert (f"{loc('lock', SCRIPT)} (fused_mlp) (in native code: libvictim.so (take_lock_twice))"
            in f["summary"]), f["summary"]


LIVE_JOB = """
import ctypes, os, sys, threading, time
from colltrace.rank import crash
from colltrace.tracefile import asks
d = sys.argv[1]
meta, keep = asks.install_signal(d, 0)
crash.install(d, 0, [])
late = sys.argv[3] == "late"
if late:
    crash.LIVE_WAIT_S = 0.0   # as on a loaded machine: the main thread takes its frames after the poller gave up
meta.update(crash.install_stack(d, 0, meta["stack_signal"]))
r = asks.StackResponder(d, 0, native=crash.main_stack)
def serve():
    while True:
        r.poll(); time.sleep(0.02)
threading.Thread(target=serve, daemon=True).start()
lib = (ctypes.PyDLL if sys.argv[2] == "gil" else ctypes.CDLL)(os.environ["VICTIM_LIB"])
import json; print(json.dumps(meta), flush=True)
def hold():
    if late:   # and, until it runs, the watchdog's signal to the process lands on another thread
        lib.take_lock_twice_after_blocking(meta["stack_signal"], 1500)
    else:
        lib.take_lock_twice()
hold()
"""


@pytest.mark.parametrize("gil, route, when", [("free", "in-process", "soon"), ("free", "in-process", "late"),
                                             ("gil", "signal", "soon")])
def test_a_live_ranks_native_frames_by_its_own_thread_or_by_the_stack_signal(tmp_path, victim_lib, gil, route, when,
                                                                            monkeypatch):
    from colltrace.host import probes

    if when == "late":   # the main thread answers once it runs again (1.5 s in): waited for, here
        monkeypatch.setattr(probes, "SIGNAL_WAIT_S", 4.0)
    p = subprocess.Popen([sys.executable, "-c", LIVE_JOB, str(tmp_path), gil, when], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "VICTIM_LIB": victim_lib})
    try:
        meta = json.loads(p.stdout.readline())
        assert meta["native_stack"] is True
        time.sleep(0.2)
        got = probes.live_stacks(str(tmp_path), {0: (p.pid, meta)}, py_spy_ok=False, with_native={0})
        assert p.poll() is None   # neither question ended it
    finally:
        p.kill()
        p.wait()
    frames, how, why, native = got[0]
    assert how == route and frames[-1]["func"] == "hold", why
    names = [(fr["object"], fr["symbol"]) for fr in native]
    # the main thread's frames, never those of the thread the signal landed on (the poller's, asleep)
    held = "take_lock_twice_after_blocking" if when == "late" else "take_lock_twice"
    assert ("libvictim.so", held) in names, names[:8]
    assert native[0]["object"].startswith("libc.so")   # innermost: the lock's wait itself

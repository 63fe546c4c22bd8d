"""Native frames without a job: the file the dying rank writes (colltrace/rank/_crash.c's format),
symbols named from an object's own tables, and how the verdict, the report and Perfetto say them."""
from __future__ import annotations

import ctypes
import signal

from colltrace import verdict
from colltrace.model import build
from colltrace.reporters import native as words
from colltrace.reporters import timeline
from colltrace.reporters.text import render_report
from colltrace.tracefile import native, symbols
from helpers.native import NATIVE, dead_in_native

FILE = """exception type=St13runtime_error
what bad shape\\n7
begin crash sig=6 code=-6 addr=0x1f4 from=0 pid=500 tid=500 t=1700000001.250000
f 0x7f0000001000 p 0x1000 fe:00 123 /nonexistent/libc.so.6
f 0x7f0000002000 r ? ? ? ?
end
begin crash sig=11 code=1 addr=0x0 from=0 pid=999 tid=999 t=1700000002.0
f 0x7f0000003000 p 0x3000 fe:00 456 /nonexistent/libchild.so
end
"""


def test_the_dying_ranks_file_is_read_back_with_its_exception():
    crash = native.crash(FILE, pid=500)   # the block of pid 999 is a forked child's, not the rank's
    assert crash["signal"] == "SIGABRT" and crash["code"] == -6 and crash["t"] == 1700000001.25
    assert crash["native_exception"] == {"type": "std::runtime_error", "what": "bad shape\n7"}
    assert [f["object"] for f in crash["native_frames"]] == ["libc.so.6", "?"]
    assert crash["native_frames"][0] == {"object": "libc.so.6", "symbol": None, "offset": "0x1000",
                                         "path": "/nonexistent/libc.so.6"}   # the file is gone: unnamed
    assert crash["returned"] is None and crash["complete"]
    assert native.parse(FILE + "returned t=1700000003\n")[-1]["returned"] == 1700000003.0


def _frame_of(addr: int, pc: bool = True) -> dict:
    """A raw frame, as the rank writes it, for an address in this very process."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            start, end = (int(x, 16) for x in parts[0].split("-"))
            if start <= addr < end:
                return {"address": addr, "pc": pc, "offset": addr - start + int(parts[2], 16), "inode": int(parts[4]),
                        "path": parts[5].strip()}
    raise AssertionError(f"{addr:#x} is mapped nowhere")


def test_an_address_is_named_from_its_objects_own_symbol_table():
    libc = ctypes.CDLL(None)
    getpid = ctypes.cast(libc.getpid, ctypes.c_void_p).value
    memset = ctypes.cast(ctypes.memset, ctypes.c_void_p).value   # an IFUNC: the implementation this CPU runs
    got = native.frames([_frame_of(getpid), _frame_of(getpid + 2, pc=False), _frame_of(memset + 4)])
    assert [(f["object"].split(".so")[0], f["symbol"], f["offset"]) for f in got] == \
           [("libc", "getpid", "0x0"), ("libc", "getpid", "0x2"), ("libc", "memset", "0x4")]


def test_cxx_names_are_demangled():
    assert symbols.demangle(["_ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
                             "memset"]) == {
        "_ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE":
            "c10::Error::Error(c10::SourceLocation, std::__cxx11::basic_string<char, std::char_traits<char>, "
            "std::allocator<char> >)", "memset": "memset"}
    assert symbols.demangle(["N3c105ErrorE"], types=True) == {"N3c105ErrorE": "c10::Error"}


def test_the_frame_named_is_the_users_library_below_libc():
    assert words.named(NATIVE) is NATIVE[1]   # libtorch_cpu's, not libc's memset
    assert words.named([NATIVE[0], NATIVE[2], NATIVE[3]]) is NATIVE[0]   # through ctypes: libc's own
    assert words.frame_text(NATIVE[0], offset=True) == "libc.so.6 (memset+0x1c)"
    assert words.frame_text({"object": "libx.so", "symbol": None, "offset": "0x9c8dc"}) == "libx.so+0x9c8dc"


def test_the_verdict_report_and_perfetto_say_where_it_died_in_native_code():
    snap = dead_in_native(exception={"type": "c10::Error", "what": "CUDA error: an illegal memory access"})
    findings = verdict.findings_of(snap, 30.0, snap["taken_at"])
    (f,) = [x for x in findings if x.kind == "dead_rank"]
    assert f.ranks["1"]["native_frames"] == NATIVE
    assert ("rank 1 (on h) died of SIGSEGV (an uncaught c10::Error: CUDA error: an illegal memory access) in "
            "libtorch_cpu.so (at::native::fill_(at::Tensor&, c10::Scalar const&)) (innermost: libc.so.6 (memset)), "
            "called from model.py:44 (fused_mlp).") in f.summary
    report = render_report(findings)
    assert "Native frames of rank 1 when it died (innermost first); an uncaught c10::Error" in report
    assert "  #0 libc.so.6 (memset+0x1c)  /usr/lib/libc.so.6\n  #1 libtorch_cpu.so (at::native::fill_" in report
    assert f.to_json()["ranks"]["1"]["native_frames"] == NATIVE
    events = timeline.build(snap, findings)["traceEvents"]
    (died,) = [e for e in events if e.get("cat") == "death"]
    assert died["pid"] == 1 and died["args"]["native_frames"][0] == "libc.so.6 (memset+0x1c)"


def test_a_live_rank_parked_in_native_code_is_placed_there():
    snap = dead_in_native(alive=True)
    (f,) = [x for x in verdict.findings_of(snap, 30.0, snap["taken_at"]) if x.kind == "stall"]
    assert f.ranks["1"]["native_frames"] == NATIVE
    assert ("its live stack is at model.py:44 (fused_mlp) (in native code: libtorch_cpu.so (at::native::fill_"
            in f.summary)


def test_a_fatal_signal_the_program_handles_is_no_death_while_the_process_lives():
    fault = {"signal": "SIGSEGV", "code": -11, "frames": [{"file": "/job/m.py", "line": 3, "func": "f"}],
             "native_frames": NATIVE, "native_pending": True}
    entry = build.rank_entry(1, {"pid": 11}, "dead", {"signal": "SIGSEGV", "code": -11}, heartbeat=1.0, progress={},
                             records=[], fault=fault)
    alive = build.host_entry(dict(entry), keep_records=8, died_at=None)
    assert (alive["status"] == "alive" and alive["exit"] is None and alive["stack"] is None
            and "native_frames" not in alive)
    gone = build.host_entry(dict(entry), keep_records=8, died_at=2.0)
    assert gone["status"] == "dead" and gone["native_frames"] == NATIVE


def test_the_module_is_built_at_install_on_every_python():
    from colltrace.rank import crash

    assert crash._crash is not None, "colltrace/rank/_crash.c was not built at install (a C compiler is needed)"
    assert crash._crash.disposition(int(signal.SIGSEGV)) in (0, 1, 2)


def test_native_frames_of_a_thread_without_python_frames_are_not_said_to_be_called_from_the_stack():
    snap = dead_in_native()
    snap["ranks"]["1"]["native_other_thread"] = True   # a library's own thread crashed (reader.fault)
    (f,) = [x for x in verdict.findings_of(snap, 30.0, snap["taken_at"]) if x.kind == "dead_rank"]
    assert ("(innermost: libc.so.6 (memset)) on a thread with no Python frames; its main thread was at "
            "model.py:44 (fused_mlp).") in f.summary


def test_faulthandlers_words_for_each_fatal_signal_are_read_on_every_python():
    """faulthandler's first line names the signal; Python 3.13 spells SIGFPE's "Floating-point
    exception" where 3.10-3.12 say "Floating point exception"."""
    from colltrace.tracefile.reader import parse_fault

    frames = '\nCurrent thread 0x00007f (most recent call first):\n  File "/job/train.py", line 25 in fused_mlp\n'
    for said, name in [("Segmentation fault", "SIGSEGV"), ("Aborted", "SIGABRT"), ("Bus error", "SIGBUS"),
                       ("Floating point exception", "SIGFPE"), ("Floating-point exception", "SIGFPE"),
                       ("Illegal instruction", "SIGILL")]:
        fault = parse_fault(f"Fatal Python error: {said}\n{frames}")
        assert (fault["signal"], fault["code"]) == (name, -getattr(signal, name)), said
        assert [(f["line"], f["func"]) for f in fault["frames"]] == [(25, "fused_mlp")]

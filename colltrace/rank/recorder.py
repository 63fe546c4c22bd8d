"""One rank's recorder: interns stacks and signatures, keeps per-group sequence numbers in step
with the backend's own counter, and writes events into the rank's ring before each call.

The hot path (enter/exit) does no formatting and no I/O beyond two 64-byte mmap writes;
anything seen for the first time (a stack, a signature, a group) is written once to the
definitions file.
"""
from __future__ import annotations

import atexit
import contextlib
import faulthandler
import itertools
import os
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import IO, Any, cast

from colltrace import origins
from colltrace.rank import calls, crash, cudamarks, exits, fastpath, flightrecorder, sampler
from colltrace.tracefile import asks, ringfile, storage
from colltrace.tracefile.layout import rank_file
from colltrace.tracefile.ringfile import (
    COMPLETE,
    ENTER,
    F_CAPTURED,
    F_DONE,
    F_P2P,
    F_UNOBSERVED,
    FAIL,
    RETURN,
    STARTED,
    UNTRACED,
    WAIT,
    WAITED,
)

_time = time.time
_getframe = sys._getframe


def job_id(environ=os.environ, store=None) -> str:
    """The same string on every rank of one job, different between jobs (colltrace.rank.identity)."""
    from colltrace.rank import identity

    return identity.job_id(store, environ)


def _line_of(code, lasti: int) -> int:
    """The source line of byte offset `lasti` in `code` (what frame.f_lineno would have said)."""
    line = None
    for start, end, ln in code.co_lines():
        if start <= lasti < end:
            line = ln
            break
    return line if line is not None else code.co_firstlineno


def _work_done(w) -> bool | str:
    """A c10d Work: finished (True), not yet (False), or the reason it failed: a work that ended
    in an error or a timeout is finished but not complete. Its future's value() raises its error
    (Work.exception() would print a deprecation warning into the program's output)."""
    if not w.is_completed():
        return False
    try:
        fut = w.get_future()
    except Exception:   # raised in C++ (no Python type we can name)
        return True   # a backend without futures: finished, as far as can be told
    try:
        fut.value()
    except Exception as exc:   # the Work's own error, of any type: its reason
        return str(exc) or type(exc).__name__
    return True


def _waitable_done(w) -> bool | str:
    """Whether a waitable the poller holds (a Work, a CUDA event, a coalesced block's works) is
    finished: True, False, or the reason it failed (asking it raised, or a work failed)."""
    try:
        if hasattr(w, "query"):
            return bool(w.query())
        if isinstance(w, (list, tuple)):
            states = [_work_done(x) for x in w]
            failed = [x for x in states if isinstance(x, str)]
            return failed[0] if failed else all(states)
        return _work_done(w)
    except Exception as exc:   # asking raised (a CUDA error, a backend's): the reason, not the poller's end
        return str(exc) or type(exc).__name__


def _cuda_in_use() -> bool:
    """Whether this process has initialized CUDA (without a CUDA call: torch.cuda's own flag)."""
    return bool(getattr(sys.modules.get("torch.cuda"), "_initialized", False))


_work_types: list = []


def _work_type():
    """c10d's Work type, whose finished state the compiled drain asks itself (is_completed(), as
    _waitable_done would); None where torch's is not that (no such type, or one with query())."""
    if not _work_types:
        mod = sys.modules.get("torch._C._distributed_c10d")
        t = getattr(mod, "Work", None)
        if not isinstance(t, type) or hasattr(t, "query") or issubclass(t, (list, tuple)):
            return None   # asked again at the next drain (torch may not be imported yet)
        _work_types.append(t)
    return _work_types[0]


class _Local(threading.local):
    depth = 0   # >0 while a traced call runs on this thread: inner calls are its parts


class GroupState:
    __slots__ = ("id", "pg", "name", "ranks", "backend", "get_seq", "seq_fn", "last_after", "p2p_offset", "p2p_seq",
                 "lanes")

    def __init__(self, gid, pg, name, ranks, backend, get_seq):
        self.id, self.pg, self.name, self.ranks, self.backend = gid, pg, name, ranks, backend   # pg: a weakref
        self.get_seq = get_seq
        # the backend's own getter, fn(pg), for the compiled hot path (colltrace/rank/fastpath.py)
        self.seq_fn = getattr(get_seq, "seq_fn", None)
        self.last_after = None   # backend counter after our last observed op
        self.p2p_offset = 0      # backend steps taken by p2p ops (gloo counts them, NCCL does not)
        self.p2p_seq = {}        # (src, dst) -> count
        # A group whose device types go to different backends ("cpu:gloo,cuda:nccl"): each backend
        # numbers its own ops, so each is a lane with its own numbers and name (this state is the
        # lane of the first accelerator); device type -> GroupState. None: one backend.
        self.lanes = None

    def lane(self, device_type: str) -> GroupState:
        """The state that numbers this group's ops on tensors of `device_type`."""
        return self if self.lanes is None else self.lanes.get(device_type, self)


class Recorder:
    def __init__(self, settings, rank: int, world_size: int, backend: str = "", cuda=None, job=None):
        """cuda: the CudaMarks that follows CUDA collectives (made at the first one unless given)."""
        self.settings = settings
        self.rank = rank
        self.pid = os.getpid()   # a forked child (a DataLoader worker) writes nothing of its ending here
        self.world_size = world_size
        self.job = job or job_id()
        # the job's store as identity.store_id says it ("tcp:HOST:PORT"): the store whose lasting
        # waits are recorded (rank/setup.py); set where it is known, before or at init_process_group
        self.store_id: str | None = None
        self.disabled = False
        d = settings.dir
        # None until it is made below (_storage_error, which the definitions' writer may call
        # first, checks for that); typed as the writer: every method that writes runs after
        self.ring = cast(ringfile.RingWriter, None)
        self._stack_signal_file: object | None = None
        self._storage_failed = False
        defs_path = rank_file(d, rank, "defs.jsonl")
        try:
            # Definitions (their meta line) before the ring: a watchdog that sees this rank's
            # ring replaced then reads this job's meta, not the previous run's.
            os.makedirs(d, exist_ok=True)
            self.defs = ringfile.DefsWriter(defs_path, settings.defs_max_bytes, on_error=self._storage_error)
            self._write_meta(rank, world_size, backend)
            if self.defs.failed is not None:
                raise self.defs.failed
            self.ring = ringfile.RingWriter(rank_file(d, rank, "ring"), settings.ring_slots,
                                            fastpath.counter(0, settings))
        except OSError as exc:
            asks.uninstall_signal(self._stack_signal_file)
            if getattr(self, "defs", None) is not None:
                self.defs.close()
                try:
                    os.unlink(defs_path)
                except OSError:
                    pass
            raise storage.StorageError(self._storage_text(exc)) from exc
        self.fault_path = rank_file(d, rank, "fault.txt")
        self._fault_file: IO[str] | None = None
        self.local = fastpath.thread_local(settings) or _Local()
        self._depth = settings.stack_depth
        self.digest_bytes = settings.digest_bytes
        self._codes: dict = {}
        self._stacks: dict = {}
        self._sigs: dict = {}
        self._threads: dict = {}
        # Interning's slow path (a new stack, signature, thread, group): the poller interns too,
        # for the store waits it records (watched below), while the program's threads do.
        self._intern = threading.RLock()
        self.groups: dict = {}          # id(process group) -> GroupState
        self._virtual: dict = {}        # name -> GroupState of a group no process group stands for (rank/setup.py)
        # Store waits in progress, thread ident -> [store, keys, op, frame, t0, ctx]: the poller records
        # the ones that last (ctx: their record, or False for a store that is not the job's).
        self.watched: dict[int, list[Any]] = {}
        self.watch_lock = threading.Lock()
        self.lasting_s = min(1.0, settings.stall_s / 2)
        # fn(recorder, ident, item) -> the wait's record: set by rank/setup.py
        self.lasting: Callable[[Recorder, int, list[Any]], Any] | None = None
        self._untraced_groups: weakref.WeakSet[Any] = weakref.WeakSet()   # groups that could not be described
        self._group_ids = itertools.count(1)
        self._rec_ids = fastpath.counter(1, settings)
        self._pending: list = []        # (rec_id, gid, seq, waitable) polled for completion off the hot path
        self._draining: list = []       # the items the poller is asking right now (a waiter looks there too)
        self._pending_lock = threading.Lock()
        # id(output tensor) -> (weakref, rec_id, gid, seq): a functional collective's result, whose
        # wait_tensor() is the one sign of its completion (there is no Work to poll)
        self._unobserved: dict = {}
        self._drain = fastpath.drainer(settings)   # the compiled drain loop, or None: the Python one
        self._cuda = cuda
        self._marks: list = []          # (rec_id, gid, seq, cudamarks.Mark): CUDA work polled by its events
        # one drain at a time: a destroyed group's Works are not in the poller's hands
        self._drain_lock = threading.Lock()
        self._stop = threading.Event()
        self._internal_error_reported = False
        self._native_rec: dict = {}   # the rank's last {"k": "native"} record (_arm_crash)
        self._install_fault_handler()
        self._raised: type | None = None   # the exception the main thread died of
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        self._prev_thread_hook = threading.excepthook
        threading.excepthook = self._thread_excepthook
        atexit.register(self._at_exit)
        exits.install()                      # sys.exit, exit(), quit(), os._exit noted where called
        exits.attach(self._write_os_exit)
        # the exit status, written after Python's finalization (its code where Python saw no call)
        self._status_armed = exits.arm_status(self.defs.fileno())
        self.ring.heartbeat(_time())
        self._flight_recorder = flightrecorder.Responder(d, rank, self.fr_names)
        self._stack_responder = asks.StackResponder(d, rank, native=crash.main_stack)
        self._sampler = sampler.Sampler(d, rank)   # where it is while others wait, when the watchdog asks
        self._poller = threading.Thread(target=self._poll_loop, name="colltrace-poller", daemon=True)
        self._poller.start()

    # ---- process-level records -------------------------------------------------------
    def _write_meta(self, rank, world_size, backend):
        settings = self.settings
        # before the meta line, which says which signal (if any) dumps this rank's stacks
        probe_meta, self._stack_signal_file = asks.install_signal(settings.dir, rank)
        self.defs.write({
            "k": "meta", "rank": rank, "world_size": world_size, "pid": os.getpid(), "host": settings.host,
            "job": self.job, "started": _time(), "backend": backend, "argv": sys.argv[:8],
            "stall_s": settings.stall_s, "local_rank": os.environ.get("LOCAL_RANK"), **probe_meta,
            # where this rank's torch, stdlib and packages are: frames are classified against them
            "roots": origins.local_roots(getattr(settings, "user_packages", ())),
        })

    def _storage_text(self, exc: BaseException) -> str:
        return (f"cannot write traces to {self.settings.dir}: {storage.describe(exc)}; "
                f"tracing is off on rank {self.rank}, the job goes on untraced")

    def _storage_error(self, exc: BaseException) -> None:
        """A write to the trace folder failed (full disk, quota): one line, then step aside.
        What is already in the files stays readable; the ring says no more slots will come."""
        if self._storage_failed:
            return
        self._storage_failed = True
        if self.ring is None:
            return   # still starting: the constructor reports it
        sys.stderr.write(f"colltrace: warning: {self._storage_text(exc)}\n")
        try:
            self.ring.mark_stopped()
            self.ring.heartbeat(_time())
        except Exception:   # the ring's file gone too: disabled all the same
            pass
        self.disable()

    def _install_fault_handler(self):
        # Leave a user's own faulthandler setup alone; otherwise dump every thread's stack to
        # our file on SIGSEGV/SIGABRT/SIGBUS/SIGFPE/SIGILL so the watchdog can name the signal.
        # Then, above whichever handler is there, the native frames' (colltrace/rank/crash.py).
        own = crash.own_handlers()   # before faulthandler's: the program's own, if any
        if faulthandler.is_enabled():
            self.defs.write({"k": "note", "text": "faulthandler already enabled by the program; "
                             "fatal-signal stacks go where it chose"})
        else:
            try:
                # kept open for the process's life: faulthandler writes into it at a fatal signal
                fault_file = open(self.fault_path, "w")  # noqa: SIM115 - faulthandler writes to it
            except OSError as exc:   # fatal-signal stacks are lost, nothing else
                self.defs.write({"k": "note", "text": f"no fault file: {storage.describe(exc)}"})
            else:
                self._fault_file = fault_file
                faulthandler.enable(file=fault_file, all_threads=True)
        rec = self._arm_crash(own)
        if self._stack_signal_file is not None and rec.get("crash"):
            rec.update(crash.install_stack(self.settings.dir, self.rank, asks.stack_signal()))
        self.defs.write(rec)

    def _arm_crash(self, own: list) -> dict:
        """colltrace's fatal-signal handlers above whichever are there (crash.install); the rank's
        native record, what an earlier one said of the stack signal kept (the reader reads the last)."""
        rec = dict(self._native_rec, **crash.install(self.settings.dir, self.rank, own))
        rec["faulthandler"] = self._fault_file is not None   # its stack comes to fault.txt after the native frames
        self._native_rec = rec
        return rec

    def rearm(self) -> None:
        """At init_process_group, for a recorder that started with the interpreter (rank/early.py):
        exit() and quit(), which site defines after the start-up hook runs, and the fatal signals
        whose handler the program set since (colltrace's goes above it again and passes each on),
        as a recorder started here would find them."""
        exits.install()
        taken = crash.taken_over()
        if taken:
            self.defs.write(self._arm_crash(sorted(set(taken) | set(self._native_rec.get("own_handlers") or ()))))

    def _excepthook(self, etype, value, tb):
        try:
            if os.getpid() == self.pid:   # not a forked child's (a DataLoader worker's)
                self._raised = etype
                frames = [{"file": f.filename, "line": f.lineno, "func": f.name} for f in traceback.extract_tb(tb)]
                # "fatal": the main thread's uncaught exception ends the rank (exit code 1) even if
                # its interpreter takes a while to shut down; the waiters learn it now
                self.defs.write({"k": "exception", "t": _time(), "type": etype.__name__,
                                 "message": str(value)[:2000], "frames": frames, "fatal": True})
        except Exception:   # never lose the program's traceback over ours: the previous hook runs regardless
            pass
        self._prev_excepthook(etype, value, tb)

    def _thread_excepthook(self, args):
        # Another thread died of an exception: the rank lives on, but its main thread may now
        # wait forever for what that thread would have done (a loader, a prefetcher).
        try:
            if args.exc_type is not SystemExit:
                frames = [{"file": f.filename, "line": f.lineno, "func": f.name}
                          for f in traceback.extract_tb(args.exc_traceback)]
                self.defs.write({"k": "exception", "t": _time(), "type": args.exc_type.__name__,
                                 "message": str(args.exc_value)[:2000], "frames": frames, "fatal": False,
                                 "thread": getattr(args.thread, "name", None)})
        except Exception:   # never lose the thread's traceback over ours: the previous hook runs regardless
            pass
        self._prev_thread_hook(args)

    def _ending(self, call: dict | None, final: bool = False) -> dict:
        """The exit record: how the program ended, with the code and the line where Python knows
        them. `status_follows`: the process's own exit status comes after finalization (a
        "status" line, colltrace/rank/exits.py), the code to believe where they differ."""
        if self._raised is not None and not final:
            if issubclass(self._raised, KeyboardInterrupt):   # Python ends itself with SIGINT then
                return {"k": "exit", "t": _time(), "how": "signal", "signal": "SIGINT", "pid": self.pid,
                        "status_follows": False}
            how = {"how": "exception", "code": 1}
        elif call is not None:
            how = call
        else:
            how = {"how": "return", "code": 0}   # or `raise SystemExit(n)`: the status line tells
        return {"k": "exit", "t": _time(), **how, "pid": self.pid, "status_follows": self._status_armed and not final}

    def _write_os_exit(self, call: dict | None) -> None:
        """os._exit: no atexit handler runs, no status is written; the rank's ending is written now."""
        if self.disabled or os.getpid() != self.pid:
            return
        # Never wait here: os._exit may come from a signal handler run while this very thread
        # holds the lock, appending a work.
        if self._pending_lock.acquire(blocking=False):
            self._pending_lock.release()
            self._drain_all(final=True)
        self.ring.heartbeat(_time())
        self.defs.write(self._ending(call, final=True))

    def _at_exit(self):
        if not self.disabled and os.getpid() == self.pid:
            self._drain_all(final=True)
            self.ring.heartbeat(_time())
            self.defs.write(self._ending(exits.last_call()))
        self._stop.set()
        sampling = getattr(self, "_sampler", None)
        if sampling is not None:   # as the poller below: not left sampling into finalization
            sampling.stop()
        # The poller is a daemon thread: left running into interpreter finalization, a torch call
        # it is in (one that released the GIL through pybind11) ends it with pthread_exit from a
        # noexcept destructor, and the process aborts ("terminate called without an active
        # exception", SIGABRT). It wakes at once on _stop: wait for it, briefly.
        poller = getattr(self, "_poller", None)
        if poller is not None and poller.is_alive() and poller is not threading.current_thread():
            poller.join(timeout=2.0)
        if threading.current_thread() is threading.main_thread():
            asks.retire_signal(self._stack_signal_file)   # nobody answers it any more
            self._stack_signal_file = None

    def disable(self, why: str | None = None):
        """Step aside for good: the program goes on untraced."""
        if self.disabled:
            return
        self.disabled = True
        self._stop.set()
        if getattr(self, "_status_armed", None) is not None:   # nothing of this rank's is written any more
            exits.detach(self._write_os_exit)
            if self._status_armed:
                exits.arm_status(-1)
            self._status_armed = False
        if getattr(self, "_sampler", None) is not None:
            self._sampler.stop(wait=False)   # its burst ends within a sample's period
        # Nothing polls the works any more: let go of them now, not at interpreter exit, where
        # the last reference to a gloo work may be dropped as the interpreter shuts down.
        with self._pending_lock:
            self._pending = []
            self._marks = []
        if why:
            try:
                self.defs.write({"k": "note", "t": _time(), "text": f"tracing disabled: {why}"})
            except Exception:   # the defs file full or gone: disabled all the same
                pass

    def internal_error(self, exc: BaseException):
        if not self._internal_error_reported:
            self._internal_error_reported = True
            sys.stderr.write(f"colltrace: internal error, tracing stops on rank {self.rank} "
                             f"(the job is unaffected): {exc!r}\n")
        self.disable(repr(exc))

    # ---- interning -------------------------------------------------------------------
    def stack_id(self, frame) -> int:
        # Keyed by instruction offset, not line: f_lasti is a plain field, f_lineno decodes the
        # line table on every read (2-3x the cost of the walk). Keyed by id(code), not the code:
        # hashing a code object rehashes its constants on every call. Safe because every code
        # in a stored key stays referenced by self._codes, so its id cannot be reused.
        parts: list[int] = []
        append = parts.append
        depth = self._depth
        f = frame
        while f is not None and depth:
            append(id(f.f_code))
            append(f.f_lasti)
            f = f.f_back
            depth -= 1
        key = tuple(parts)
        sid = self._stacks.get(key)
        if sid is None:
            with self._intern:
                sid = self._stacks.get(key) or self._new_stack(key, frame)
        return sid

    def _new_stack(self, key, frame) -> int:
        frames = []
        depth = self._depth
        while frame is not None and depth:
            code = frame.f_code
            line = _line_of(code, frame.f_lasti)
            cid = self._codes.get(code)
            if cid is None:
                cid = len(self._codes) + 1
                if not self.defs.write({"k": "code", "id": cid, "file": code.co_filename, "func": code.co_name,
                                        "first": code.co_firstlineno, **origins.code_traits(code)}):
                    return 0
                self._codes[code] = cid
            frames.append((cid, line))
            frame = frame.f_back
            depth -= 1
        sid = len(self._stacks) + 1
        if not self.defs.write({"k": "stack", "id": sid, "frames": frames}):  # innermost first
            return 0
        self._stacks[key] = sid
        return sid

    def sig_id(self, key: calls.CallSig) -> int:
        sid = self._sigs.get(key)
        if sid is None:
            return self._new_sig(key)
        return sid

    def _new_sig(self, key: calls.CallSig) -> int:
        with self._intern:
            sid = self._sigs.get(key)
            if sid is not None:
                return sid
            op, backend_op, gid, shapes, dtypes, redop, root, peer, is_async = key
            sid = len(self._sigs) + 1
            if not self.defs.write({"k": "sig", "id": sid, "op": op, "backend_op": backend_op, "group": gid,
                                    "shapes": shapes, "dtypes": dtypes, "reduce_op": redop, "root": root,
                                    "peer": peer, "async": is_async}):
                return 0
            self._sigs[key] = sid
        return sid

    def thread_id(self, ident: int | None = None) -> int:
        """The number of this thread (or of the thread `ident`), its name written once."""
        ident = threading.get_ident() if ident is None else ident
        tid = self._threads.get(ident)
        if tid is None:
            with self._intern:
                tid = self._threads.get(ident)
                if tid is None:
                    t = (threading.current_thread() if ident == threading.get_ident()
                         else threading._active.get(ident))   # type: ignore[attr-defined]  # threading's own table
                    tid = len(self._threads) + 1
                    self.defs.write({"k": "thread", "id": tid, "name": t.name if t is not None else f"thread-{ident}"})
                    self._threads[ident] = tid
        return tid

    def group_state(self, pg, describe, quiet: bool = False) -> GroupState | None:
        """describe(pg) -> (name, desc, global ranks, backend, seq getter); called once per group.
        None for a group that cannot be described (or named) yet: its calls pass through
        untraced, with one note in the trace (none if quiet: torch fills in a new group's ranks
        after registering it); the other groups are traced as ever.

        Groups are held weakly (keyed by id, the entry dropped when the group is freed, before
        its id can be reused): a group the program destroyed must be freed when torch lets go
        of it, not at interpreter exit, where a gloo group's destructor can abort."""
        key = id(pg)
        gs = self.groups.get(key)
        if gs is None:
            if pg in self._untraced_groups:
                return None   # already found undescribable at a call: not described again on every call
            try:
                name, desc, ranks, backend, get_seq, *more = describe(pg)
                lanes = more[0] if more else None   # calls.describe_group: {device type: (backend, counter)}
                if not name:
                    raise ValueError("it has no name")
            # an undescribable group (a stand-in, a Python-defined backend): noted, not traced
            except Exception as exc:
                if not quiet and pg not in self._untraced_groups:
                    self._untraced_groups.add(pg)
                    self.defs.write({"k": "note", "t": _time(),
                                     "text": f"group {type(pg).__name__} not traced: {exc!r}"})
                return None
            # cast: mypy cannot type a lambda whose parameters take their values from defaults
            ref = weakref.ref(pg, cast(Any, lambda _, key=key, groups=self.groups: groups.pop(key, None)))
            timeout = calls.group_timeout(pg)
            if lanes:
                gs = self._lanes(ref, name, desc, ranks, lanes, timeout)
            else:
                gs = self._group(ref, name, desc, ranks, backend, get_seq, timeout=timeout)
            self.groups[key] = gs
        return gs

    def _group(self, ref, name, desc, ranks, backend, get_seq, device=None, timeout=None) -> GroupState:
        gs = GroupState(next(self._group_ids), ref, name, ranks, backend, get_seq)
        d = {"k": "group", "id": gs.id, "name": name, "desc": desc, "ranks": ranks, "backend": backend}
        if device is not None:
            d["device"] = device
        if timeout is not None:
            d["timeout_s"] = timeout   # the backend's: a post-mortem tells its abort from a crash
        self.defs.write(d)
        if get_seq is None:
            self.defs.write({"k": "note", "t": _time(), "text": f"group {name} ({backend or 'its backend'}) "
                             "keeps no sequence numbers: numbered by the calls colltrace saw"})
        return gs

    def _lanes(self, ref, name, desc, ranks, lanes: dict, timeout=None) -> GroupState:
        """A group of several backends: one lane per device type, each numbered by its backend's own
        counter. The first accelerator's lane keeps the group's name (what NCCL's Flight Recorder
        calls it); the others are named "<group>:<device type>". None of them takes the compiled
        path (its counter reader reads the group's default backend)."""
        accelerators = sorted(t for t in lanes if t != "cpu")
        primary = accelerators[0] if accelerators else sorted(lanes)[0]
        out = {}
        for t in [primary] + sorted(t for t in lanes if t != primary):
            backend, get_seq = lanes[t]
            lane_name = name if t == primary else f"{name}:{t}"
            out[t] = self._group(ref, lane_name, desc, ranks, backend, get_seq, device=t, timeout=timeout)
            out[t].seq_fn = None
        main = out[primary]
        main.lanes = out
        for lane in out.values():
            lane.lanes = out
        return main

    def group_ids(self, pg) -> set:
        """The ids of a group's states (its lanes too); empty for a group never seen."""
        gs = self.groups.get(id(pg))
        if gs is None:
            return set()
        return {lane.id for lane in (gs.lanes or {}).values()} | {gs.id}

    def fr_names(self) -> dict:
        """{(group name, backend): lane name} for the groups of several backends: what the Flight
        Recorder of each backend calls a lane (flightrecorder.py)."""
        out = {}
        for gs in list(self.groups.values()):
            for lane in (gs.lanes or {}).values():
                out[(gs.name, lane.backend)] = lane.name
        return out
    # ---- calls that synchronize ranks without being collectives (rank/setup.py) ------------
    def virtual_group(self, name: str, desc: str, ranks, any_of: bool = False) -> GroupState:
        """A group no process group stands for, numbered by the calls this rank makes in it: the
        job's group creations, those of a group's members alone, the waits on one key of the job's
        store (any_of: any member may end the wait, by setting the key)."""
        gs = self._virtual.get(name)
        if gs is None:
            with self._intern:
                gs = self._virtual.get(name)
                if gs is None:
                    gs = GroupState(next(self._group_ids), None, name, list(ranks), "setup", None)
                    gs.last_after = 0   # the calls made in it so far
                    line = {"k": "group", "id": gs.id, "name": name, "desc": desc, "ranks": gs.ranks,
                            "backend": "setup"}
                    if any_of:
                        line["any_of"] = True
                    self.defs.write(line)
                    self._virtual[name] = gs
        return gs

    def setup_sig(self, op: str, backend_op: str, gs: GroupState, members, detail) -> int:
        """The signature of a setup call: what it asks for (its ranks, its structure) is compared
        across the ranks that make it at one number, as a collective's tensors are."""
        key = ("setup", op, backend_op, gs.id, members, detail)
        sid = self._sigs.get(key)
        if sid is None:
            with self._intern:
                sid = self._sigs.get(key)
                if sid is None:
                    sid = len(self._sigs) + 1
                    line = {"k": "sig", "id": sid, "op": op, "backend_op": backend_op, "group": gs.id, "shapes": [],
                            "dtypes": [], "reduce_op": None, "root": -1, "peer": -1, "async": False, "setup": True}
                    if members is not None:
                        line["members"] = list(members)
                    if detail is not None:
                        line["detail"] = detail
                    if not self.defs.write(line):
                        return 0
                    self._sigs[key] = sid
        return sid

    def setup_enter(self, gs: GroupState, seq: int, sig: int, frame, t: float | None = None,
                    ident: int | None = None):
        """ENTER of a setup call numbered `seq` in its virtual group (t, ident: when and on which
        thread it began, for a wait the poller records once it lasts)."""
        rec = next(self._rec_ids)
        self.ring.write(ENTER, 0, gs.id, sig, self.stack_id(frame), self.thread_id(ident), 0, seq, -1,
                        _time() if t is None else t, rec)
        return rec, gs, seq

    def setup_return(self, ctx) -> None:
        rec, gs, seq = ctx
        self.ring.write(RETURN, F_DONE, gs.id, 0, 0, 0, 0, seq, seq, _time(), rec)

    def setup_fail(self, ctx, exc: BaseException) -> None:
        rec, gs, seq = ctx
        self._failed(rec, gs.id, seq, type(exc).__name__, str(exc))

    def _record_lasting(self, now: float, lasting) -> None:
        """Store waits that have lasted `lasting_s`, on the job's store: recorded (ENTER at their
        start) by rank/setup.py's lasting(); the program's thread writes their end."""
        for ident, item in list(self.watched.items()):
            if item[5] is not None or now - item[4] < self.lasting_s:
                continue
            with self.watch_lock:
                if self.watched.get(ident) is item and item[5] is None:
                    item[5] = lasting(self, ident, item) or False

    # ---- events ----------------------------------------------------------------------
    def enter(self, gs: GroupState, sig: int, frame, flags: int, seq_hint_p2p=None, peer: int = -1, digest: int = 0):
        """Write the ENTER slot; returns the context exit() needs."""
        # A backend without a counter (one defined in Python): the calls seen are the count.
        before = gs.get_seq() if gs.get_seq is not None else (gs.last_after or 0)
        last = gs.last_after
        if last is not None and before > last:
            # The backend ran collectives we did not see (DDP's C++ reducer, pg.allreduce, compiled code).
            self.ring.write(UNTRACED, 0, gs.id, 0, 0, 0, 0, last - gs.p2p_offset + 1, before - last, _time(), 0)
        if seq_hint_p2p is not None:
            seq = gs.p2p_seq.get(seq_hint_p2p, 0) + 1
            gs.p2p_seq[seq_hint_p2p] = seq
        else:
            seq = before - gs.p2p_offset + 1
        rec = next(self._rec_ids)
        tid = self._threads.get(threading.get_ident()) or self.thread_id()
        self.ring.write(ENTER, flags, gs.id, sig, self.stack_id(frame), tid, digest, seq, peer, _time(), rec)
        return rec, gs, before, seq, flags

    def exit(self, ctx, done: bool, waitable=None, captured: bool = False, unobserved: bool = False):
        """done: the call's return means the work finished; waitable: what says when it does (a
        Work, works, a cudamarks.Mark); captured: the call was captured into a CUDA graph;
        unobserved: nothing will say when it finishes (a functional collective)."""
        rec, gs, before, seq, flags = ctx
        after = gs.get_seq() if gs.get_seq is not None else before + 1
        steps = after - before
        if flags & F_P2P:
            gs.p2p_offset += steps
            seq_end = seq
        else:
            seq_end = seq + max(steps, 1) - 1
        gs.last_after = after
        if captured:
            flags |= F_DONE | F_CAPTURED
        elif done:
            flags |= F_DONE
        elif unobserved:
            flags |= F_UNOBSERVED
        self.ring.write(RETURN, flags, gs.id, 0, 0, 0, 0, seq, seq_end, _time(), rec)
        if waitable is not None and not captured:
            with self._pending_lock:
                if isinstance(waitable, cudamarks.Mark):
                    self._marks.append((rec, gs.id, seq, waitable))
                else:
                    self._pending.append((rec, gs.id, seq, waitable))

    def fail(self, ctx, exc: BaseException):
        rec, gs, before, seq, flags = ctx
        try:
            gs.last_after = gs.get_seq() if gs.get_seq is not None else before + 1
        except Exception:   # a counter that raises (a group destroyed): the failure is still written
            pass
        self._failed(rec, gs.id, seq, type(exc).__name__, str(exc), flags)

    def _failed(self, rec: int, gid: int, seq: int, etype: str, message: str, flags: int = 0) -> None:
        """A FAIL slot and its reason: the call raised, or its work ended in an error or a timeout.
        The reason first: a reader that sees the slot has read the definitions written before it."""
        self.defs.write({"k": "error", "rec": rec, "t": _time(), "type": etype, "message": message[:2000]})
        self.ring.write(FAIL, flags, gid, 0, 0, 0, 0, seq, 0, _time(), rec)

    # ---- what the program waits for --------------------------------------------------------
    def unobserved(self, ctx, outputs) -> None:
        """RETURN of a call whose completion nothing reports (a functional collective): its output
        tensors are remembered, and waiting on one of them (waiting_on) tells when it is done."""
        rec, gs, before, seq, flags = ctx
        self.exit(ctx, done=False, unobserved=True)
        table = self._unobserved
        for t in outputs:
            key = id(t)
            try:
                # mypy cannot type a lambda bound by defaults; no cast() here, a call per traced tensor
                ref = weakref.ref(t, lambda _, key=key, table=table: table.pop(key, None))  # type: ignore[misc]
            except TypeError:
                continue
            table[key] = (ref, rec, gs.id, seq)

    def pending_for(self, waitable):
        """(rec_id, gid, seq) of the traced call whose Work or output tensor this is, if it has not
        completed yet; None otherwise (untraced, or already done)."""
        item = self._unobserved.get(id(waitable))
        if item is not None and item[0]() is waitable:
            return item[1:]
        for items in (self._pending, self._draining):
            for it in items:
                if it[3] is waitable:
                    return it[:3]
        return None

    def wait_begins(self, pending, frame) -> None:
        """A WAIT slot: this thread parks on that call (Work.wait, wait_tensor) at `frame`."""
        rec, gid, seq = pending
        tid = self._threads.get(threading.get_ident()) or self.thread_id()
        self.ring.write(WAIT, 0, gid, 0, self.stack_id(frame), tid, 0, seq, 0, _time(), rec)

    def wait_ends(self, pending, waitable, exc: BaseException | None, complete: bool) -> None:
        """The wait returned (complete: the call is done, as a CPU wait_tensor says) or raised
        (the call failed: its reason kept, never "completed")."""
        rec, gid, seq = pending
        tid = self._threads.get(threading.get_ident()) or self.thread_id()
        if exc is not None:
            with self._pending_lock:
                self._pending = [it for it in self._pending if it[3] is not waitable]
            self._failed(rec, gid, seq, type(exc).__name__, str(exc))
        elif complete:
            self.ring.write(COMPLETE, 0, gid, 0, 0, 0, 0, seq, 0, _time(), rec)
        if exc is not None or complete:
            self._unobserved.pop(id(waitable), None)
        self.ring.write(WAITED, 0, gid, 0, 0, tid, 0, seq, 0, _time(), rec)

    # ---- completion poller (off the hot path) -----------------------------------------
    def _poll_loop(self):
        period = self.settings.poll_s
        while not self._stop.wait(period):
            try:
                now = _time()
                self.ring.heartbeat(now)
                self._drain_all()
                if self.watched and self.lasting is not None:
                    self._record_lasting(now, self.lasting)
                self._answer_fr()              # a watchdog's request for the Flight Recorder
                self._stack_responder.poll()   # a watchdog's request for this rank's stacks
                self._sampler.poll()           # ... for samples of its stack (a straggler)
            except OSError as exc:   # its answer could not be written: the folder is full
                self._storage_error(exc)
                return
            except Exception as exc:  # pragma: no cover - defensive
                self.internal_error(exc)
                return

    def _answer_fr(self):
        if self._cuda is None and not _cuda_in_use():
            self._flight_recorder.poll()
            return
        # NCCL's recorder queries its CUDA events as it dumps: not during a global-mode capture,
        # and with this thread's device set
        with self.cuda.quiet() as free:
            if free:
                self.cuda.settle()
                self._flight_recorder.poll()

    def _drain_all(self, final=False):
        # bounded: a poller stuck in a CUDA call (a wedged GPU) must not hold the program's exit
        if self._drain_lock.acquire(timeout=2.0 if final else -1):
            try:
                self._drain_gated(final)
            finally:
                self._drain_lock.release()

    def _drain_gated(self, final):
        if self._cuda is None and not _cuda_in_use():
            self._drain_pending(final)
            return
        # CUDA in use: no CUDA call (an event query, a Work's is_completed) while a global-mode graph
        # capture is under way; the Works wait for the capture's end too (they may be NCCL's).
        with self.cuda.quiet() as free:
            if free:
                self.cuda.settle()   # a Work's is_completed queries an event of its device
                self._drain_pending(final)
                self._drain_marks(final)
            elif final:   # exiting mid-capture: nothing more is asked; let go of it all
                with self._pending_lock:
                    self._pending, self._marks = [], []

    def _drain_pending(self, final: bool = False) -> None:
        if not self._pending:
            return
        with self._pending_lock:
            pending, self._pending = self._pending, []
            self._draining = pending
        failed: list = []   # (item, reason): ended in an error or a timeout, written FAIL below
        if self._drain is not None:   # the compiled loop (fastpath.drainer): the same slots
            ring = self.ring
            keep = self._drain(pending, final, ring._serial, ring._mm, ring.slots, _work_type(), _waitable_done, failed)
        else:
            keep = []
            for item in pending:
                rec, gid, seq, w = item
                done = _waitable_done(w)
                if isinstance(done, str):
                    failed.append((item, done))
                elif done:
                    self.ring.write(COMPLETE, 0, gid, 0, 0, 0, 0, seq, 0, _time(), rec)
                elif not final:
                    keep.append(item)
        for (rec, gid, seq, _), why in failed:
            self._failed(rec, gid, seq, "", why)   # the work's own text says what it was
        with self._pending_lock:
            if keep:
                self._pending[:0] = keep
            self._draining = []

    def _drain_marks(self, final):
        if not self._marks:
            return
        with self._pending_lock:
            marks, self._marks = self._marks, []
        keep = []
        poll = self._cuda.poll
        for item in marks:
            rec, gid, seq, mark = item
            started, outcome = poll(mark)
            if outcome is not False:
                self._finished(item, outcome)
                continue
            if started:
                self.ring.write(STARTED, 0, gid, 0, 0, 0, 0, seq, 0, _time(), rec)
            if not final:
                keep.append(item)
        if keep:
            with self._pending_lock:
                self._marks[:0] = keep

    def _finished(self, item, outcome) -> None:
        """A CUDA mark's (or a destroyed group's Work's) end: True (it ran) or a reason (it failed).
        A failed one is written finished, as _drain_pending writes a failed Work."""
        rec, gid, seq, _ = item
        if isinstance(outcome, str):
            self._failed(rec, gid, seq, "", outcome)   # ended in an error or a timeout: never "completed"
        else:
            self.ring.write(COMPLETE, 0, gid, 0, 0, 0, 0, seq, 0, _time(), rec)

    # ---- CUDA collectives --------------------------------------------------------------
    @property
    def cuda(self) -> cudamarks.CudaMarks:
        """What follows this rank's CUDA collectives (made at the first one)."""
        if self._cuda is None:
            self._cuda = cudamarks.CudaMarks()
        return self._cuda

    def forget_group(self, pg) -> None:
        """The group is being destroyed: its Works are asked once more, then let go, before the
        communicator they point into is freed (nccl2's WorkNCCL holds it by a raw pointer). The
        CUDA events colltrace recorded are its own and stay followed. pg None: every group."""
        ids = None if pg is None else self.group_ids(pg)
        if ids is not None and not ids:
            return
        # a drain under way puts back what it did not finish first (bounded: a poller stuck in CUDA
        # must not hold the program's destroy_process_group)
        if self._drain_lock.acquire(timeout=5.0):
            try:
                self._forget(ids)
            finally:
                self._drain_lock.release()

    def _forget(self, ids) -> None:
        mine = (lambda gid: True) if ids is None else ids.__contains__
        with self._pending_lock:
            works = [x for x in self._pending if mine(x[1])]
            held = [x for x in self._marks if mine(x[1]) and x[3].works is not None]
            self._pending = [x for x in self._pending if not mine(x[1])]
            self._marks = [x for x in self._marks if not (mine(x[1]) and x[3].works is not None)]
        keep = []
        cuda = self._cuda
        with (cuda.quiet() if cuda is not None else contextlib.nullcontext(True)) as free:
            if free:
                self._ask_once(works)
                for item in held:
                    outcome = cuda.poll(item[3])[1]
                    if outcome is not False:
                        self._finished(item, outcome)
                    elif item[3].works is None:   # an event of colltrace's own now
                        keep.append(item)
        for item in held:
            if item not in keep:
                cuda.release(item[3], reuse=False)
        if keep:
            with self._pending_lock:
                self._marks.extend(keep)

    def _ask_once(self, works) -> None:
        for item in works:
            done = _waitable_done(item[3])
            if done:
                self._finished(item, done)

    def close(self):
        self.disable()
        exits.uninstall()   # the exit calls as they were
        if self.ring is not None:
            self.ring.close()
        self.defs.close()

"""The per-rank trace files: a fixed-size ring of 64-byte event slots plus an append-only
file of definitions (stacks, signatures, groups) that the slots refer to by number.

The ring is a shared file mapping: a slot written before the collective is entered is in the
kernel's page cache, so it survives SIGKILL, SIGSEGV and SIGABRT of the writer. Definitions are
written with os.write before the first slot that uses them. Readers never import torch.

Slot layout (little-endian, 64 bytes):
  kind u8, flags u8, pad u16, group u32, sig u32, stack u32, thread u32, aux32 u32 (digest),
  seq i64, aux i64, t f64, rec u64, commit u64   (commit = 1 + the slot's serial, written with it)
"""
from __future__ import annotations

import itertools
import json
import mmap
import os
import struct

from colltrace.tracefile import storage

MAGIC = b"CLTRACE1"
VERSION = 1
HEADER_SIZE = 4096
SLOT = struct.Struct("<BBHIIIIIqqdQQ")
SLOT_SIZE = SLOT.size
HEADER = struct.Struct("<8sIIIIqd")          # magic, version, slot size, slots, pad, pid, created
COUNT = struct.Struct("<Qd")                 # slots written, heartbeat
COUNT_OFFSET = 64
STOPPED = struct.Struct("<I")                # the header's pad: 1 once tracing stepped aside
STOPPED_OFFSET = 20

# slot kinds
ENTER, RETURN, COMPLETE, UNTRACED, FAIL, STARTED = 1, 2, 3, 4, 5, 6
# WAIT: a thread parks waiting for record `rec` (Work.wait(), funcol's wait_tensor): its stack is
# where it waits; WAITED: that wait returned (or raised). Kind 7 is left for other events.
WAIT, WAITED = 8, 9
# flags
F_ASYNC, F_P2P, F_DONE, F_DIGEST, F_START, F_CAPTURED, F_UNOBSERVED = 1, 2, 4, 8, 16, 32, 64
# F_DONE on RETURN: the call's return means the work finished. F_DIGEST on ENTER: aux32 holds a
# CRC-32 of the input tensor's bytes (COLLTRACE_DIGEST). F_START on ENTER: a CUDA event was
# recorded on the collective's stream before the call; a STARTED slot (its record's rec, group
# and seq) comes when the poller sees it reached: the GPU finished what was queued ahead of the
# collective. F_CAPTURED on RETURN (with F_DONE): the call was captured into a CUDA graph; it runs
# at the graph's replays, which no record follows. F_UNOBSERVED on RETURN: nothing tells when this
# work completes (a functional collective: no Work to poll); completed when waited on, or when a
# later op on its group completes.

assert SLOT_SIZE == 64

# The meta line's "job" (colltrace/rank/identity.py makes it): what follows HOST_PART differs by host.
HOST_PART = "#ppid"


def shared_job(job) -> str:
    """The part of a job id every host of the job has (a folder shared by hosts holds both)."""
    return str(job).rpartition(HOST_PART)[0] or str(job) if job is not None else ""


class RingWriter:
    """Owned by one process; any of its threads may write (the serial comes from an atomic counter)."""

    def __init__(self, path: str, slots: int, serial=None):
        """serial: the iterator of slot serials (0, 1, ...), itertools.count() unless given (the
        recorder gives one the compiled path shares)."""
        self.path = path
        self.slots = slots
        size = HEADER_SIZE + slots * SLOT_SIZE
        # Built under a hidden name, fully allocated (a page of a sparse mapping that cannot be
        # allocated is a SIGBUS in the program), then renamed in place: a reader of a previous
        # run's file sees a new file, never a truncated one. Raises OSError (ENOSPC) instead.
        d, base = os.path.split(path)
        tmp = os.path.join(d, f".{base}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            try:
                storage.preallocate(fd, size)
                self._mm = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            import time

            HEADER.pack_into(self._mm, 0, MAGIC, VERSION, SLOT_SIZE, slots, 0, os.getpid(), time.time())
            os.replace(tmp, path)
        except BaseException:   # re-raised below, the half-made file removed first
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self._serial = itertools.count() if serial is None else serial
        self._pack = SLOT.pack_into
        self.written = 0

    def write(self, kind, flags, group, sig, stack, thread, aux32, seq, aux, t, rec) -> None:
        # One slot and nothing else on the hot path: readers find new slots by their commit
        # numbers; the header count is only a hint, refreshed with the heartbeat.
        i = next(self._serial)
        self._pack(self._mm, HEADER_SIZE + (i % self.slots) * SLOT_SIZE,
                   kind, flags, 0, group, sig, stack, thread, aux32, seq, aux, t, rec, i + 1)
        self.written = i + 1

    def heartbeat(self, t: float) -> None:
        # the compiled hot path (colltrace/rank/_fastpath.c) raises the count in place as it writes
        written = max(self.written, COUNT.unpack_from(self._mm, COUNT_OFFSET)[0])
        COUNT.pack_into(self._mm, COUNT_OFFSET, written, t)

    def mark_stopped(self) -> None:
        """Say in the header that tracing stepped aside: no slot after this one will come."""
        STOPPED.pack_into(self._mm, STOPPED_OFFSET, 1)

    def close(self) -> None:
        try:
            self._mm.flush()
            self._mm.close()
        except (ValueError, OSError):
            pass


class DefsWriter:
    """Append-only JSON lines. Bounded: past max_bytes, new definitions are dropped (callers
    fall back to id 0, shown as 'not recorded')."""

    def __init__(self, path: str, max_bytes: int, on_error=None):
        """on_error(exc): called once, on the first write that fails (ENOSPC, EDQUOT); every
        write after it is dropped. A line cut short by the failure stays unterminated, and
        readers skip it."""
        self.path = path
        self.max_bytes = max_bytes
        self.written = 0
        self.failed: OSError | None = None
        self.on_error = on_error
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)

    def write(self, obj: dict) -> bool:
        if self.failed is not None:
            return False
        data = (json.dumps(obj, separators=(",", ":"), default=str) + "\n").encode()
        if self.written + len(data) > self.max_bytes and obj.get("k") not in ("meta", "exit", "note"):
            return False
        try:
            view = memoryview(data)
            while view:   # a full disk first writes what fits, then fails
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError as exc:
            # kept without its traceback: its frames are the traced program's (a collective's
            # arguments, the process group among them), which must not outlive their call
            self.failed = exc.with_traceback(None)
            if self.on_error is not None:
                self.on_error(exc)
            return False
        self.written += len(data)
        return True

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass


class RingFormatError(ValueError):
    pass


class RingReader:
    """Reads a ring incrementally; `poll()` returns the slots written since the last call.

    Safe against a writer that is alive, hung or dead. Slots overwritten before they were
    read are counted in `lost`.
    """

    def __init__(self, path: str):
        self.path = path
        self.next_serial = 0
        self.lost = 0
        self.heartbeat = 0.0
        self.pid = None
        self._ino: int | None = None
        self._mm: mmap.mmap | None = None
        self.slots = 0
        self.stopped = False   # the writer stepped aside (its folder was full): no more slots
        self.readable = 0      # slots the file holds: fewer than `slots` in a copy cut short
        self.cut: tuple[int, int] | None = None   # (bytes there, bytes the header promises) when cut short
        self.cut_lost = 0      # slots written past the cut, lost with it
        self.newest_lost = False   # the scan for new slots stopped at the cut: the newest may be past it

    def _open(self):
        with open(self.path, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_size < HEADER_SIZE:
                raise RingFormatError(f"{self.path}: too short to be a colltrace ring ({st.st_size} bytes, "
                                      f"its header alone is {HEADER_SIZE})")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        magic, version, slot_size, slots, _, pid, _created = HEADER.unpack_from(mm, 0)
        if magic != MAGIC or slot_size != SLOT_SIZE or version != VERSION or slots <= 0:
            mm.close()
            raise RingFormatError(f"{self.path}: not a colltrace ring (bad magic or version)")
        size, want = len(mm), HEADER_SIZE + slots * SLOT_SIZE
        # A copy cut short (a transfer that stopped, a full disk at the destination): the slots it
        # holds are read; those past the cut are lost, and said so (ringfile's readers name it).
        self.readable = min(slots, (size - HEADER_SIZE) // SLOT_SIZE)
        self.cut = (size, want) if size < want else None
        self._mm, self._ino, self.slots, self.pid = mm, st.st_ino, slots, pid
        self.stopped = False
        self.next_serial = 0

    def reopened(self) -> bool:
        """True when the file was replaced (a restarted rank) since the last poll, or, read cut
        short, has grown since (a copy still arriving: it is read again, whole)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        return st.st_ino != self._ino or (self.cut is not None and st.st_size != self.cut[0])

    def poll(self) -> list[tuple]:
        if self._mm is None or self.reopened():
            if self._mm is not None:
                self._mm.close()
            self._open()
        mm = self._mm
        assert mm is not None   # _open set it, or raised
        count, self.heartbeat = COUNT.unpack_from(mm, COUNT_OFFSET)
        self.stopped = STOPPED.unpack_from(mm, STOPPED_OFFSET)[0] == 1
        # The header count is a hint refreshed with the heartbeat: scan forward from what we
        # know by commit numbers, jumping ahead where the ring wrapped past us.
        end = max(count, self.next_serial)
        slots, readable = self.slots, self.readable
        while True:
            if end % slots >= readable:   # past the cut: what follows cannot be known
                self.newest_lost = True
                break
            commit = SLOT.unpack_from(mm, HEADER_SIZE + (end % slots) * SLOT_SIZE)[-1]
            if commit == end + 1:
                end += 1
            elif commit > end + 1 and (commit - 1 - end) % slots == 0:
                end = commit
            else:
                break
        start = self.next_serial
        if end - start > self.slots:
            self.lost += end - self.slots - start
            start = end - self.slots
        out = []
        for serial in range(start, end):
            if serial % slots >= readable:
                self.lost += 1
                self.cut_lost += 1
                continue
            s = SLOT.unpack_from(mm, HEADER_SIZE + (serial % self.slots) * SLOT_SIZE)
            if s[-1] != serial + 1:  # overwritten or torn while we read
                if s[-1] > serial + 1:
                    self.lost += 1
                continue
            out.append(s)
        self.next_serial = end
        return out

    def close(self):
        if self._mm is not None:
            self._mm.close()
            self._mm = None


class DefsReader:
    """Incremental reader of the definitions file; keeps only complete lines."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0
        self._partial = b""
        self.bad_lines = 0

    def poll(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_size < self.offset:  # truncated: a restarted rank
                    self.offset, self._partial = 0, b""
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out = []
        for line in lines:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                self.bad_lines += 1
                continue
            if isinstance(obj, dict):
                out.append(obj)
            else:
                self.bad_lines += 1
        return out

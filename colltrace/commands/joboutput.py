"""The job's stderr under `colltrace run`: relayed as it comes, except the launcher's failure report
(torchrun's "failed (exitcode ...)" and SIGTERM lines, its traceback and its table of failures) and
the ranks' tracebacks of collectives that failed because a peer died, which are held until the job
ends. Then, where colltrace knows the cause of every failure they list (ranks it ended, a dead
rank it found, ranks the launcher ended after it), they are folded into one line each and kept
whole in the run's folder (launcher.txt); else they are printed as they were. So the verdict is the
last thing a user reads, and nothing is lost.

Reading only: what the lines mean is parsed here; the words are colltrace/reporters/ending.py's.
"""
from __future__ import annotations

import os
import re
import select
import threading
import time
from dataclasses import dataclass, field

from colltrace.words import signal_name

LOG_FILE = "launcher.txt"
HOLD_S = 3.0   # a rank's traceback waits this long for colltrace to explain it, then is printed as it was

# torchrun's own log lines about the failure, with or without logging's prefix ("E1128 06:49:17.395000 10060
# .../elastic/multiprocessing/api.py:1002] "): "failed (exitcode: -9) local_rank: 0 (pid: 10214) of binary: ..."
# and "Sending process 11425 closing signal SIGTERM"
_LAUNCHER_LOG = re.compile(r"^(?:[EWI]\d{4} [\d:.]+ +\d+ \S+\] )?"
                           r"(failed \(exitcode: -?\d+\) local_rank: \d+ \(pid: \d+\) of binary: |"
                           r"Sending process \d+ closing signal SIG\w+$)")
_SIGTERMED = re.compile(r"Sending process (\d+) closing signal SIG(?:TERM|KILL)")
_FAILURE = re.compile(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)(?:\s*\((SIG\w+)\))?")
_RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?(.*)$")   # torch prefixes an uncaught exception's lines so
TRACEBACK = "Traceback (most recent call last):"
_MAY_BE_HELD = re.compile(rb"\[rank|Tra|[EWI]\d")   # a line's start that may begin something held
# what a collective raises when a peer went away (gloo's pair.cc, NCCL's watchdog, c10d's errors)
_COLLECTIVE_FAILURE = re.compile(r"Connection (closed|reset) by peer|DistBackendError|DistNetworkError|gloo|NCCL|"
                                 r"ProcessGroup|remote worker crash", re.I)


@dataclass
class Failure:
    """One entry of the launcher's table: a rank, its exit code and the signal that ended it."""
    rank: int
    code: int
    pid: int
    signal: str | None


@dataclass
class RankTraceback:
    rank: int
    lines: list[bytes]
    exception: str          # its last line: "RuntimeError: [...] Connection closed by peer ..."
    ended_at: float
    n: int = 0              # the job's line number of its last line


@dataclass
class Held:
    """What the relay held back: the launcher's report (its lines in order) and the ranks' tracebacks."""
    report: list[bytes] = field(default_factory=list)
    tracebacks: list[RankTraceback] = field(default_factory=list)
    _chunks: list[tuple[int, bytes]] = field(default_factory=list)   # (the job's line number, text)

    def add_report(self, n: int, line: bytes) -> None:
        self.report.append(line)
        self._chunks.append((n, line))

    def add_traceback(self, tb: RankTraceback) -> None:
        self.tracebacks.append(tb)
        self._chunks.append((tb.n, b"".join(tb.lines)))

    def log(self) -> bytes:
        """Every held line, in the order the job wrote them."""
        return b"".join(text for _, text in sorted(self._chunks, key=lambda c: c[0]))

    def failures(self) -> list[Failure]:
        text = b"".join(self.report).decode("utf-8", "replace")
        out: dict[int, Failure] = {}
        for m in _FAILURE.finditer(text):
            code = int(m.group(2))
            # torch 2.4-2.9's table gives the code alone: a negative one is the signal's number
            out[int(m.group(1))] = Failure(int(m.group(1)), code, int(m.group(3)), m.group(4) or signal_name(code))
        return [out[r] for r in sorted(out)]

    def sigtermed(self) -> set[int]:
        """The pids the launcher itself ended (its "Sending process N closing signal SIGTERM")."""
        text = b"".join(self.report).decode("utf-8", "replace")
        return {int(p) for p in _SIGTERMED.findall(text)}


def _text(line: bytes) -> str:
    return line.decode("utf-8", "replace").rstrip("\r\n")


class Relay:
    """Reads the job's stderr (a pipe, or a pseudo-terminal where ours is one, so the job sees a
    terminal as it would without colltrace) on a thread and writes it to `stream` line by line
    as it comes; a line not yet ended is passed on at once too (progress bars). `explained()`
    says, when asked, whether colltrace knows why ranks are failing now (a dead rank found, ranks
    it ended): a rank's collective-failure traceback then stays held."""

    def __init__(self, stream, explained=lambda: False):
        self.stream = stream
        self.explained = explained
        self.held = Held()
        self._out = getattr(stream, "buffer", None)
        self._tty = False
        try:
            self._tty = stream.isatty()
        except (AttributeError, ValueError):
            pass
        if self._tty:
            self._read_fd, self.child_fd = _pty_pair(stream)
        else:
            self._read_fd, self.child_fd = os.pipe()
        self._partial = b""          # the current line, not ended yet
        self._sent = 0               # how much of it was passed on already
        self._block: list[bytes] | None = None   # an unprefixed traceback being read
        self._table = 0              # inside the launcher's table: how many "=====" lines seen
        self._ranks: dict[int, list[bytes]] = {}   # a rank's traceback being read
        self._pending: list[RankTraceback] = []    # complete, waiting to be explained
        self._n = 0                  # lines of the job's read so far
        self._lock = threading.Lock()
        self._ending = False         # the job exited: read until the pipe is quiet, then stop
        self._thread = threading.Thread(target=self._run, name="colltrace-job-stderr", daemon=True)

    # -- the thread ---------------------------------------------------------------------------
    def start(self) -> None:
        """After the job started: our copy of its end is closed, so the job's exit ends the read."""
        os.close(self.child_fd)
        self.child_fd = -1
        self._thread.start()

    def finish(self, timeout: float = 5.0) -> Held:
        """After the job exited: what is left in the pipe is read (a process the job left behind
        holding it open is not waited for), held tracebacks are decided, and the held report is
        returned."""
        self._ending = True
        self._thread.join(timeout)
        with self._lock:
            self._flush_open_blocks()
            self._decide(final=True)
        return self.held

    def _run(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self._read_fd], [], [], 0.1)
            except (OSError, ValueError):
                break
            if ready:
                try:
                    data = os.read(self._read_fd, 65536)
                except OSError:   # a pseudo-terminal whose last writer closed it: EIO
                    data = b""
                if not data:
                    break
                with self._lock:
                    self._feed(data)
            if not ready and self._ending:
                break
            with self._lock:
                if not ready:
                    self._pass_partial()   # quiet for a moment: what there is of a line goes out
                self._decide(final=False)
        try:
            os.close(self._read_fd)
        except OSError:
            pass

    # -- lines ---------------------------------------------------------------------------------
    def _feed(self, data: bytes) -> None:
        lines = (self._partial + data).split(b"\n")
        rest = lines.pop()
        for i, line in enumerate(lines):
            if i == 0 and self._sent:   # its start is already out (a progress bar): the rest follows it
                self._write(line[self._sent:] + b"\n")
                self._sent = 0
                continue
            self._line(line + b"\n")
        self._partial = rest
        if b"\r" in rest:
            self._pass_partial()   # a progress bar's updates: each passed on as it comes

    def _pass_partial(self) -> None:
        """A line not ended yet is passed on (a progress bar, a prompt) unless it may begin
        something held."""
        rest = self._partial
        if rest[self._sent:] and self._block is None and not self._table and not _MAY_BE_HELD.match(rest):
            self._write(rest[self._sent:])
            self._sent = len(rest)

    def _line(self, line: bytes) -> None:
        self._n += 1
        text = _text(line)
        if self._table:
            self.held.add_report(self._n, line)
            if text.startswith("=====") and len(set(text)) == 1:
                self._table += 1
                if self._table > 2:
                    self._table = 0
            return
        if self._block is not None:
            self._block.append(line)
            if text.startswith((" ", "\t")) or not text:
                return
            block, self._block = self._block, None
            launcher = any(b"torch/distributed/run.py" in b or b"torch/distributed/launcher/api.py" in b for b in block)
            if launcher or text.startswith("torch.distributed.elastic.multiprocessing.errors.ChildFailedError"):
                for i, held in enumerate(block):
                    self.held.add_report(self._n - len(block) + 1 + i, held)
                if text.startswith("torch.distributed.elastic.multiprocessing.errors.ChildFailedError"):
                    self._table = 1   # its table follows, between two lines of "="
            else:
                self._write(b"".join(block))
            return
        if _LAUNCHER_LOG.match(text):
            self.held.add_report(self._n, line)
            return
        if text == TRACEBACK:
            self._block = [line]
            return
        m = _RANK_LINE.match(text)
        if m:
            self._rank_line(int(m.group(1)), m.group(2), line)
            return
        self._write(line)

    def _rank_line(self, rank: int, rest: str, line: bytes) -> None:
        block = self._ranks.get(rank)
        if block is None:
            for tb in [t for t in self._pending if t.rank == rank]:   # the rank goes on: its order first
                self._pending.remove(tb)
                self._write(b"".join(tb.lines))
            if rest.strip() == TRACEBACK:
                self._ranks[rank] = [line]
            else:
                self._write(line)
            return
        block.append(line)
        if rest.startswith((" ", "\t")) or not rest.strip():
            return
        del self._ranks[rank]
        if _COLLECTIVE_FAILURE.search(rest):
            self._pending.append(RankTraceback(rank, block, rest.strip(), time.monotonic(), self._n))
        else:
            self._write(b"".join(block))

    def _decide(self, final: bool) -> None:
        """Held tracebacks: kept (folded at the end) once colltrace explains them; printed as they
        were when it has not within HOLD_S, or by the end."""
        if not self._pending:
            return
        explained = self._explained()
        now = time.monotonic()
        for tb in list(self._pending):
            if explained:
                self._pending.remove(tb)
                self.held.add_traceback(tb)
            elif final or now - tb.ended_at > HOLD_S:
                self._pending.remove(tb)
                self._write(b"".join(tb.lines))

    def _explained(self) -> bool:
        try:
            return bool(self.explained())
        except Exception:   # never a reason to lose a line
            return False

    def _flush_open_blocks(self) -> None:
        """The job ended inside something held line by line: what was read is passed on as it was."""
        if self._block is not None:
            self._write(b"".join(self._block))
            self._block = None
        for rank in sorted(self._ranks):
            self._write(b"".join(self._ranks.pop(rank)))
        self._write(self._partial[self._sent:])
        self._partial, self._sent = b"", 0
        self._table = 0

    def _write(self, data: bytes) -> None:
        if not data:
            return
        try:
            if self._out is not None:
                self.stream.flush()
                self._out.write(data)
                self._out.flush()
            else:
                self.stream.write(data.decode("utf-8", "replace"))
                self.stream.flush()
        except (OSError, ValueError):
            pass


def _pty_pair(stream) -> tuple[int, int]:
    """(ours, the job's) ends of a pseudo-terminal sized like `stream`'s terminal, its output
    passed as written (no \\n to \\r\\n)."""
    import fcntl
    import pty
    import termios

    ours, theirs = pty.openpty()
    try:
        attrs = termios.tcgetattr(theirs)
        attrs[1] &= ~termios.OPOST
        termios.tcsetattr(theirs, termios.TCSANOW, attrs)
        size = fcntl.ioctl(stream.fileno(), termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(theirs, termios.TIOCSWINSZ, size)
    except (OSError, ValueError, termios.error):
        pass
    return ours, theirs


def explain(held: Held, ended: set[int], dead: dict[int, str | None]) -> list[tuple] | None:
    """Why each rank of the launcher's report failed, grouped: [(ranks, code, signal, why)], why
    one of reporters/ending.py's; None when colltrace cannot tell for one of them (the report is
    then shown whole). ended: the ranks colltrace ended; dead: {rank: signal} of the dead ranks it
    found."""
    from colltrace.reporters.ending import DEAD, ENDED, LAUNCHER, RAISED

    failures = held.failures()
    if not failures:
        return None
    terminated = held.sigtermed()
    raised = {tb.rank for tb in held.tracebacks}
    groups: dict[tuple, list[int]] = {}
    for f in failures:
        if f.rank in ended and f.code == -9:
            why = ENDED
        elif f.rank in dead and f.code < 0 and dead[f.rank] in (None, f.signal):
            why = DEAD
        elif f.pid in terminated and f.code in (-15, -9):
            why = LAUNCHER
        elif f.code > 0 and f.rank in raised:
            why = RAISED
        else:
            return None
        groups.setdefault((f.code, f.signal, why), []).append(f.rank)
    return [(ranks, code, sig, why) for (code, sig, why), ranks in groups.items()]


def write_log(directory: str, held: Held) -> str | None:
    """launcher.txt in the run's folder: every held line, in the job's order; None if it cannot be written."""
    path = os.path.join(directory, LOG_FILE)
    try:
        with open(path, "wb") as f:
            f.write(held.log())
    except OSError:
        return None
    return path


def release(stream, held: Held) -> None:
    """Print what was held as it was (the report not folded)."""
    out = getattr(stream, "buffer", None)
    data = held.log()
    stream.flush()
    if out is not None:
        out.write(data)
        out.flush()
    else:
        stream.write(data.decode("utf-8", "replace"))

"""The store side of a host's watchdog: who is the leader, the meeting point it serves or finds,
and the exchange of host summaries, wanted stacks, findings and the hang signal through it."""
from __future__ import annotations

import threading
import time

from colltrace.host import meeting, storelink
from colltrace.model.build import compact_entry
from colltrace.reporters.text import format_ranks

STORE_RETRY_S = 5.0
LEADER_POLL_S = 0.5          # how often another host looks for the leader's announced address
LEADER_WAIT_S = 60.0         # then it says so once and judges its own ranks alone
LEADER_COPY_S = 1.0          # how often another host copies the leader's summary (its ranks, if its host dies)
LEADER_LINGER_S = 1.0        # the leader's server outlives its "ended" by this: the others read it first


class Exchange:
    """One host's link to the others. The host of rank 0 serves the meeting point (its own
    TCPStore, announced by one key in the job's store); the others find it and talk only to it.
    Connecting imports torch (seconds), so it happens in a background thread; the host's own
    ranks are watched from their files meanwhile. Losing the store costs one warning line."""

    def __init__(self, node, store_address, stream):
        self.node = node
        self.store_address = store_address   # (host, port) of the job's store, or None
        self.stream = stream
        self.link: storelink.StoreLink | None = None
        self.meeting: meeting.MeetingPoint | None = None
        self.warned = False
        self.next_try = 0.0                # time.time() of the next connection attempt
        self._published_at = 0.0
        self._wanted: set[int] = set()
        self._connecting: threading.Thread | None = None
        self._leader_ended = False         # the leader said the job is over: its server goes away quietly
        self._leader_wait_since: float | None = None
        self._leader_copy: tuple[float, dict] | None = None   # (when, the leader's node summary)
        self.lost_leader: dict | None = None   # the leader's ranks, marked dead, once its host stopped answering

    @property
    def leader(self) -> bool:
        # The host of rank 0 judges the whole job. Another host judges alone only when there is
        # no store to reach the leader through (none configured, or it failed): while its link is
        # still connecting it waits, or it would act on half the picture.
        if 0 in self.node.traces or self.store_address is None:
            return True
        return self.link is None and self.warned

    def _link(self) -> storelink.StoreLink | None:
        if self.store_address is None or self.link is not None or self._leader_ended:
            return self.link
        if self._connecting is None and time.time() >= self.next_try:
            def connect():
                try:
                    self._meet()
                except storelink.StoreError as exc:
                    self.down(exc)
                finally:
                    self._connecting = None

            self._connecting = threading.Thread(target=connect, name="colltrace-store", daemon=True)
            self._connecting.start()
        return None

    def _meet(self) -> None:
        """The host of rank 0 serves the meeting point and announces it in the job's store; the
        others look for that announcement (asking again until it is there, or rank 0 shows up
        here) and then talk only to the leader's server."""
        if 0 in self.node.traces:
            if self.meeting is None:
                self.meeting = meeting.MeetingPoint(*self.store_address)
            link = storelink.StoreLink(*self.meeting.address)
            link.node_index = int(link._store.add(storelink.PREFIX + "nodes", 1))   # 1: the others know it
            self.meeting.announce()
            self.link = link
            return
        found = meeting.find_leader(*self.store_address)
        if found is not None:
            self.link = storelink.StoreLink(*found)
            return
        now = time.time()
        self._leader_wait_since = self._leader_wait_since or now
        if now - self._leader_wait_since > LEADER_WAIT_S:
            raise storelink.StoreError(f"no leader announced in the job's store at "
                                       f"{self.store_address[0]}:{self.store_address[1]} after {LEADER_WAIT_S:.0f} s")
        self.next_try = now + LEADER_POLL_S   # not announced yet: ask again, quietly

    def close(self) -> None:
        """The job is over: tell the other hosts, then take the one key out of the job's store."""
        mp, self.meeting = self.meeting, None
        if mp is None:
            return
        if self.link is not None:
            try:
                self.link.report_end()
                time.sleep(LEADER_LINGER_S)
            except storelink.StoreError:
                pass
        mp.withdraw()

    def down(self, exc: Exception) -> None:
        # The ranks never touch the store: losing it costs only the cross-host view. Say so once.
        if self.link is not None and self._leader_copy and self.lost_leader is None and not self.node.all_gone():
            # The leader's server went away without saying the job ended: its host died. Its
            # ranks, as last seen, are dead; this host judges what it can see from now on.
            seen = self._leader_copy[1]
            note = f"its host ({seen.get('host')}) stopped answering: the leader's meeting point at {self.link.address} is gone"
            self.lost_leader = dict(seen, ranks={r: dict(e, status="dead", died_at=time.time(),
                                                         exit={"signal": None, "note": note})
                                                 for r, e in seen["ranks"].items()})
            exc = storelink.StoreError(f"the leader's host ({seen.get('host')}, ranks "
                                       f"{format_ranks(sorted(int(r) for r in seen['ranks']))}) stopped answering")
        self.link = None
        self.next_try = time.time() + STORE_RETRY_S
        if not self.warned:
            self.warned = True
            self.stream.write(f"colltrace: warning: {exc}; this host's ranks are still watched from their files\n")
            self.stream.flush()

    def exchange(self, summary: dict, on_hang) -> tuple[list[dict], set[int]]:
        """Publish this host's summary. The leader gets the other hosts' summaries; the others
        get the ranks whose live stacks the leader wants, and call on_hang(why) when it found a hang."""
        link = self._link()
        if link is None:
            return [], set()
        try:
            now = time.time()
            if now - self._published_at >= storelink.PUBLISH_S:
                link.publish_node({**summary, "ranks": {r: compact_entry(e) for r, e in summary["ranks"].items()}})
                self._published_at = now
            if self.leader:
                return link.node_summaries(skip=link.node_index), set()
            why = link.hang_reported()
            if why:
                on_hang(why)
            if link.leader_ended():
                self._leader_ended, self.link = True, None
                return [], set()
            if self._leader_copy is None or now - self._leader_copy[0] >= LEADER_COPY_S:
                copy = link.node_summary(1)
                if copy is not None:
                    self._leader_copy = (now, copy)
            return [], link.wanted_stacks()
        except storelink.StoreError as exc:
            self.down(exc)
            return [], set()

    def want(self, wanted: set[int]) -> None:
        """The leader: the ranks whose live stacks it needs from the hosts that hold them."""
        if self.link is not None and wanted != self._wanted:
            try:
                self.link.set_wanted_stacks(wanted)
                self._wanted = wanted
            except storelink.StoreError as exc:
                self.down(exc)

    def publish_findings(self, findings: list[dict]) -> None:
        if self.link is not None:
            try:
                self.link.publish_findings(findings)
            except storelink.StoreError as exc:
                self.down(exc)

    def report_hang(self, why: str) -> None:
        """The leader found a hang: every other host acts on COLLTRACE_ON_HANG too."""
        if self.link is not None:
            try:
                self.link.report_hang(why)
            except storelink.StoreError as exc:
                self.down(exc)

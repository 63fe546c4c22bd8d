"""The store side of a host's watchdog: who is the leader, the meeting point it serves or finds,
and the exchange of host summaries, wanted stacks, findings and the hang signal through it. On a
job of more than FANOUT + 1 hosts, the same exchange runs along a tree (host/tree.py): a host
with children serves them as the leader serves its own, and passes their summaries up as one.

Its parts, each with one job: what goes up and when (publication), what the leader asks
(wants), who speaks for the leader if its host dies (succession), clock offsets (clock.Clocks).
The Exchange itself connects, meets and moves: the links and the meeting points."""
from __future__ import annotations

import threading
import time
from typing import cast

from colltrace.host import clock, meeting, publication, storelink, succession, tree, wants
from colltrace.model.finding import Finding
from colltrace.model.schema import Snapshot
from colltrace.words import format_ranks

STORE_RETRY_S = 5.0
LEADER_POLL_S = 0.5          # how often another host looks for the leader's announced address
LEADER_WAIT_S = 60.0         # then it says so once and judges its own ranks alone
LEADER_LINGER_S = 1.0        # the leader's server outlives its "ended" by this: the others read it first


class Exchange:
    """One host's link to the others. The host of rank 0 serves the meeting point (its own
    TCPStore, announced by one key in the job's store); the others find it and talk only to it.
    Connecting imports torch (seconds), so it happens in a background thread; the host's own
    ranks are watched from their files meanwhile. Losing the store costs one warning line."""

    def __init__(self, node, store_address: tuple[str, int] | None, stream, place: tuple[int, int] | None = None,
                 fan: int | None = None, connect=None, clocks: bool = True):
        """connect: how a link reaches a server (storelink.connect, the default; the hosts one process
        simulates share clients: storelink.SharedClients). clocks: measure this host's clock against the
        servers it publishes to, and answer those who measure theirs (simulated hosts share one)."""
        self.node = node
        self._connect = connect if connect is not None else storelink.connect
        self.store_address = store_address   # (host, port) of the job's store, or None
        self.stream = stream
        self.link: storelink.StoreLink | None = None
        self.meeting: meeting.MeetingPoint | None = None
        # The tree (host/tree.py): this host's place in it where torchrun says so. A host with
        # children serves them (self.below: its own server, through which it reads them).
        place = place if place is not None else tree.host_index()
        self.topo = tree.Topology(place[0], place[1], fan or tree.fanout(place[1])) if place else None
        self.below: storelink.StoreLink | None = None
        self.serving: meeting.MeetingPoint | None = None
        self.clocks = clock.Clocks(clocks, lambda: str(node.host_name()))
        self.publication = publication.Publication()
        self.wants = wants.Wants()                     # the leader's asks
        self.succession = succession.Succession()
        self._want = tree.want_of(None)     # what the parent last asked
        self._want_raw: bytes | None = None
        self.warned = False
        self.next_try = 0.0                # time.time() of the next connection attempt
        self._connecting: threading.Thread | None = None
        self._leader_ended = False         # the leader said the job is over: its server goes away quietly
        self._leader_wait_since: float | None = None

    @property
    def leader(self) -> bool:
        # The host of rank 0 judges the whole job. Another host judges alone only when there is
        # no store to reach the leader through (none configured, or it failed): while its link is
        # still connecting it waits, or it would act on half the picture.
        if 0 in self.node.traces or self.store_address is None or self.succession.took_over:
            return True
        return self.link is None and self.warned

    @property
    def tree_parent(self) -> int | None:
        """The index of this host's parent in the tree, where it is not the leader (1)."""
        if self.topo is None or self.topo.parent in (None, 1):
            return None
        return self.topo.parent

    @property
    def has_children(self) -> bool:
        return self.topo is not None and self.topo.index != 1 and self.topo.interior

    @property
    def took_over(self) -> bool:
        """The leader's host died and this one judges the job now."""
        return self.succession.took_over

    @property
    def lost_leader(self) -> dict | None:
        """The leader's ranks, marked dead, once its host stopped answering."""
        return self.succession.lost_leader

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
        store_address = self.store_address
        assert store_address is not None   # _link connects only where there is a store
        if 0 in self.node.traces:
            if self.meeting is None:
                self.meeting = meeting.MeetingPoint(*store_address, connect=self._connect)
            link = storelink.StoreLink(*self.meeting.address, connect=self._connect)
            link.node_index = link.join()   # 1: the others know it
            self.meeting.announce()
            self.clocks.answer(self.meeting.address)
            self.link = link
            return
        if self.has_children and self.serving is None:
            topo = self.topo
            assert topo is not None   # has_children: it has a place in the tree
            self.serving = meeting.MeetingPoint(*store_address, key=meeting.parent_key(topo.index),
                                                connect=self._connect)
            below = storelink.StoreLink(*self.serving.address, connect=self._connect)
            below.node_index = below.join()   # 1: its children know it
            self.serving.announce()
            self.clocks.answer(self.serving.address)
            self.below = below
        parent = self.tree_parent
        keys = (meeting.LEADER_KEY,) + ((meeting.parent_key(parent),) if parent else ())
        answer = meeting.find_leader(*store_address, keys=keys, connect=self._connect)
        found: tuple[str, int] | None
        root = self.succession
        if parent:   # two keys: a list of two addresses (None where not announced)
            both = cast("list[tuple[str, int] | None]", answer)
            root.root_address = both[0] or root.root_address
            found = both[1]
        else:
            found = cast("tuple[str, int] | None", answer)
        if found is not None:
            try:
                self.link = storelink.StoreLink(*found, connect=self._connect)
            except storelink.StoreError:
                if not (parent and root.root_address):
                    raise
                # its parent's host is gone (its announcement outlives it): straight to the root
                self.link = storelink.StoreLink(*root.root_address, connect=self._connect)
            return
        now = time.time()
        self._leader_wait_since = self._leader_wait_since or now
        if now - self._leader_wait_since > LEADER_WAIT_S:
            raise storelink.StoreError(f"no leader announced in the job's store at "
                                       f"{store_address[0]}:{store_address[1]} after {LEADER_WAIT_S:.0f} s")
        self.next_try = now + LEADER_POLL_S   # not announced yet: ask again, quietly

    def close(self) -> None:
        """The job is over: tell the other hosts, then take the one key out of the job's store."""
        self.clocks.stop()
        serving, self.serving = self.serving, None
        if serving is not None:
            if self.took_over:
                _say_ended(self.below)
            serving.withdraw()
        mp, self.meeting = self.meeting, None
        if mp is None:
            return
        _say_ended(self.link)
        mp.withdraw()

    def down(self, exc: Exception) -> None:
        # The ranks never touch the store: losing it costs only the cross-host view. Say so once.
        if self._move_up(exc):
            return
        heirs = self.succession
        if self.link is not None and heirs.leader_copy and heirs.lost_leader is None and not self.node.all_gone():
            # The leader's server went away without saying the job ended: its host died. Its
            # ranks, as last seen, are dead; this host judges what it can see from now on.
            heirs.lost_leader = heirs.dead_leader(self.link.address)
            seen = heirs.leader_copy[1]
            exc = storelink.StoreError(f"the leader's host ({seen.get('host')}, ranks "
                                       f"{format_ranks(sorted(int(r) for r in seen['ranks']))}) stopped answering")
        self.link = None
        self.next_try = time.time() + STORE_RETRY_S
        if not self.warned:
            self.warned = True
            self.stream.write(f"colltrace: warning: {exc}; this host's ranks are still watched from their files\n")
            self.stream.flush()

    def _move_up(self, exc: Exception) -> bool:
        """On a tree, a host whose parent stopped answering moves up: under a host that died,
        to the leader; under the leader, to the first of the leader's other children that still
        answers, or, being that first one, it judges the job from now on (the verdict still
        comes). Quietly: one line, by the host that took over."""
        heirs = self.succession
        if self.link is None or self.topo is None or self._leader_ended:
            return False
        if self.tree_parent is not None and heirs.root_address is not None:
            try:
                self.link = storelink.StoreLink(*heirs.root_address, connect=self._connect)
                return True
            except storelink.StoreError:
                return False
        if not (self.has_children and heirs.leader_copy and self.topo.parent == 1):
            return False
        for address in heirs.elder_siblings(self.topo.index):
            try:
                self.link = storelink.StoreLink(*address, timeout_s=1.0, connect=self._connect)
                heirs.leader_copy = None   # the new leader speaks for the old one's ranks
                return True
            except storelink.StoreError:
                continue
        lost = heirs.lost_leader = heirs.dead_leader(self.link.address)
        copy = heirs.leader_copy
        assert copy is not None   # checked above: the loop clears it only as it returns
        seen = copy[1]
        heirs.took_over, self.link = True, None
        self.stream.write(f"colltrace: the leader's host ({seen.get('host')}, ranks "
                          f"{format_ranks(sorted(int(r) for r in lost['ranks']))}) stopped answering "
                          f"({exc}): this host ({self.node.host}) judges the job from now on\n")
        self.stream.flush()
        return True

    def _subtree(self, summary: dict, now: float) -> dict:
        """This host's summary with its children's (each their own subtree's), as one."""
        below = self.below
        assert below is not None   # its one caller checked it
        children = below.node_summaries(skip=below.node_index, unfold=False)   # passed up folded
        return tree.merge_subtree(summary, children, now)

    def exchange(self, summary: dict, on_hang) -> tuple[list[dict], set[int]]:
        """Publish this host's summary. The leader gets the other hosts' summaries; the others
        get the ranks whose live stacks the leader wants, and call on_hang(why) when it found a hang."""
        if self.took_over:
            # only a host with children takes over, and it serves them (self.below) before it links
            below = cast(storelink.StoreLink, self.below)
            try:
                return below.node_summaries(skip=below.node_index), set()
            except storelink.StoreError:
                return [], set()
        link = self._link()
        if link is None:
            return [], set()
        try:
            now = time.time()
            if self.below is not None and not self.leader:
                summary = self._subtree(summary, now)
            if not self.leader:
                offset = self.clocks.offset(link)
                if offset is not None:
                    summary = dict(summary, clock=offset)
            self.publication.publish(link, summary, self._want, self.node.traces, now)
            if self.leader:
                return link.node_summaries(skip=link.node_index), set()
            want_raw, hang, ended = link.control()
            if self.below is not None:
                self.below.set_control(want_raw, hang, ended)
            if want_raw is not None and want_raw != self._want_raw:
                self._want_raw, self.publication.urgent = want_raw, True
                self._want = tree.want_from(want_raw)   # control() read it already
            if hang:
                on_hang(hang.decode(errors="replace"))
            if ended:
                self._leader_ended, self.link = True, None
                return [], set()
            heirs = self.succession
            if (self.topo is None or self.topo.parent in (None, 1)) and heirs.copy_due(now):
                heirs.keep_copy(now, link.node_summary(1))
                if self.has_children and self.serving is not None:
                    topo = self.topo
                    assert topo is not None   # has_children: it has a place in the tree
                    heirs.learn_siblings(link, topo.index, self.serving.address)
            return [], set(self._want["stacks"])
        except storelink.StoreError as exc:
            self.down(exc)
            return [], set()

    @property
    def _top(self) -> storelink.StoreLink | None:
        """Where the leader writes what every host reads: its meeting point, or, on a host that
        took over, its own server."""
        return self.below if self.took_over else self.link

    @property
    def leader_copy_at(self) -> float | None:
        """When this host last copied the leader's summary (to speak for its ranks if it dies)."""
        copy = self.succession.leader_copy
        return copy[0] if copy else None

    @property
    def large(self) -> bool:
        """A job seen from vitals (more than DETAIL_ALL_RANKS ranks): records do not travel, so
        each host digests its ranks' arrivals (model/arrivals.py) for the straggler view."""
        return not self.wants.every if self.leader else not self._want["all"]

    @property
    def sample_wanted(self) -> set[int]:
        """The ranks the leader last asked every host to have sampled (this host asks its own)."""
        return set(self._want["sample"])

    def want(self, wanted: set[int], snap: Snapshot | None = None, now: float | None = None,
             parts: list[dict] | None = None, sample: set[int] | frozenset[int] = frozenset()) -> None:
        """The leader: the ranks whose live stacks it needs from the hosts that hold them, and, on
        a job of more than DETAIL_ALL_RANKS ranks, the groups whose members it needs in full.
        parts: the summaries snap merged. sample: the ranks whose stacks their hosts have sampled
        (stragglers: host/latecomers.py)."""
        key = self.wants.update(wanted, snap, now, parts, sample)
        top = self._top
        if top is not None and key is not None:
            _, groups, every, _ = key   # (stacks, groups, every, sample): wants.Wants.update
            try:
                top.set_wanted_stacks(wanted, groups, every, sample)
                self.wants.sent(key)
            except storelink.StoreError as exc:
                self.down(exc)

    def publish_findings(self, findings: list[Finding]) -> None:
        top = self._top
        if top is not None:
            try:
                top.publish_findings(findings)
            except storelink.StoreError as exc:
                self.down(exc)

    def report_hang(self, why: str) -> None:
        """The leader found a hang: every other host acts on COLLTRACE_ON_HANG too."""
        top = self._top
        if top is not None:
            try:
                top.report_hang(why)
            except storelink.StoreError as exc:
                self.down(exc)


def _say_ended(link: storelink.StoreLink | None) -> None:
    """The leader's "ended", left for LEADER_LINGER_S on its server so the others read it first."""
    if link is None:
        return
    try:
        link.report_end()
        time.sleep(LEADER_LINGER_S)
    except storelink.StoreError:
        pass


"""How far each host's clock is from the root's, measured through the exchange (no NTP assumed).

The ranks stamp their records with their own host's wall clock; comparing arrivals across hosts
(analysis/stragglers.py) needs each host's offset to one clock. A host that serves a store (the
leader's meeting point, a parent in the tree) runs an Answerer: a thread with its own connection,
blocked in the store's queue until a ping comes, that answers it with its own time at once. A host
with a parent runs a Probe: BURST pings at FIRST_AT_S and then every PROBE_EVERY_S, each timed
from before its push to after the answer came (a blocking get on its own connection):

    sent t1 (host clock)  ->  answered t2 (parent clock)  ->  received t3 (host clock)

The answer was given between send and receive, so the host's clock minus the parent's lies in
[t1 - t2, t3 - t2]: the offset is that interval's middle and its error bound half its width, half
the round trip (a LAN's: well under a millisecond; of the last KEEP_S, the ping with the shortest
trip stands: a busy moment's slow answers do not widen it). Offsets compose up the tree
(model/build.py's clock_offsets, in every merge): a host's offset to the root is its own to its
parent plus its parent's to the root, the bounds added.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from colltrace.host import storelink

PING_KEY = storelink.PREFIX + "clock/ping"
PROBE_EVERY_S = 30.0      # clocks disciplined or not drift far less than a millisecond in this time
FIRST_AT_S = (0.0, 1.0, 3.0, 7.0)   # the first measurements, soon: a job's start keeps the cores busy
BURST = 8                 # pings a measurement; the shortest round trip wins
KEEP_S = 120.0            # the best measurement of this long stands (a loaded moment's longer trips do not)
ANSWER_WAIT_S = 2.0       # a ping not answered within this: the parent serves no Answerer (an older one)
STOP = b"stop"


def pong_key(who: str, n: int) -> str:
    return f"{storelink.PREFIX}clock/pong/{who}/{n}"


class Answerer:
    """On a host serving a store: answers pings with this host's time, until stop()."""

    def __init__(self, address: tuple[str, int], clock=time.time):
        self.address, self.clock = address, clock
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="colltrace-clock", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            client = storelink.connect(self.address[0], self.address[1], 30.0)
        except storelink.StoreError:
            return
        if not callable(getattr(client, "queue_pop", None)):
            return   # a TCPStore without queues (torch 2.4): no answers (the probes get none), and no spin
        while not self._stopped:
            try:
                raw = bytes(client.queue_pop(PING_KEY, True))
            except Exception:   # its wait timed out (nobody pinged), or the server is going away
                if self._stopped:
                    return
                continue
            t2 = self.clock()
            if raw == STOP:
                return
            try:
                ping = json.loads(raw)
                client.set(pong_key(str(ping["who"]), int(ping["n"])), repr(t2).encode())
            except Exception:   # a malformed ping answers nothing (its sender times out)
                continue

    def stop(self) -> None:
        self._stopped = True
        try:
            client = storelink.connect(self.address[0], self.address[1], 2.0)
            client.queue_push(PING_KEY, STOP)
        except Exception:   # the server gone already (c10d's error, any type): nothing left to stop
            pass


class Probe:
    """On a host with a parent: its clock's offset to the parent's, measured every PROBE_EVERY_S.
    `offset`: (seconds this host's clock is ahead of the parent's, error bound), or None before the
    first measurement (or where the parent answers nothing)."""

    def __init__(self, address: tuple[str, int], who: str, clock=time.time, every_s: float = PROBE_EVERY_S):
        self.address, self.who, self.clock, self.every_s = address, who, clock, every_s
        self.offset: tuple[float, float] | None = None
        self._n = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="colltrace-clock-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            client = storelink.connect(self.address[0], self.address[1], ANSWER_WAIT_S)
        except storelink.StoreError:
            return
        if not callable(getattr(client, "queue_push", None)):
            return   # a TCPStore without queues (torch 2.4): no offset, as with a parent that answers nothing
        kept: list[tuple[float, float, float]] = []   # (offset, bound, when)
        start = time.monotonic()
        n = 0
        while not self._stop.is_set():
            for _ in range(BURST):
                got = self._ping(client)
                if got is None:
                    break
                kept.append((got[0], got[1], time.monotonic()))
            now = time.monotonic()
            kept = [k for k in kept if now - k[2] <= KEEP_S] or kept[-1:]
            if kept:
                best = min(kept, key=lambda k: k[1])
                self.offset = (round(best[0], 6), round(best[1], 6))
            n += 1
            later = FIRST_AT_S[n] - (now - start) if n < len(FIRST_AT_S) else self.every_s
            self._stop.wait(max(0.0, min(later, self.every_s)))

    def _ping(self, client) -> tuple[float, float] | None:
        self._n += 1
        key = pong_key(self.who, self._n)
        try:
            t1 = self.clock()
            client.queue_push(PING_KEY, json.dumps({"who": self.who, "n": self._n}).encode())
            t2 = float(bytes(client.get(key)))   # blocks until answered (or ANSWER_WAIT_S)
            t3 = self.clock()
            client.delete_key(key)
        except Exception:   # a parent gone, a wait timed out (c10d's errors): no sample this round
            return None
        return (t1 + t3) / 2 - t2, (t3 - t1) / 2

    def stop(self) -> None:
        self._stop.set()



class Clocks:
    """One host's clock duties in the exchange: an Answerer on each server it serves, and a Probe
    against the server it publishes to (moved with it). Off where the hosts one process simulates
    share one clock."""

    def __init__(self, enabled: bool, who: Callable[[], str]):
        self.enabled = enabled
        self._who = who                       # this host's name, read when a probe starts
        self._answerers: list[Answerer] = []
        self._probe: Probe | None = None

    def answer(self, address: tuple[str, int]) -> None:
        if self.enabled:
            self._answerers.append(Answerer(address))

    def offset(self, link: storelink.StoreLink) -> list | None:
        """This host's clock against the server link reaches ([offset, bound]; None until measured)."""
        if not self.enabled:
            return None
        address = storelink.parse_address(link.address)
        if self._probe is None or self._probe.address != address:
            if self._probe is not None:
                self._probe.stop()
            self._probe = Probe(address, self._who())
        return list(self._probe.offset) if self._probe.offset is not None else None

    def stop(self) -> None:
        for a in self._answerers:
            a.stop()
        self._answerers = []
        if self._probe is not None:
            self._probe.stop()

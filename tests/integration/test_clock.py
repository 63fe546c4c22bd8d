"""Each host's clock against its parent's, measured through a real c10d store (colltrace/host/clock.py).
Their composition up the tree: tests/unit/test_clock_offsets.py."""
from __future__ import annotations

import time

from torch.distributed import TCPStore

from colltrace.host import clock


def _until(cond, seconds=10.0):
    end = time.time() + seconds
    while not cond() and time.time() < end:
        time.sleep(0.01)
    return cond()


def test_a_host_whose_clock_runs_ahead_measures_the_offset_within_its_bound():
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    answerer = clock.Answerer(("127.0.0.1", server.port))
    probe = clock.Probe(("127.0.0.1", server.port), "node2", clock=lambda: time.time() + 0.25, every_s=0.2)
    try:
        assert _until(lambda: probe.offset is not None)
        offset, bound = probe.offset
        assert 0 < bound < 0.05 and abs(offset - 0.25) <= bound   # the true offset lies within the bound
        # a ping that is not one is skipped: the next measurement is still answered
        server.queue_push(clock.PING_KEY, b"{not json")
        first = probe.offset
        assert _until(lambda: probe.offset is not first and probe._n > clock.BURST)
        assert abs(probe.offset[0] - 0.25) <= probe.offset[1]
    finally:
        probe.stop()
        answerer.stop()
    assert _until(lambda: not answerer._thread.is_alive() and not probe._thread.is_alive(), 5)


def test_a_parent_that_answers_nothing_leaves_the_offset_unmeasured():
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    probe = clock.Probe(("127.0.0.1", server.port), "node2", every_s=0.1)
    try:
        time.sleep(clock.ANSWER_WAIT_S + 0.5)
        assert probe.offset is None and probe._thread.is_alive()
    finally:
        probe.stop()
    assert _until(lambda: not probe._thread.is_alive(), clock.ANSWER_WAIT_S + 2)

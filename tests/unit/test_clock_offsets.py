"""Clock offsets composed up the tree (model/build.py's clock_offsets, in every merge); measured
through a real store in tests/integration/test_clock.py."""
from __future__ import annotations

from colltrace.model.build import clock_offsets, merge


def test_offsets_compose_up_the_tree_with_their_bounds_added():
    # node3 is 10 ms ahead of its parent node2, which is 5 ms behind the root node1
    node2 = {"host": "node2", "clock": [-0.005, 0.001],
             "clocks": clock_offsets("node2", [{"host": "node3", "clock": [0.010, 0.0005]}])}
    snap = merge([{"host": "node1", "ranks": {}}, node2, {"host": "node4", "ranks": {}}], 0.0)
    assert snap["clocks"] == {"node1": [0.0, 0.0], "node2": [-0.005, 0.001], "node3": [0.005, 0.0015]}
    # node4 never measured (an older colltrace): its times are compared as they are
    assert "node4" not in snap["clocks"]
    assert "clocks" not in merge([{"host": "node1", "ranks": {}}], 0.0)   # one host: nothing to say


def test_a_store_without_queues_measures_nothing_and_spins_nothing(monkeypatch):
    """torch 2.4's TCPStore has no queue_push/queue_pop: the Answerer and the Probe end at once
    (no offset, as with a parent that answers nothing) instead of retrying the missing call."""
    from colltrace.host import clock, storelink

    class OldStore:   # what a torch 2.4 TCPStore offers of what clock.py calls
        def get(self, key):
            raise RuntimeError("timeout")

        def set(self, key, value):
            pass

    monkeypatch.setattr(storelink, "_connect", lambda *a, **k: OldStore())
    answerer = clock.Answerer(("127.0.0.1", 1))
    probe = clock.Probe(("127.0.0.1", 1), "node2", every_s=0.05)
    answerer._thread.join(2)
    probe._thread.join(2)
    assert not answerer._thread.is_alive() and not probe._thread.is_alive() and probe.offset is None

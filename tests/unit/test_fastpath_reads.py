"""What the compiled hot path reads of colltrace's own objects by name (_fastpath.c's
COLLTRACE_READS, exported as _fastpath.READS) exists on real instances: a field renamed in Python
fails here, not as every rank silently falling back to the Python wrappers."""
from __future__ import annotations

from colltrace import config
from colltrace.rank import fastpath, shim
from colltrace.rank.recorder import GroupState, Recorder


def test_every_field_the_compiled_path_reads_is_on_the_objects_it_reads(tmp_path):
    assert fastpath.available(), "the compiled hot path is not built: pip install -e . with a C compiler"
    reads = fastpath._fastpath.READS
    assert set(reads) == {"shim", "Recorder", "RingWriter", "GroupState"}
    rec = Recorder(config.load({"COLLTRACE_DIR": str(tmp_path)}), rank=0, world_size=2, backend="gloo")
    try:
        owners = {"shim": shim, "Recorder": rec, "RingWriter": rec.ring,
                  "GroupState": GroupState(1, None, "0", [0, 1], "gloo", lambda pg: 0)}
        missing = [f"{owner}.{name}" for owner, names in reads.items() for name in names
                   if not hasattr(owners[owner], name)]
        assert missing == []
        assert "_depth" in reads["Recorder"] and "_mm" in reads["RingWriter"]   # privates too: they are the contract
    finally:
        rec.close()


def test_learn_speaks_one_layout_to_the_plans_and_the_gates():
    """What learn() says of a kind of call is one tuple for the wrappers' Plans and the hooks'
    Gates, its fields named alike in C and in Python."""
    assert fastpath.available(), "the compiled hot path is not built: pip install -e . with a C compiler"
    assert fastpath._fastpath.LEARNED == fastpath.LEARNED
    gs = GroupState(7, "a weakref to the group", "tp", [0, 1], "gloo", lambda pg: 0)
    got = dict(zip(fastpath.LEARNED, fastpath.learned(42, gs, one_step=True), strict=False))
    assert got == {"sig": 42, "wrapper_only": False, "gs": gs, "seq_fn": gs.seq_fn, "pg": "a weakref to the group",
                   "gid": 7, "one_step": True}

"""Ranks in the same state travel as one class on a large job (colltrace/host/tree.py's fold and
unfold): lossless, and what travels grows with the distinct states, not ranks x records."""
from __future__ import annotations

import json
import time

from colltrace.host import tree
from colltrace.host.storelink import decode, encode
from colltrace.model.build import compact_entry
from colltrace.testing import simhosts


def hung_job(ranks=1024):
    t0 = time.time() - 10
    job = simhosts.Job(ranks, t0, hang_at=t0 + 5)
    now = t0 + 8
    out = {}
    for index in range(1, job.hosts() + 1):
        for r in job.host_ranks(index):
            e = job.entry(r, index, now)
            e["records"][-1]["entered_at"] += r * 1e-4   # each rank entered at its own moment
            out[str(r)] = compact_entry(e)
    return out, now


def test_fold_then_unfold_gives_every_entry_back_through_json():
    ranks, _ = hung_job()
    folded, classes = tree.fold(ranks)
    back = tree.unfold(*decode(encode([folded, classes])))
    assert back == json.loads(json.dumps(ranks))


def test_a_world_hang_of_1024_ranks_folds_into_a_few_classes_and_a_small_payload():
    ranks, _ = hung_job()
    folded, classes = tree.fold(ranks)
    assert len(classes) <= 4            # waiting in the all_reduce, the culprit, its partner, the host groups
    # what every parent on the way decodes and encodes each round (zlib shrinks both alike)
    assert len(json.dumps([folded, classes])) < len(json.dumps(ranks)) / 3


def test_a_parent_passes_its_childrens_residues_and_unites_their_classes():
    ranks, now = hung_job(64)
    halves = [{r: e for r, e in ranks.items() if int(r) < 32}, {r: e for r, e in ranks.items() if int(r) >= 32}]
    children = []
    for h in halves:
        folded, classes = tree.fold(h)
        children.append({"host": "child", "ranks": folded, "classes": classes, "groups": {}})
    own = {"host": "parent", "ranks": {}, "groups": {}}
    merged = tree.merge_subtree(own, children, now)
    again, classes = tree.fold(merged["ranks"], merged["classes"])
    assert again == merged["ranks"]                        # residues pass as they came
    assert len(classes) < sum(len(c["classes"]) for c in children)   # equal classes of two children: one
    assert tree.unfold(again, classes) == ranks


def test_a_waiting_residue_is_sent_unasked_like_the_entry_it_stands_for():
    ranks, now = hung_job(16)
    folded, _ = tree.fold(ranks)
    want = {"stacks": set(), "groups": set(), "all": False}
    assert set(tree.slim(folded, want, now)) == set(tree.slim(ranks, want, now))
    assert [r for r, e in tree.slim(folded, want, now).items() if tree.detailed(e)] == \
        [r for r, e in tree.slim(ranks, want, now).items() if tree.detailed(e)]


def test_a_residue_without_its_class_is_read_as_its_vitals():
    ranks, _ = hung_job(8)
    folded, _ = tree.fold(ranks)
    back = tree.unfold(folded, {})
    assert all(not tree.detailed(e) and "records" not in e for e in back.values())

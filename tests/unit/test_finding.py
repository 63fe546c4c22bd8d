"""colltrace/model/finding.py: a finding's JSON is docs/findings.md's contract. The typed finding
gives back the very dict it was read from (keys, their order, null kept apart from absent), and
keeps what another version wrote that this one does not know."""
from __future__ import annotations

import json
import os

import pytest

from colltrace import verdict
from colltrace.model.finding import KINDS, Deadlock, DeadRank, Finding, Mismatch, Stall
from colltrace.tracefile import postmortem
from helpers.paths import FIXTURES


def round_trips(d: dict) -> Finding:
    """from_json then to_json: the same dict, in the same key order, through real JSON text."""
    d = json.loads(json.dumps(d))
    f = Finding.from_json(d)
    back = f.to_json()
    assert back == d and list(back) == list(d)
    assert json.dumps(back) == json.dumps(d)
    return f


@pytest.mark.parametrize("folder, kinds", [
    ("distill-checkpoint-barrier", ["deadlock"]),
    ("fr-gloo/mismatch", ["mismatch"]),
    ("fr-gloo/skipped", ["stall"]),
])
def test_the_analyzers_findings_on_the_fixtures_round_trip(folder, kinds):
    snap = postmortem.load(os.path.join(FIXTURES, folder))
    v = verdict.of_snapshot(snap, stall_s=0.0, now=snap["taken_at"])   # a dump's waits end at its newest entry
    assert [f.kind for f in v.findings] == kinds
    for f in v.findings:
        assert type(f) is KINDS[f.kind]
        g = round_trips(f.to_json())
        assert type(g) is type(f) and g == f


def test_a_key_this_version_does_not_know_survives():
    d = Stall(key="stall:0:3", stage="arrival", waiting=[0], missing_ranks=[1], look_first={"rank": 1}).to_json()
    d["from_a_newer_version"] = {"x": [1, 2]}
    d["ranks"] = {"0": {"state": "waiting", "new_entry_field": 1}}
    f = round_trips(d)
    assert isinstance(f, Stall) and f.extra == {"from_a_newer_version": {"x": [1, 2]}}


def test_an_unknown_kind_keeps_every_key():
    f = round_trips({"kind": "livelock", "key": "livelock:0", "summary": "Livelock.", "spin": 3})
    assert type(f) is Finding and f.summary == "Livelock." and f.extra == {"spin": 3}


def test_absent_stays_absent_and_null_stays_null():
    # an older finding without `groups`; a dead rank whose exit is unknown (null, always written)
    f = round_trips({"kind": "dead_rank", "key": "dead_rank:3", "rank": 3, "exit": None, "died_at": None})
    assert isinstance(f, DeadRank) and f.exit is None and "groups" not in f.to_json()
    # an optional key written as null by someone else is kept as null, not dropped
    f = round_trips({"kind": "mismatch", "key": "mismatch:0:4", "untraced_before": None, "behind": None})
    assert isinstance(f, Mismatch) and f.to_json()["behind"] is None
    # a key this kind writes only in another case (p2p fields on a collective's stall)
    round_trips({"kind": "stall", "key": "stall:0:1", "stage": "arrival", "waited_s": 1.0, "waiting": [0],
                 "peer": 4, "p2p": False})


def test_the_fields_the_later_stages_set_are_written_in_order():
    f = Deadlock(key="deadlock:a", cycle=[], waited_s=1.0, look_first={"rank": 0})
    f.supersedes = ["stall:0:1"]
    f.same_kind = [{"file": "a.py", "line": 1}]
    out = f.to_json()
    assert list(out)[-3:] == ["look_first", "supersedes", "same_kind"] and "superseded_by" not in out
    round_trips(out)

"""duplicate_data from what each rank fed its DDP/FSDP model (colltrace/analysis/batches.py), on
synthetic snapshots: no torch, no processes. What a user reads: which ranks, in how many sampled
steps, the DataLoader's line and why it repeats; and nothing where ranks are equal on purpose."""
from __future__ import annotations

import json

import pytest

from colltrace import analysis
from colltrace.analysis import HANG_KINDS
from colltrace.model.finding import Finding
from colltrace.reporters.text import summarize
from colltrace.tracefile.batchlog import BatchLog

T = 1_000.0
ROOTS = {"stdlib": ["/usr/lib/python3.11"], "site": ["/venv/lib/python3.11/site-packages"],
         "torch": ["/venv/lib/python3.11/site-packages/torch"],
         "colltrace": ["/venv/lib/python3.11/site-packages/colltrace"], "user_packages": []}
LOOP = [{"file": "/job/train.py", "line": 120, "func": "main"},
        {"file": "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", "line": 1780, "func": "_call_impl"}]
LOADER = {"frames": [{"file": "/job/train.py", "line": 900, "func": "main"},
                     {"file": "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", "line": 300,
                      "func": "__init__"}],
          "before_init": True, "sampler": "RandomSampler", "distributed": False}


def analyze(snap, stall_s, now) -> list[dict]:
    """The findings with the reporter's paragraphs, as `colltrace analyze` shows them."""
    return summarize(analysis.analyze(snap, stall_s, now))


def snap(digests: dict[int, list], members=None, loader=LOADER, group="0", exhaustive=False) -> dict:
    """digests[rank][i]: the digest rank fed at sampled step i+1 (None: nothing to compare)."""
    members = sorted(digests) if members is None else members
    ranks = {}
    for r, ds in digests.items():
        model = {"kind": "DistributedDataParallel", "exhaustive": exhaustive,
                 "group": {"name": group, "desc": "default_pg", "ranks": members},
                 "steps": [[i + 1, d] for i, d in enumerate(ds)], "sampled": len(ds), "frames": LOOP}
        if loader is not None:
            model["loader"] = loader
        ranks[str(r)] = {"rank": r, "status": "exited", "exit": {"code": 0}, "pid": 100 + r, "host": "h",
                         "heartbeat": T, "progress": {}, "records": [], "stack": None, "roots": ROOTS,
                         "batches": {"1": model}}
    return {"version": 1, "taken_at": T, "groups": {group: {"name": group, "desc": "default_pg", "ranks": members}},
            "ranks": ranks}


def test_ranks_fed_identical_batches_is_named_with_the_loaders_line():
    (f,) = analyze(snap({0: ["aa"] * 40, 1: ["aa"] * 40}), 30.0, T)
    assert f.kind == "duplicate_data" and f.kind not in HANG_KINDS and f.missing_ranks == []
    assert f.summary.startswith("ranks 0-1 trained on identical batches in 40 of 40 sampled steps: the DataLoader "
                                   "at train.py:900 was built before init_process_group (no DistributedSampler)")
    assert "called at train.py:120 (main)" in f.summary
    assert f.advice.startswith("Look first at the DataLoader at train.py:900")
    assert f.look_first["rank"] == 0 and f.ranks["0"]["frames"][f.look_first["user_frame"]]["line"] == 120
    d = json.loads(json.dumps(f.to_json()))   # findings.jsonl's line, read back: the same finding
    assert Finding.from_json(d) == f and Finding.from_json(d).to_json() == d
    assert list(d)[10:14] == ["source", "model", "op", "identical_calls"]   # the order it was always written in


@pytest.mark.parametrize("loader, words", [
    (dict(LOADER, before_init=False),
     "the DataLoader at train.py:900 has no DistributedSampler (its sampler: RandomSampler)"),
    (dict(LOADER, before_init=False, sampler="DistributedSampler", distributed=True, num_replicas=1),
     "the DataLoader at train.py:900 has a DistributedSampler with num_replicas=1"),
    (None, "no DataLoader was seen feeding them; the batches reach the model at train.py:120 (main)"),
])
def test_the_text_says_where_the_batches_came_from(loader, words):
    (f,) = analyze(snap({0: ["aa"] * 5, 1: ["aa"] * 5}, loader=loader, exhaustive=loader is None), 30.0, T)
    assert words in f.summary, f.summary


def test_batches_no_dataloader_gave_are_judged_in_the_exhaustive_mode_only():
    """torch.randn from torch's fixed default seed on every rank (the DDP tutorial's smoke test)."""
    assert analyze(snap({0: ["aa"] * 5, 1: ["aa"] * 5}, loader=None), 30.0, T) == []


def test_a_split_in_two_halves_names_each_half():
    """4 ranks, a sampler told of 2 replicas: ranks 0,1 read one half, ranks 2,3 the other."""
    fs = analyze(snap({0: ["a1", "a2", "a3"], 1: ["a1", "a2", "a3"], 2: ["b1", "b2", "b3"], 3: ["b1", "b2", "b3"]}),
                 30.0, T)
    assert sorted(sorted(f.ranks) for f in fs) == [["0", "1"], ["2", "3"]]
    assert len({f.key for f in fs}) == 2


def test_a_rank_whose_samples_lag_is_named_with_the_others_not_after_them():
    """On a loaded machine rank 0's third sample comes a round after ranks 1 and 2's: the three
    are named together once it has, never ranks 1-2 first."""
    assert analyze(snap({0: ["aa"] * 2, 1: ["aa"] * 3, 2: ["aa"] * 3}), 30.0, T) == []
    (f,) = analyze(snap({0: ["aa"] * 3, 1: ["aa"] * 3, 2: ["aa"] * 3}), 30.0, T)
    assert sorted(f.ranks) == ["0", "1", "2"]


@pytest.mark.parametrize("case", ["different", "too_few", "mostly_different", "constant", "one_rank_seen",
                                  "world_of_one", "unaligned"])
def test_equal_data_is_named_only_as_a_pattern_of_real_batches(case):
    same = ["aa", "bb", "cc", "dd", "ee"]
    digests = {
        "different": {0: same, 1: ["xa", "xb", "xc", "xd", "xe"]},
        "too_few": {0: same[:2], 1: same[:2]},                       # two steps are no pattern
        "mostly_different": {0: same + ["f", "g", "h", "i", "j"],
                             1: same[:2] + ["q", "r", "s", "t", "u", "v", "w", "x"]},
        "constant": {0: [None] * 5, 1: [None] * 5},                  # all-zero inputs: no digest at all
        "one_rank_seen": {0: same},                                  # rank 1 not traced: nothing to compare
        "world_of_one": {0: same},
        "unaligned": {0: same, 1: []},                               # no step in common
    }[case]
    members = [0, 1] if case in ("one_rank_seen", "unaligned") else None
    assert analyze(snap(digests, members=members), 30.0, T) == []


def test_the_rank_files_lines_become_the_entry_the_analyzer_reads():
    log = BatchLog()
    log.apply({"k": "dp", "id": 1, "kind": "FSDP", "group": {"name": "0", "desc": "default_pg", "ranks": [0, 1]},
               "exhaustive": False})
    log.apply({"k": "loader", "id": 1, "frames": LOADER["frames"], "before_init": True, "sampler": "RandomSampler",
               "distributed": False})
    for step in range(1, 101):
        log.apply({"k": "batch", "m": 1, "step": step, "d": f"{step:08x}", "n": 256, "stack": 3, "loader": 1})
    e = log.entry(lambda sid: [{"file": "train.py", "line": sid, "func": "main"}])
    assert e["1"]["steps"][0] == [37, "00000025"] and len(e["1"]["steps"]) == 64   # the newest kept
    assert e["1"]["frames"] == [{"file": "train.py", "line": 3, "func": "main"}]
    assert e["1"]["loader"]["before_init"] is True and e["1"]["group"]["ranks"] == [0, 1]
    with pytest.raises(KeyError):
        log.apply({"k": "batch", "step": 1})

"""The rank side of duplicate_data (colltrace/rank/batches.py): what a batch's digest reads, and
what it leaves alone. The same batch gives the same digest on every rank (which lays it out the
same way); data that cannot tell ranks apart, or that cannot be read without a sync, gives none."""
from __future__ import annotations

import torch

from colltrace.rank import batches


def digest(*tensors, limit=0):
    return batches._digest(list(tensors), limit)


def test_a_batch_is_read_in_a_few_pieces_and_its_bytes_decide():
    x = torch.arange(4096, dtype=torch.int64).reshape(64, 64)
    d, n, skipped = digest(x)
    assert d is not None and n == batches.PIECES * batches.PIECE and skipped is None
    assert digest(x.clone()) == (d, n, None)   # equal bytes, equal digest
    y = x.clone()
    y[-1, -1] += 1
    assert digest(y)[0] != d   # the last piece ends at the last byte
    assert digest(x, limit=1 << 20)[1] == x.nbytes   # COLLTRACE_DIGEST: every byte


def test_a_sliced_batch_is_read_in_place_without_a_copy():
    x = torch.arange(4096, dtype=torch.int64).reshape(64, 64)
    view = x[:, :-1]
    assert not view.is_contiguous()
    same = x.clone()[:, :-1]
    assert digest(view)[0] is not None and digest(view)[0] == digest(same)[0] != digest(x[:, 1:])[0]


def test_data_that_cannot_tell_ranks_apart_gives_no_digest():
    assert digest(torch.zeros(64, 64))[0] is None          # padding, an all-zero batch
    assert digest(torch.ones(4))[0] is None                # a few bytes (a flag, a step count)
    d, _, skipped = digest(torch.empty(8, 16, device="meta"))
    assert d is None and skipped == "they are on meta"


def test_the_batch_is_found_in_arguments_lists_and_dicts():
    a, b, c = torch.randn(4, 16), torch.randn(4, 16), torch.randn(4, 16)
    found = batches._tensors((a, [b, 3]), {"labels": {"x": c}, "deeper": [[c]]})
    assert [id(t) for t in found] == [id(a), id(b), id(c)]   # one level in

"""Token data: sequences from a fixed Markov chain, so there is something to learn and the
teacher (a bigram model that knows the chain) has something to teach. Made locally, no downloads.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler


def transition_matrix(vocab: int, seed: int = 0) -> torch.Tensor:
    """Each token has a few likely successors: low entropy, easy to learn, a clear loss curve."""
    g = torch.Generator().manual_seed(seed)
    # Dirichlet(0.05) rows, as normalised Gamma samples (torch.distributions takes no generator)
    x = torch._standard_gamma(torch.full((vocab, vocab), 0.05), generator=g) + 1e-9
    return x / x.sum(dim=1, keepdim=True)


class MarkovTokens(Dataset):
    """n sequences of seq_len + 1 tokens (inputs and next-token targets), made once, up front."""

    def __init__(self, n: int, seq_len: int, vocab: int, seed: int = 0):
        self.P = transition_matrix(vocab, seed)
        g = torch.Generator().manual_seed(seed + 1)
        cdf = self.P.cumsum(dim=1)
        cdf[:, -1] = 1.0
        u = torch.rand(seq_len + 1, n, 1, generator=g)
        seqs = torch.empty(n, seq_len + 1, dtype=torch.long)
        seqs[:, 0] = (u[0, :, 0] * vocab).long()
        for t in range(1, seq_len + 1):   # inverse-CDF sampling, all sequences at once
            seqs[:, t] = torch.searchsorted(cdf[seqs[:, t - 1]], u[t]).squeeze(1).clamp_(max=vocab - 1)
        self.seqs = seqs

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.seqs[i]


def build_loader(dataset: Dataset, batch_size: int, train_rank: int, train_world: int, seed: int = 0) -> DataLoader:
    """lingua's loader: sharded over the training ranks when the process group exists."""
    if dist.is_initialized():
        sampler = DistributedSampler(dataset, num_replicas=train_world, rank=train_rank, shuffle=True, seed=seed)
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True)
    # Built before init_process_group (bug: loader_before_pg): no sampler, so every rank
    # draws the very same batches.
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True,
                      generator=torch.Generator().manual_seed(seed))

"""The student (a one-block causal transformer) and the teacher (a bigram model that knows the
data's transition table), both small enough for CPU."""
from __future__ import annotations

import ctypes

import torch
import torch.nn as nn
import torch.nn.functional as F

import bugs


class Student(nn.Module):
    def __init__(self, vocab: int, seq_len: int, dim: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab)
        self.crash_on_call = None   # set by the segfault switch: crash on that forward call
        self.calls = 0

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        b, t = tokens.shape
        x = self.tok(tokens) + self.pos(torch.arange(t))
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, -1))
        x = x + fused_mlp(self.mlp, self.norm2(x), crash=self.calls == self.crash_on_call)
        return self.head(x)


def fused_mlp(mlp: nn.Module, x: torch.Tensor, crash: bool = False) -> torch.Tensor:
    """Stands in for a custom native kernel. With the segfault switch it writes through NULL, as
    a broken extension does: the process dies of SIGSEGV in libc's memset, no Python handler runs."""
    if crash and bugs.on("segfault"):
        ctypes.memset(0, 0, 64)  # bug: segfault
    return mlp(x)


class BigramTeacher(nn.Module):
    """Next-token log-probabilities straight from the chain's transition table."""

    def __init__(self, transition: torch.Tensor):
        super().__init__()
        self.logits = nn.Embedding.from_pretrained(torch.log(transition + 1e-9), freeze=True)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.logits(tokens)


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
                      alpha: float = 0.5, temperature: float = 1.0) -> tuple[torch.Tensor, float, float]:
    """Cross-entropy on the data plus KL towards the teacher's distribution: (loss, ce, kl)."""
    vocab = student_logits.size(-1)
    ce = F.cross_entropy(student_logits.reshape(-1, vocab), targets.reshape(-1))
    kl = F.kl_div(F.log_softmax(student_logits / temperature, dim=-1).reshape(-1, vocab),
                  F.log_softmax(teacher_logits / temperature, dim=-1).reshape(-1, vocab),
                  log_target=True, reduction="batchmean") * temperature ** 2
    return (1 - alpha) * ce + alpha * kl, ce.item(), kl.item()


def entropy_floor(transition: torch.Tensor) -> float:
    """The best achievable cross-entropy on the chain (nats), for the log line."""
    p = transition.clamp_min(1e-12)
    return float(-(p * p.log()).sum(dim=1).mean())

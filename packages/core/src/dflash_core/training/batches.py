"""Which samples and anchors each step trains on: pure functions of (seed, step), so resume is exact.

Global batch G = batch_size * grad_accum * world_size sequences per optimizer step. Step s covers
the positions [s*G, (s+1)*G) of an endless stream in which epoch e is a seeded permutation of the
data set; micro-batch m of rank r takes its own contiguous slice. Anchors of a position are drawn
from a generator seeded by (seed, position), so they are resampled every epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dflash_core.training.data import TokenDataset


@dataclass
class Batch:
    tokens: torch.Tensor  # [B, T] right-padded token ids
    valid: torch.Tensor  # [B, T] True on real tokens
    anchors: torch.Tensor  # [B, N] anchor positions (0 where unused)
    anchor_valid: torch.Tensor  # [B, N] True for real anchors
    labels: torch.Tensor  # [B, N, Q-1] token at anchor + k, k = 1..Q-1
    label_valid: torch.Tensor  # [B, N, Q-1]


def sample_index(position: int, num_samples: int, seed: int) -> int:
    epoch, offset = divmod(position, num_samples)
    order = np.random.default_rng([seed, 7919, epoch]).permutation(num_samples)
    return int(order[offset])


def micro_positions(step: int, micro: int, rank: int, batch_size: int, grad_accum: int, world: int) -> range:
    global_batch = batch_size * grad_accum * world
    start = step * global_batch + (micro * world + rank) * batch_size
    return range(start, start + batch_size)


def choose_anchors(prompt_length: int, length: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """Up to `count` distinct anchors a with the next token inside the response: a in [P-1, T-2]."""
    low, high = max(prompt_length - 1, 0), length - 2
    if high < low:
        return np.zeros(0, dtype=np.int64)
    candidates = np.arange(low, high + 1)
    if len(candidates) > count:
        candidates = np.sort(rng.choice(candidates, size=count, replace=False))
    return candidates


def make_batch(data: TokenDataset, positions: range, *, anchors: int, block_size: int, max_length: int,
               seed: int) -> Batch:
    samples = []
    for position in positions:
        sample = data[sample_index(position, len(data), seed)]
        tokens = sample.tokens[:max_length].astype(np.int64)
        rng = np.random.default_rng([seed, 104729, position])
        samples.append((tokens, choose_anchors(min(sample.prompt_length, len(tokens)), len(tokens), anchors, rng)))
    width = max(len(t) for t, _ in samples)
    n = max(1, max(len(a) for _, a in samples))
    tokens = torch.zeros(len(samples), width, dtype=torch.long)
    valid = torch.zeros(len(samples), width, dtype=torch.bool)
    anchor = torch.zeros(len(samples), n, dtype=torch.long)
    anchor_valid = torch.zeros(len(samples), n, dtype=torch.bool)
    for i, (t, a) in enumerate(samples):
        tokens[i, : len(t)] = torch.from_numpy(t)
        valid[i, : len(t)] = True
        anchor[i, : len(a)] = torch.from_numpy(a)
        anchor_valid[i, : len(a)] = True
    offsets = torch.arange(1, block_size)
    target_pos = anchor[:, :, None] + offsets  # [B, N, Q-1]
    lengths = valid.sum(dim=1)
    label_valid = anchor_valid[:, :, None] & (target_pos < lengths[:, None, None])
    labels = tokens.gather(1, target_pos.clamp(max=width - 1).flatten(1)).view_as(target_pos)
    return Batch(tokens, valid, anchor, anchor_valid, labels, label_valid)

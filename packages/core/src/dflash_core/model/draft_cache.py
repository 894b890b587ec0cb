"""The drafter's context K/V cache for decoding.

Only target-derived context K/V is kept: each accepted token is projected once (KV injection) and
appended; the block's own K/V is recomputed every step and never stored. Rows are packed to the
left (row b holds `lengths[b]` valid slots, then unused ones), so ragged acceptance across a batch
costs no copies of old entries. Storage is allocated once, for the longest sequence expected.
"""

from __future__ import annotations

import torch


class DraftKVCache:
    """Context K/V of all draft layers: k, v [L, B, g, capacity, d]; per-row lengths on the host."""

    def __init__(self, layers: int, batch: int, kv_heads: int, head_dim: int, capacity: int,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        shape = (layers, batch, kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.lengths = [0] * batch

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def max_length(self) -> int:
        return max(self.lengths, default=0)

    def is_ragged(self) -> bool:
        """True when some row has fewer valid slots than the longest one (attention needs a mask)."""
        return min(self.lengths, default=0) != self.max_length

    def append(self, k: torch.Tensor, v: torch.Tensor, counts: list[int]) -> None:
        """Append context entries k/v [L, B, g, n, d]; row b keeps its first counts[b] of the n."""
        n = k.shape[3]
        new_lengths = [length + c for length, c in zip(self.lengths, counts)]
        if max(new_lengths) > self.capacity:
            raise RuntimeError(f"draft KV cache overflow: {max(new_lengths)} slots > capacity {self.capacity}")
        if not self.is_ragged() and all(c == n for c in counts):
            start = self.lengths[0]
            self.k[:, :, :, start : start + n] = k
            self.v[:, :, :, start : start + n] = v
        else:
            device = k.device
            counts_t = torch.tensor(counts, device=device)
            keep = torch.arange(n, device=device)[None, :] < counts_t[:, None]  # [B, n]
            rows, cols = keep.nonzero(as_tuple=True)
            slots = torch.tensor(self.lengths, device=device)[rows] + cols
            self.k[:, rows, :, slots] = k[:, rows, :, cols]
            self.v[:, rows, :, slots] = v[:, rows, :, cols]
        self.lengths = new_lengths

    def context(self) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v views [L, B, g, max_len, d] over the filled slots."""
        return self.context_with_room(0)

    def context_with_room(self, room: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """k, v views [L, B, g, max_len + room, d]: the filled slots and `room` free ones after them, for a
        block's own K/V to be written into (`graph.draft_layer`'s block_in_place); None where the capacity
        has no such room. Writing there changes no entry: the slots are past every row's length."""
        end = self.max_length + room
        if end > self.capacity:
            return None
        return self.k[:, :, :, :end], self.v[:, :, :, :end]

    def valid(self) -> torch.Tensor:
        """[B, max_len] True where a slot holds a real context entry."""
        slots = torch.arange(self.max_length, device=self.k.device)
        return slots[None, :] < torch.tensor(self.lengths, device=self.k.device)[:, None]

    def select_rows(self, rows: list[int]) -> None:
        """Keep only the given batch rows (finished rows leave the batch)."""
        index = torch.tensor(rows, device=self.k.device)
        self.k = self.k.index_select(1, index)
        self.v = self.v.index_select(1, index)
        self.lengths = [self.lengths[r] for r in rows]

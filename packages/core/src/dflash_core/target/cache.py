"""The target's KV cache during speculative decoding, rolled back without recomputation.

A Hugging Face `DynamicCache` whose rows are kept packed to the left: row b's first `lengths[b]`
slots hold its verified tokens (slot index == token position) and any slots beyond are stale.
After each verification only the accepted entries of the block are kept (a token tree's: its
accepted path); where they do not already sit next to the row's prefix they are moved down there,
then the whole cache is cut to the longest row. So memory never grows with rejected drafts, and nothing
accepted is recomputed.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from dflash_core.target.adapter import TargetModel


class TargetCache:
    def __init__(self, batch: int) -> None:
        self.cache = DynamicCache()
        self.lengths = [0] * batch  # valid slots per row
        self.slots = 0  # physical slots (== max(lengths) between steps)

    def is_ragged(self) -> bool:
        return any(length != self.slots for length in self.lengths)

    def attention_mask(self, target: TargetModel, query_positions: torch.Tensor,
                       query_valid: torch.Tensor | None = None, among_queries: torch.Tensor | None = None):
        """None when every row is full (the model's own causal mask is right), else a ragged mask.

        query_positions [B, T] are the positions of the tokens about to be appended; query_valid
        [B, T] marks padding among them (prefill of prompts of different lengths); among_queries [B, T, T]
        which of them each may see (a token tree: its ancestors and itself; `TargetModel.ragged_mask`).
        """
        if not self.is_ragged() and query_valid is None and among_queries is None:
            return None
        batch = query_positions.shape[0]
        device = query_positions.device
        slots = torch.arange(self.slots, device=device).expand(batch, -1)
        lengths = torch.tensor(self.lengths, device=device)[:, None]
        new_valid = torch.ones_like(query_positions, dtype=torch.bool) if query_valid is None else query_valid
        key_positions = torch.cat([slots, query_positions], dim=1)
        key_valid = torch.cat([slots < lengths, new_valid], dim=1)
        return target.ragged_mask(key_positions, key_valid, query_positions, among_queries)

    def commit(self, appended: int, counts: list[int], kept: list[list[int]] | None = None) -> None:
        """After a forward appended `appended` slots per row, keep the first counts[b] for row b, or with
        `kept` (a token tree's accepted path) its slots kept[b] (increasing), in that order."""
        kept = kept if kept is not None else [list(range(c)) for c in counts]
        new_lengths = [length + c for length, c in zip(self.lengths, counts)]
        new_slots = max(new_lengths, default=0)
        moves = [(b, j, self.lengths[b] + i) for b, slots in enumerate(kept) for i, j in enumerate(slots)
                 if self.lengths[b] + i != self.slots + j]
        if moves:
            device = self.cache.layers[0].keys.device
            rows = torch.tensor([b for b, _, _ in moves], device=device)
            src = torch.tensor([self.slots + j for _, j, _ in moves], device=device)
            dst = torch.tensor([d for _, _, d in moves], device=device)
        for layer in self.cache.layers:
            keys, values = layer.keys, layer.values  # [B, heads, slots + appended, d]
            if moves:
                keys[rows, :, dst] = keys[rows, :, src]
                values[rows, :, dst] = values[rows, :, src]
            layer.keys = keys[:, :, :new_slots]
            layer.values = values[:, :, :new_slots]
        self.lengths = new_lengths
        self.slots = new_slots

    def select_rows(self, rows: list[int]) -> None:
        """Keep only these batch rows (finished rows leave), trimming slots no remaining row needs."""
        self.lengths = [self.lengths[r] for r in rows]
        new_slots = max(self.lengths, default=0)
        index = torch.tensor(rows, device=self.cache.layers[0].keys.device)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, :new_slots]
            layer.values = layer.values.index_select(0, index)[:, :, :new_slots]
        self.slots = new_slots


def truncate_cache(cache, length: int) -> None:
    """Cut every layer of a Hugging Face `DynamicCache` back to its first `length` slots.

    By hand, not `cache.crop`: its argument changed meaning across transformers releases (a final
    length in 4.x; 5.x refuses that and takes a negative count of tokens to drop).
    """
    for layer in cache.layers:
        layer.keys = layer.keys[:, :, :length]  # [B, kv_heads, slots, head_dim]
        layer.values = layer.values[:, :, :length]

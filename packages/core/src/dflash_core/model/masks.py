"""The block attention mask: one pure function for training and inference alike.

Keys are `[context | blocks]`; queries are the blocks. A query of the block anchored at position
`a` sees a context key only if that key is valid and lies STRICTLY before `a` (the target feature
at the anchor itself would leak the answer), sees every key of its own block (bidirectional), and
no key of another block. A sliding window further hides keys with `q_pos - k_pos >= window`.

At inference there is one block per row, anchored right after the row's context, so the rule
reduces to "all valid context + the whole block". In training many blocks share one pass.
"""

from __future__ import annotations

import torch


def block_attention_mask(
    context_positions: torch.Tensor,
    context_valid: torch.Tensor,
    anchor_positions: torch.Tensor,
    block_size: int,
    window: int | None = None,
) -> torch.Tensor:
    """Boolean visibility mask (True = may attend).

    context_positions: [B, C] position of each context key
    context_valid:     [B, C] False for padding / unused cache slots
    anchor_positions:  [B, N] position of each block's first token (block j covers a_j .. a_j+Q-1)
    returns:           [B, 1, N*Q, C + N*Q]
    """
    batch, num_blocks = anchor_positions.shape
    offsets = torch.arange(block_size, device=anchor_positions.device)
    query_pos = (anchor_positions[:, :, None] + offsets).reshape(batch, num_blocks * block_size)  # [B, NQ]
    query_anchor = anchor_positions.repeat_interleave(block_size, dim=1)  # [B, NQ]
    sees_context = context_valid[:, None, :] & (context_positions[:, None, :] < query_anchor[:, :, None])
    block_of = torch.arange(num_blocks, device=anchor_positions.device).repeat_interleave(block_size)
    sees_block = (block_of[:, None] == block_of[None, :]).expand(batch, -1, -1)  # [B, NQ, NQ]
    if window is not None:
        sees_context = sees_context & (query_pos[:, :, None] - context_positions[:, None, :] < window)
        sees_block = sees_block & (query_pos[:, :, None] - query_pos[:, None, :] < window)
    return torch.cat([sees_context, sees_block], dim=-1)[:, None]


def window_mask(query_positions: torch.Tensor, key_positions: torch.Tensor, window: int) -> torch.Tensor:
    """Visibility [B, 1, Q, K] for a sliding window over explicit positions (no block structure)."""
    return (query_positions[:, :, None] - key_positions[:, None, :] < window)[:, None]

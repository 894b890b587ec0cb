"""The training objective: many blocks per sequence in one pass, position-decayed cross entropy.

Keys are [target context | all blocks]; each block sees the context strictly before its anchor
and itself (`masks.block_attention_mask`, the same function inference uses). Block position k
(1..B-1) predicts the token k after the anchor, with weight exp(-(k-1)/gamma): early positions
matter most, because a draft is only accepted up to its first mistake.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import graph
from ..drafter import Drafter
from ..masks import block_attention_mask
from ..target import TargetModel
from .batches import Batch


def position_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """w_k = exp(-(k-1)/gamma) for k = 1..B-1: [B-1]."""
    k = torch.arange(1, block_size, device=device, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


def block_hidden(drafter: Drafter, target: TargetModel, features: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Drafter outputs for every block: [B, N, Q, H]."""
    block = drafter.config.block_size
    b, n = batch.anchors.shape
    offsets = torch.arange(block, device=features.device)
    block_pos = (batch.anchors[:, :, None] + offsets).reshape(b, n * block)  # [B, N*Q]
    block_ids = torch.full((b, n, block), drafter.config.mask_token_id, device=features.device, dtype=torch.long)
    block_ids[:, :, 0] = batch.tokens.gather(1, batch.anchors)
    with torch.no_grad():
        noise = target.embed(block_ids.view(b, n * block))
    ctx_pos = torch.arange(features.shape[1], device=features.device).expand(b, -1)
    w = drafter.weights()
    ctx_k, ctx_v = graph.inject_context(w, drafter.dims, features, ctx_pos)
    masks = {window: block_attention_mask(ctx_pos, batch.valid, batch.anchors, block, window)
             for window in set(drafter.dims.windows)}
    hidden = graph.draft_forward(w, drafter.dims, noise.to(features.dtype), block_pos, ctx_k, ctx_v,
                                 [masks[window] for window in drafter.dims.windows])
    return hidden.view(b, n, block, -1)


def block_loss(logits: torch.Tensor, batch: Batch, gamma: float) -> tuple[torch.Tensor, dict]:
    """Weighted cross entropy over block positions 1..Q-1 and a running acceptance estimate.

    logits [B, N, Q-1, V]. The estimate is the mean, over blocks, of 1 + the number of leading
    positions whose argmax equals the label: tau under teacher forcing.
    """
    weights = position_weights(logits.shape[2] + 1, gamma, logits.device)
    ce = F.cross_entropy(logits.float().flatten(0, 2), batch.labels.flatten(), reduction="none").view_as(batch.labels)
    w = weights * batch.label_valid
    loss = (ce * w).sum() / w.sum().clamp(min=1e-6)
    with torch.no_grad():
        correct = (logits.argmax(-1) == batch.labels) & batch.label_valid
        run = correct.long().cumprod(dim=-1).sum(dim=-1)  # [B, N]
        blocks = batch.anchor_valid.sum().clamp(min=1)
        stats = {"tau_est": ((run + 1) * batch.anchor_valid).sum().item() / blocks.item(),
                 "acc1": (correct[..., 0].sum() / batch.label_valid[..., 0].sum().clamp(min=1)).item()}
    return loss, stats


class TrainingObjective(nn.Module):
    """Wraps the drafter so DistributedDataParallel sees one forward per micro-batch."""

    def __init__(self, drafter: Drafter, target: TargetModel, gamma: float) -> None:
        super().__init__()
        self.drafter = drafter
        self._target = [target]  # a list: the frozen target is not a submodule (DDP must not sync it)
        self.gamma = gamma

    def forward(self, features: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict]:
        target = self._target[0]
        hidden = block_hidden(self.drafter, target, features, batch)  # [B, N, Q, H]
        logits = target.logits(hidden[:, :, 1:])  # frozen head; gradients flow to the drafter only
        return block_loss(logits, batch, self.gamma)

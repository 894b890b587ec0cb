"""The drafter-backend protocol: what the decode loop needs from a drafter, whatever runs it.

Two backends implement it: `Drafter` (torch, eager) and `OnnxRuntimeDrafter` (the exported graph
under ONNX Runtime). As Hugging Face declares `CandidateGenerator` for its drafting strategies, the
loop is typed against this protocol only; each backend keeps its own per-request state in the
object its `new_cache` returns (the loop only ever asks that state to drop finished rows).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from dflash_core.model.config import DFlashConfig
from dflash_core.model.draft_vocab import ReadOut


@runtime_checkable
class DraftState(Protocol):
    """A backend's per-request drafter state (context K/V of the accepted tokens, and the like)."""

    def select_rows(self, rows: list[int]) -> None:
        """Keep only these batch rows, in this order (finished rows leave the batch)."""


@runtime_checkable
class DrafterBackend(Protocol):
    config: DFlashConfig
    """The published drafter config (block size, mask token, target layers...)."""

    def check_runtime(self, target) -> None:
        """Raise CompatibilityError when this backend cannot take the target's tensors (dtype, device)."""

    def new_cache(self, batch: int, capacity: int) -> DraftState:
        """Fresh state for `batch` rows of at most `capacity` context tokens each."""

    def extend_cache(self, cache: DraftState, target_hidden: torch.Tensor, positions: torch.Tensor,
                     counts: list[int]) -> None:
        """KV injection of newly verified tokens: features [B, n, n_feat*H] at positions [B, n];
        row b keeps its first counts[b] of the n."""

    def propose(self, cache: DraftState, noise_embedding: torch.Tensor, block_positions: torch.Tensor,
                read_out: ReadOut, num_drafts: int | None = None) -> torch.Tensor:
        """Draft tokens [B, k] for the block embedded as noise_embedding [B, Q, H] at positions [B, Q]:
        the first k = num_drafts (default Q-1) block positions after the anchor, turned into tokens by
        `read_out` (hidden [B, k, H] -> tokens [B, k]; `draft_vocab.read_out_for`)."""

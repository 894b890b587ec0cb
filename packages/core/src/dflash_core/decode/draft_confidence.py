"""Greedy drafts with the drafter's confidence in each: what a step's verify is trimmed by.

The draft length policy (`draft_length`) chooses k before the drafter runs, from the acceptance the
request has shown so far: an average over steps. Once the block is drafted, the drafter's own softmax
says which of this step's drafts are likely: its probability of the argmax at each position, taken as
the chance the target agrees (the demo drafter's q is calibrated: at T=1 no rescaling of it kept more
drafts, docs/training.md). `DraftLengthPolicy.trim` then verifies only the drafts that pay for their
share of the verify, and none at all when the first is unlikely: a plain step, cheaper than a verify
over several tokens where the target's cost grows with the width (on an AVX2-only CPU 2 tokens cost
1.4 and 3 tokens 1.7 one-token forwards). Opt-in (`generate(..., confidence_trim=True)`): on the demo
pair on that CPU, replaying fresh training-pool prompts under the cost table put it 2.4-2.6% ahead, but
end to end, side by side with the defaults (`dflash bench e2e --methods ar,dflash,dflash_trimmed`), it was
0.4-2% behind in three runs (docs/benchmarks.md, "Trimming drafts by the drafter's confidence").

Greedy only: trimming shortens a chain of deterministic drafts, which the target verifies as before,
so the output is unchanged. (A sampled draft's length must not depend on the drawn tokens, or the
kept drafts would no longer be draws from q.)
"""

from __future__ import annotations

from typing import Callable

import torch

from dflash_core.model.draft_vocab import read_out_logits
from dflash_core.sampling.tokens import greedy_tokens


class ConfidentReadOut:
    """hidden [B, k, H] -> draft tokens [B, k] (the same argmax as `read_out_for`'s), keeping the
    softmax probability of each argmax [B, k] (fp32) for `take()`."""

    def __init__(self, logits: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor | None) -> None:
        self.logits = logits  # hidden -> logits over the read-out list (or the whole vocabulary)
        self.ids = ids  # [N]: logits column j is token ids[j]; None: column j is token j
        self._confidence: torch.Tensor | None = None

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.logits(hidden).float()  # [B, k, N]
        top = logits.amax(dim=-1, keepdim=True)
        # p(argmax) = 1 / sum_j exp(l_j - l_max): one pass, no [B, k, N] softmax kept
        self._confidence = torch.exp(logits - top).sum(dim=-1).reciprocal()
        columns = greedy_tokens(logits)
        return columns if self.ids is None else self.ids[columns]

    def take(self) -> torch.Tensor | None:
        """The confidences of the last read-out [B, k], once (None if nothing was read out since)."""
        confidence, self._confidence = self._confidence, None
        return confidence


def confident_read_out(drafter, target) -> ConfidentReadOut:
    """`read_out_for(drafter, target)`'s drafts, with their confidences."""
    return ConfidentReadOut(*read_out_logits(drafter, target))

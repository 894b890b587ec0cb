"""Sampled drafts: at temperature > 0 the drafter proposes from its own distribution q, and the
target accepts each draft with probability min(1, p/q) (speculative sampling, Leviathan et al. 2023).

Why: a greedy draft d (q one-hot) is accepted with probability p(d) only, and at temperature 1 the
target's distribution p spreads over many continuations, so greedy drafts rarely survive. A draft
drawn from q is accepted with probability sum_x min(p(x), q(x)): one whenever q equals p, however
spread both are.

Exactness, one position (standard): the draft d ~ q is kept with probability min(1, p(d)/q(d)); on
rejection the token is drawn from the residual r(x) = max(0, p(x) - q(x)) / sum(max(0, p - q)). The
committed token has probability min(p(x), q(x)) + max(0, p(x) - q(x)) = p(x). A block applies this
position after position, each p conditioned on the drafts kept before it; DFlash drafts the block in
one pass, so q_i does not depend on d_1..d_{i-1}, which changes nothing: q_i is simply the proposal
the test divides by. After k kept drafts the target's own next token is a plain sample of p_k.

The drafter's logits are warped like the target's (temperature, top-k, top-p): any q keeps the
output exact; a q shaped like the warped p is the one that is accepted most.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import SamplingParams, warp_logits


@dataclass
class SampledDrafts:
    """The distribution q the drafts were drawn from, over the read-out's columns only: with a read-out
    list (`draft_vocab`) of N ids that is [B, k, N], not [B, k, V] (V = 151,936 for Qwen3)."""

    probs: torch.Tensor  # [B, k, N] q per draft position, fp32
    picks: torch.Tensor  # [B, k] the column each draft was drawn as
    ids: torch.Tensor | None  # [N] token id of each column; None: column j is token j (N = V)
    vocab_size: int  # V

    def of_drafts(self) -> torch.Tensor:
        """q(d_i) [B, k]: > 0, each draft was drawn from it."""
        return self.probs.gather(2, self.picks[..., None])[..., 0]

    def over_vocabulary(self, positions: torch.Tensor) -> torch.Tensor:
        """q over all V token ids [B, V] at one draft position per row (positions [B]); 0 off the list."""
        rows = self.probs[torch.arange(len(positions), device=positions.device), positions]  # [B, N]
        if self.ids is None:
            return rows
        return rows.new_zeros(rows.shape[0], self.vocab_size).index_copy_(1, self.ids, rows)


class DraftSampler:
    """A read-out (drafter hidden [B, k, H] -> draft tokens [B, k]) that samples each draft from q.

    Wraps a greedy read-out (`draft_vocab.FullReadOut` / `SubsetReadOut`: its `logits` and `ids`) and
    keeps what it sampled (`SampledDrafts`) for `take`.
    """

    def __init__(self, read_out, vocab_size: int, params: SamplingParams, generator: torch.Generator | None) -> None:
        self.read_out, self.vocab_size, self.params, self.generator = read_out, vocab_size, params, generator
        self.sampled: SampledDrafts | None = None

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        probs = warp_logits(self.read_out.logits(hidden), self.params).softmax(dim=-1)  # [B, k, N], fp32
        flat = probs.reshape(-1, probs.shape[-1])
        picks = torch.multinomial(flat, 1, generator=self.generator).view(probs.shape[:-1])  # [B, k]
        ids = self.read_out.ids
        self.sampled = SampledDrafts(probs, picks, ids, self.vocab_size)
        return picks if ids is None else ids[picks]

    def take(self) -> SampledDrafts | None:
        """q of the latest drafts, once; None when no draft was sampled since (the backend read out by
        itself, e.g. an ONNX graph with the LM head inside: those drafts are greedy, one-hot)."""
        sampled, self.sampled = self.sampled, None
        return sampled


def speculative_accept(drafts: torch.Tensor, sampled: SampledDrafts, target_probs: torch.Tensor,
                       generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """drafts [B, k] drawn from `sampled` (q); target_probs p [B, k+1, V] at the verified positions
    (p_i is the target's next-token distribution after the anchor and d_1..d_i).

    Returns (accepted [B]: drafts kept, a prefix; next [B]: the token committed after them).
    """
    batch, k = drafts.shape
    p_of_draft = target_probs[:, :k].gather(2, drafts[..., None])[..., 0]  # [B, k]
    uniform = torch.rand(batch, k, generator=generator, device=drafts.device)
    kept = uniform * sampled.of_drafts() < p_of_draft  # probability min(1, p/q); never when p(d) = 0
    accepted = kept.long().cumprod(dim=1).sum(dim=1)  # [B]
    p_next = target_probs[torch.arange(batch, device=drafts.device), accepted]  # [B, V]
    rejected = (accepted < k)[:, None]
    q_next = sampled.over_vocabulary(accepted.clamp(max=k - 1)) * rejected  # zero when every draft was kept
    residual = (p_next - q_next).clamp(min=0)
    # a zero residual means p <= q everywhere, i.e. p == q: rejecting had probability 0 (rounding only)
    weights = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p_next)
    next_tokens = torch.multinomial(weights, 1, generator=generator)[:, 0]
    return accepted, next_tokens

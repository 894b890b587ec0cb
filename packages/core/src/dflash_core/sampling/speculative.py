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
output exact; a q shaped like the warped p is the one that is accepted most. q spans the whole
vocabulary even for a drafter with a read-out list (`draft_vocab`): the list holds what the target
writes greedily, and a q cut to it would never propose the rarer tokens a sample takes; except for a
drafter trained over its list only, whose other logits were never trained (`sampling_head_for`).
"""

from __future__ import annotations

from typing import Callable

import torch

from dflash_core.sampling.tokens import SamplingParams, sample_categorical, warp_logits


class DraftSampler:
    """A read-out (drafter hidden [B, k, H] -> draft tokens [B, k]) that samples each draft from q, the
    warped distribution of `lm_head`'s logits [B, k, V] (`draft_vocab.sampling_head_for`), and keeps q for `take`."""

    def __init__(self, lm_head: Callable[[torch.Tensor], torch.Tensor], params: SamplingParams,
                 generator: torch.Generator | None) -> None:
        self.lm_head, self.params, self.generator = lm_head, params, generator
        self.probs: torch.Tensor | None = None

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        probs = warp_logits(self.lm_head(hidden), self.params).softmax(dim=-1)  # [B, k, V], fp32
        self.probs = probs
        return sample_categorical(probs, self.generator)  # [B, k]

    def take(self) -> torch.Tensor | None:
        """q [B, k, V] of the latest drafts, once; None when no draft was sampled since (the backend read
        out by itself, e.g. an ONNX graph with the LM head inside: those drafts are greedy, one-hot)."""
        probs, self.probs = self.probs, None
        return probs


def speculative_accept(drafts: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                       generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """drafts [B, k] drawn from draft_probs q [B, k, V]; target_probs p [B, k+1, V] at the verified
    positions (p_i is the target's next-token distribution after the anchor and d_1..d_i).

    Returns (accepted [B]: drafts kept, a prefix; next [B]: the token committed after them).
    """
    batch, k = drafts.shape
    p_of_draft = target_probs[:, :k].gather(2, drafts[..., None])[..., 0]  # [B, k]
    q_of_draft = draft_probs.gather(2, drafts[..., None])[..., 0]  # [B, k], > 0: d was drawn from q
    uniform = torch.rand(batch, k, generator=generator, device=drafts.device)
    kept = uniform * q_of_draft < p_of_draft  # probability min(1, p/q); never when p(d) = 0
    accepted = kept.long().cumprod(dim=1).sum(dim=1)  # [B]
    rows = torch.arange(batch, device=drafts.device)
    p_next = target_probs[rows, accepted]  # [B, V]
    rejected = (accepted < k)[:, None]
    q_next = draft_probs[rows, accepted.clamp(max=k - 1)] * rejected  # zero when every draft was kept
    residual = (p_next - q_next).clamp(min=0)
    # a zero residual means p <= q everywhere, i.e. p == q: rejecting had probability 0 (rounding only)
    weights = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p_next)
    next_tokens = sample_categorical(weights, generator)  # [B]
    return accepted, next_tokens

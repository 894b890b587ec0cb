"""The verifier: the target scores a proposal in one pass and keeps the longest prefix it agrees with.

At each verified position i (0 = the row's last committed token, i = draft i) the target chooses y_i:
its argmax, or a draw from its warped distribution p_i. With fixed drafts (greedy drafts, lookup copies,
anything one-hot) draft d_{i+1} is kept while d_{i+1} == y_i, then y_a itself is committed (a = drafts
accepted): every committed token is the target's own choice, so greedy output is the target's greedy
decoding and a sampled one is exact rejection sampling with one-hot q. With sampled drafts (q in the
proposal) draft d_{i+1} ~ q_{i+1} is kept with probability min(1, p_i/q_{i+1}) and the first rejection
commits a draw from the residual max(0, p_i - q_{i+1}) (`sampling.speculative.speculative_accept`):
the committed tokens are draws from the target's own conditionals either way.
"""

from __future__ import annotations

from typing import Protocol

import torch

from dflash_core.decode.sources import Proposal, StepInput, Verdict
from dflash_core.sampling.speculative import speculative_accept
from dflash_core.sampling.tokens import SamplingParams, choose_tokens, warp_logits
from dflash_core.target.adapter import TargetModel
from dflash_core.target.cache import TargetCache


class Verifier(Protocol):
    def verify(self, target: TargetModel, cache: TargetCache, step: StepInput, proposal: Proposal) -> Verdict:
        """One target pass over [last, drafts] at step.positions[:, :k+1]; what it accepts of each row."""


class ChainVerifier:
    """Verifies one chain of drafts per row (the drafter's argmax chain, a lookup copy, a plain step)."""

    def __init__(self, params: SamplingParams, generator: torch.Generator | None) -> None:
        self.params, self.generator = params, generator

    def verify(self, target: TargetModel, cache: TargetCache, step: StepInput, proposal: Proposal) -> Verdict:
        drafts = proposal.drafts  # [B, k]
        positions = step.positions[:, : proposal.k + 1]  # [B, k+1]
        ids = torch.cat([step.last[:, None], drafts], dim=1)
        out = target(ids, positions, cache.cache, cache.attention_mask(target, positions))
        logits = target.logits(out.hidden)  # [B, k+1, V]
        if proposal.probs is None:
            chosen = choose_tokens(logits, self.params, self.generator)  # y_i, [B, k+1]
            # a = length of the longest prefix with d_{i+1} == y_i; then y_a is the target's own next token
            accepted = (drafts == chosen[:, :-1]).cumprod(dim=1).sum(dim=1)  # [B]
            bonus = chosen.gather(1, accepted[:, None])[:, 0]  # [B]
        else:
            target_probs = warp_logits(logits, self.params).softmax(dim=-1)
            accepted, bonus = speculative_accept(drafts, proposal.probs, target_probs, self.generator)
        host = torch.cat([accepted[:, None], bonus[:, None], drafts], dim=1).tolist()  # one device sync
        return Verdict(accepted=[h[0] for h in host], committed=[h[2 : 2 + h[0]] + [h[1]] for h in host],
                       bonus=bonus, features=out.features, positions=positions, counts=[h[0] + 1 for h in host])

"""Draft sources: what proposes the tokens a step verifies, and what each learns from the verdict.

A step is draft -> verify -> accept -> commit (`decode.loop`). The drafting is done by a `DraftSource`:
- `DrafterSource`: the DFlash drafter, one pass over the block [last token, MASK x (B-1)] conditioned
  on the target features injected into its K/V (`DrafterBackend`); greedy drafts are argmaxes, sampled
  ones draws from the drafter's warped distribution q (kept in the proposal for the acceptance test).
- `LookupSource`: context lookup, copies of what followed the row's latest n-gram in its own prompt and
  output (`context_lookup`); no model pass.
- `PlainSource`: no drafts at all, a step of the target alone.
Which source drafts a step, and how many drafts, is decided outside them (`decode.choice`); how the target
judges a proposal is the verifier's (`decode.verify`). A new source implements `DraftSource` and plugs
into `generate(..., chooser=...)` without a change to the loop.

Shapes: B = active rows, k = drafts per row this step, Q = the block's positions, F = target features.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch.nn.utils.rnn import pad_sequence

from dflash_core.decode.context_lookup import NgramIndex
from dflash_core.decode.draft_confidence import ConfidentReadOut
from dflash_core.model.backend import DrafterBackend
from dflash_core.sampling.speculative import DraftSampler


@dataclass
class StepInput:
    """What a source sees at the start of a step (active rows only)."""

    last: torch.Tensor
    """[B] each row's newest committed token, not yet seen by the target (the block's first position)."""
    positions: torch.Tensor
    """[B, Q] the positions of the block: `last` at 0, draft i at i."""
    limit: int
    """The most drafts any row can still use (its remaining tokens - 1); a proposal is at most this long."""


@dataclass
class Proposal:
    """One step's drafts, all rows padded to the same k."""

    source: str
    """Who proposed: "drafter", "lookup", "plain" or a source of your own."""
    drafts: torch.Tensor
    """[B, k] token ids."""
    probs: torch.Tensor | None = None
    """q [B, k, V] the drafts were sampled from (speculative sampling); None: fixed (one-hot) drafts."""
    lengths: list[int] | None = None
    """Per row, the drafts it really proposes (the rest is padding, verified and rejected or not, exact)."""
    cut: list[float] | None = None
    """Per row, the drafter's confidence in the first draft it trimmed away (None: nothing trimmed)."""
    trees: list | None = None
    """Per row, the `decode.tree.DraftTree` whose nodes the drafts are, in node order (None: a chain).
    Sampled tree drafts' q is by depth: probs [B, D, V], q_d for the nodes at depth d."""

    @property
    def k(self) -> int:
        """Drafts per row: a chain's length, a tree's node count."""
        return self.drafts.shape[1]


@dataclass
class Verdict:
    """What the target made of a proposal (or, at prefill, of the prompts)."""

    accepted: list[int]
    """Per row, drafts accepted."""
    committed: list[list[int]]
    """Per row, the accepted drafts then the target's own token (before any stop or length cut)."""
    bonus: torch.Tensor
    """[B] the target's own token of each row: the next step's `last`."""
    features: torch.Tensor
    """[B, n, F] the target's features at the positions it just saw (k+1 per row, or the prompts)."""
    positions: torch.Tensor
    """[B, n] their positions."""
    counts: list[int]
    """Per row, how many of the n positions are now committed (accepted + 1, or the prompt's length)."""
    kept: list[list[int]] | None = None
    """A tree's verdict: per row, the verified positions committed (its accepted path, root 0 first); the
    features above are theirs, in that order. None: the first counts[b] positions."""


@runtime_checkable
class DraftSource(Protocol):
    """Proposes drafts; learns from every verdict (whoever proposed); keeps per-row state in active-row order."""

    name: str

    def propose(self, step: StepInput, k: int) -> Proposal:
        """At most k drafts per row (k <= step.limit)."""

    def observe(self, proposal: Proposal | None, verdict: Verdict) -> None:
        """After each step (proposal None: the prefill): take in what the target committed."""

    def select_rows(self, keep: list[int]) -> None:
        """Keep only these active rows, in this order (finished rows leave the batch)."""


class PlainSource:
    """No drafts: the step is one target forward over the last token, the target alone."""

    name = "plain"

    def propose(self, step: StepInput, k: int = 0) -> Proposal:
        return Proposal(self.name, step.last.new_zeros((step.last.shape[0], 0)))

    def observe(self, proposal: Proposal | None, verdict: Verdict) -> None:
        pass

    def select_rows(self, keep: list[int]) -> None:
        pass


class LookupSource:
    """Context lookup: per row, the tokens that followed the latest earlier occurrence of its newest n-gram."""

    name = "lookup"

    def __init__(self, prompts: list[list[int]]) -> None:
        self.histories = [NgramIndex(p) for p in prompts]  # per active row: prompt + output so far

    def candidates(self, count: int) -> list[list[int]]:
        """Each row's copy of up to `count` tokens ([] where its newest n-gram never occurred before)."""
        return [h.continuation(count) for h in self.histories]

    def propose(self, step: StepInput, k: int, copies: list[list[int]] | None = None) -> Proposal:
        """The rows' copies cut to k; a shorter copy is padded with its row's last token."""
        copies = [c[:k] for c in (copies if copies is not None else self.candidates(k))]
        width = max(len(c) for c in copies)
        drafts = [c + [last] * (width - len(c)) for c, last in zip(copies, step.last.tolist())]
        return Proposal(self.name, torch.tensor(drafts, dtype=torch.long, device=step.last.device),
                        lengths=[len(c) for c in copies])

    def observe(self, proposal: Proposal | None, verdict: Verdict) -> None:
        for history, tokens in zip(self.histories, verdict.committed):
            history.extend(tokens)  # a row's tokens past a stop are never looked up: the row leaves the batch

    def select_rows(self, keep: list[int]) -> None:
        self.histories = [self.histories[i] for i in keep]


class DrafterSource:
    """The DFlash drafter: the whole block in one pass over its cache of injected target features.

    Features of tokens committed by steps it did not draft (the prompts, plain steps, lookup steps) wait
    here and are injected in one projection just before its next draft: a request that never drafts
    again never pays for them."""

    name = "drafter"

    def __init__(self, drafter: DrafterBackend, embed, read_out, batch: int, capacity: int, device: torch.device,
                 trim_policy=None) -> None:
        self.drafter, self.embed, self.read_out, self.trim_policy = drafter, embed, read_out, trim_policy
        self.cache = drafter.new_cache(batch, capacity)
        block = drafter.config.block_size
        self.masks = torch.full((1, block - 1), drafter.config.mask_token_id, dtype=torch.long, device=device)
        self.prompt: tuple[torch.Tensor, torch.Tensor, list[int]] | None = None  # features [B, T, F], positions, lengths
        self.pending: list[tuple[torch.Tensor, torch.Tensor, list[int]]] = []  # the same, per step not drafted

    def propose(self, step: StepInput, k: int) -> Proposal:
        """The first k drafts of the block at `step.positions`; greedy drafts may be trimmed by confidence."""
        self._inject_pending()
        block_ids = torch.cat([step.last[:, None], self.masks.expand(step.last.shape[0], -1)], dim=1)  # [B, Q]
        drafts = self.drafter.propose(self.cache, self.embed(block_ids), step.positions, self.read_out, k)
        probs = self.read_out.take() if isinstance(self.read_out, DraftSampler) else None
        proposal = Proposal(self.name, drafts, probs)
        return self._trim(proposal) if isinstance(self.read_out, ConfidentReadOut) else proposal

    def observe(self, proposal: Proposal | None, verdict: Verdict) -> None:
        """KV injection of what the target committed: now after its own drafts, else at its next draft."""
        keep = max(verdict.counts)
        features, positions = verdict.features[:, :keep], verdict.positions[:, :keep]
        if proposal is None:
            self.prompt = (verdict.features, verdict.positions, verdict.counts)
        elif proposal.source == self.name and proposal.k > 0:
            self.drafter.extend_cache(self.cache, features, positions, verdict.counts)
        else:
            self.pending.append((features, positions, verdict.counts))

    def select_rows(self, keep: list[int]) -> None:
        self.cache.select_rows(keep)
        index = torch.tensor(keep, device=self.masks.device)
        self.pending = [(f.index_select(0, index), p.index_select(0, index), [c[i] for i in keep])
                        for f, p, c in self.pending]
        if self.prompt is not None:
            features, positions, lengths = self.prompt
            self.prompt = (features.index_select(0, index), positions.index_select(0, index), [lengths[i] for i in keep])

    def _trim(self, proposal: Proposal) -> Proposal:
        """Greedy drafts after `DraftLengthPolicy.trim` by the drafter's confidences (not on a retry, which
        drafts to learn): the drafts kept, and per row the confidence of the first one dropped."""
        confidence = self.read_out.take()
        policy = self.trim_policy
        if confidence is None or policy is None or policy.exploring:  # e.g. an ONNX graph that reads out itself
            return proposal
        kept = policy.trim(proposal.k, confidence)
        if kept == proposal.k:
            return proposal
        return Proposal(self.name, proposal.drafts[:, :kept], cut=confidence[:, kept].tolist())

    def _inject_pending(self) -> None:
        """KV injection of the prompts (once), then of what steps without a drafter pass committed, in one
        projection (each row's tokens packed left: rows committed different numbers at a lookup step)."""
        if self.prompt is not None:
            self.drafter.extend_cache(self.cache, *self.prompt)
            self.prompt = None
        if not self.pending:
            return
        if all(c == f.shape[1] for f, _, counts in self.pending for c in counts):  # plain steps only
            features = torch.cat([f for f, _, _ in self.pending], dim=1)  # [B, m, F]
            positions = torch.cat([p for _, p, _ in self.pending], dim=1)  # [B, m]
            counts = [features.shape[1]] * features.shape[0]
        else:
            rows = range(self.pending[0][0].shape[0])
            features = pad_sequence([torch.cat([f[b, :c[b]] for f, _, c in self.pending]) for b in rows],
                                    batch_first=True)  # [B, max m, F]
            positions = pad_sequence([torch.cat([p[b, :c[b]] for _, p, c in self.pending]) for b in rows],
                                     batch_first=True)  # [B, max m]
            counts = [sum(c[b] for _, _, c in self.pending) for b in rows]
        self.drafter.extend_cache(self.cache, features, positions, counts)
        self.pending = []

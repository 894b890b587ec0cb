"""Which source drafts a step, and how many drafts: the policy the decode step leaves outside itself.

`FixedChoice`: one source, k drafts every step (the tests' and `draft_length=int`'s).
`CostAwareChoice` (`draft_length="auto"`): the drafter's `DraftLengthPolicy` chooses k in 0..B-1 from
this machine's verify cost table and the acceptance seen so far (k = 0: a plain step). Where context
lookup is on, each step on which some row has a copy, the lookup's own policy (the same costs with
drafting free) is weighed against the drafter's: the source that promises more committed tokens per
second drafts (the lookup's budgeted retries included). Whatever is chosen, every committed token is
the target's own choice: the choice changes speed, never output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dflash_core.decode.sources import DraftSource, LookupSource, PlainSource, Proposal, StepInput, Verdict
from dflash_core.tuning.draft_length import DraftLengthPolicy


@dataclass
class Choice:
    source: DraftSource
    k: int
    copies: list[list[int]] | None = None  # lookup: the copies the choice was made on (cut to k by the source)

    def propose(self, step: StepInput) -> Proposal:
        if isinstance(self.source, LookupSource):
            return self.source.propose(step, self.k, self.copies)
        return self.source.propose(step, self.k)


class SourceChooser(Protocol):
    sources: list[DraftSource]
    """Every source the decoder keeps informed (`observe`, `select_rows`), whether chosen or not."""

    def choose(self, step: StepInput) -> Choice:
        """This step's source and k (k <= step.limit)."""

    def observe(self, proposal: Proposal, verdict: Verdict) -> None:
        """What the chosen proposal got: the acceptance the policy learns from."""


class FixedChoice:
    """`source` with k drafts every step (fewer where a row can emit no more); k = 0: plain steps."""

    def __init__(self, source: DraftSource, k: int, plain: DraftSource | None = None) -> None:
        self.source, self.k = source, k
        self.plain = plain or PlainSource()
        self.sources = [source] if source is self.plain else [source, self.plain]

    def choose(self, step: StepInput) -> Choice:
        k = min(self.k, step.limit)
        return Choice(self.source if k > 0 else self.plain, k)

    def observe(self, proposal: Proposal, verdict: Verdict) -> None:
        pass


class CostAwareChoice:
    """The drafter or context lookup, with k chosen by each one's `DraftLengthPolicy`."""

    def __init__(self, drafter: DraftSource, policy: DraftLengthPolicy, plain: DraftSource,
                 lookup: LookupSource | None = None, lookup_policy: DraftLengthPolicy | None = None,
                 greedy: bool = True) -> None:
        self.drafter, self.policy, self.plain = drafter, policy, plain
        self.lookup, self.lookup_policy, self.greedy = lookup, lookup_policy, greedy
        self.sources = [s for s in (drafter, plain, lookup) if s is not None]
        self.shadow: list[list[int]] | None = None  # this step's copies when the drafter drafts instead (greedy)

    def choose(self, step: StepInput) -> Choice:
        k = min(self.policy.choose(step.last.shape[0]), step.limit)
        copies = self._lookup_copies(step, k)
        if copies is not None:
            return Choice(self.lookup, max(len(c) for c in copies), copies)
        return Choice(self.drafter if k > 0 else self.plain, k)

    def _lookup_copies(self, step: StepInput, k: int) -> list[list[int]] | None:
        """Each row's lookup copy (maybe []) when the lookup drafts this step, else None.

        It drafts when its best k_l > 0 promises more tokens per second than a plain step and than the
        drafter's k, counting only the rows that have a copy (a row without one commits 1 token, its
        width wasted), or when its policy retries (budgeted exploration). Copies are cut to k_l.
        """
        self.shadow = None
        if self.lookup is None or step.limit < 1:
            return None
        copies = self.lookup.candidates(min(step.limit, self.policy.block_size - 1))
        if not any(copies):
            return None
        batch = len(copies)
        retry = self.lookup_policy.choose(batch)  # its retry budget; its k assumes every row has a copy
        if self.lookup_policy.exploring:
            return [c[:retry] for c in copies]
        # the step's expected tokens: E(min(k, copy length)) per row with a copy, 1 per row without
        expected = self.lookup_policy.expected_tokens()
        rates = [sum(expected[min(j, len(c))] for c in copies) / self.lookup_policy.costs.step(j, batch)
                 for j in range(len(expected))]
        best = max(range(1, len(rates)), key=lambda j: (rates[j], -j))
        # the drafter's rate at its k, recomputed: a policy of the caller's may override `choose`
        if rates[best] <= max(rates[0], self.policy.rates(batch)[k]):
            self.shadow = copies if self.greedy else None  # scored against what the target commits
            return None
        return [c[:best] for c in copies]

    def observe(self, proposal: Proposal, verdict: Verdict) -> None:
        """Each row's outcome to the policy of the source that drafted (a lookup step is idle time to the other);
        where the lookup had a copy but the drafter drafted (greedy), the copy is scored against the tokens the
        target committed: what it would have had accepted, as far as those tokens tell."""
        for i, a in enumerate(verdict.accepted):
            if proposal.source != self.lookup_name:
                if proposal.trees is not None:  # the chain's own outcome: what the tree's argmax chain accepted
                    self.policy.observe(*main_chain_outcome(proposal.trees[i], verdict.kept[i]))
                else:
                    self.policy.observe(proposal.k, a, None if proposal.cut is None else proposal.cut[i])
                if self.shadow and self.shadow[i]:
                    self.lookup_policy.observe(*shadow_outcome(self.shadow[i], verdict.committed[i]))
                continue
            self.policy.observe(0, 0)
            if proposal.lengths[i]:  # padding past a row's copy is not the lookup's miss
                self.lookup_policy.observe(proposal.lengths[i], min(a, proposal.lengths[i]))

    lookup_name = LookupSource.name


def main_chain_outcome(tree, path: list[int]) -> tuple[int, int, float | None]:
    """(drafts verified, accepted, next confidence) of the chain inside a token tree (`decode.tree.DraftTree`:
    its nodes on the drafter's argmax chain), given the accepted path: what a chain step over those drafts would
    have got, and where the tree left the rest of the step's chain out and all of it was accepted, the estimated
    acceptance of the first left out (as `DraftLengthPolicy.observe` takes a trimmed chain's). The policy learns
    from it, so its k and its weighing against context lookup stay a chain's (a tree's extra tokens are the
    tree's gain, their cost its size choice's), and a tree sized to nothing still says the drafter was tried."""
    on_chain = sum(not off for off in tree.off_chain)
    accepted = 0
    for node in path[1:]:
        if tree.off_chain[node - 1]:
            break
        accepted += 1
    return on_chain, accepted, tree.chain_next if accepted == on_chain else None


def shadow_outcome(copy: list[int], committed: list[int]) -> tuple[int, int]:
    """(drafts verified, accepted) had `copy` been verified at a step that committed `committed` (the target's
    tokens): its first m tokens equal those, so m accepted; a mismatch within both is the (m+1)-th draft
    rejected; where the copy or the committed tokens end first, nothing is known past them."""
    known = min(len(copy), len(committed))
    m = next((j for j in range(known) if copy[j] != committed[j]), known)
    return (m + 1, m) if m < known else (m, m)

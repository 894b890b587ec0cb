"""Token trees from one draft pass: the drafter's top candidates per position, verified together.

The DFlash drafter returns a distribution for every position of the block in one pass; the chain keeps
its argmax only, so a wrong first token loses the whole step although the target's choice is often the
drafter's second or third candidate. A tree keeps several: node = (parent, a candidate token for the next
position), the root being the row's last committed token. The target scores every node in one pass
(`decode.tree_verify`: each node sees the context and its ancestors) and the longest path it agrees with
is committed. The chain is the tree with one candidate per depth.

Shape (`grow_tree`): best-first, as Medusa's and Sequoia's dynamic trees. A node's score is the estimated
chance that the target accepts its whole path: the product over the path of `Calibration(q)`, the
acceptance observed so far for drafts the drafter gave probability q (a prior of q itself at the start), learnt
apart for nodes off the drafter's argmax chain.
The drafter's q at depth d does not depend on the path (one pass conditioned on the context only), so a
node's children are the top candidates of q_{d+1}, in rank order; the frontier is a heap of each node's
next child and each node's next sibling. Popping N nodes gives the N-node tree of largest expected
accepted length under that estimate, and every prefix of the pop order is itself such a tree (parents pop
before children), so one growth serves every size.

Depth: the draft-length policy's k for the step (`decode.choice`), as for a chain: it says how far drafts
are worth reading out, from the acceptance seen per position and the cost table. The policy goes on learning
a chain's acceptance: from the tree's argmax chain (`choice.main_chain_outcome`), with the estimated
acceptance of the chain's first draft the tree left out, as for a trimmed chain.

Size (`TreeSource._size`): `size=None` ("auto") takes the N in 0..max_nodes with the most expected committed
tokens per second, sum over rows of (1 + the scores of its first N nodes) over this machine's verify time for
rows * (N + 1) tokens (`VerifyCostTable`): N = 0 is a plain target step after the draft, a chain is chosen
whenever side branches do not pay. Whether to draft at all, and how deep, stays the draft-length policy's
(`decode.choice`). An int fixes N. Rows share N and differ in shape. (Growing the policy's chain of k first
and adding branches to it instead measured slower: on the demo pair at T=0, batch 1, 1.00x the chain against
1.10x, its trees larger for the same tau.)

Sampling: the shape is grown from q's sorted probabilities (fixed before any token is drawn), then each
node's children are drawn from q without replacement (`sampling.multi_candidate`), and the verifier keeps
at most one by recursive rejection sampling: the committed tokens keep the target's law exactly.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch

from dflash_core.decode.sources import DrafterSource, Proposal, StepInput, Verdict
from dflash_core.model.draft_vocab import read_out_logits
from dflash_core.sampling.multi_candidate import draw_without_replacement
from dflash_core.sampling.speculative import DraftSampler
from dflash_core.tuning.cost_table import VerifyCostTable
from dflash_core.tuning.tree_calibration import Calibration

CANDIDATES = 8  # children a node may have at most (candidates read out per position)


@dataclass
class DraftTree:
    """One row's tree in pop order: node i (1-based; 0 is the root, the row's last token) has parent
    parents[i-1] < i, depth depths[i-1] (the root's is 0), rank ranks[i-1] among its siblings (0 = the
    drafter's most likely), q probs[i-1] of its rank at its depth, and estimated path acceptance scores[i-1]."""

    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    off_chain: list[bool] = field(default_factory=list)
    """Whether the node or an ancestor is not its depth's most likely candidate."""
    chain_next: float | None = None
    """Where the tree holds the drafter's argmax chain to a lesser depth than the step drafted: the estimated
    acceptance of the chain's first draft left out (for the draft-length policy, as a trimmed chain's)."""

    def __len__(self) -> int:
        return len(self.parents)

    def first(self, count: int) -> "DraftTree":
        """The tree of the first `count` nodes (a tree: parents pop before their children)."""
        return DraftTree(self.parents[:count], self.depths[:count], self.ranks[:count], self.probs[:count],
                         self.scores[:count], self.off_chain[:count])  # chain_next: set by the source

    def children(self) -> dict[int, list[int]]:
        """node -> its children in rank order."""
        kids: dict[int, list[int]] = {}
        for node, parent in enumerate(self.parents, start=1):
            kids.setdefault(parent, []).append(node)
        return kids


def grow_tree(sorted_probs: list[list[float]], nodes: int, calibration: Calibration) -> DraftTree:
    """Best-first growth of up to `nodes` nodes. sorted_probs[d][r]: the drafter's r-th largest probability
    at depth d+1 (depth 1 = the first draft position); candidates of probability 0 are never added."""
    tree = DraftTree()
    depth_limit = len(sorted_probs)
    frontier: list[tuple[float, int, int, int, float]] = []  # (-score, depth, rank, parent, parent score)

    def offer(depth: int, rank: int, parent: int, parent_score: float) -> None:
        if depth <= depth_limit and rank < len(sorted_probs[depth - 1]) and sorted_probs[depth - 1][rank] > 0:
            off_chain = rank > 0 or (parent > 0 and tree.off_chain[parent - 1])
            score = parent_score * calibration(sorted_probs[depth - 1][rank], off_chain)
            heapq.heappush(frontier, (-score, depth, rank, parent, parent_score))

    offer(1, 0, 0, 1.0)
    while frontier and len(tree) < nodes:
        negative, depth, rank, parent, parent_score = heapq.heappop(frontier)
        tree.parents.append(parent)
        tree.depths.append(depth)
        tree.ranks.append(rank)
        tree.probs.append(sorted_probs[depth - 1][rank])
        tree.scores.append(-negative)
        tree.off_chain.append(rank > 0 or (parent > 0 and tree.off_chain[parent - 1]))
        offer(depth, rank + 1, parent, parent_score)  # the next sibling
        offer(depth + 1, 0, len(tree), -negative)  # the first child
    return tree


class CandidateReadOut:
    """hidden [B, D, H] -> the argmax drafts [B, D] (as `read_out_for`'s), keeping the top CANDIDATES
    tokens and their softmax probabilities per position ([B, D, c] each) for `take()`."""

    def __init__(self, logits, ids: torch.Tensor | None, width: int = CANDIDATES) -> None:
        self.logits, self.ids, self.width = logits, ids, width
        self._taken: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.logits(hidden).float()  # [B, D, N]
        probs, columns = logits.softmax(dim=-1).topk(min(self.width, logits.shape[-1]), dim=-1)
        tokens = columns if self.ids is None else self.ids[columns]
        self._taken = (tokens, probs)
        return tokens[..., 0]

    def take(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        taken, self._taken = self._taken, None
        return taken


def candidate_read_out(drafter, target) -> CandidateReadOut:
    """`read_out_for(drafter, target)`'s drafts over the same list, with the top candidates kept."""
    return CandidateReadOut(*read_out_logits(drafter, target))


class TreeSource(DrafterSource):
    """The drafter proposing a token tree per row (a `Proposal` with `parents`); `DrafterSource` otherwise.

    `size`: nodes per tree (an int), or None to choose per step from `costs` (see the module docstring);
    `max_nodes` bounds that choice. `read_out`: a `CandidateReadOut` (greedy) or a `DraftSampler` (sampling)."""

    def __init__(self, drafter, embed, read_out, batch: int, capacity: int, device: torch.device, *,
                 size: int | None, costs: VerifyCostTable | None, max_nodes: int, generator=None,
                 calibration: Calibration | None = None) -> None:
        super().__init__(drafter, embed, read_out, batch, capacity, device)
        if size is None and costs is None:
            raise ValueError("a tree of automatic size needs the machine's verify cost table")
        self.size, self.costs, self.max_nodes, self.generator = size, costs, max_nodes, generator
        self.calibration = calibration or Calibration()

    def propose(self, step: StepInput, k: int) -> Proposal:
        """A tree over the first k positions of the block: the chooser's k (the draft-length policy's, from the
        acceptance seen per position and the cost table) sets how deep drafts reach, the tree adds width."""
        self._inject_pending()
        block_ids = torch.cat([step.last[:, None], self.masks.expand(step.last.shape[0], -1)], dim=1)
        drafts = self.drafter.propose(self.cache, self.embed(block_ids), step.positions, self.read_out, k)
        sampled = isinstance(self.read_out, DraftSampler)
        q = self.read_out.take() if sampled else None
        candidates = None if sampled else self.read_out.take()
        if q is None and candidates is None:  # a backend that read out by itself: its chain
            return Proposal(self.name, drafts[:, :k])
        if sampled:
            sorted_probs = q.topk(min(CANDIDATES, q.shape[-1]), dim=-1).values
        else:
            tokens, sorted_probs = candidates
        limit = self.max_nodes if self.size is None else self.size
        probs_by_row = sorted_probs.tolist()  # one device-to-host copy per step
        trees = [grow_tree(row, limit, self.calibration) for row in probs_by_row]
        count = self._size(trees) if self.size is None else min(len(t) for t in trees)
        trees = [t.first(count) for t in trees]
        for tree, row in zip(trees, probs_by_row):
            on_chain = sum(not off for off in tree.off_chain)
            if on_chain < k:
                tree.chain_next = self.calibration(row[on_chain][0])
        if sampled:
            node_tokens = self._draw(trees, q)
        else:
            node_tokens = [[int(tokens[b, d - 1, r]) for d, r in zip(t.depths, t.ranks)] for b, t in enumerate(trees)]
        ids = torch.tensor(node_tokens, dtype=torch.long, device=step.last.device).reshape(len(trees), count)
        return Proposal(self.name, ids, probs=q, trees=trees)

    def _size(self, trees: list[DraftTree]) -> int:
        """The node count in 0..(the smallest tree) with the most expected committed tokens per second."""
        rows = len(trees)
        largest = min(len(t) for t in trees)
        best, best_rate, expected = 0, 0.0, float(rows)
        for count in range(largest + 1):
            if count:
                expected += sum(t.scores[count - 1] for t in trees)
            rate = expected / self.costs.verify(rows * (count + 1))
            if rate > best_rate:
                best, best_rate = count, rate
        return best

    def _draw(self, trees: list[DraftTree], q: torch.Tensor) -> list[list[int]]:
        """Sampling: each node's children, drawn from q at their depth without replacement, in rank order."""
        node_tokens = []
        for b, tree in enumerate(trees):
            kids = tree.children()
            tokens = [0] * len(tree)
            parents = sorted(kids)
            if parents:
                depths = [0 if p == 0 else tree.depths[p - 1] for p in parents]
                width = max(len(kids[p]) for p in parents)
                draws = draw_without_replacement(q[b, depths], width, self.generator).tolist()
                for parent, row in zip(parents, draws):
                    for child, token in zip(kids[parent], row):
                        tokens[child - 1] = token
            node_tokens.append(tokens)
        return node_tokens

    def observe(self, proposal: Proposal | None, verdict: Verdict) -> None:
        """KV injection (the accepted path's features, as for a chain), and the calibration learns from every
        node whose parent was accepted: accepted or not."""
        super().observe(proposal, verdict)
        if proposal is None or proposal.trees is None or verdict.kept is None:
            return
        for tree, path in zip(proposal.trees, verdict.kept):
            on_path = set(path)
            for node, (parent, q, off) in enumerate(zip(tree.parents, tree.probs, tree.off_chain), start=1):
                if parent in on_path:
                    self.calibration.record(q, off, node in on_path)

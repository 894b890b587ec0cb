"""Verifying a token tree in one target pass; chains go to the `ChainVerifier` as before.

The pass runs [last, node_1 .. node_N] per row. Node i sits at position (the row's length + its depth)
and sees the row's context and its own ancestors only (the root is the row's last token, depth 0):
`TargetModel.ragged_mask` with the ancestor matrix in place of causality among the block. So the
target's distribution at node i is exactly the one it has after the context and i's path, as if that
path alone had been fed (a test checks it against that brute force).

Acceptance walks down from the root. At each reached node the target chooses its next token:
- fixed candidates (greedy, and by default sampling: the drafter's top candidates): y = the target's own
  choice at the node (its argmax, or a draw from its warped p); the child whose token is y is accepted,
  else y is committed. One batched choice over all nodes, then a walk on the host.
- sampled candidates (`Proposal.probs`: children drawn from the drafter's q without replacement): at
  most one is kept by recursive rejection sampling (`sampling.multi_candidate.recursive_accept`); if none
  is, a draw from the final residual is committed. With one-hot q this is the rule above.
Either way each committed token is the target's own choice given the path before it: greedy output
equals the target's greedy decoding, sampled output keeps its law. The cache and the features the
drafter receives then keep the accepted path only (`Verdict.kept`, `TargetCache.commit`).
"""

from __future__ import annotations

import torch

from dflash_core.decode.sources import Proposal, StepInput, Verdict
from dflash_core.decode.tree import DraftTree
from dflash_core.decode.verify import ChainVerifier
from dflash_core.sampling.multi_candidate import AcceptRule, recursive_accept
from dflash_core.sampling.tokens import SamplingParams, choose_tokens, sample_categorical, warp_logits
from dflash_core.target.adapter import TargetModel
from dflash_core.target.cache import TargetCache


def ancestor_matrix(tree: DraftTree, size: int) -> torch.Tensor:
    """[size, size] bool, size >= len(tree) + 1: entry (i, j) when j is i or an ancestor of i (0 the root);
    positions past the tree (padding) see only the root and themselves."""
    rows = [[j == 0 or j == i for j in range(size)] for i in range(size)]
    for node, parent in enumerate(tree.parents, start=1):
        rows[node] = [a or b for a, b in zip(rows[node], rows[parent])]
    return torch.tensor(rows, dtype=torch.bool)


class TreeVerifier:
    """Verifies token trees (proposals with `trees`) and chains (delegated to `ChainVerifier`).

    `accept`: the multi-candidate acceptance rule for sampled trees (the tests pass a wrong one to show
    the chi-square test catches it)."""

    def __init__(self, params: SamplingParams, generator: torch.Generator | None,
                 accept: AcceptRule = recursive_accept) -> None:
        self.params, self.generator, self.accept = params, generator, accept
        self.chain = ChainVerifier(params, generator)

    def verify(self, target: TargetModel, cache: TargetCache, step: StepInput, proposal: Proposal) -> Verdict:
        if proposal.trees is None:
            return self.chain.verify(target, cache, step, proposal)
        trees = proposal.trees
        width = proposal.k + 1
        device = step.last.device
        depths = torch.tensor([[0] + t.depths for t in trees], device=device)  # [B, N+1]
        positions = step.positions[:, :1] + depths
        among = torch.stack([ancestor_matrix(t, width) for t in trees]).to(device)  # [B, N+1, N+1]
        ids = torch.cat([step.last[:, None], proposal.drafts], dim=1)
        out = target(ids, positions, cache.cache, cache.attention_mask(target, positions, among_queries=among))
        logits = target.logits(out.hidden)  # [B, N+1, V]
        tokens = proposal.drafts.tolist()
        if proposal.probs is None:  # fixed candidates: the target's own choice y at every node, then follow it
            chosen = choose_tokens(logits, self.params, self.generator).tolist()
            walks = [_matching_walk(t, row, y) for t, row, y in zip(trees, tokens, chosen)]
        else:
            probs = warp_logits(logits, self.params).softmax(dim=-1)
            walks = [self._sampled_walk(t, row, probs[b], proposal.probs[b]) for b, (t, row) in
                     enumerate(zip(trees, tokens))]
        paths = [path for path, _ in walks]
        longest = max(len(p) for p in paths)
        index = torch.tensor([p + [0] * (longest - len(p)) for p in paths], device=device)  # [B, L]
        features = out.features.gather(1, index[..., None].expand(-1, -1, out.features.shape[-1]))
        bonus = torch.tensor([b for _, b in walks], dtype=torch.long, device=device)
        committed = [[tokens[b][n - 1] for n in path[1:]] + [walks[b][1]] for b, path in enumerate(paths)]
        return Verdict(accepted=[len(p) - 1 for p in paths], committed=committed, bonus=bonus, features=features,
                       positions=step.positions[:, :longest], counts=[len(p) for p in paths], kept=paths)

    def _sampled_walk(self, tree: DraftTree, tokens: list[int], p: torch.Tensor,
                      q: torch.Tensor) -> tuple[list[int], int]:
        """p [N+1, V] the target's warped distributions at the nodes, q [D, V] the drafter's by depth."""
        kids, path = tree.children(), [0]
        while True:
            node = path[-1]
            children = kids.get(node, [])
            depth = 0 if node == 0 else tree.depths[node - 1]
            if not children:
                return path, int(sample_categorical(p[node][None], self.generator)[0])
            kept, residual = self.accept(p[node], q[depth], [tokens[c - 1] for c in children], self.generator)
            if kept is None:
                return path, int(sample_categorical(residual[None], self.generator)[0])
            path.append(children[kept])


def _matching_walk(tree: DraftTree, tokens: list[int], chosen: list[int]) -> tuple[list[int], int]:
    """Follow the target's choice y (argmax, or a draw from p made at every node at once) from the root
    while a child carries it: (the path, the last y). Drawing y at nodes never reached changes nothing: each
    committed token is still one draw from the target's distribution after the tokens before it."""
    child_of = {(parent, tokens[node - 1]): node for node, parent in enumerate(tree.parents, start=1)}
    path = [0]
    while (path[-1], chosen[path[-1]]) in child_of:
        path.append(child_of[(path[-1], chosen[path[-1]])])
    return path, chosen[path[-1]]

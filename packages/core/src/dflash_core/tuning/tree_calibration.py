"""How far a token tree's estimates of acceptance can be trusted: learnt from what the target accepted.

A tree (`decode.tree`) is grown by the chance that the target accepts each node given its parent. The
drafter's own probability q of the node's token is the first estimate; `Calibration` maps it to the
acceptance observed so far. Greedy requests keep one per drafter in the caller's `Tuning` (what earlier
requests taught); a sampling request starts from the prior, so that a seed reproduces its sample.
"""

from __future__ import annotations


class Calibration:
    """P(a node is accepted | its parent was) as a function of the drafter's probability q of the node's
    token and of whether the node is off the drafter's argmax chain (some ancestor, or the node itself, not
    its depth's most likely token: the drafter's q at a depth is one marginal for every path, shaped by its
    own argmax before it, so it is worth less below another token). Acceptance counts in BINS equal bins of
    q per kind, each starting from `prior_weight` pseudo-trials that accept with probability q."""

    BINS = 20

    def __init__(self, prior_weight: float = 2.0) -> None:
        centres = [(i + 0.5) / self.BINS for i in range(self.BINS)]
        self.hits = [[prior_weight * c for c in centres] for _ in range(2)]
        self.trials = [[prior_weight] * self.BINS for _ in range(2)]

    def _bin(self, q: float) -> int:
        return min(self.BINS - 1, max(0, int(q * self.BINS)))

    def __call__(self, q: float, off_chain: bool = False) -> float:
        i = self._bin(q)
        return self.hits[off_chain][i] / self.trials[off_chain][i]

    def record(self, q: float, off_chain: bool, accepted: bool) -> None:
        i = self._bin(q)
        self.trials[off_chain][i] += 1.0
        self.hits[off_chain][i] += float(accepted)

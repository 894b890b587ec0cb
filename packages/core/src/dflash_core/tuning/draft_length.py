"""Cost-aware draft length: verify only as many drafts as pay for their verify time.

Cost model (one decode step; B = block size; k = drafts verified, 0 <= k <= B-1):
  T(k) = [k > 0] * (draft_s + k * head_s) + verify(k + 1)
                                                 seconds; k = 0 is a plain target step, no drafter pass
  E(k) = 1 + sum_{j=1..k} prod_{i=1..j} p_i      expected committed tokens (the target's own token is 1)
  p_i  = P(draft i accepted | drafts 1..i-1 accepted), estimated from this request's steps
  k*   = argmax_k E(k) / T(k)                    committed tokens per second
`verify(q)` (a target forward over q new tokens, logits and argmax included), `draft_s` (one
drafter pass over the block) and `head_s` (the target's LM head over one more draft position: the
drafter reads out only the k drafts that will be verified, and for a small model with a large
vocabulary that head is most of the drafting cost) come from a `VerifyCostTable` measured once on
the machine (a sampling request's own, measured drawing and testing as it decodes). A batch of r rows
verifying k+1 tokens each is costed as one forward over r*(k+1) tokens (the table extended
linearly past B), the drafter pass scaled the same way.

Estimates: per draft position i, decayed counts reached[i] (draft i was verified with all before
it accepted) and accepted[i]; p_1 = (accepted + 2) / (reached + 3) (a Beta(2, 1) prior, a mildly
optimistic 2/3 before any evidence, so the drafter is tried first), and each later position's
prior is its predecessor's estimate with the same 3 pseudo-counts, p_i = (accepted_i + 3 p_{i-1}) /
(reached_i + 3), so positions not reached yet inherit what the earlier ones showed. Counts decay by
`memory` (0.9) per observed row, so the estimate follows the last ~10 steps of the request.
A greedy request decoded after others by the same drafter starts instead from what those saw
(`AcceptanceHistory`: position i's prior mean is its pooled, slowly decayed acceptance), so a
drafter that is rarely right is not tried first on every request, and a good one drafts its best k
from the first step. (At T=1 on an AVX2 CPU the Beta(2, 1) guess drafted the first two or three
steps of every request, a third of the drafting steps that lost time there; sampling requests keep
it all the same, since which tokens a seed draws depends on k and a seed must reproduce its sample.)

Exploration: once the policy settles on k = 0 no drafts are verified and nothing new is learnt,
so now and then one step drafts anyway (a retry, with the best k >= 1). Retries are paid from a
time budget: a retry costs T(k) - T(0) more than a plain step, and it is taken only once the plain
steps since the last drafting step have lasted that extra cost / `explore_share` (5%). So on a
prompt where the drafter never helps, retries cost at most ~5% of the time, whatever the machine:
where drafting is cheap (a GPU: the verify width is nearly free) retries come every few steps, and
where it is dear (an AVX2 CPU, where verifying 2 tokens costs 1.7 plain steps and a drafter pass
0.7) only every few dozen. (A fixed schedule of retries after 2, 4, 8, ..., 32 plain steps lost up
to 21% on such prompts there.) A retry whose rows accepted at least half their drafts is followed
by another at once (and so on while they do), so a drafter that starts agreeing again gathers the
evidence to be chosen on its own within a few steps; in a batch that is judged on all rows together
(one row's lucky draft does not keep 16 rows drafting).
"""

from __future__ import annotations

from typing import Sequence

import torch

from dflash_core.tuning.cost_table import VerifyCostTable

PRIOR = (2.0, 1.0)  # Beta(accepted, rejected) pseudo-counts per draft position: mean 2/3
IDLE_MEMORY = 0.98  # evidence kept per plain step: rejections seen 35 plain steps ago weigh half
MIN_PRIOR_WEIGHT = 0.05  # the prior never fades below 0.15 pseudo-counts (keeps unreached positions defined)
EXPLORE_SHARE = 0.05  # retries while settled on k = 0 may cost this share of the plain steps' time
HISTORY_MEMORY = 0.99  # a process's acceptance history keeps ~100 drafting rows (a few requests)
HISTORY_EVIDENCE = 3.0  # first-draft verifications the history needs before it replaces the Beta(2, 1) start


class AcceptanceHistory:
    """What earlier requests saw from one draft source: per draft position, counts of rows that
    verified it with every draft before it accepted (reached) and of those that accepted it, pooled
    over requests and decayed by `memory` per drafting row. `priors()` gives a new request's policy
    its starting estimates; a source whose first draft is rarely kept is then not tried first again.
    """

    def __init__(self, positions: int, *, memory: float = HISTORY_MEMORY) -> None:
        if positions < 1 or not 0.0 < memory <= 1.0:
            raise ValueError(f"acceptance history needs >= 1 position and memory in (0, 1], got {positions}, {memory}")
        self.memory = memory
        self.reached = [0.0] * positions  # index i-1: draft position i
        self.accepted = [0.0] * positions

    def record(self, k_verified: int, accepted: int, next_confidence: float | None = None) -> None:
        """One drafting row's outcome (`DraftLengthPolicy.observe`'s, `next_confidence` included; plain
        steps say nothing here)."""
        if k_verified == 0 and next_confidence is None:
            return
        for i in range(len(self.reached)):
            self.reached[i] *= self.memory
            self.accepted[i] *= self.memory
        for i in range(min(accepted + 1, k_verified, len(self.reached))):
            self.reached[i] += 1.0
            self.accepted[i] += 1.0 if i < accepted else 0.0
        if next_confidence is not None and accepted == k_verified < len(self.reached):
            self.reached[k_verified] += 1.0
            self.accepted[k_verified] += next_confidence

    def priors(self) -> tuple[float, ...] | None:
        """Per position the pooled acceptance, each position shrunk towards the one before it as a policy's
        own estimates are (Beta(2, 1) first); None until the first draft has been verified `HISTORY_EVIDENCE` times."""
        if self.reached[0] < HISTORY_EVIDENCE:
            return None
        a, b = PRIOR
        mean, estimates = a / (a + b), []
        for acc, n in zip(self.accepted, self.reached):
            mean = (acc + (a + b) * mean) / (n + a + b)
            estimates.append(mean)
        return tuple(estimates)


class DraftLengthPolicy:
    """Per request: choose how many drafts to verify each step, learn from what was accepted."""

    def __init__(self, costs: VerifyCostTable, block_size: int | None = None, *, memory: float = 0.9,
                 explore_share: float = EXPLORE_SHARE, history: AcceptanceHistory | None = None) -> None:
        block_size = costs.block_size if block_size is None else block_size
        if not 1 <= block_size <= costs.block_size:
            raise ValueError(f"block_size {block_size} is outside 1..{costs.block_size} (the cost table's length)")
        if not 0.0 < memory <= 1.0:
            raise ValueError(f"memory must be in (0, 1], got {memory}")
        if not 0.0 < explore_share < 1.0:
            raise ValueError(f"explore_share must be in (0, 1), got {explore_share}")
        self.costs, self.block_size = costs, block_size
        self.memory, self.explore_share = memory, explore_share
        self.reached = [0.0] * (block_size - 1)  # index i-1: draft position i
        self.accepted = [0.0] * (block_size - 1)
        self.plain_s = 0.0  # modelled seconds of the k = 0 steps since the last drafting step
        self.prior_weight = 1.0  # the prior's pseudo-counts age like observations
        self.retry = (0, 0)  # (k, rows) of this step when it drafts only to explore, else k = 0
        self.retry_accepted = 0  # drafts accepted by the rows of that retry so far
        if history is not None and len(history.reached) < block_size - 1:
            raise ValueError(f"acceptance history covers {len(history.reached)} draft positions, the block {block_size - 1}")
        self.history = history  # earlier requests' evidence: the prior's means, and what this one adds to it
        priors = history.priors() if history is not None else None
        self.prior_means = None if priors is None else priors[: block_size - 1]

    # ---- estimates ---------------------------------------------------------------------------
    def acceptance(self) -> tuple[float, ...]:
        """p_i for i = 1..B-1: posterior mean of draft i's acceptance given all before it accepted.

        A chain of priors: position 1 starts from Beta(2, 1) (mean 2/3); position i's prior has the
        same strength around position i-1's estimate. So a position not reached yet is believed no
        better than the one before it: two rejections of draft 1 make a long block look poor at once,
        instead of leaving positions 2..B-1 at the optimistic 2/3. The prior's 3 pseudo-counts age
        with the evidence (`prior_weight`): were they kept whole against ~10 decayed observations,
        they would hold p_1 at >= 2/13 on a drafter that is never right, and where drafting is cheap
        (a GPU) the policy would keep drafting for nothing.
        """
        a, b = PRIOR
        strength = (a + b) * max(self.prior_weight, MIN_PRIOR_WEIGHT)
        mean, estimates = a / (a + b), []
        for i, (acc, n) in enumerate(zip(self.accepted, self.reached)):
            prior = mean if self.prior_means is None else self.prior_means[i]  # the history's, when there is one
            mean = (acc + strength * prior) / (n + strength)
            estimates.append(mean)
        return tuple(estimates)

    def expected_tokens(self) -> tuple[float, ...]:
        """E(k) for k = 0..B-1: expected committed tokens when k drafts are verified."""
        expected, survive = [1.0], 1.0
        for p in self.acceptance():
            survive *= p
            expected.append(expected[-1] + survive)
        return tuple(expected)

    def rates(self, rows: int = 1) -> tuple[float, ...]:
        """Expected committed tokens per second, E(k) * rows / T(k, rows), for k = 0..B-1."""
        return tuple(e * rows / self.costs.step(k, rows) for k, e in enumerate(self.expected_tokens()))

    # ---- decisions ---------------------------------------------------------------------------
    def choose(self, rows: int = 1) -> int:
        """k for this step (one for all `rows` rows of the batch); retries drafting within the time budget."""
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        rates = self.rates(rows)
        best = max(range(len(rates)), key=lambda k: (rates[k], -k))  # ties: the cheaper step
        paid_off = self._retry_paid_off()
        self.retry, self.retry_accepted = (0, 0), 0
        if best > 0:
            self.plain_s = 0.0
            return best
        if self.block_size == 1:
            return 0
        retry = max(range(1, len(rates)), key=lambda k: (rates[k], -k))  # the best k >= 1 today
        plain = self.costs.step(0, rows)
        if paid_off or self.plain_s * self.explore_share >= self.costs.step(retry, rows) - plain:
            self.plain_s, self.retry = 0.0, (retry, rows)  # the retry spends the budget the plain steps earned
            return retry
        self.plain_s += plain
        return 0

    @property
    def exploring(self) -> bool:
        """Whether the k last chosen is a budgeted retry (drafting to learn), not the best rate."""
        return self.retry[0] > 0

    def _retry_paid_off(self) -> bool:
        """Whether the last step was a retry whose rows accepted at least half their drafts on average.

        Not "any draft accepted": in a batch one row's lucky draft would keep every row drafting. Not
        "as fast as plain steps" either: a retry verifies few drafts (often k = 1), which on a CPU
        cannot pay for its drafter pass even when all are right, and recovery would wait for the budget.
        """
        k, rows = self.retry
        return k > 0 and 2 * self.retry_accepted >= k * rows

    def observe(self, k_verified: int, accepted: int, next_confidence: float | None = None) -> None:
        """One row's outcome: `accepted` of the `k_verified` drafts it verified were accepted.

        `next_confidence`: when the step drafted more than it verified (`trim`), the drafter's confidence in
        the first draft left unverified. A row that accepted every verified draft reached that position,
        and it counts as reached with the confidence as its (expected) acceptance: a trimmed step is then
        evidence like any other, not only the confident drafts that were verified (whose acceptance alone
        would flatter the drafter). With k_verified = 0 (all trimmed) the step is a drafting step too.
        """
        if not 0 <= accepted <= k_verified <= self.block_size - 1:
            raise ValueError(f"observed {accepted} accepted of {k_verified} verified drafts; expected "
                             f"0 <= accepted <= verified <= {self.block_size - 1}")
        if next_confidence is not None and not (0.0 <= next_confidence <= 1.0 and k_verified < self.block_size - 1):
            raise ValueError(f"next_confidence must be in [0, 1] for a draft past the {k_verified} verified, "
                             f"got {next_confidence} (block {self.block_size})")
        drafted = k_verified > 0 or next_confidence is not None
        # evidence (prior included) ages: by `memory` per observed drafting row, by IDLE_MEMORY per plain
        # step (which says nothing about the drafter), so a retry's outcome outweighs old rejections
        decay = self.memory if drafted else IDLE_MEMORY
        self.prior_weight *= decay
        for i in range(self.block_size - 1):
            self.reached[i] *= decay
            self.accepted[i] *= decay
        if not drafted:
            return
        if self.history is not None:
            self.history.record(k_verified, accepted, next_confidence)
        self.retry_accepted += accepted
        for i in range(min(accepted + 1, k_verified)):  # positions 1..a accepted, a+1 (if verified) rejected
            self.reached[i] += 1.0
            self.accepted[i] += 1.0 if i < accepted else 0.0
        if next_confidence is not None and accepted == k_verified:
            self.reached[k_verified] += 1.0
            self.accepted[k_verified] += next_confidence

    def trim(self, k: int, confidences: Sequence[float] | torch.Tensor) -> int:
        """Shorten a chosen k using the drafter's own confidence in each draft (`draft_confidence`). Pure.

        confidences [k'] or [rows, k'] (k' >= k): the drafter's softmax probability of its argmax at draft
        positions 1..k' of each row, taken as acceptance probabilities: E_j = sum over rows of
        1 + sum_{m<=j} prod_{i<=m} c_i, over T_j = the drafting already paid for k drafts + verify(rows
        (j + 1)). Returns the j in 0..k with the best E_j / T_j (ties: the shorter): a position is kept while
        its expected tokens pay for its marginal verify time at the step's rate; j = 0 is a plain step.
        Only as good as the drafter's calibration.
        """
        values = torch.as_tensor(confidences, dtype=torch.float64).cpu()
        values = values.reshape(1, -1) if values.dim() < 2 else values
        rows = values.shape[0]
        if not 0 <= k <= min(values.shape[1], self.block_size - 1):
            raise ValueError(f"trim needs 0 <= k <= {self.block_size - 1} and a confidence per draft; "
                             f"got k={k} with confidences of shape {tuple(values.shape)}")
        if k == 0:
            return 0
        survive = values[:, :k].clamp(0.0, 1.0).cumprod(dim=1).sum(dim=0)  # [k]: expected accepted, per depth
        expected = [float(rows)] + (rows + survive.cumsum(dim=0)).tolist()  # E_j, j = 0..k
        sunk = self.costs.step(k, rows) - self.costs.verify(rows * (k + 1))  # the drafter pass, read-out
        rates = [e / (sunk + self.costs.verify(rows * (j + 1))) for j, e in enumerate(expected)]
        return max(range(k + 1), key=lambda j: (rates[j], -j))

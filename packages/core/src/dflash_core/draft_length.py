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

import copy
import hashlib
import json
import math
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from transformers import DynamicCache

from .draft_sampling import DraftSampler, speculative_accept
from .draft_vocab import read_out_for, sampling_head_for
from .profiling import sync_device
from .sampling import SamplingParams, choose_tokens, warp_logits
from .target import TargetModel
from .target_cache import truncate_cache

PRIOR = (2.0, 1.0)  # Beta(accepted, rejected) pseudo-counts per draft position: mean 2/3
IDLE_MEMORY = 0.98  # evidence kept per plain step: rejections seen 35 plain steps ago weigh half
MIN_PRIOR_WEIGHT = 0.05  # the prior never fades below 0.15 pseudo-counts (keeps unreached positions defined)
EXPLORE_SHARE = 0.05  # retries while settled on k = 0 may cost this share of the plain steps' time
HISTORY_MEMORY = 0.99  # a process's acceptance history keeps ~100 drafting rows (a few requests)
HISTORY_EVIDENCE = 3.0  # first-draft verifications the history needs before it replaces the Beta(2, 1) start
SPOT_TOLERANCE = 1.25  # a cached cost table is measured again when a spot check now is this much faster
GREEDY = SamplingParams()


@dataclass(frozen=True)
class VerifyCostTable:
    """Measured step costs on one machine, for one target/drafter pair, at batch 1."""

    seconds: tuple[float, ...]
    """seconds[q-1]: a target forward over q new tokens (q = 1..B), logits and argmax included; > 0."""
    draft_s: float
    """One drafter pass over a block of B positions, without the LM head; >= 0."""
    head_s: float = 0.0
    """The target's LM head + argmax over one more draft position (drafts are read only for k positions)."""

    def __post_init__(self) -> None:
        if not self.seconds or not all(math.isfinite(s) and s > 0 for s in self.seconds):
            raise ValueError(f"verify cost table needs one positive time per block position, got {self.seconds}")
        if not (math.isfinite(self.draft_s) and self.draft_s >= 0):
            raise ValueError(f"drafter pass time must be >= 0 seconds, got {self.draft_s}")
        if not (math.isfinite(self.head_s) and self.head_s >= 0):
            raise ValueError(f"per-draft LM-head time must be >= 0 seconds, got {self.head_s}")

    @property
    def block_size(self) -> int:
        return len(self.seconds)

    def verify(self, q: int) -> float:
        """Seconds of a target forward over q new tokens; past the table, extended linearly."""
        if q < 1:
            raise ValueError(f"a target forward covers at least 1 token, got {q}")
        if q <= len(self.seconds):
            return self.seconds[q - 1]
        return self.seconds[-1] + (q - len(self.seconds)) * self.marginal_s

    @property
    def marginal_s(self) -> float:
        """Mean cost of one more token over the table (the slope used to extend it)."""
        if len(self.seconds) == 1:
            return self.seconds[0]
        return max(0.0, (self.seconds[-1] - self.seconds[0]) / (len(self.seconds) - 1))

    def step(self, k: int, rows: int = 1) -> float:
        """T(k): seconds of a step verifying k drafts per row for `rows` rows (drafter pass if k > 0)."""
        verify = self.verify(rows * (k + 1))
        return verify if k == 0 else self.drafting(k, rows) + verify

    def drafting(self, k: int, rows: int = 1) -> float:
        """Seconds of a step's drafter work: its pass for `rows` rows, reading out k drafts per row."""
        scale = self.verify(rows * self.block_size) / self.seconds[-1]  # a batch's pass ~ a wider forward
        return (self.draft_s + k * self.head_s) * scale

    def relative(self) -> tuple[float, ...]:
        """Verify times as multiples of the one-token forward (1.0 first): the shape of the table."""
        return tuple(s / self.seconds[0] for s in self.seconds)

    def to_dict(self) -> dict:
        return {"seconds": list(self.seconds), "draft_s": self.draft_s, "head_s": self.head_s}

    @classmethod
    def from_dict(cls, data: dict) -> "VerifyCostTable":
        try:
            return cls(seconds=tuple(float(s) for s in data["seconds"]), draft_s=float(data["draft_s"]),
                       head_s=float(data.get("head_s", 0.0)))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"not a verify cost table ({error}): expected {{'seconds': [...], 'draft_s': x}}") \
                from None


class _StepTimer:
    """The pair after a cached context of `context` random tokens, ready to time a verify forward over q
    new tokens (then back to the context) and a drafting step (on a drafter context made by `fresh_context`)."""

    def __init__(self, target, drafter, block_size: int, context: int, sampling: SamplingParams | None = None) -> None:
        if not 1 <= block_size <= drafter.config.block_size:
            raise ValueError(f"block_size {block_size} is outside 1..{drafter.config.block_size} (the drafter's block)")
        if context < 1:
            raise ValueError(f"context must be >= 1, got {context}")
        model = target.model if isinstance(target, TargetModel) else target
        self.target = TargetModel(model, drafter.config.target_layer_ids)  # features the drafter reads
        self.drafter, self.context, self.device = drafter, context, self.target.device
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, self.target.vocab_size, (1, context + block_size), generator=generator).to(self.device)
        self.positions = torch.arange(context + block_size, device=self.device)[None]  # [1, C + B]
        self.cache = DynamicCache()
        self.out = self.target(self.ids[:, :context], self.positions[:, :context], self.cache)
        masks = torch.full((1, block_size - 1), drafter.config.mask_token_id, dtype=torch.long, device=self.device)
        self.noise = self.target.embed(torch.cat([self.ids[:, context - 1 : context], masks], dim=1))  # [1, B, H]
        self.sampling = None if sampling is None or sampling.greedy else sampling
        self.generator = torch.Generator(device=self.device).manual_seed(0) if self.sampling else None
        if self.sampling is None:
            self.read_out = read_out_for(drafter, self.target)
        else:  # drafts drawn from q over the whole vocabulary, kept by rejection against p
            self.read_out = DraftSampler(sampling_head_for(drafter, self.target), self.sampling, self.generator)
            hidden = self.target(self.ids[:, context:], self.positions[:, context:], self.cache).hidden
            self.target_probs = warp_logits(self.target.logits(hidden), self.sampling).softmax(dim=-1)  # [1, B, V]
            truncate_cache(self.cache, context)
        self.dcache = None

    def verify(self, q: int) -> None:
        c = self.context
        hidden = self.target(self.ids[:, c : c + q], self.positions[:, c : c + q], self.cache).hidden
        choose_tokens(self.target.logits(hidden), self.sampling or GREEDY, self.generator)  # [1, q]: the target's choices
        truncate_cache(self.cache, c)  # back to the context

    def fresh_context(self) -> None:
        c = self.context
        # a round's two draft() calls inject 1 token each, and the block's K/V go after the context as in decoding
        self.dcache = self.drafter.new_cache(1, c + 2 + self.drafter.config.block_size)
        self.drafter.extend_cache(self.dcache, self.out.features, self.positions[:, :c], [c])

    def draft(self, k: int) -> None:
        c = self.context
        drafts = self.drafter.propose(self.dcache, self.noise, self.positions[:, c:], self.read_out, k)  # [1, k]
        probs = self.read_out.take() if self.sampling is not None else None  # None: a backend read out greedily
        if probs is not None:  # the rejection test of sampled drafts is drafting's cost too
            speculative_accept(drafts, probs, self.target_probs[:, : k + 1], self.generator)
        self.drafter.extend_cache(self.dcache, self.out.features[:, -1:], self.positions[:, c - 1 : c], [1])

    def fastest(self, items: list, repeats: int) -> list[float]:
        """Each (function, argument) item timed once per round, in `repeats` interleaved rounds after a
        warm-up round, keeping its fastest time; rounds with drafting steps start the drafter's context afresh."""
        drafting = any(run == self.draft for run, _ in items)
        best = [math.inf] * len(items)
        for round_ in range(repeats + 1):  # round 0 warms up
            if drafting:
                self.fresh_context()
                sync_device(self.device)  # a GPU's queued context work must not land in the first item's time
            for i, (run, arg) in enumerate(items):
                started = time.perf_counter()
                run(arg)
                sync_device(self.device)
                if round_:
                    best[i] = min(best[i], time.perf_counter() - started)
        return best


@torch.inference_mode()
def measure_cost_table(target, drafter, block_size: int, *, context: int = 64, repeats: int = 5,
                       sampling: SamplingParams | None = None) -> VerifyCostTable:
    """Times of the target verify forward for q = 1..block_size and of one drafting step.

    `sampling` (not greedy): the steps as a sampling request pays them, the target's choice a draw from
    its warped distribution, the drafts sampled from q over the whole vocabulary and tested against p
    (`draft_sampling`). On the demo pair (fp32, AVX2-only EPYC) a drafting step at T=1 verifying 12 drafts
    measured 2.91 plain steps in decoding against 2.14 in the greedy table: a policy costing T=1 steps from
    the greedy table drafted where it lost.

    `target` is a TargetModel or a Hugging Face causal LM; both models as they will decode
    (device, dtype, threads), after a cached context of `context` tokens. Every item (each q, a
    drafting step reading out 1 and B-1 drafts) is timed once per round, in `repeats` interleaved
    rounds after a warm-up round, and keeps its fastest time: a burst of other work on the machine
    then spoils one round of every item rather than all rounds of one. The table is made
    non-decreasing in q (a forward over more tokens is never cheaper). A drafting step is what the
    decoder pays for drafting: the block pass, the read-out and the KV injection of one token. Each
    round starts the drafter's context afresh, so every round drafts over the same context lengths as
    the warm-up: the steady state of a process that meets those lengths again. (The first pass over a
    new length builds kernels for it: in bf16 on an AVX512-BF16 CPU that added ~1.2 ms to a 1.3 ms
    pass, and a table timed over ever-growing contexts read a drafting step at 0.36-0.56 target
    tokens from one run to the next; timed this way, 0.36-0.38.)
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    timer = _StepTimer(target, drafter, block_size, context, sampling)
    items = [(timer.verify, q) for q in range(1, block_size + 1)]
    best = timer.fastest(items + [(timer.draft, 1), (timer.draft, max(1, block_size - 1))], repeats)
    seconds = best[:block_size]
    for q in range(1, block_size):  # more tokens never cost less
        seconds[q] = max(seconds[q], seconds[q - 1])
    one, full = best[block_size], best[block_size + 1]
    head_s = max(0.0, (full - one) / (block_size - 2)) if block_size > 2 else 0.0
    return VerifyCostTable(seconds=tuple(seconds), draft_s=max(0.0, one - head_s), head_s=head_s)


@torch.inference_mode()
def spot_times(target, drafter, block_size: int, *, context: int = 64, repeats: int = 3,
               sampling: SamplingParams | None = None) -> tuple[float, float]:
    """(seconds of a verify forward over 1 token, over `block_size` tokens), timed now as the table is:
    the check that a cached table still describes this machine (a few forwards, not the whole table)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    timer = _StepTimer(target, drafter, block_size, context, sampling)
    one, full = timer.fastest([(timer.verify, 1), (timer.verify, block_size)], repeats)
    return one, full


def table_is_stale(table: VerifyCostTable, one: float, full: float, *, tolerance: float = SPOT_TOLERANCE) -> bool:
    """Whether spot times taken now (`spot_times`) say the table was measured on a busier machine: the
    one-token or the whole-block verify now faster than the table's by more than `tolerance` times.
    Slower now says this moment is busy, not that the table is wrong, and the table is kept: the draft
    length follows the table's shape (k* = argmax E(k) / T(k) does not change when every T scales), and a
    busy moment's shape is the one to distrust (a table measured beside a training run read every verify
    width 2..16 at 1.10x one token, against ~1.22x at rest). On the demo pair (bf16, AVX512-BF16 EPYC),
    spot one-token times read 0.93-1.10x the cached table's in one quiet minute and 1.1-1.8x in the next,
    with nothing else of ours running: a shared machine's own swings, which must not re-measure every process."""
    return one * tolerance < table.seconds[0] or full * tolerance < table.seconds[-1]


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


_HISTORIES: "weakref.WeakKeyDictionary[object, dict[str, AcceptanceHistory]]" = weakref.WeakKeyDictionary()


def saved_histories(drafter) -> dict[str, AcceptanceHistory]:
    """A copy of this process's acceptance histories for `drafter` (every source), for `restore_histories`."""
    return copy.deepcopy(_HISTORIES.get(drafter, {}))


def restore_histories(drafter, saved: dict[str, AcceptanceHistory]) -> None:
    """Make `drafter`'s histories what `saved_histories` copied (a copy again: `saved` stays reusable).

    For benchmarks: each method keeps its own history and every repeat of a request starts from the same
    one, as in a process that serves only that method and sees each request once."""
    _HISTORIES[drafter] = copy.deepcopy(saved)


def history_for(drafter, source: str = "drafter") -> AcceptanceHistory:
    """This process's acceptance history of greedy requests' `source` ("drafter", or "lookup": context
    lookup beside this drafter). Lives as long as the drafter object does."""
    histories = _HISTORIES.setdefault(drafter, {})
    if source not in histories:
        histories[source] = AcceptanceHistory(drafter.config.block_size - 1)
    return histories[source]


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


# ---- the table for a pair, measured once per machine ----------------------------------------------
COST_FILE = "cost_tables.json"
# in the cache key: tables measured by an earlier `measure_cost_table`, or of an earlier, dearer drafting step
# (3: the drafter's block pass with fewer dispatched ops and the block's K/V in the cache's free slots; 4: the
# target's multi-token verify on the CPU without a K/V copy per query group, `grouped_attention`), are measured again
COST_METHOD = 4
_MEASURED: dict[tuple, VerifyCostTable] = {}


def cost_table_for(target: TargetModel, drafter, *, sampling: SamplingParams | None = None, cache_dir=None,
                   spot=spot_times) -> VerifyCostTable:
    """The pair's cost table: from this process, else the user's cache directory, else measured now.

    Keyed by machine (CPU and ISA flags or GPU, torch, threads), target config, dtype, device, the
    drafter's config, backend, read-out vocabulary size and weight format, the target's prepacked layers,
    and how tokens are chosen (`sampling`: greedy, or sampled with or without top-p / top-k filtering,
    whose sort costs time; the temperature's value costs nothing). A few seconds on the demo pair the first time.
    A cached table is first checked against `spot(target, drafter, block)` (one- and whole-block verify
    times now, a few forwards), since the key cannot see how busy the machine was when the table was
    measured: when now is clearly faster (`table_is_stale`) the table is measured again, used and cached
    (it replaces the cached one only if its one-token verify is the faster, so noise never swaps a table
    measured at rest for a busier one).
    """
    from .auto_dtype import default_cache_dir, machine_key, model_key, read_cache, write_cache
    from .dtypes import short_name

    block = drafter.config.block_size
    drafter_hash = hashlib.sha256(json.dumps(drafter.config.to_dict(), sort_keys=True, default=str).encode())
    key = (f"{machine_key(target.device)}|model={model_key(target.model, block)[:16]}|dtype={short_name(target.dtype)}"
           f"|device={target.device}|drafter={drafter_hash.hexdigest()[:16]}|backend={type(drafter).__name__}"
           f"|readout={len(getattr(drafter, 'draft_vocab', None) or ()) or 'all'}|method={COST_METHOD}"
           f"{_choice_key(sampling)}{_weights_key(drafter)}{_target_key(target)}")
    if key in _MEASURED:
        return _MEASURED[key]
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    stored = read_cache(cache_dir, COST_FILE)
    try:
        cached = VerifyCostTable.from_dict(stored[key])
    except (KeyError, ValueError, TypeError, AttributeError):
        cached = None
    sampling = None if sampling is None or sampling.greedy else sampling
    spotted = (lambda: spot(target, drafter, block)) if sampling is None else (
        lambda: spot(target, drafter, block, sampling=sampling))
    if cached is not None and cached.block_size == block and not table_is_stale(cached, *spotted()):
        table = cached
    else:
        table = measure_cost_table(target, drafter, block, sampling=sampling)
        if cached is None or cached.block_size != block or table.seconds[0] < cached.seconds[0]:
            stored[key] = table.to_dict()
            write_cache(cache_dir, stored, COST_FILE)
    _MEASURED[key] = table
    return table


def _weights_key(drafter) -> str:
    """The key's part for how the drafter reads its weights: empty when plain (the keys tables had before)."""
    weight_format = getattr(drafter, "weight_format", "plain")
    return "" if weight_format == "plain" else f"|weights={weight_format}"


def _target_key(target: TargetModel) -> str:
    """The key's part for the target's linear layers: empty when plain, else how many run prepacked
    (`prepacked_linear`: the same numbers, other times)."""
    from .prepacked_linear import is_prepacked

    packed = sum(is_prepacked(m) for m in target.model.modules())
    return f"|prepacked={packed}" if packed else ""


def _choice_key(sampling: SamplingParams | None) -> str:
    """The cache key's part for how tokens are chosen: empty when greedy (the keys tables had before)."""
    if sampling is None or sampling.greedy:
        return ""
    return "|choice=sample" + ("+top_k" if sampling.top_k > 0 else "") + ("+top_p" if sampling.top_p < 1 else "")

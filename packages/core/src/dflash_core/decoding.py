"""The lossless DFlash decode loop: the reference every engine adapter is checked against.

One step, for every active row:
  0. choose  k, the drafts to verify (0..B-1): `DraftLengthPolicy` weighs this machine's cost of
             verifying k+1 tokens against the acceptance seen so far; k = 0 is a plain target step.
  1. draft   the block [last token, MASK x (B-1)] in ONE drafter pass over the cached context;
             the draft tokens are the argmax of the target's LM head at block positions 1..k
             (when sampling: draws from that head's warped distribution q, `draft_sampling`).
             (Or, where the row's latest n-gram recurs in its history and that source promises
             more tokens per second, copy what followed it: `context_lookup`, no model pass.)
  2. verify  [last token, d_1 .. d_k] in ONE target pass; at each position i the target
             chooses y_i (argmax, or a sample from its warped distribution).
  3. accept  the longest prefix with d_{i+1} == y_i, then y_a itself (a = accepted drafts).
Whatever k is, every committed token is the target's own choice, so k changes speed, never output.
Greedy: y is the target's argmax, so the output equals the target's greedy decoding.
Sampling, drafts from the drafter: d_{i+1} ~ q_{i+1} is kept with probability min(1, p_i/q_{i+1}),
and the first rejection commits a draw from the residual max(0, p_i - q_{i+1}) instead
(`draft_sampling.speculative_accept`). Copies from the context (and drafts a backend read out
greedily by itself) are one-hot: y_i ~ p(. | prefix, d_1..d_i) and d_{i+1} is kept only when it
equals y_i. Both are exact rejection sampling: every committed token is a draw from the target's
own conditional, so the output distribution is the target's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

from .context_lookup import NgramIndex, free_drafting
from .cost_table import cost_table_for
from .draft_length import DraftLengthPolicy, history_for
from .draft_sampling import DraftSampler, speculative_accept
from .draft_confidence import ConfidentReadOut, confident_read_out
from .draft_vocab import read_out_for, sampling_head_for
from .drafter_backend import DrafterBackend
from .errors import GenerationError
from .pairing import check_compatibility
from .profiling import DecodeProfile, PhaseClock, StepRecord
from .request_checks import check_request, split_prompts
from .sampling import SamplingParams, choose_tokens, make_generator, warp_logits
from .target import TargetModel
from .target_cache import TargetCache


@dataclass
class GenerationResult:
    """What `generate` returns: outputs only, one list per prompt row (timings: `DecodeProfile`)."""

    tokens: list[list[int]]
    acceptance_lengths: list[list[int]]
    """Tokens committed by each verify step of the row (accepted drafts + the target's own token)."""
    finish_reasons: list[str]
    """"stop" (a stop token was emitted) or "length" (max_new_tokens reached), per row."""

    @property
    def num_new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tau(self) -> float:
        """Mean tokens committed per verify step (0.0 when no step ran)."""
        steps = [a for row in self.acceptance_lengths for a in row]
        return sum(steps) / len(steps) if steps else 0.0

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "acceptance_lengths": self.acceptance_lengths,
                "finish_reasons": self.finish_reasons, "tau": self.tau}


def commit_tokens(new: list[int], remaining: int, stops: frozenset[int]) -> tuple[list[int], str | None]:
    """Cut a row's newly accepted tokens at max_new_tokens and after the first stop token."""
    for i, token in enumerate(new[:remaining]):
        if token in stops:
            return new[: i + 1], "stop"
    kept = new[:remaining]
    return kept, ("length" if len(kept) == remaining else None)


@dataclass
class _Rows:
    """Per-row bookkeeping of the active batch (index i of every list = active row i)."""

    ids: list[int]  # original row of each active row
    remaining: list[int]  # tokens each row may still emit
    last: torch.Tensor  # [B] the newest committed token, not yet seen by the target


class DecodeStream:
    """Iterate to get each step's newly committed tokens (one list per prompt row); then `.result`."""

    def __init__(self, decoder: "_Decoder") -> None:
        self._decoder = decoder

    @property
    def result(self) -> GenerationResult:
        """Everything committed so far (complete once iteration has ended)."""
        return self._decoder.result

    def __iter__(self) -> Iterator[list[list[int]]]:
        return _run(self._decoder)


def generate(target, drafter: DrafterBackend, input_ids: torch.Tensor, *, max_new_tokens: int,
             temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
             stop_token_ids: Sequence[int] | None = None, attention_mask: torch.Tensor | None = None,
             seed: int | None = None, draft_length: int | str | DraftLengthPolicy = "auto",
             context_lookup: bool = True, confidence_trim: bool = False,
             profile: DecodeProfile | None = None) -> GenerationResult:
    """Speculatively decode `input_ids` [B, T] with `drafter`; output is exactly the target's.

    `draft_length`: drafts verified per step; "auto" (default) lets `DraftLengthPolicy` choose k in
    0..B-1 each step from this machine's cost table and the acceptance seen so far (k = 0 is a plain
    target step); an int fixes it; a `DraftLengthPolicy` of your own (e.g. over another cost table)
    is used as is. Any choice is lossless.
    `context_lookup`: with a policy (not a fixed k), also draft by copying what followed the row's
    latest n-gram earlier in its prompt or output, whenever that source promises more tokens per second
    (`dflash_core.context_lookup`); lossless too.
    `confidence_trim`: with a policy and greedy decoding, verify only the drafts the drafter's own
    confidence says pay for their verify time (`dflash_core.draft_confidence`; none: a plain step).
    Off by default: on the AVX2-only CPU it measured no faster end to end (docs/benchmarks.md).
    `profile`: a `DecodeProfile` to fill with per-phase timings (off by default: no clocks, no syncs).
    """
    stream = generate_stream(target, drafter, input_ids, max_new_tokens=max_new_tokens, temperature=temperature,
                             top_p=top_p, top_k=top_k, stop_token_ids=stop_token_ids,
                             attention_mask=attention_mask, seed=seed, draft_length=draft_length,
                             context_lookup=context_lookup, confidence_trim=confidence_trim, profile=profile)
    for _ in stream:
        pass
    return stream.result


def generate_stream(target, drafter: DrafterBackend, input_ids: torch.Tensor, *, max_new_tokens: int,
                    temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                    stop_token_ids: Sequence[int] | None = None, attention_mask: torch.Tensor | None = None,
                    seed: int | None = None, draft_length: int | str | DraftLengthPolicy = "auto",
                    context_lookup: bool = True, confidence_trim: bool = False,
                    profile: DecodeProfile | None = None) -> DecodeStream:
    """Like `generate`, yielding each step's committed tokens as they are accepted.

    Arguments are validated here, before the first step runs.
    """
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    target = as_target(target, drafter)
    prompts = split_prompts(input_ids, attention_mask)
    check_request(target, prompts, max_new_tokens)
    generator = make_generator(params, seed, target.device)
    policy = _draft_length_policy(draft_length, target, drafter, params)
    lookup = None
    if context_lookup and isinstance(policy, DraftLengthPolicy):
        history = history_for(drafter, "lookup") if policy.history is not None else None
        lookup = DraftLengthPolicy(free_drafting(policy.costs), policy.block_size, history=history)
    trim = confidence_trim and isinstance(policy, DraftLengthPolicy)
    return DecodeStream(_Decoder(target, drafter, prompts, max_new_tokens, params, frozenset(stop_token_ids or ()),
                                 generator, policy, profile, lookup, trim))


def _draft_length_policy(draft_length: int | str | DraftLengthPolicy, target: TargetModel, drafter: DrafterBackend,
                         params: SamplingParams):
    """A DraftLengthPolicy for "auto" (or the caller's own policy), else the fixed k, checked against the block.
    "auto" costs steps as this request pays them: a sampling request's table includes drawing and testing."""
    block = drafter.config.block_size
    if isinstance(draft_length, DraftLengthPolicy):
        if draft_length.block_size != block:
            raise GenerationError(f"the draft-length policy is for blocks of {draft_length.block_size}, "
                                  f"the drafter's block is {block}.")
        return draft_length
    if draft_length == "auto":
        # greedy requests start from what earlier ones saw (k never changes a greedy output); a sampling
        # request does not: which tokens its seed draws depends on k, and a seed must reproduce its sample
        history = history_for(drafter) if params.greedy else None
        return DraftLengthPolicy(cost_table_for(target, drafter, sampling=params), block, history=history)
    if isinstance(draft_length, bool) or not isinstance(draft_length, int) or not 0 <= draft_length < block:
        raise GenerationError(f"draft_length is {draft_length!r}, expected 'auto' or an integer in [0, {block - 1}] "
                              f"(the drafter's block is {block}).")
    return draft_length


def as_target(target, drafter: DrafterBackend) -> TargetModel:
    """Wrap a Hugging Face model (or re-point an adapter) at the drafter's feature layers, checked."""
    if not isinstance(target, TargetModel):
        target = TargetModel(target)
    check_compatibility(drafter.config, target)
    if target.layer_ids != drafter.config.target_layer_ids:
        target = TargetModel(target.model, drafter.config.target_layer_ids)
    drafter.check_runtime(target)
    return target


@torch.inference_mode()
def _run(decoder: "_Decoder") -> Iterator[list[list[int]]]:
    """Drive a decoder: prefill, then one draft-verify-accept step per iteration."""
    yield decoder.prefill()
    clock = PhaseClock(decoder.profile, decoder.device)
    clock.start()
    while decoder.rows.ids:
        yield decoder.step()
    clock.charge("decode_s")


class _Decoder:
    """One generate() call: owns both caches and the per-row state of the active batch."""

    def __init__(self, target: TargetModel, drafter: DrafterBackend | None, prompts: list[list[int]], max_new_tokens: int,
                 params: SamplingParams, stops: frozenset[int], generator: torch.Generator | None,
                 policy: DraftLengthPolicy | int, profile: DecodeProfile | None,
                 lookup: DraftLengthPolicy | None = None, trim: bool = False) -> None:
        self.target, self.drafter, self.params, self.stops = target, drafter, params, stops
        self.lookup = lookup  # the context-lookup source's policy (None: drafter drafts only)
        self.shadow: list[list[int]] | None = None  # this step's lookup copies when the drafter drafts instead (greedy)
        self.histories = [NgramIndex(p) for p in prompts] if lookup is not None else []  # per original row
        self.prompts, self.max_new_tokens = prompts, max_new_tokens
        self.device = target.device
        self.generator, self.profile, self.policy = generator, profile, policy
        self.clock = PhaseClock(profile, self.device)
        batch = len(prompts)
        self.block = drafter.config.block_size if drafter is not None else 1  # no drafter: the target alone
        self.result = GenerationResult([[] for _ in prompts], [[] for _ in prompts], ["length"] * batch)
        self.tcache = TargetCache(batch)
        self.dcache = None if drafter is None else drafter.new_cache(
            batch, max(len(p) for p in prompts) + max_new_tokens + self.block)
        self.rows = _Rows(ids=list(range(batch)), remaining=[max_new_tokens] * batch,
                          last=torch.zeros(batch, dtype=torch.long, device=self.device))
        self.offsets = torch.arange(self.block, device=self.device)
        mask_id = drafter.config.mask_token_id if drafter is not None else 0
        self.masks = torch.full((1, self.block - 1), mask_id, dtype=torch.long, device=self.device)
        self.no_drafts = torch.zeros((batch, 0), dtype=torch.long, device=self.device)
        # hidden -> draft tokens: the argmax over the drafter's read-out list (if any) when greedy; when
        # sampling, draws from q over the whole vocabulary (held-out tau at T=1, demo pair: 1.36 over all
        # 8,192 ids, 1.31 over the 1,920 listed), or over the list for a drafter trained over it only
        if drafter is None:
            self.read_out = None
        elif params.greedy and trim:  # the same drafts, with the drafter's confidence in each (`_trim`)
            self.read_out = confident_read_out(drafter, target)
        elif params.greedy:
            self.read_out = read_out_for(drafter, target)
        else:
            self.read_out = DraftSampler(sampling_head_for(drafter, target), params, generator)
        # features [B, n, F], positions [B, n] and per-row counts of the tokens that steps without a
        # drafter pass committed (plain steps, lookup steps), injected into the drafter's context only
        # before its next draft: one projection for many steps, none if the drafter never drafts again
        self.pending: list[tuple[torch.Tensor, torch.Tensor, list[int]]] = []
        # the prompts' features [B, T, F], positions [B, T] and lengths, injected at the first draft too:
        # a request that ends (or never drafts) before then costs the drafter nothing
        self.prompt_features: tuple[torch.Tensor, torch.Tensor, list[int]] | None = None

    def prefill(self) -> list[list[int]]:
        """Run the prompts (right-padded) through the target; fill both caches; commit the first tokens."""
        self.clock.start()
        lengths = [len(p) for p in self.prompts]
        width = max(lengths)
        ids = torch.tensor([p + [p[-1]] * (width - len(p)) for p in self.prompts], device=self.device)
        positions = torch.arange(width, device=self.device).expand(len(self.prompts), -1)
        valid = None if min(lengths) == width else positions < torch.tensor(lengths, device=self.device)[:, None]
        out = self.target(ids, positions, self.tcache.cache, self.tcache.attention_mask(self.target, positions, valid))
        self.tcache.commit(width, lengths)
        if self.drafter is not None:
            self.prompt_features = (out.features, positions, lengths)
        last = out.hidden[torch.arange(len(lengths), device=self.device), torch.tensor(lengths, device=self.device) - 1]
        self.rows.last = choose_tokens(self.target.logits(last), self.params, self.generator)
        emitted = self._emit([[t] for t in self.rows.last.tolist()], verified=False)
        self.clock.charge("prefill_s")
        return emitted

    def step(self) -> list[list[int]]:
        """Draft one block per row, verify its first k drafts in one target pass, commit what the target agrees with."""
        clock, rows = self.clock, self.rows
        k = self._draft_length()
        clock.start()
        copied = self._lookup_drafts(k)  # per row, or None: the drafter (or no one) drafts
        if copied is not None:
            k = max(len(c) for c in copied)
        block_positions = torch.tensor(self.tcache.lengths, device=self.device)[:, None] + self.offsets  # [B, Q]
        draft_probs = None  # q [B, k, V] of sampled drafts (`draft_sampling`); None: one-hot drafts
        cut = None  # per row, the confidence of the first draft trimmed away (None: nothing trimmed)
        if copied is not None:  # rows with a shorter copy are padded with their last token (rejected or not, exact)
            drafts = torch.tensor([c + [last] * (k - len(c)) for c, last in zip(copied, rows.last.tolist())],
                                  dtype=torch.long, device=self.device)
        elif k:
            self._inject_pending()
            drafts, draft_probs = self._draft(k, block_positions)
            k, drafts, cut = self._trim(k, drafts)
        else:
            drafts = self.no_drafts[: len(rows.ids)]  # [B, k]
        clock.charge("draft_s")
        positions = block_positions[:, : k + 1]  # [B, k+1]: the verified ones
        verify_ids = torch.cat([rows.last[:, None], drafts], dim=1)
        out = self.target(verify_ids, positions, self.tcache.cache, self.tcache.attention_mask(self.target, positions))
        logits = self.target.logits(out.hidden)  # [B, k+1, V]
        if draft_probs is None:
            chosen = choose_tokens(logits, self.params, self.generator)  # y_i, [B, k+1]
            # a = length of the longest prefix with d_{i+1} == y_i; then y_a is the target's own next token
            accepted = (drafts == chosen[:, :-1]).cumprod(dim=1).sum(dim=1)  # [B]
            bonus = chosen.gather(1, accepted[:, None])[:, 0]  # [B]
        else:
            target_probs = warp_logits(logits, self.params).softmax(dim=-1)
            accepted, bonus = speculative_accept(drafts, draft_probs, target_probs, self.generator)
        clock.charge("verify_s")
        host = torch.cat([accepted[:, None], bonus[:, None], drafts], dim=1).tolist()  # one device sync
        counts = [h[0] + 1 for h in host]  # block positions the target has now verified, per row
        self.tcache.commit(k + 1, counts)
        committed = [h[2 : 2 + h[0]] + [h[1]] for h in host]  # per row: accepted drafts + the target's token
        self._observe(k, copied, [h[0] for h in host], cut, committed)
        keep = max(counts)
        clock.start()
        # KV injection of the accepted tokens: drafter work, timed as drafting
        if self.drafter is not None and (k == 0 or copied is not None):  # no drafter pass: wait for the next
            self.pending.append((out.features[:, :keep], positions[:, :keep], counts))
        elif self.drafter is not None:
            self.drafter.extend_cache(self.dcache, out.features[:, :keep], positions[:, :keep], counts)
        clock.charge("draft_s")
        if self.profile is not None:
            self.profile.steps += 1
            self.profile.lookup_steps += copied is not None
            self.profile.trimmed_steps += cut is not None
            if self.profile.step_log is not None:
                # a drafter step trimmed to no drafts (`cut`) still paid the drafter's pass
                source = "lookup" if copied is not None else "drafter" if k or cut is not None else "plain"
                self.profile.step_log.append(StepRecord(source, k, tuple(counts)))
        rows.last = bonus
        return self._emit(committed, verified=True)

    def _inject_pending(self) -> None:
        """KV injection of the prompts (once), then of what steps without a drafter pass committed, in one
        projection (each row's tokens packed left: rows committed different numbers at a lookup step)."""
        if self.prompt_features is not None:
            self.drafter.extend_cache(self.dcache, *self.prompt_features)
            self.prompt_features = None
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
        self.drafter.extend_cache(self.dcache, features, positions, counts)
        self.pending = []

    def _draft_length(self) -> int:
        """k for this step: the policy's choice (or the fixed one), never more than a row can still emit.

        Without a drafter the policy is 0: every step is a plain target step over the whole batch."""
        k = self.policy.choose(len(self.rows.ids)) if isinstance(self.policy, DraftLengthPolicy) else self.policy
        return min(k, max(self.rows.remaining) - 1)

    def _lookup_drafts(self, k: int) -> list[list[int]] | None:
        """Each row's lookup copy (maybe []) when the lookup source drafts this step, else None.

        It drafts when its best k_l > 0 promises more tokens per second than a plain step and than the
        drafter's k, counting only the rows that have a copy (a row without one commits 1 token, its
        width wasted), or when its policy retries (budgeted exploration). Copies are cut to k_l.
        """
        self.shadow = None
        if self.lookup is None:
            return None
        rows, limit = self.rows, max(self.rows.remaining) - 1
        if limit < 1:
            return None
        copies = [self.histories[row].continuation(min(limit, self.block - 1)) for row in rows.ids]
        if not any(copies):
            return None
        batch = len(rows.ids)
        retry = self.lookup.choose(batch)  # its retry budget; its k assumes every row has a copy
        if self.lookup.exploring:
            return [c[:retry] for c in copies]
        # the step's expected tokens: E(min(k, copy length)) per row with a copy, 1 per row without
        expected = self.lookup.expected_tokens()
        rates = [sum(expected[min(j, len(c))] for c in copies) / self.lookup.costs.step(j, batch)
                 for j in range(len(expected))]
        best = max(range(1, len(rates)), key=lambda j: (rates[j], -j))
        # the drafter's rate at its k, recomputed: a policy of the caller's may override `choose`
        if rates[best] <= max(rates[0], self.policy.rates(batch)[k]):
            self.shadow = copies if self.params.greedy else None  # scored against what the target commits
            return None
        return [c[:best] for c in copies]

    def _observe(self, k: int, copied: list[list[int]] | None, accepted: list[int],
                 cut: list[float] | None = None, committed: list[list[int]] | None = None) -> None:
        """Each row's outcome to the policy of the source that drafted (a lookup step is idle time to the other);
        `cut`: per row the confidence of the first draft `_trim` left unverified. Where the lookup had a copy
        but the drafter drafted (greedy), the copy is scored against the tokens the target committed
        (`committed`, per row): what it would have had accepted, as far as those tokens tell."""
        if not isinstance(self.policy, DraftLengthPolicy):
            return
        for i, a in enumerate(accepted):
            if copied is None:
                self.policy.observe(k, a, None if cut is None else cut[i])
                if self.shadow and self.shadow[i] and committed is not None:
                    self.lookup.observe(*_shadow_outcome(self.shadow[i], committed[i]))
                continue
            self.policy.observe(0, 0)
            if copied[i]:  # padding past a row's copy is not the lookup's miss
                self.lookup.observe(len(copied[i]), min(a, len(copied[i])))

    def _trim(self, k: int, drafts: torch.Tensor) -> tuple[int, torch.Tensor, list[float] | None]:
        """(k, drafts [B, k], cut) after `DraftLengthPolicy.trim` by the drafter's confidences (greedy with a
        policy; not on a retry, which drafts to learn): the drafts kept, and per row the confidence of the
        first one dropped (None when none was)."""
        confidence = self.read_out.take() if isinstance(self.read_out, ConfidentReadOut) else None
        if confidence is None or self.policy.exploring:  # e.g. an ONNX graph that reads out by itself
            return k, drafts, None
        kept = self.policy.trim(k, confidence)
        if kept == k:
            return k, drafts, None
        return kept, drafts[:, :kept], confidence[:, kept].tolist()

    def _draft(self, k: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The drafter's first k drafts [B, k]: the whole block [last, MASK x (B-1)] at `positions` [B, Q] at once;
        with the distribution q [B, k, V] they were drawn from when sampled (None: greedy drafts)."""
        block_ids = torch.cat([self.rows.last[:, None], self.masks.expand(len(self.rows.ids), -1)], dim=1)
        drafts = self.drafter.propose(self.dcache, self.target.embed(block_ids), positions, self.read_out, k)
        return drafts, self.read_out.take() if isinstance(self.read_out, DraftSampler) else None

    def _emit(self, new_tokens: list[list[int]], verified: bool) -> list[list[int]]:
        """Record each active row's committed tokens; retire rows that stopped or hit the limit."""
        result, rows = self.result, self.rows
        emitted: list[list[int]] = [[] for _ in result.tokens]
        for i, row in enumerate(rows.ids):
            kept, finish = commit_tokens(new_tokens[i], rows.remaining[i], self.stops)
            result.tokens[row].extend(kept)
            if self.histories:
                self.histories[row].extend(kept)
            emitted[row] = kept
            if verified:
                result.acceptance_lengths[row].append(len(kept))
            rows.remaining[i] -= len(kept)
            if finish is not None:
                result.finish_reasons[row] = finish
                rows.remaining[i] = 0
        self._drop_finished()
        return emitted

    def _drop_finished(self) -> None:
        rows = self.rows
        keep = [i for i, r in enumerate(rows.remaining) if r > 0]
        if len(keep) == len(rows.ids):
            return
        rows.ids = [rows.ids[i] for i in keep]
        rows.remaining = [rows.remaining[i] for i in keep]
        if keep:
            rows.last = rows.last[torch.tensor(keep, device=self.device)]
            self.tcache.select_rows(keep)
            if self.dcache is not None:
                self.dcache.select_rows(keep)
                index = torch.tensor(keep, device=self.device)
                self.pending = [(f.index_select(0, index), p.index_select(0, index), [c[i] for i in keep])
                                for f, p, c in self.pending]
                if self.prompt_features is not None:
                    features, positions, lengths = self.prompt_features
                    self.prompt_features = (features.index_select(0, index), positions.index_select(0, index),
                                            [lengths[i] for i in keep])


def _shadow_outcome(copy: list[int], committed: list[int]) -> tuple[int, int]:
    """(drafts verified, accepted) had `copy` been verified at a step that committed `committed` (the target's
    tokens): its first m tokens equal those, so m accepted; a mismatch within both is the (m+1)-th draft
    rejected; where the copy or the committed tokens end first, nothing is known past them."""
    known = min(len(copy), len(committed))
    m = next((j for j in range(known) if copy[j] != committed[j]), known)
    return (m + 1, m) if m < known else (m, m)

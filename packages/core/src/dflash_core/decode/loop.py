"""The lossless DFlash decode loop: the reference every engine adapter is checked against.

One step, for every active row (`_Decoder.step`):
  choose  which source drafts and how many drafts k (`decode.choice`): by default the drafter's
          `DraftLengthPolicy` weighs this machine's cost of verifying k+1 tokens against the acceptance
          seen so far (k = 0 is a plain target step), and context lookup drafts instead where its copies
          promise more tokens per second.
  draft   the source proposes k drafts per row (`decode.sources`): the drafter, the block
          [last token, MASK x (B-1)] in ONE pass over its cache of injected target features; lookup, a
          copy of what followed the row's latest n-gram; plain, nothing.
  verify  [last token, d_1 .. d_k] in ONE target pass, and accept the longest prefix the target agrees
          with, then the target's own next token (`decode.verify`: greedy, or exact speculative sampling).
  commit  the target's KV cache keeps what was accepted; every source observes the verdict (the drafter
          injects the new target features into its K/V); stops and limits retire rows.
Whatever the source and k, every committed token is the target's own choice, so they change speed,
never output: greedy output equals the target's greedy decoding, sampled output keeps its law.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from dflash_core.decode.choice import CostAwareChoice, FixedChoice, SourceChooser
from dflash_core.decode.context_lookup import free_drafting
from dflash_core.decode.draft_confidence import confident_read_out
from dflash_core.decode.sources import DrafterSource, LookupSource, PlainSource, StepInput, Verdict
from dflash_core.decode.tree import TreeSource, candidate_read_out
from dflash_core.decode.tree_verify import TreeVerifier
from dflash_core.decode.verify import ChainVerifier, Verifier
from dflash_core.sampling.speculative import DraftSampler
from dflash_core.tuning.draft_length import DraftLengthPolicy
from dflash_core.tuning.plan import Tuning
from dflash_core.model.draft_vocab import read_out_for, sampling_head_for
from dflash_core.model.backend import DrafterBackend
from dflash_core.errors import GenerationError
from dflash_core.target.pairing import check_compatibility
from dflash_core.decode.profiling import DecodeProfile, PhaseClock, StepRecord
from dflash_core.decode.request_checks import check_request, split_prompts
from dflash_core.sampling.tokens import SamplingParams, choose_tokens, make_generator
from dflash_core.target.adapter import TargetModel
from dflash_core.target.cache import TargetCache


MAX_TREE_NODES = 64  # a fixed tree's nodes at most (verified in one pass with the row's last token)


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
             context_lookup: bool = True, confidence_trim: bool = False, tree: int | str | None = None,
             tuning: Tuning | None = None, chooser: SourceChooser | None = None, verifier: Verifier | None = None,
             profile: DecodeProfile | None = None) -> GenerationResult:
    """Speculatively decode `input_ids` [B, T] with `drafter`; output is exactly the target's.

    `draft_length`: drafts verified per step; "auto" (default) lets `DraftLengthPolicy` choose k in
    0..B-1 each step from this machine's cost table and the acceptance seen so far (k = 0 is a plain
    target step); an int fixes it; a `DraftLengthPolicy` of your own (e.g. over another cost table)
    is used as is. Any choice is lossless.
    `context_lookup`: with a policy (not a fixed k), also draft by copying what followed the row's
    latest n-gram earlier in its prompt or output, whenever that source promises more tokens per second
    (`dflash_core.decode.context_lookup`); lossless too.
    `confidence_trim`: with a policy and greedy decoding, verify only the drafts the drafter's own
    confidence says pay for their verify time (`dflash_core.decode.draft_confidence`; none: a plain step).
    Off by default: on the AVX2-only CPU it measured no faster end to end (docs/benchmarks.md).
    `tree`: "off" verifies the drafter's argmax chain; an int N a token tree of N nodes per drafter step built
    from the drafter's top candidates per position, "auto" a tree whose size (0 .. 2 block - 1 nodes) is chosen
    per step from the cost table and the acceptance seen so far (`dflash_core.decode.tree`); lossless too,
    greedy and sampled. None (default): "auto" for a greedy request of one prompt with `draft_length="auto"`,
    "off" otherwise: where trees measured faster than the chain (docs/benchmarks.md, "Token trees").
    `tuning`: the `Tuning` whose cost tables and acceptance histories "auto" uses (`load_pair` returns one as
    `pair.tuning`); without one, a fresh in-memory `Tuning` measures the cost table for this call alone and
    nothing is written anywhere. A sampled request's `seed` reproduces its tokens under the same `tuning`
    (the same cost table): "auto" draft lengths follow the measured costs, and the length decides which
    draws the seed feeds (never the law of the output). Two calls without one may differ.
    `chooser` / `verifier`: draft sources and the policy choosing among them, and how a proposal is verified
    (`decode.choice`, `decode.verify`), in place of the defaults built from the arguments above.
    `profile`: a `DecodeProfile` to fill with per-phase timings (off by default: no clocks, no syncs).
    """
    stream = generate_stream(target, drafter, input_ids, max_new_tokens=max_new_tokens, temperature=temperature,
                             top_p=top_p, top_k=top_k, stop_token_ids=stop_token_ids,
                             attention_mask=attention_mask, seed=seed, draft_length=draft_length,
                             context_lookup=context_lookup, confidence_trim=confidence_trim, tree=tree,
                             tuning=tuning, chooser=chooser, verifier=verifier, profile=profile)
    for _ in stream:
        pass
    return stream.result


def generate_stream(target, drafter: DrafterBackend, input_ids: torch.Tensor, *, max_new_tokens: int,
                    temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                    stop_token_ids: Sequence[int] | None = None, attention_mask: torch.Tensor | None = None,
                    seed: int | None = None, draft_length: int | str | DraftLengthPolicy = "auto",
                    context_lookup: bool = True, confidence_trim: bool = False, tree: int | str | None = None,
                    tuning: Tuning | None = None, chooser: SourceChooser | None = None,
                    verifier: Verifier | None = None, profile: DecodeProfile | None = None) -> DecodeStream:
    """Like `generate`, yielding each step's committed tokens as they are accepted.

    Arguments are validated here, before the first step runs.
    """
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    target = as_target(target, drafter)
    prompts = split_prompts(input_ids, attention_mask)
    check_request(target, prompts, max_new_tokens)
    generator = make_generator(params, seed, target.device)
    tree = default_tree(params, len(prompts), draft_length, confidence_trim) if tree is None else tree
    tree_size = _tree_size(tree)
    if chooser is None:
        tuning = tuning if tuning is not None else Tuning()  # one for the call: its table and histories
        policy = _draft_length_policy(draft_length, target, drafter, params, tuning)
        chooser = _default_chooser(target, drafter, prompts, max_new_tokens, params, generator, policy,
                                   context_lookup, confidence_trim, tuning, tree_size)
    if verifier is None:
        verifier = ChainVerifier(params, generator) if tree_size == "off" else TreeVerifier(params, generator)
    return DecodeStream(_Decoder(target, prompts, max_new_tokens, params, frozenset(stop_token_ids or ()), chooser,
                                 verifier, profile, drafter.config.block_size, generator))


def default_tree(params: SamplingParams, rows: int, draft_length="auto", confidence_trim: bool = False) -> str:
    """What `tree=None` means: a tree where it measured faster than the chain on this project's CPUs (the
    defaults, greedy, one prompt: 1.10-1.12x on both pairs, docs/benchmarks.md "Token trees"; at batch 4 and at
    T=1 trees measured no faster), the chain elsewhere, and wherever the caller fixed the drafts verified (an
    int or policy of its own as `draft_length`, `confidence_trim`)."""
    plain_defaults = isinstance(draft_length, str) and draft_length == "auto" and not confidence_trim
    return "auto" if params.greedy and rows == 1 and plain_defaults else "off"


def _tree_size(tree: int | str) -> int | str | None:
    """"off", None (automatic size) or the fixed node count, checked."""
    if tree in ("off", "auto"):
        return None if tree == "auto" else "off"
    if isinstance(tree, bool) or not isinstance(tree, int) or not 1 <= tree <= MAX_TREE_NODES:
        raise GenerationError(f"tree is {tree!r}, expected 'off', 'auto' or a node count in [1, {MAX_TREE_NODES}].")
    return tree


def _default_chooser(target: TargetModel, drafter: DrafterBackend, prompts: list[list[int]], max_new_tokens: int,
                     params: SamplingParams, generator, policy: DraftLengthPolicy | int, context_lookup: bool,
                     confidence_trim: bool, tuning: Tuning, tree_size: int | str | None = "off") -> SourceChooser:
    """The drafter (with context lookup beside it where on) under the draft-length policy, or a fixed k.

    The drafts' read-out: the argmax over the drafter's read-out list (if any) when greedy; when sampling,
    draws from q over the whole vocabulary (held-out tau at T=1, demo pair: 1.36 over all 8,192 ids, 1.31
    over the 1,920 listed), or over the list for a drafter trained over it only."""
    trim = confidence_trim and isinstance(policy, DraftLengthPolicy)
    if params.greedy:
        read_out = confident_read_out(drafter, target) if trim else read_out_for(drafter, target)
    else:
        read_out = DraftSampler(sampling_head_for(drafter, target), params, generator)
    capacity = max(len(p) for p in prompts) + max_new_tokens + drafter.config.block_size
    if tree_size != "off":
        costs = tuning.cost_table(target, drafter, params) if tree_size is None else None
        source = TreeSource(drafter, target.embed, candidate_read_out(drafter, target) if params.greedy else read_out,
                            len(prompts), capacity, target.device, size=tree_size, costs=costs,
                            max_nodes=2 * drafter.config.block_size - 1, generator=generator,
                            calibration=tuning.tree_calibration(drafter) if params.greedy else None)
    else:
        source = DrafterSource(drafter, target.embed, read_out, len(prompts), capacity, target.device,
                               trim_policy=policy if trim else None)
    if not isinstance(policy, DraftLengthPolicy):
        return FixedChoice(source, policy)
    lookup = lookup_policy = None
    if context_lookup:
        history = tuning.history(drafter, "lookup") if policy.history is not None else None
        lookup_policy = DraftLengthPolicy(free_drafting(policy.costs), policy.block_size, history=history)
        lookup = LookupSource(prompts)
    return CostAwareChoice(source, policy, PlainSource(), lookup, lookup_policy, params.greedy)


def _draft_length_policy(draft_length: int | str | DraftLengthPolicy, target: TargetModel, drafter: DrafterBackend,
                         params: SamplingParams, tuning: Tuning):
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
        history = tuning.history(drafter) if params.greedy else None
        return DraftLengthPolicy(tuning.cost_table(target, drafter, params), block, history=history)
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
        layouts = target.layouts
        target = TargetModel(target.model, drafter.config.target_layer_ids)
        target.layouts = layouts  # what the adapter measured still holds: the same head
    drafter.check_runtime(target)
    return target


@torch.inference_mode()
def _run(decoder: "_Decoder") -> Iterator[list[list[int]]]:
    """Drive a decoder: prefill, then one draft-verify-accept-commit step per iteration."""
    yield decoder.prefill()
    clock = PhaseClock(decoder.profile, decoder.device)
    clock.start()
    while decoder.rows.ids:
        yield decoder.step()
    clock.charge("decode_s")


class _Decoder:
    """One generate() call: owns the target's cache, the per-row state of the active batch, the chooser."""

    def __init__(self, target: TargetModel, prompts: list[list[int]], max_new_tokens: int, params: SamplingParams,
                 stops: frozenset[int], chooser: SourceChooser, verifier: Verifier, profile: DecodeProfile | None,
                 block: int, generator: torch.Generator | None) -> None:
        self.target, self.params, self.stops, self.generator = target, params, stops, generator
        self.chooser, self.verifier, self.profile = chooser, verifier, profile
        self.prompts, self.block = prompts, block
        self.device = target.device
        self.clock = PhaseClock(profile, self.device)
        batch = len(prompts)
        self.result = GenerationResult([[] for _ in prompts], [[] for _ in prompts], ["length"] * batch)
        self.tcache = TargetCache(batch)
        self.rows = _Rows(ids=list(range(batch)), remaining=[max_new_tokens] * batch,
                          last=torch.zeros(batch, dtype=torch.long, device=self.device))
        self.offsets = torch.arange(block, device=self.device)

    def prefill(self) -> list[list[int]]:
        """Run the prompts (right-padded) through the target; fill its cache; commit the first tokens."""
        self.clock.start()
        lengths = [len(p) for p in self.prompts]
        width = max(lengths)
        ids = torch.tensor([p + [p[-1]] * (width - len(p)) for p in self.prompts], device=self.device)
        positions = torch.arange(width, device=self.device).expand(len(self.prompts), -1)
        valid = None if min(lengths) == width else positions < torch.tensor(lengths, device=self.device)[:, None]
        out = self.target(ids, positions, self.tcache.cache, self.tcache.attention_mask(self.target, positions, valid))
        self.tcache.commit(width, lengths)
        last = out.hidden[torch.arange(len(lengths), device=self.device), torch.tensor(lengths, device=self.device) - 1]
        first = choose_tokens(self.target.logits(last), self.params, self.generator)  # [B]
        verdict = Verdict([0] * len(lengths), [[t] for t in first.tolist()], first, out.features, positions, lengths)
        for source in self.chooser.sources:  # the drafter keeps the prompts' features for its first draft
            source.observe(None, verdict)
        self.rows.last = first
        emitted = self._emit(verdict.committed, verified=False)
        self.clock.charge("prefill_s")
        return emitted

    def step(self) -> list[list[int]]:
        """Draft -> verify -> accept -> commit, for every active row at once."""
        step = self._step_input()
        self.clock.start()
        proposal = self.chooser.choose(step).propose(step)  # draft: the chosen source, k drafts per row
        self.clock.charge("draft_s")
        verdict = self.verifier.verify(self.target, self.tcache, step, proposal)  # verify + accept: one pass
        self.clock.charge("verify_s")
        self.tcache.commit(proposal.k + 1, verdict.counts, verdict.kept)  # commit: the target's cache keeps the accepted
        self.chooser.observe(proposal, verdict)
        self.clock.start()
        for source in self.chooser.sources:  # the drafter injects the new features (drafter work, timed so)
            source.observe(proposal, verdict)
        self.clock.charge("draft_s")
        self._record(proposal, verdict)
        self.rows.last = verdict.bonus
        return self._emit(verdict.committed, verified=True)

    def _step_input(self) -> StepInput:
        positions = torch.tensor(self.tcache.lengths, device=self.device)[:, None] + self.offsets  # [B, Q]
        return StepInput(self.rows.last, positions, min(max(self.rows.remaining) - 1, self.block - 1))

    def _record(self, proposal, verdict: Verdict) -> None:
        profile = self.profile
        if profile is None:
            return
        profile.steps += 1
        profile.drafter_steps += proposal.source == DrafterSource.name
        profile.lookup_steps += proposal.source == LookupSource.name
        profile.trimmed_steps += proposal.cut is not None
        if proposal.trees is not None:
            profile.tree_steps += 1
            profile.tree_nodes += proposal.k
        if profile.step_log is not None:
            profile.step_log.append(StepRecord(proposal.source, proposal.k, tuple(verdict.counts)))

    def _emit(self, new_tokens: list[list[int]], verified: bool) -> list[list[int]]:
        """Record each active row's committed tokens; retire rows that stopped or hit the limit."""
        result, rows = self.result, self.rows
        emitted: list[list[int]] = [[] for _ in result.tokens]
        for i, row in enumerate(rows.ids):
            kept, finish = commit_tokens(new_tokens[i], rows.remaining[i], self.stops)
            result.tokens[row].extend(kept)
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
            for source in self.chooser.sources:
                source.select_rows(keep)

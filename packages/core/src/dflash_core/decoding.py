"""The lossless DFlash decode loop: the reference every engine adapter is checked against.

One step, for every active row:
  1. draft   the block [last token, MASK x (B-1)] in ONE drafter pass over the cached context;
             the draft tokens are the argmax of the target's LM head at block positions 1..B-1.
  2. verify  [last token, d_1 .. d_{B-1}] in ONE target pass; at each position i the target
             chooses y_i (argmax, or a sample from its warped distribution).
  3. accept  the longest prefix with d_{i+1} == y_i, then y_a itself (a = accepted drafts).
Greedy: y is the target's argmax, so the output equals the target's greedy decoding.
Sampling: y_i ~ p(. | prefix, d_1..d_i) and d_{i+1} is kept only when it equals y_i, which is
exact rejection sampling against a one-hot draft: every committed token is a draw from the
target's own conditional, so the output distribution is the target's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from .compat import check_compatibility
from .drafter import Drafter
from .request import check_request, commit_tokens, split_prompts, sync_device
from .sampling import SamplingParams, choose_tokens
from .target import TargetModel
from .target_cache import TargetCache


@dataclass
class GenerationResult:
    """What `generate` returns; times in seconds, one list per prompt row."""

    tokens: list[list[int]]
    acceptance_lengths: list[list[int]]
    finish_reasons: list[str]
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    decode_s: float = 0.0

    @property
    def num_new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tau(self) -> float:
        """Mean tokens committed per verify step (0.0 when no step ran)."""
        steps = [a for row in self.acceptance_lengths for a in row]
        return sum(steps) / len(steps) if steps else 0.0

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of wall time, prefill included."""
        return self.num_new_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def overhead_s(self) -> float:
        """Decode time spent outside the drafter and target forwards (the loop's own cost)."""
        return max(0.0, self.decode_s - self.draft_s - self.verify_s)

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens, "acceptance_lengths": self.acceptance_lengths,
            "finish_reasons": self.finish_reasons, "tau": self.tau, "tokens_per_s": self.tokens_per_s,
            "prefill_s": self.prefill_s, "draft_s": self.draft_s, "verify_s": self.verify_s,
            "decode_s": self.decode_s, "overhead_s": self.overhead_s,
        }


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
        """Everything committed so far, with timings (complete once iteration has ended)."""
        return self._decoder.result

    def __iter__(self) -> Iterator[list[list[int]]]:
        return _run(self._decoder)


def generate(target, drafter: Drafter, input_ids: torch.Tensor, *, max_new_tokens: int,
             temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
             stop_token_ids: Sequence[int] | None = None, attention_mask: torch.Tensor | None = None,
             seed: int | None = None) -> GenerationResult:
    """Speculatively decode `input_ids` [B, T] with `drafter`; output is exactly the target's."""
    stream = generate_stream(target, drafter, input_ids, max_new_tokens=max_new_tokens, temperature=temperature,
                             top_p=top_p, top_k=top_k, stop_token_ids=stop_token_ids,
                             attention_mask=attention_mask, seed=seed)
    for _ in stream:
        pass
    return stream.result


def generate_stream(target, drafter: Drafter, input_ids: torch.Tensor, *, max_new_tokens: int,
                    temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                    stop_token_ids: Sequence[int] | None = None, attention_mask: torch.Tensor | None = None,
                    seed: int | None = None) -> DecodeStream:
    """Like `generate`, yielding each step's committed tokens as they are accepted.

    Arguments are validated here, before the first step runs.
    """
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    target = as_target(target, drafter)
    prompts = split_prompts(input_ids, attention_mask)
    check_request(target, prompts, max_new_tokens)
    return DecodeStream(_Decoder(target, drafter, prompts, max_new_tokens, params, frozenset(stop_token_ids or ()),
                                 seed))


def as_target(target, drafter: Drafter) -> TargetModel:
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
    started = time.perf_counter()
    while decoder.rows.ids:
        yield decoder.step()
    decoder.result.decode_s = time.perf_counter() - started


class _Decoder:
    """One generate() call: owns both caches and the per-row state of the active batch."""

    def __init__(self, target: TargetModel, drafter: Drafter, prompts: list[list[int]], max_new_tokens: int,
                 params: SamplingParams, stops: frozenset[int], seed: int | None) -> None:
        self.target, self.drafter, self.params, self.stops = target, drafter, params, stops
        self.prompts, self.max_new_tokens = prompts, max_new_tokens
        self.device = target.device
        self.generator = None
        if not params.greedy:
            self.generator = torch.Generator(device=self.device)
            self.generator.manual_seed(seed if seed is not None else torch.seed())
        batch = len(prompts)
        self.block = drafter.config.block_size
        self.result = GenerationResult([[] for _ in prompts], [[] for _ in prompts], ["length"] * batch)
        self.tcache = TargetCache(batch)
        self.dcache = drafter.new_cache(batch, max(len(p) for p in prompts) + max_new_tokens + self.block)
        self.rows = _Rows(ids=list(range(batch)), remaining=[max_new_tokens] * batch,
                          last=torch.zeros(batch, dtype=torch.long, device=self.device))
        self.offsets = torch.arange(self.block, device=self.device)
        self.masks = torch.full((1, self.block - 1), drafter.config.mask_token_id, dtype=torch.long,
                                device=self.device)

    def prefill(self) -> list[list[int]]:
        """Run the prompts (right-padded) through the target; fill both caches; commit the first tokens."""
        started = time.perf_counter()
        lengths = [len(p) for p in self.prompts]
        width = max(lengths)
        ids = torch.tensor([p + [p[-1]] * (width - len(p)) for p in self.prompts], device=self.device)
        positions = torch.arange(width, device=self.device).expand(len(self.prompts), -1)
        valid = None if min(lengths) == width else positions < torch.tensor(lengths, device=self.device)[:, None]
        out = self.target(ids, positions, self.tcache.cache, self.tcache.attention_mask(self.target, positions, valid))
        self.tcache.commit(width, lengths)
        self.drafter.extend_cache(self.dcache, out.features, positions, lengths)
        last = out.hidden[torch.arange(len(lengths), device=self.device), torch.tensor(lengths, device=self.device) - 1]
        self.rows.last = choose_tokens(self.target.logits(last), self.params, self.generator)
        emitted = self._emit([[t] for t in self.rows.last.tolist()], verified=False)
        sync_device(self.device)
        self.result.prefill_s = time.perf_counter() - started
        return emitted

    def step(self) -> list[list[int]]:
        """Draft one block per row, verify it in one target pass, commit what the target agrees with."""
        t0 = time.perf_counter()
        positions = torch.tensor(self.tcache.lengths, device=self.device)[:, None] + self.offsets  # [B, Q]
        drafts = self._draft(positions)  # [B, Q-1]
        sync_device(self.device)
        t1 = time.perf_counter()
        verify_ids = torch.cat([self.rows.last[:, None], drafts], dim=1)
        out = self.target(verify_ids, positions, self.tcache.cache, self.tcache.attention_mask(self.target, positions))
        chosen = choose_tokens(self.target.logits(out.hidden), self.params, self.generator)  # y_i, [B, Q]
        sync_device(self.device)
        t2 = time.perf_counter()
        self.result.draft_s += t1 - t0
        self.result.verify_s += t2 - t1
        # a = length of the longest prefix with d_{i+1} == y_i; then y_a is the target's own next token
        accepted = (drafts == chosen[:, :-1]).cumprod(dim=1).sum(dim=1)  # [B]
        bonus = chosen.gather(1, accepted[:, None])[:, 0]  # [B]
        host = torch.cat([accepted[:, None], bonus[:, None], drafts], dim=1).tolist()  # one device sync
        counts = [h[0] + 1 for h in host]  # block positions the target has now verified, per row
        self.tcache.commit(self.block, counts)
        keep = max(counts)
        t3 = time.perf_counter()
        # KV injection of the accepted tokens: drafter work, timed as drafting
        self.drafter.extend_cache(self.dcache, out.features[:, :keep], positions[:, :keep], counts)
        sync_device(self.device)
        self.result.draft_s += time.perf_counter() - t3
        self.rows.last = bonus
        return self._emit([h[2 : 2 + h[0]] + [h[1]] for h in host], verified=True)

    def _draft(self, positions: torch.Tensor) -> torch.Tensor:
        block_ids = torch.cat([self.rows.last[:, None], self.masks.expand(len(self.rows.ids), -1)], dim=1)
        return self.drafter.propose(self.dcache, self.target.embed(block_ids), positions, self.target.logits)

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
            self.dcache.select_rows(keep)

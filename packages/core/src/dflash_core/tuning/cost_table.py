"""The cost table the draft-length policy decides by (`draft_length`): what a step costs on this machine.

`VerifyCostTable` holds, for one target/drafter pair at batch 1, the seconds of a target forward over
q = 1..B new tokens and over 2B and 4B (logits and the token choice included), of one drafter pass over a block, and of
reading out one more draft through the target's LM head. `measure_cost_table` times them on the pair as
it will decode; `cost_table_for` reads a pair's table from a cache directory (`cost_tables.json`, keyed by
everything that changes the times; spot-checked against a few forwards timed now before it is trusted) or
measures it and writes it there. Which directory, and the table kept for the process, are the caller's
`Tuning` (`dflash_core.tuning.plan`).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache

from dflash_core.devices import sync_device
from dflash_core.dtypes import short_name
from dflash_core.kernels.prepacked_linear import is_prepacked
from dflash_core.sampling.speculative import DraftSampler, speculative_accept
from dflash_core.model.draft_vocab import read_out_for, sampling_head_for
from dflash_core.sampling.tokens import SamplingParams, choose_tokens, warp_logits
from dflash_core.target.adapter import TargetModel
from dflash_core.target.cache import truncate_cache
from dflash_core.tuning.auto_dtype import machine_key, model_key, read_cache, write_cache

WIDE_BLOCKS = (2, 4)  # wider forwards timed too, in blocks: a batch's rows or a token tree verified together
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
    wide: tuple[tuple[int, float], ...] = ()
    """(q, seconds) of wider forwards, q > B increasing (a batch's rows or a token tree verified together)."""

    def __post_init__(self) -> None:
        if not self.seconds or not all(math.isfinite(s) and s > 0 for s in self.seconds):
            raise ValueError(f"verify cost table needs one positive time per block position, got {self.seconds}")
        if not (math.isfinite(self.draft_s) and self.draft_s >= 0):
            raise ValueError(f"drafter pass time must be >= 0 seconds, got {self.draft_s}")
        if not (math.isfinite(self.head_s) and self.head_s >= 0):
            raise ValueError(f"per-draft LM-head time must be >= 0 seconds, got {self.head_s}")
        widths = [q for q, _ in self.wide]
        if widths != sorted(set(widths)) or any(q <= len(self.seconds) or not (math.isfinite(t) and t > 0)
                                                for q, t in self.wide):
            raise ValueError(f"wide forwards must be (q, seconds) with q increasing past the block and seconds > 0, "
                             f"got {self.wide}")

    @property
    def block_size(self) -> int:
        return len(self.seconds)

    def verify(self, q: int) -> float:
        """Seconds of a target forward over q new tokens; past the block, linear between the measured wide
        forwards, and past the last of them extended with the last slope (`marginal_s` without any)."""
        if q < 1:
            raise ValueError(f"a target forward covers at least 1 token, got {q}")
        if q <= len(self.seconds):
            return self.seconds[q - 1]
        low_q, low_s, slope = len(self.seconds), self.seconds[-1], self.marginal_s
        for high_q, high_s in self.wide:
            slope = max(0.0, (high_s - low_s) / (high_q - low_q))
            if q <= high_q:
                break
            low_q, low_s = high_q, high_s
        return low_s + (q - low_q) * slope

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
        return {"seconds": list(self.seconds), "draft_s": self.draft_s, "head_s": self.head_s,
                "wide": [list(w) for w in self.wide]}

    @classmethod
    def from_dict(cls, data: dict) -> "VerifyCostTable":
        try:
            return cls(seconds=tuple(float(s) for s in data["seconds"]), draft_s=float(data["draft_s"]),
                       head_s=float(data.get("head_s", 0.0)),
                       wide=tuple((int(q), float(t)) for q, t in data.get("wide", ())))
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
        width = block_size * WIDE_BLOCKS[-1]
        self.ids = torch.randint(0, self.target.vocab_size, (1, context + width), generator=generator).to(self.device)
        self.positions = torch.arange(context + width, device=self.device)[None]  # [1, C + widest]
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
            end = context + block_size
            hidden = self.target(self.ids[:, context:end], self.positions[:, context:end], self.cache).hidden
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
        block = self.noise.shape[1]
        drafts = self.drafter.propose(self.dcache, self.noise, self.positions[:, c : c + block], self.read_out, k)
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
    widths = list(range(1, block_size + 1)) + [block_size * m for m in WIDE_BLOCKS]
    items = [(timer.verify, q) for q in widths]
    best = timer.fastest(items + [(timer.draft, 1), (timer.draft, max(1, block_size - 1))], repeats)
    seconds = best[: len(widths)]
    for q in range(1, len(widths)):  # more tokens never cost less
        seconds[q] = max(seconds[q], seconds[q - 1])
    one, full = best[len(widths)], best[len(widths) + 1]
    head_s = max(0.0, (full - one) / (block_size - 2)) if block_size > 2 else 0.0
    wide = tuple(zip(widths[block_size:], seconds[block_size:]))
    return VerifyCostTable(seconds=tuple(seconds[:block_size]), draft_s=max(0.0, one - head_s), head_s=head_s,
                           wide=wide)


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


# ---- the table for a pair, measured once per machine ----------------------------------------------
COST_FILE = "cost_tables.json"
# in the cache key: tables measured by an earlier `measure_cost_table`, or of an earlier, dearer drafting step
# (3: the drafter's block pass with fewer dispatched ops and the block's K/V in the cache's free slots; 4: the
# target's multi-token verify on the CPU without a K/V copy per query group, `grouped_attention`; 5: sampled tokens
# drawn by inverse CDF, `sampling.sample_categorical`, not torch.multinomial, which cost a sampling table's verify
# 180-200 us per position on the Zen 4 EPYC; 6: wide forwards), are measured again
COST_METHOD = 6  # 6: forwards over 2 and 4 blocks of tokens measured too (`VerifyCostTable.wide`)


def cost_table_key(target: TargetModel, drafter, sampling: SamplingParams | None = None) -> str:
    """What a pair's step times depend on: machine, target, dtype, device, drafter, read-out, weights, choice."""
    block = drafter.config.block_size
    drafter_hash = hashlib.sha256(json.dumps(drafter.config.to_dict(), sort_keys=True, default=str).encode())
    return (f"{machine_key(target.device)}|model={model_key(target.model, block)[:16]}|dtype={short_name(target.dtype)}"
            f"|device={target.device}|drafter={drafter_hash.hexdigest()[:16]}|backend={type(drafter).__name__}"
            f"|readout={len(getattr(drafter, 'draft_vocab', None) or ()) or 'all'}|method={COST_METHOD}"
            f"{_choice_key(sampling)}{_weights_key(drafter)}{_target_key(target)}")


def cost_table_for(target: TargetModel, drafter, *, sampling: SamplingParams | None = None, cache_dir=None,
                   spot=spot_times, key: str | None = None) -> VerifyCostTable:
    """The pair's cost table: from `cache_dir` when a table cached there still holds, else measured now (and
    written there). Without a `cache_dir` it is measured and nothing is read or written.

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
    block = drafter.config.block_size
    sampling = None if sampling is None or sampling.greedy else sampling
    if cache_dir is None:
        return measure_cost_table(target, drafter, block, sampling=sampling)
    key = key or cost_table_key(target, drafter, sampling)
    cache_dir = Path(cache_dir)
    stored = read_cache(cache_dir, COST_FILE)
    try:
        cached = VerifyCostTable.from_dict(stored[key])
    except (KeyError, ValueError, TypeError, AttributeError):
        cached = None
    spotted = (lambda: spot(target, drafter, block)) if sampling is None else (
        lambda: spot(target, drafter, block, sampling=sampling))
    if cached is not None and cached.block_size == block and not table_is_stale(cached, *spotted()):
        table = cached
    else:
        table = measure_cost_table(target, drafter, block, sampling=sampling)
        if cached is None or cached.block_size != block or table.seconds[0] < cached.seconds[0]:
            stored[key] = table.to_dict()
            write_cache(cache_dir, stored, COST_FILE)
    return table


def _weights_key(drafter) -> str:
    """The key's part for how the drafter reads its weights: empty when plain (the keys tables had before)."""
    weight_format = getattr(drafter, "weight_format", "plain")
    return "" if weight_format == "plain" else f"|weights={weight_format}"


def _target_key(target: TargetModel) -> str:
    """The key's part for the target's linear layers: empty when plain, else how many run prepacked
    (`prepacked_linear`: the same numbers, other times)."""

    packed = sum(is_prepacked(m) for m in target.model.modules())
    return f"|prepacked={packed}" if packed else ""


def _choice_key(sampling: SamplingParams | None) -> str:
    """The cache key's part for how tokens are chosen: empty when greedy (the keys tables had before)."""
    if sampling is None or sampling.greedy:
        return ""
    return "|choice=sample" + ("+top_k" if sampling.top_k > 0 else "") + ("+top_p" if sampling.top_p < 1 else "")

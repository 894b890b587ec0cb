"""Turning the target's logits into tokens: greedy, or temperature / top-k / top-p sampling.

The warpers are applied in Hugging Face's order (temperature, then top-k, then top-p) with its
top-p convention (keep the smallest set whose probability reaches top_p), so "the target's own
sampling" means exactly what `generate(do_sample=True, ...)` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dflash_core.errors import GenerationError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    """0 for greedy; > 0 divides the logits before sampling."""
    top_p: float = 1.0
    """Nucleus mass kept, in (0, 1]."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 keeps all."""

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):  # inf would sample uniformly
            raise GenerationError(f"temperature is {self.temperature}, expected a finite number >= 0.")
        if not (0 < self.top_p <= 1):
            raise GenerationError(f"top_p is {self.top_p}, expected a value in (0, 1].")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise GenerationError(f"top_k is {self.top_k!r}, expected an integer >= 0.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def warp_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[..., V] logits -> fp32 logits with filtered tokens at -inf."""
    scores = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= 1 - params.top_p
        drop_sorted[..., -1:] = False  # always keep the most likely token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Argmax over the vocabulary, first index on ties (as Hugging Face's greedy search).

    On a CPU as `max(dim=-1).indices`, which also returns the first maximal index: one vectorised pass
    in any dtype and layout, where `argmax` is unvectorised in bf16 (238 us on a [16, 8192] block on a
    Zen 4 EPYC, against 59) and casting to fp32 first copies a transposed view slowly (the LM head's
    `matmul_layout` may return one: 111-213 us there). Elsewhere an exact fp32 cast, then argmax.
    """
    if logits.device.type == "cpu":
        return logits.max(dim=-1).indices
    return logits.float().argmax(dim=-1)


def choose_tokens(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """One token per position: [..., V] -> [...]. Argmax when greedy, else a sample."""
    if params.greedy:
        return greedy_tokens(logits)
    return sample_categorical(warp_logits(logits, params).softmax(dim=-1), generator)


def sample_categorical(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """[..., V] nonnegative weights (any positive total) -> [...] indices, i drawn with probability
    weights[i] / sum(weights): one uniform per row, inverted through a float64 running sum.

    Why not `torch.multinomial`: on a CPU it draws V exponentials per row (its race for sampling
    without replacement, also for one sample): 180-200 us a row over the demo target's 8,192 ids on the
    Zen 4 EPYC and 2.7 ms for a 16-position verify block, against 30 and 100 us here (1.0 ms against
    90 us a row over SmolLM2's 49,152). The running sum is float64 so that each index's interval is its
    weight to ~1e-16 (a float32 sum near 1 rounds a weight to 6e-8), except where the device has no float64.
    """
    flat = weights.reshape(-1, weights.shape[-1])
    uniform = torch.rand(flat.shape[0], dtype=running_sum_dtype(flat.device), generator=generator, device=flat.device)
    return categorical_from_uniform(flat, uniform).view(weights.shape[:-1])


def categorical_from_uniform(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """weights [N, V] (nonnegative), uniform [N] in [0, 1) -> [N]: per row the first index whose running
    sum exceeds uniform * total. A zero-weight index is never returned (its running sum equals the one
    before it), and the target point is kept strictly below the total, so rounding cannot carry it past
    the last index of positive weight."""
    cdf = weights.cumsum(dim=-1, dtype=running_sum_dtype(weights.device))  # [N, V]
    total = cdf[:, -1:]
    if cdf.device.type == "cpu" and not bool((total > 0).all()):  # NaN compares False too; no GPU sync
        raise GenerationError("cannot sample: a distribution has no positive finite mass (NaN or all-zero "
                              "probabilities); expected finite logits.")
    point = torch.minimum(uniform[:, None].to(cdf.dtype) * total, total.nextafter(torch.zeros_like(total)))
    return torch.searchsorted(cdf, point, right=True)[:, 0]


def running_sum_dtype(device: torch.device) -> torch.dtype:
    """float64 for the sampler's running sum, float32 on Apple's MPS, which has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


def make_generator(params: SamplingParams, seed: int | None, device: torch.device) -> torch.Generator | None:
    """The random stream of one request: None when greedy, else seeded with `seed` (fresh when None)."""
    if params.greedy:
        return None
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64):
        raise GenerationError(f"seed is {seed!r}, expected an integer in [0, 2^64).")
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else torch.seed())
    return generator

"""The target alone, one token per forward: the baseline DFlash is measured against.

It is the speculative loop itself with no drafter (every step verifies zero drafts), so a speed
ratio compares decoding strategies, not two code paths, at batch 1 and at larger batches alike.
"""

from __future__ import annotations

from typing import Sequence

import torch

from dflash_core.decode.choice import FixedChoice
from dflash_core.decode.loop import GenerationResult, _Decoder, _run
from dflash_core.decode.sources import PlainSource
from dflash_core.decode.verify import ChainVerifier
from dflash_core.decode.profiling import DecodeProfile
from dflash_core.decode.request_checks import check_request, split_prompts
from dflash_core.sampling.tokens import SamplingParams, make_generator
from dflash_core.target.adapter import TargetModel


def generate_autoregressive(target, input_ids: torch.Tensor, *, max_new_tokens: int, temperature: float = 0.0,
                            top_p: float = 1.0, top_k: int = 0, stop_token_ids: Sequence[int] | None = None,
                            attention_mask: torch.Tensor | None = None, seed: int | None = None,
                            profile: DecodeProfile | None = None) -> GenerationResult:
    """Plain decoding, one token per forward, all prompt rows together as one (ragged) batch.

    The speculative loop with no drafter: every step is a target forward over one token per row,
    through the same caches, masks and token choice, so a speed ratio compares strategies only.
    `profile` (opt-in) gets prefill and decode times; every decode step counts as verification.
    """
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    # no feature layers: the target alone pays for no hooks
    target = TargetModel(target.model if isinstance(target, TargetModel) else target)
    prompts = split_prompts(input_ids, attention_mask)
    check_request(target, prompts, max_new_tokens)
    generator = make_generator(params, seed, target.device)
    decoder = _Decoder(target, prompts, max_new_tokens, params, frozenset(stop_token_ids or ()),
                       FixedChoice(PlainSource(), 0), ChainVerifier(params, generator), profile, 1, generator)
    for _ in _run(decoder):
        pass
    result = decoder.result
    result.acceptance_lengths = [[] for _ in prompts]  # no verify steps: nothing was drafted
    if profile is not None:
        profile.verify_s, profile.draft_s = profile.verify_s + profile.draft_s, 0.0
    return result

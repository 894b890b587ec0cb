"""The target alone, one token per forward: the baseline DFlash is measured against.

It runs through the same `TargetModel` forward and cache as the speculative loop, so a speed
ratio compares decoding strategies, not two different code paths.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .decoding import GenerationResult
from .profiling import DecodeProfile, PhaseClock
from .request_checks import check_request, split_prompts
from .sampling import SamplingParams, choose_tokens, make_generator
from .target import TargetModel


@torch.inference_mode()
def generate_autoregressive(target, input_ids: torch.Tensor, *, max_new_tokens: int, temperature: float = 0.0,
                            top_p: float = 1.0, top_k: int = 0, stop_token_ids: Sequence[int] | None = None,
                            attention_mask: torch.Tensor | None = None, seed: int | None = None,
                            profile: DecodeProfile | None = None) -> GenerationResult:
    """Plain decoding of each prompt row (rows run one after another; batch 1 is the usual case).

    `profile` (opt-in) gets prefill and decode times; every decode step counts as verification.
    """
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    # no feature layers: the target alone pays for no hooks
    target = TargetModel(target.model if isinstance(target, TargetModel) else target)
    prompts = split_prompts(input_ids, attention_mask)
    check_request(target, prompts, max_new_tokens)
    stops = frozenset(stop_token_ids or ())
    generator = make_generator(params, seed, target.device)
    result = GenerationResult([[] for _ in prompts], [[] for _ in prompts], ["length"] * len(prompts))
    clock = PhaseClock(profile, target.device)
    for row, prompt in enumerate(prompts):
        _decode_row(target, prompt, max_new_tokens, params, stops, generator, result, row, clock)
    if profile is not None:
        profile.verify_s = profile.decode_s
    return result


def _decode_row(target: TargetModel, prompt: list[int], max_new_tokens: int, params: SamplingParams,
                stops: frozenset[int], generator, result: GenerationResult, row: int, clock: PhaseClock) -> None:
    from transformers import DynamicCache

    device = target.device
    cache = DynamicCache()
    clock.start()
    out = target(torch.tensor([prompt], device=device), torch.arange(len(prompt), device=device)[None], cache)
    token = choose_tokens(target.logits(out.hidden[:, -1]), params, generator)
    tokens = [int(token.item())]
    clock.charge("prefill_s")
    position = len(prompt)
    while tokens[-1] not in stops and len(tokens) < max_new_tokens:
        out = target(token.view(1, 1), torch.tensor([[position]], device=device), cache)
        token = choose_tokens(target.logits(out.hidden[:, -1]), params, generator)
        tokens.append(int(token.item()))
        position += 1
    result.tokens[row] = tokens
    result.finish_reasons[row] = "stop" if tokens[-1] in stops else "length"
    clock.charge("decode_s")

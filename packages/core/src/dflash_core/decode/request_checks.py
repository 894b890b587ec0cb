"""Checks of a generation request, shared by the speculative and plain decoders: prompts and limits."""

from __future__ import annotations

import torch

from dflash_core.errors import GenerationError
from dflash_core.target.adapter import TargetModel


def split_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[list[int]]:
    """Rows of `input_ids` without their padding (left or right), as lists of token ids."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.dtype not in (torch.long, torch.int):
        shape = list(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise GenerationError(f"input_ids is {shape}, expected an integer tensor [batch, tokens].")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise GenerationError("the prompt is empty: expected at least one token per row.")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise GenerationError(
            f"attention_mask has shape {list(attention_mask.shape)}, expected {list(input_ids.shape)} like input_ids."
        )
    rows = input_ids.tolist()
    if attention_mask is None:
        return rows
    keep = attention_mask.bool().tolist()
    prompts = [[t for t, k in zip(row, mask) if k] for row, mask in zip(rows, keep)]
    for i, p in enumerate(prompts):
        if not p:
            raise GenerationError(f"prompt row {i} is empty after removing padding: expected at least one token.")
    return prompts


def check_request(target: TargetModel, prompts: list[list[int]], max_new_tokens: int) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise GenerationError(f"max_new_tokens is {max_new_tokens!r}, expected an integer >= 1.")
    longest = max(len(p) for p in prompts)
    limit = target.max_positions
    if limit is not None and longest + max_new_tokens > limit:
        raise GenerationError(
            f"prompt ({longest} tokens) plus max_new_tokens ({max_new_tokens}) is {longest + max_new_tokens}, "
            f"beyond the target's {limit} positions."
        )
    bad = [t for p in prompts for t in p if not 0 <= t < target.vocab_size]
    if bad:
        raise GenerationError(f"token id {bad[0]} is outside the target's vocabulary [0, {target.vocab_size}).")

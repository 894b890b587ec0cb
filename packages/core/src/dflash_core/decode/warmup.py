"""Warm-up before timing: the first forwards of a shape pay for lazy kernel set-up."""

from __future__ import annotations

import torch

from dflash_core.decode.autoregressive import generate_autoregressive
from dflash_core.decode.loop import generate
from dflash_core.model.backend import DrafterBackend
from dflash_core.tuning.plan import Tuning


def warm_up(target, drafter: DrafterBackend, input_ids: torch.Tensor, stop_token_ids: list[int],
            tuning: Tuning | None = None) -> None:
    """A few greedy tokens of both decoders on the last 8 prompt tokens (nothing is returned); `tuning`: the one
    the timed calls will use (its cost table is measured here, not in them)."""
    short = input_ids[:, -8:]
    generate_autoregressive(target, short, max_new_tokens=4, stop_token_ids=stop_token_ids)
    generate(target, drafter, short, max_new_tokens=2 * drafter.config.block_size, stop_token_ids=stop_token_ids,
             tuning=tuning)

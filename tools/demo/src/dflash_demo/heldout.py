"""Held-out tau: how many tokens a drafter lets each verify step commit on prompts it never saw.

The whole block is verified every step (k = B-1), so the figure measures the drafter, not the
machine's cost-aware draft-length policy (which would mix in plain target steps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from tqdm import tqdm

from dflash_core.decoding import generate
from dflash_core.loading import encode_prompt, load_pair, stop_token_ids


def heldout_tau(target: Path, drafter: Path, prompts: Sequence[str], *, max_new_tokens: int, device: str = "cpu",
                dtypes: Sequence[str] = ("fp32", "bf16"), temperatures: Sequence[float] = (0.0, 1.0)) -> dict:
    """{dtype: {"T=t": tau}}: mean tokens committed per full-block step, prompt i sampled with seed i."""
    taus: dict[str, dict[str, float]] = {}
    for dtype in dtypes:
        pair = load_pair(target, drafter, dtype=dtype, device=device)
        stops = stop_token_ids(pair.target, pair.tokenizer)
        full = pair.drafter.config.block_size - 1
        for temperature in temperatures:
            lengths = []
            for i, text in enumerate(tqdm(prompts, desc=f"held-out tau {dtype} T={temperature:g}", leave=False)):
                ids = encode_prompt(pair.tokenizer, text, device)
                result = generate(pair.target, pair.drafter, ids, max_new_tokens=max_new_tokens, draft_length=full,
                                  temperature=temperature, seed=i, stop_token_ids=stops)
                lengths += result.acceptance_lengths[0]
            taus.setdefault(dtype, {})[f"T={temperature:g}"] = round(sum(lengths) / max(1, len(lengths)), 3)
    return taus

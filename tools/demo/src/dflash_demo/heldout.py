"""Held-out tau: how many tokens a drafter lets each verify step commit on prompts it never saw.

The whole block is verified every step (k = B-1), so the figure measures the drafter, not the
machine's cost-aware draft-length policy (which would mix in plain target steps); and the drafter
reads its own weights (`drafter_weights="plain"`), so the figure is the same on every CPU.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from tqdm import tqdm

from dflash_core.decode.loop import generate
from dflash_core.loading import encode_prompt, load_pair, stop_token_ids


def heldout_lengths(target: Path, drafter: Path, prompts: Sequence[str], *, max_new_tokens: int,
                    device: str = "cpu", dtypes: Sequence[str] = ("fp32", "bf16"),
                    temperatures: Sequence[float] = (0.0, 1.0)) -> dict[str, dict[str, list[int]]]:
    """{dtype: {"T=t": tokens committed by every full-block step, all prompts}}, prompt i sampled with seed i."""
    lengths: dict[str, dict[str, list[int]]] = {}
    for dtype in dtypes:
        pair = load_pair(target, drafter, dtype=dtype, device=device, drafter_weights="plain")
        stops = stop_token_ids(pair.target, pair.tokenizer)
        full = pair.drafter.config.block_size - 1
        for temperature in temperatures:
            steps = lengths.setdefault(dtype, {}).setdefault(f"T={temperature:g}", [])
            for i, text in enumerate(tqdm(prompts, desc=f"held-out tau {dtype} T={temperature:g}", leave=False)):
                ids = encode_prompt(pair.tokenizer, text, device)
                result = generate(pair.target, pair.drafter, ids, max_new_tokens=max_new_tokens, draft_length=full,
                                  temperature=temperature, seed=i, stop_token_ids=stops, tree="off")
                steps += result.acceptance_lengths[0]
    return lengths


def heldout_tau(target: Path, drafter: Path, prompts: Sequence[str], *, max_new_tokens: int, device: str = "cpu",
                dtypes: Sequence[str] = ("fp32", "bf16"), temperatures: Sequence[float] = (0.0, 1.0)) -> dict:
    """{dtype: {"T=t": tau}}: mean tokens committed per full-block step, prompt i sampled with seed i."""
    return _per_setting(heldout_lengths(target, drafter, prompts, max_new_tokens=max_new_tokens, device=device,
                                        dtypes=dtypes, temperatures=temperatures), _mean)


def kept_by_position(steps: Sequence[int], drafts: int) -> list[float]:
    """P(drafts 1..j all kept) for j = 1..drafts, from tokens committed per full-block step (kept + 1)."""
    return [round(sum(n - 1 >= j for n in steps) / max(1, len(steps)), 4) for j in range(1, drafts + 1)]


def _mean(steps: Sequence[int]) -> float:
    return round(sum(steps) / max(1, len(steps)), 3)


def _per_setting(lengths: dict[str, dict[str, list[int]]], reduce) -> dict:
    """{dtype: {"T=t": reduce(that setting's step lengths)}}."""
    return {dtype: {t: reduce(steps) for t, steps in by_t.items()} for dtype, by_t in lengths.items()}


def _names(*allowed: str):
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(name.strip() for name in text.split(","))
        if any(name not in allowed for name in names):
            raise argparse.ArgumentTypeError(f"{text!r}: expected a comma-separated list of {', '.join(allowed)}")
        return names

    return parse


def _temperatures(text: str) -> tuple[float, ...]:
    refused = argparse.ArgumentTypeError(f"{text!r}: expected comma-separated temperatures >= 0")
    try:
        values = tuple(float(value) for value in text.split(","))
    except ValueError:
        raise refused from None
    if not all(value >= 0 for value in values):  # also refuses nan
        raise refused
    return values


def main(argv: list[str] | None = None) -> int:
    """`python -m dflash_demo.heldout`: held-out tau of a pair into a JSON file (atomically)."""
    import json

    from dflash_core.model.config import DFlashConfig
    from dflash_core.files.atomic import write_json
    from dflash_core.training.data import read_prompts

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--drafter", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, required=True, help="JSONL: `prompt` strings or `messages` chats")
    parser.add_argument("--count", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtypes", type=_names("fp32", "bf16"), default=("fp32", "bf16"),
                        help="comma-separated, of fp32,bf16 (default both)")
    parser.add_argument("--temperatures", type=_temperatures, default=(0.0, 1.0),
                        help="comma-separated sampling temperatures, 0 = greedy (default 0,1)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    prompts = read_prompts(args.prompts)[: args.count]
    lengths = heldout_lengths(args.target, args.drafter, prompts, max_new_tokens=args.max_new_tokens,
                              device=args.device, dtypes=args.dtypes, temperatures=args.temperatures)
    taus = _per_setting(lengths, _mean)
    drafts = DFlashConfig.from_pretrained(args.drafter).block_size - 1
    kept = _per_setting(lengths, lambda steps: kept_by_position(steps, drafts))
    write_json(args.out, {"target": str(args.target), "drafter": str(args.drafter), "prompts": str(args.prompts),
                          "count": len(prompts), "max_new_tokens": args.max_new_tokens, "tau": taus,
                          "kept_by_position": kept})
    print(json.dumps(taus))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

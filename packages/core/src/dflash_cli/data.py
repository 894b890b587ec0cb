"""`dflash data`: regenerate responses with the target (target-aligned training data)."""

from __future__ import annotations

import sys
from pathlib import Path

from dflash_core.errors import DataError
from dflash_core.loading import load_target, load_tokenizer
from dflash_core.training.data import (DataSettings, generate_responses, prompts_fingerprint, read_prompts,
                                       target_fingerprint)

from .common import add_runtime_args, apply_threads


def add_parser(commands) -> None:
    p = commands.add_parser("data", help="regenerate prompt responses with the target (training data)")
    p.add_argument("--target", required=True, help="Hugging Face target model directory (with tokenizer)")
    p.add_argument("--prompts", required=True, help="JSONL file, one object per line with a 'prompt' string")
    p.add_argument("--out", required=True, type=Path, help="data directory (resumed if it exists)")
    p.add_argument("--responses", choices=["greedy", "sampled", "both"], default="greedy")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0, help="temperature of sampled responses")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--shard-size", type=int, default=256, help="samples per shard")
    p.add_argument("--seed", type=int, default=0)
    add_runtime_args(p)
    p.set_defaults(run=run)


def run(args) -> int:
    apply_threads(args.threads)
    for name in ("max_new_tokens", "batch_size", "shard_size"):
        if getattr(args, name) < 1:
            raise DataError(f"--{name.replace('_', '-')} is {getattr(args, name)}, expected an integer >= 1.")
    prompts = read_prompts(args.prompts)
    target = load_target(args.target, (), args.dtype, args.device)
    tokenizer = load_tokenizer(args.target)
    settings = DataSettings(target=target_fingerprint(args.target), prompts=prompts_fingerprint(prompts), responses=args.responses,
                            max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                            shard_size=args.shard_size)
    index = generate_responses(target.model, tokenizer, prompts, args.out, settings, batch_size=args.batch_size)
    samples = sum(s["samples"] for s in index["shards"])
    tokens = sum(s["tokens"] for s in index["shards"])
    print(f"{args.out}: {samples} samples, {tokens} tokens in {len(index['shards'])} shards", file=sys.stderr)
    return 0

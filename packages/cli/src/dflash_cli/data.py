"""`dflash data`: regenerate responses with the target (target-aligned training data)."""

from __future__ import annotations

import sys
from pathlib import Path

from dflash_core.tuning.auto_dtype import BATCHED_ROWS
from dflash_core.files.atomic import guard_output
from dflash_core.loading import load_tokenizer
from dflash_core.target.checks import read_target_config
from dflash_core.training.data import (INDEX_FILE, DataSettings, generate_responses, load_or_start_index,
                                       prompts_fingerprint, read_prompts, target_fingerprint)

from dflash_cli import flags
from dflash_cli.common import add_runtime_args, apply_threads, load_target_in, tuning_for


def add_parser(commands) -> None:
    p = commands.add_parser("data", help="regenerate prompt responses with the target (training data)")
    p.add_argument("--target", required=True, help="Hugging Face target model directory (with tokenizer)")
    p.add_argument("--prompts", required=True,
                   help="JSONL file, one object per line with a 'prompt' string or a 'messages' chat "
                        "(OpenAI-style; the tokenizer's chat template is applied)")
    p.add_argument("--out", required=True, type=Path, help="data directory (resumed if it exists)")
    p.add_argument("--force", action="store_true", help="write into an --out that holds other files")
    p.add_argument("--responses", choices=["greedy", "sampled", "both"], default="greedy")
    p.add_argument("--max-new-tokens", type=flags.integer(1), default=256)
    p.add_argument("--temperature", type=flags.number(0.0), default=1.0, help="temperature of sampled responses")
    p.add_argument("--batch-size", type=flags.integer(1), default=32,
                   help="prompts answered together (from 8 on, --dtype auto probes a batch's forward, not one token)")
    p.add_argument("--shard-size", type=flags.integer(1), default=256, help="samples per shard")
    p.add_argument("--seed", type=flags.seed, default=0)
    add_runtime_args(p, default_dtype="auto", allow_auto=True)
    p.set_defaults(run=run)


def run(args) -> int:
    apply_threads(args.threads)
    prompts = read_prompts(args.prompts)
    read_target_config(Path(args.target))
    settings = DataSettings(target=target_fingerprint(args.target), prompts=prompts_fingerprint(prompts),
                            responses=args.responses, max_new_tokens=args.max_new_tokens,
                            temperature=args.temperature, seed=args.seed, shard_size=args.shard_size)
    guard_output(args.out, [args.target, args.prompts], force=args.force,
                 is_own_state=lambda out: (out / INDEX_FILE).is_file())
    load_or_start_index(args.out, settings)  # a corrupt index or other settings: refused before the target loads
    # many sequences at once: their matmuls are a batch's, where bf16 hardware pays even if one token does not
    workload = "train" if args.batch_size >= BATCHED_ROWS else "decode"
    target, _ = load_target_in(args.target, args.dtype, args.device, workload=workload, tuning=tuning_for(args))
    tokenizer = load_tokenizer(args.target)
    index = generate_responses(target.model, tokenizer, prompts, args.out, settings, batch_size=args.batch_size)
    samples = sum(s["samples"] for s in index["shards"])
    tokens = sum(s["tokens"] for s in index["shards"])
    print(f"{args.out}: {samples} samples, {tokens} tokens in {len(index['shards'])} shards", file=sys.stderr)
    return 0

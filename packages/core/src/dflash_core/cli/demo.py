"""`dflash demo`: the embedded default — stream a held-out completion, report tau and speedup."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..errors import DFlashError
from .common import add_runtime_args, apply_threads, encode, load_pair, stop_token_ids
from .generate import TextStream, run_speculative, warm_up


def default_models_dir() -> Path:
    """$DFLASH_DEMO_MODELS, else ./models/demo, else the repository's models/demo."""
    env = os.environ.get("DFLASH_DEMO_MODELS")
    if env:
        return Path(env)
    local = Path("models/demo")
    if local.is_dir():
        return local
    return Path(__file__).resolve().parents[5] / "models" / "demo"


# Printed when greedy outputs part in reduced precision; docs/benchmarks.md has the measurements.
ROUNDING_NOTE = ("note: in {dtype}, scoring 16 tokens at once and 1 token at a time round logits differently; where "
                 "the target's top two tokens tie within that rounding the two runs may pick differently "
                 "(fp32 outputs are identical; see docs/benchmarks.md, 'Greedy equality in bf16').")


def add_parser(commands) -> None:
    p = commands.add_parser("demo", help="stream a held-out completion with the bundled demo models")
    p.add_argument("--models", type=Path, default=None, help="demo models directory (target/, drafter/, heldout.jsonl)")
    p.add_argument("--prompt-index", type=int, default=0, help="which held-out prompt to complete")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--summary-prompts", type=int, default=24,
                   help="also measure tau and speedup over the first N held-out prompts (0: skip)")
    add_runtime_args(p)
    p.set_defaults(run=run)


def _prompts(models: Path) -> list[str]:
    path = models / "heldout.jsonl"
    prompts = [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]
    if not prompts:
        raise DFlashError(f"{path} holds no prompts.")
    return prompts


def run(args) -> int:
    from ..autoregressive import generate_autoregressive

    apply_threads(args.threads)
    models = args.models or default_models_dir()
    if not (models / "target" / "config.json").is_file() or not (models / "drafter" / "config.json").is_file():
        raise DFlashError(f"no demo models in {models}: run `make models` to build them (see README).")
    prompts = _prompts(models)
    prompt = prompts[args.prompt_index % len(prompts)]
    pair = load_pair(models / "target", models / "drafter", args.dtype, args.device)
    ids = encode(pair.tokenizer, prompt, args.device)
    stops = stop_token_ids(pair.target, pair.tokenizer)
    c = pair.drafter.config
    print(f"DFlash demo: {pair.target.num_layers}-layer Qwen3 target ({_params(pair.target.model)}M params) "
          f"+ {c.num_hidden_layers}-layer drafter, block {c.block_size}, {args.dtype}, {args.device}", file=sys.stderr)
    print(f"held-out prompt #{args.prompt_index % len(prompts)} ({ids.shape[1]} tokens):", file=sys.stderr)
    print(prompt, end="")
    warm_up(pair, ids, args, stops)
    printer = TextStream(pair.tokenizer)
    sys.stdout.write("\033[1m") if sys.stdout.isatty() else None
    result = run_speculative(pair, ids, args, stops, printer.push)
    printer.push([], final=True)
    sys.stdout.write("\033[0m\n") if sys.stdout.isatty() else print()
    ar = generate_autoregressive(pair.target, ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                 top_p=args.top_p, top_k=args.top_k, stop_token_ids=stops, seed=args.seed)
    all_identical = result.tokens == ar.tokens
    print(f"\nthis prompt: {len(result.tokens[0])} tokens | tau {result.tau:.2f} | DFlash {result.tokens_per_s:.1f} tok/s"
          f" | target alone {ar.tokens_per_s:.1f} tok/s | speedup {result.tokens_per_s / ar.tokens_per_s:.2f}x"
          + (f" | identical to target alone: {'yes' if all_identical else 'NO'}" if args.temperature == 0 else ""),
          file=sys.stderr)
    if args.summary_prompts:
        all_identical &= _summary(pair, prompts[: args.summary_prompts], args, stops)
    if not all_identical and args.temperature == 0 and args.dtype != "fp32":
        print(ROUNDING_NOTE.format(dtype=args.dtype), file=sys.stderr)
    return 0


def _summary(pair, prompts: list[str], args, stops) -> bool:
    """Both decoders on several held-out prompts, measured side by side in this run; True if all identical."""
    from ..bench.e2e import measure_prompts

    totals = measure_prompts(pair, prompts, stops, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                             top_p=args.top_p, top_k=args.top_k, seed=args.seed, device=args.device,
                             label="held-out prompts")
    row = totals.row()
    line = (f"{len(prompts)} held-out prompts: tau {row['tau']:.2f} | DFlash {row['dflash_tok_s']:.1f} tok/s | "
            f"target alone {row['target_tok_s']:.1f} tok/s | speedup {row['speedup']:.2f}x")
    if args.temperature == 0:
        line += f" | identical to target alone: {row['identical']}"
    print(line, file=sys.stderr)
    return totals.matches == totals.prompts


def _params(model) -> str:
    return f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}"

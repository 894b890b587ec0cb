"""The drafter-depth and block-size study behind docs/benchmarks.md (the last two commands of `make bench`).

Trains drafters of 1, 2, 3 and 5 layers at block 16 and a 1-layer drafter at block 8 on the demo
data (same recipe and budget for all), then measures each against the demo target alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .build import DemoRecipe, build_drafter

VARIANTS = [(1, 16), (2, 16), (3, 16), (5, 16), (1, 8)]


def main(argv: list[str] | None = None) -> int:
    from dflash_bench import e2e

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, default=Path("runs/demo"))
    parser.add_argument("--models", type=Path, default=Path("models/demo"))
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--epochs", type=float, default=2.0, help="training budget of every variant")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--only", default="", help="comma-separated subset of the variants, e.g. L1-B16,L2-B16")
    parser.add_argument("--name", default="variants", help="results file name under --out")
    args = parser.parse_args(argv)
    chosen = [(layers, block) for layers, block in VARIANTS
              if not args.only or f"L{layers}-B{block}" in args.only.split(",")]
    if not chosen:
        parser.error(f"--only {args.only!r} names none of " + ", ".join(f"L{l}-B{b}" for l, b in VARIANTS))
    recipe = DemoRecipe(epochs=args.epochs, eval_every=0)
    heldout = args.models / "heldout.jsonl"
    pairs = []
    for layers, block in chosen:
        name = f"L{layers}-B{block}"
        # The budget is part of the run's name: a run resumes only under the settings it started with.
        run_name = f"variants/e{args.epochs:g}/{name}"
        # Always through the trainer: it resumes an interrupted run and returns at once for a finished one.
        run = build_drafter(args.work, args.models, args.work / "data", heldout, recipe, layers=layers,
                            block_size=block, run_name=run_name)
        pairs.append(e2e.PairSpec(name, args.models / "target", run))
    e2e.run(args.out, pairs, heldout, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
            dtypes=("bf16",), methods=("ar", "dflash"), temperatures=[float(t) for t in args.temperatures.split(",")], name=args.name,
            title=f"Drafter depth and block size, {args.epochs:g} epochs each (demo target, bf16, batch 1)",
            command="python -m dflash_demo.variants " + " ".join(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`make models`: rebuild the demo target, tokenizer, held-out prompts and drafter from scratch.

Stages (each resumable, each skipped when its output exists):
  tokenizer -> token streams -> target LM -> held-out prompts -> target-aligned data -> drafter.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerFast

from ..fileio import atomic_file, write_json
from .corpus import CorpusSplit, split_corpus
from .target_lm import TargetRecipe, encode_documents, train_target_lm
from .tokenizer import train_tokenizer


def build_tokenizer(split: CorpusSplit, work: Path) -> PreTrainedTokenizerFast:
    path = work / "tokenizer"
    if (path / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(path)
    started = time.perf_counter()
    tokenizer = train_tokenizer(split.read(f) for f in split.train)
    tokenizer.save_pretrained(path)
    print(f"tokenizer: {len(tokenizer)} entries in {time.perf_counter() - started:.1f}s")
    return tokenizer


def token_stream(tokenizer: PreTrainedTokenizerFast, split: CorpusSplit, files: tuple[str, ...], path: Path) -> np.ndarray:
    if path.is_file():
        return np.load(path)
    stream = encode_documents(tokenizer, [split.read(f) for f in files])
    with atomic_file(path) as handle:
        np.save(handle, stream)
    print(f"{path.name}: {len(stream):,} tokens from {len(files)} files")
    return stream


def build_target(work: Path, out: Path, recipe: TargetRecipe) -> Path:
    split = split_corpus()
    work.mkdir(parents=True, exist_ok=True)
    write_json(work / "split.json", {"root": str(split.root), "train": split.train, "heldout": split.heldout})
    tokenizer = build_tokenizer(split, work)
    train = token_stream(tokenizer, split, split.train, work / "train_tokens.npy")
    heldout = token_stream(tokenizer, split, split.heldout, work / "heldout_tokens.npy")
    return train_target_lm(tokenizer, train, heldout, recipe, work / "target_state", out / "target")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("runs/demo"), help="scratch and resumable state")
    parser.add_argument("--out", type=Path, default=Path("models/demo"), help="where the demo models go")
    parser.add_argument("--stage", choices=["target", "all"], default="all")
    parser.add_argument("--target-steps", type=int, default=TargetRecipe.steps)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    recipe = TargetRecipe(steps=args.target_steps)
    if not (args.out / "target" / "config.json").is_file():
        build_target(args.work, args.out, recipe)
    print(json.dumps({"target": str(args.out / "target")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

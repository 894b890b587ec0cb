"""`make models`: rebuild the demo target, tokenizer, held-out prompts and drafter from scratch.

Stages (each resumable, each skipped when its output exists):
  tokenizer -> token streams -> target LM -> assistant LM -> held-out prompts -> target-aligned data -> drafter.
The assistant is the small draft model of the `assisted` peer method (Hugging Face assisted generation).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerFast

from dflash_core.fileio import atomic_file, write_json
from .corpus import CorpusSplit, split_corpus
from .target_lm import TargetRecipe, encode_documents, train_target_lm
from .prompts import code_prompts
from .tokenizer import train_tokenizer


@dataclass(frozen=True)
class DemoRecipe:
    """How the demo drafter is made (the numbers behind `make models`)."""

    heldout_prompts: int = 64
    train_prompts: int = 6000
    responses: str = "greedy"
    response_tokens: int = 256
    draft_layers: int = 1
    block_size: int = 16
    anchors: int = 48
    batch_size: int = 8
    epochs: float = 3.0
    learning_rate: float = 6e-4
    feature_layers: int | None = None  # target layers feeding the drafter (None: as many as draft layers)
    init_from_target: bool = False
    distill: str = "hard"
    eval_every: int = 500
    eval_prompts: int = 8

    def train_config(self, layers: int | None = None, block_size: int | None = None, *, bf16: bool = True):
        from dflash_core.training.recipe import TrainConfig

        return TrainConfig(draft_layers=layers or self.draft_layers, block_size=block_size or self.block_size,
                           anchors=self.anchors, batch_size=self.batch_size, epochs=self.epochs,
                           learning_rate=self.learning_rate, feature_layers=self.feature_layers,
                           init_from_target=self.init_from_target, distill=self.distill, max_length=1024, bf16=bf16)


def load_demo_target(out: Path, recipe: DemoRecipe, device: str):
    """The demo target for data and training, in the precision `dtype='auto'` picks on this machine.

    bf16 where this machine runs it faster (CUDA, AMX, AVX512-BF16), else fp32: on an AVX2-only CPU bf16 is
    emulated and the data stage runs 3.5x, a training step about 9x slower in bf16 (docs/training.md).
    Returns (target, bf16: whether training should autocast to bf16).
    """
    from dflash_core.loading import load_target_auto

    target, dtype, reason = load_target_auto(out / "target", (), recipe.block_size, device)
    print(f"demo target dtype {reason}", flush=True)
    return target, dtype == torch.bfloat16


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


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with atomic_file(path, "w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def build_prompts(work: Path, out: Path, recipe: DemoRecipe) -> tuple[Path, Path]:
    split = split_corpus()
    heldout = out / "heldout.jsonl"
    if not heldout.is_file():
        write_jsonl(heldout, code_prompts(split, split.heldout, recipe.heldout_prompts, seed=1, def_fraction=1.0))
    train = work / "train_prompts.jsonl"
    if not train.is_file():
        write_jsonl(train, code_prompts(split, split.train, recipe.train_prompts, seed=2))
    return train, heldout


def build_data(work: Path, out: Path, train_prompts: Path, recipe: DemoRecipe, *, device: str = "cpu",
               batch_size: int = 64) -> Path:
    from dflash_core.loading import load_tokenizer
    from dflash_core.training.data import DataSettings, generate_responses, prompts_fingerprint, read_prompts, target_fingerprint

    data = work / "data"
    target, _ = load_demo_target(out, recipe, device)
    prompts = read_prompts(train_prompts)
    settings = DataSettings(target=target_fingerprint(out / "target"), prompts=prompts_fingerprint(prompts),
                            responses=recipe.responses, max_new_tokens=recipe.response_tokens, seed=0)
    generate_responses(target.model, load_tokenizer(out / "target"), prompts, data, settings, batch_size=batch_size)
    return data


def build_drafter(work: Path, out: Path, data: Path, heldout: Path, recipe: DemoRecipe, layers: int | None = None,
                  block_size: int | None = None, run_name: str = "drafter_run", *, device: str = "cpu",
                  eval_max_new_tokens: int = 128) -> Path:
    from dflash_core.loading import load_tokenizer
    from dflash_core.training.data import read_prompts
    from dflash_core.training.trainer import Distributed, RunOptions, Trainer, load_data

    target, bf16 = load_demo_target(out, recipe, device)
    train = recipe.train_config(layers, block_size, bf16=bf16)
    run = work / run_name
    options = RunOptions(out=run, checkpoint_every=50, eval_every=recipe.eval_every,
                         eval_prompts=read_prompts(heldout)[: recipe.eval_prompts],
                         eval_max_new_tokens=eval_max_new_tokens)
    trainer = Trainer(target, load_tokenizer(out / "target"), load_data(data),
                      train, options, Distributed(device=torch.device(device)))
    report = trainer.run()
    timings = report["timings"]
    recompute = {  # the store-vs-recompute evidence of docs/training.md (zero for a run already finished)
        "target_s": round(timings["target_s"], 1), "step_s": round(timings["step_s"], 1),
        "target_us_per_token": round(1e6 * timings["target_s"] / max(1, timings["feature_tokens"]), 2),
        "target_share": round(timings["target_s"] / max(1e-9, timings["step_s"]), 3)}
    print(json.dumps({"drafter": str(run), "steps": report["steps"], "tau": report["tau"],
                      "feature_recompute": recompute}))
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("runs/demo"), help="scratch and resumable state")
    parser.add_argument("--out", type=Path, default=Path("models/demo"), help="where the demo models go")
    parser.add_argument("--stage", choices=["target", "assistant", "prompts", "data", "drafter", "all"], default="all",
                        help="stop after this stage (every stage resumes from its saved state)")
    parser.add_argument("--target-steps", type=int, default=TargetRecipe.steps)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    demo = DemoRecipe()
    if not (args.out / "target" / "config.json").is_file():
        build_target(args.work, args.out, TargetRecipe(steps=args.target_steps))
    if args.stage == "target":
        return 0
    if not (args.out / "assistant" / "config.json").is_file():
        from .assistant import build_assistant

        build_assistant(args.work, args.out)
    if args.stage == "assistant":
        return 0
    train_prompts, heldout = build_prompts(args.work, args.out, demo)
    if args.stage == "prompts":
        return 0
    data = build_data(args.work, args.out, train_prompts, demo)
    if args.stage == "data":
        return 0
    if not (args.out / "drafter" / "config.json").is_file():
        run = build_drafter(args.work, args.out, data, heldout, demo)
        publish_drafter(run, args.out / "drafter")
    print(json.dumps({"target": str(args.out / "target"), "assistant": str(args.out / "assistant"),
                      "drafter": str(args.out / "drafter"), "heldout": str(heldout)}))
    return 0


def publish_drafter(run: Path, dest: Path) -> None:
    """Copy the trained drafter (published format and its read-out list, no training state) into
    models/demo/drafter."""
    import shutil

    from dflash_core.draft_vocab import DRAFT_VOCAB_FILE
    from dflash_core.fileio import atomic_directory

    with atomic_directory(dest, overwrite=True) as tmp:
        for name in ("config.json", "model.safetensors"):
            shutil.copy2(run / name, tmp / name)
        if (run / DRAFT_VOCAB_FILE).is_file():  # a run trained with --no-draft-vocab has none
            shutil.copy2(run / DRAFT_VOCAB_FILE, tmp / DRAFT_VOCAB_FILE)


if __name__ == "__main__":
    raise SystemExit(main())

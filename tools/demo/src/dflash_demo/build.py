"""`make models`: rebuild the demo target, tokenizer, held-out prompts and drafter from scratch.

Stages (each resumable, each skipped when its output exists):
  tokenizer -> token streams -> target LM -> assistant LM -> held-out prompts -> target-aligned data -> drafter
  -> continuations of the drafter (`DemoRecipe.continuations`) -> published drafter.
The assistant is the small draft model of the `assisted` peer method (Hugging Face assisted generation).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from transformers import PreTrainedTokenizerFast

from dflash_core.files.atomic import atomic_file, write_json
from .corpus import CorpusSplit, split_corpus
from .target_lm import TargetRecipe, encode_documents, train_target_lm
from .prompts import code_prompts
from .tokenizer import train_tokenizer


@dataclass(frozen=True)
class Continuation:
    """A training stage that starts from the previous stage's drafter (`TrainConfig.init_from`).

    `data` is "greedy" (the base stage's data: the target's greedy responses to every training prompt) or
    "both" (a greedy and a sampled response to each training prompt in `prompts`, [first, stop), in
    work/data_both_<first>_<stop>).
    """

    name: str
    data: str
    steps: int
    learning_rate: float
    distill: str
    prompts: tuple[int, int] | None = None  # a "both" stage's training prompts, [first, stop); greedy: all
    draft_layers: int | None = None  # None: the recipe's
    feature_layers: int | None = None  # None: the recipe's
    grow: bool = False  # start as the previous stage's drafter grown into this shape (`TrainConfig.grow_from`)


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
    # Continuations of the base drafter, each 650 steps from the previous one's weights (docs/training.md tells
    # what each kind paid, held-out tau stage by stage in docs/results/recipe_stages.json): more steps on the greedy
    # data (the base run is under-trained), then greedy + sampled responses with soft labels mixed in, two or three
    # passes over each new set of 1,500 prompts at lr 3e-4; from stage 21 on, lr 1e-4, fresh sets of 1,500 up to
    # prompt 35,999, then a second and a third pass over each, oldest first (no data to generate; on the dev set the
    # second passes paid about as much as fresh prompts, the third passes over the nine newer sets about half).
    continuations: tuple[Continuation, ...] = (
        Continuation("greedy_run", data="greedy", steps=650, learning_rate=3e-4, distill="hard"),
        Continuation("sampled_run", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(0, 1500)),
        Continuation("sampled_run_2", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(0, 1500)),
        Continuation("sampled_run_3", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(1500, 3000)),
        Continuation("sampled_run_4", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(1500, 3000)),
        Continuation("sampled_run_5", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(1500, 3000)),
        Continuation("sampled_run_6", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(3000, 4500)),
        Continuation("sampled_run_7", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(3000, 4500)),
        Continuation("sampled_run_8", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(4500, 6000)),
        Continuation("sampled_run_9", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(4500, 6000)),
        Continuation("sampled_run_10", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(6000, 7500)),
        Continuation("sampled_run_11", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(6000, 7500)),
        Continuation("sampled_run_12", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(7500, 9000)),
        Continuation("sampled_run_13", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(7500, 9000)),
        Continuation("sampled_run_14", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(9000, 10500)),
        Continuation("sampled_run_15", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(9000, 10500)),
        Continuation("sampled_run_16", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(10500, 12000)),
        Continuation("sampled_run_17", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(10500, 12000)),
        Continuation("sampled_run_18", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(12000, 13500)),
        Continuation("sampled_run_19", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(12000, 13500)),
        Continuation("sampled_run_20", data="both", steps=650, learning_rate=3e-4, distill="mix", prompts=(13500, 15000)),
        Continuation("sampled_run_21_lr1e4", data="both", steps=650, learning_rate=1e-4, distill="mix",
                     prompts=(13500, 15000)),
        *(Continuation(f"sampled_run_{n}_lr1e4", data="both", steps=650, learning_rate=1e-4, distill="mix",
                       prompts=(first, first + 1500))
          # stages 22-35 on fresh sets (15,000-35,999), 36-49 a second pass over each (oldest first), 50-63 a third
          for n, first in zip(range(22, 64), [*range(15000, 36000, 1500)] * 3)))
    sampled_temperature: float = 1.0

    def scaled_to(self, train_prompts: int) -> "DemoRecipe":
        """The recipe on fewer (or more) training prompts: each continuation's prompt range scales with them."""
        def scale(prompts: tuple[int, int] | None) -> tuple[int, int] | None:
            if prompts is None:
                return None
            return tuple(bound * train_prompts // self.train_prompts for bound in prompts)

        return replace(self, train_prompts=train_prompts, continuations=tuple(
            replace(stage, prompts=scale(stage.prompts)) for stage in self.continuations))

    @property
    def prompt_pool(self) -> int:
        """Training prompts drawn in all: the base stage's `train_prompts` and every continuation's range."""
        return max([self.train_prompts] + [stage.prompts[1] for stage in self.continuations if stage.prompts])

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

    target, dtype, reason = load_target_auto(out / "target", (), recipe.block_size, device, workload="train")
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
    if not train.is_file() or _count_lines(train) < recipe.prompt_pool:
        # the draw is prefix-stable (one seeded sequence): a longer pool keeps every prompt drawn before
        write_jsonl(train, code_prompts(split, split.train, recipe.prompt_pool, seed=2))
    return train, heldout


def _count_lines(path: Path) -> int:
    with open(path, encoding="utf-8") as handle:
        return sum(1 for _ in handle)


def build_data(work: Path, out: Path, train_prompts: Path, recipe: DemoRecipe, *, device: str = "cpu",
               batch_size: int = 64, kind: str = "greedy", prompt_range: tuple[int, int] | None = None,
               loaded: tuple | None = None) -> Path:
    """The target's responses to the training prompts: kind "greedy" (work/data, the base stage's, every
    prompt) or "both" (work/data_both_<first>_<stop>: a greedy and a sampled response to each prompt in
    `prompt_range`, [first, stop)). `loaded`: `load_demo_target`'s (target, bf16) when the caller has it."""
    from dflash_core.loading import load_tokenizer
    from dflash_core.training.data import DataSettings, generate_responses, prompts_fingerprint, read_prompts, target_fingerprint

    prompts = read_prompts(train_prompts)
    if kind == "greedy":  # the base stage's prompts: the first `train_prompts` of the pool
        data, responses, temperature = work / "data", recipe.responses, 1.0
        prompts = prompts[: recipe.train_prompts]
    elif kind == "both":
        if prompt_range is None:
            raise ValueError("data kind 'both' needs a prompt range (first, stop) of the training prompts")
        first, stop = prompt_range
        if not 0 <= first < stop <= len(prompts):
            raise ValueError(f"prompt range {prompt_range} is empty or outside the {len(prompts)} training prompts")
        data, responses, temperature = work / f"data_both_{first}_{stop}", "both", recipe.sampled_temperature
        prompts = prompts[first:stop]
    else:
        raise ValueError(f"data kind is {kind!r}, expected greedy or both")
    target, _ = loaded or load_demo_target(out, recipe, device)
    settings = DataSettings(target=target_fingerprint(out / "target"), prompts=prompts_fingerprint(prompts),
                            responses=responses, max_new_tokens=recipe.response_tokens, temperature=temperature, seed=0)
    generate_responses(target.model, load_tokenizer(out / "target"), prompts, data, settings, batch_size=batch_size)
    return data


def build_drafter(work: Path, out: Path, data: Path, heldout: Path, recipe: DemoRecipe, layers: int | None = None,
                  block_size: int | None = None, run_name: str = "drafter_run", *, device: str = "cpu",
                  eval_max_new_tokens: int = 128, continuation: Continuation | None = None,
                  init_from: Path | None = None, loaded: tuple | None = None) -> Path:
    """Train (or resume, or find finished) the drafter in work/run_name; a `continuation` starts from the
    drafter in `init_from` with its own steps, learning rate and labels. `loaded`: `load_demo_target`'s
    (target, bf16) when the caller has it already."""
    from dflash_core.loading import load_tokenizer
    from dflash_core.training.data import read_prompts
    from dflash_core.training.trainer import Distributed, RunOptions, Trainer, load_data

    target, bf16 = loaded or load_demo_target(out, recipe, device)
    train = recipe.train_config(layers, block_size, bf16=bf16)
    if continuation is not None:
        start = {"grow_from" if continuation.grow else "init_from": str(init_from)}
        train = replace(train, max_steps=continuation.steps, learning_rate=continuation.learning_rate,
                        distill=continuation.distill, draft_layers=continuation.draft_layers or train.draft_layers,
                        feature_layers=continuation.feature_layers or train.feature_layers, **start)
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


def build_continuations(work: Path, out: Path, base_run: Path, train_prompts: Path, heldout: Path,
                        recipe: DemoRecipe, *, device: str = "cpu", data_batch: int = 64,
                        eval_max_new_tokens: int = 128,
                        go_on: Callable[[Continuation, float], bool] | None = None) -> Path:
    """Run `recipe.continuations` in order, each from the previous stage's drafter; returns the last run.

    `go_on(stage, last_s)` is asked before each stage, with the seconds the stage before took (0 before the
    first); False ends the chain there (a time budget), and the last stage run is returned."""
    run, loaded = base_run, load_demo_target(out, recipe, device)  # one target for every stage's data and training
    last_s = 0.0
    for stage in recipe.continuations:
        if go_on is not None and not go_on(stage, last_s):
            break
        begun = time.perf_counter()
        data = build_data(work, out, train_prompts, recipe, device=device, batch_size=data_batch, kind=stage.data,
                          prompt_range=stage.prompts, loaded=loaded)
        run = build_drafter(work, out, data, heldout, recipe, run_name=stage.name, device=device,
                            eval_max_new_tokens=eval_max_new_tokens, continuation=stage, init_from=run, loaded=loaded)
        last_s = time.perf_counter() - begun
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
        base = build_drafter(args.work, args.out, data, heldout, demo)
        run = build_continuations(args.work, args.out, base, train_prompts, heldout, demo)
        publish_drafter(run, args.out / "drafter", read_out_list_from=base)
    print(json.dumps({"target": str(args.out / "target"), "assistant": str(args.out / "assistant"),
                      "drafter": str(args.out / "drafter"), "heldout": str(heldout)}))
    return 0


def publish_drafter(run: Path, dest: Path, read_out_list_from: Path | None = None) -> None:
    """Copy the trained drafter (published format and its read-out list, no training state) into
    models/demo/drafter.

    `read_out_list_from`: the run whose `draft_vocab.json` to publish (default: `run`'s own). The demo takes
    the base run's, made from greedy responses: greedy requests read out over it, and the ids the target
    writes greedily are a tighter list (1,920 ids) than what its sampled responses use (7,296 for the same
    coverage); sampling requests read out over the whole vocabulary anyway.
    """
    import shutil

    from dflash_core.model.draft_vocab import DRAFT_VOCAB_FILE
    from dflash_core.files.atomic import atomic_directory

    with atomic_directory(dest, overwrite=True) as tmp:
        for name in ("config.json", "model.safetensors"):
            shutil.copy2(run / name, tmp / name)
        read_out_list = (read_out_list_from or run) / DRAFT_VOCAB_FILE
        if read_out_list.is_file():  # a run trained with --no-draft-vocab has none
            shutil.copy2(read_out_list, tmp / DRAFT_VOCAB_FILE)


if __name__ == "__main__":
    raise SystemExit(main())

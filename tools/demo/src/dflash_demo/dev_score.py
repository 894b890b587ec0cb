"""Dev-set acceptance: a figure fine enough to tell one training stage from the next.

Held-out tau on the 64 held-out prompts moves by +-0.05 between neighbouring stages, more than one
stage adds (+0.01-0.02): stage-level choices cannot be read from it. The dev set is the target's
greedy and sampled responses to training-split prompts drawn far past any stage's range (pool
indices `DEV_FIRST`..), which no stage trains on; each drafter is scored teacher-forced, as the
training objective sees it, on every sequence at 48 seeded anchors (70,000 blocks for 800 prompts),
the same blocks for every drafter, so two drafters' scores differ only by what they predict.

    python -m dflash_demo.dev_score data --count 800 --work runs/dev
    python -m dflash_demo.dev_score score --data runs/dev/data_both_0_800 DRAFTER [DRAFTER ...]

Each drafter gets `committed` (the mean of 1 + the leading drafts equal to the data, over all blocks;
the whole block verified), `tau_est` (the training log's harmonic-mean estimate, `tokens_per_step`) and
`acc1` (the first draft's accuracy). The held-out prompts stay the reported figure (`dflash_demo.heldout`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

import torch
from tqdm import tqdm

from dflash_core.model.drafter import load_drafter
from dflash_core.target.adapter import TargetModel
from dflash_core.training.batches import make_batch
from dflash_core.training.data import TokenDataset
from dflash_core.training.objective import block_hidden, committed_per_anchor, tokens_per_step

from .build import DemoRecipe, build_data, load_demo_target, write_jsonl
from .paths import default_models_dir

DEV_FIRST = 60_000  # the dev prompts' first index in the seeded training-prompt draw
ANCHORS, SEED, BATCH = 48, 1234, 8


def write_dev_prompts(path: Path, count: int, recipe: DemoRecipe = DemoRecipe()) -> Path:
    """Prompts DEV_FIRST..DEV_FIRST+count of the training split's seeded draw (`build_prompts`' seed 2)."""
    from .corpus import split_corpus
    from .prompts import code_prompts

    if recipe.prompt_pool > DEV_FIRST:
        raise ValueError(f"the recipe draws {recipe.prompt_pool} training prompts, past the dev set's first "
                         f"({DEV_FIRST}): expected a pool below it (move DEV_FIRST up)")
    split = split_corpus()
    write_jsonl(path, code_prompts(split, split.train, DEV_FIRST + count, seed=2)[DEV_FIRST:])
    return path


@torch.no_grad()
def dev_score(target: TargetModel, drafter_dir: Path, data: TokenDataset, *, autocast_bf16: bool,
              limit: int | None = None) -> dict:
    """Teacher-forced acceptance of one drafter over the first `limit` (None: all) sequences of `data`."""
    drafter = load_drafter(drafter_dir, device=target.device, dtype=torch.float32)
    target.set_layer_ids(drafter.config.target_layer_ids)
    count = len(data) if limit is None else min(limit, len(data))
    committed, valid, first_right, first_valid = [], [], 0, 0
    for start in tqdm(range(0, count, BATCH), desc=f"dev score {drafter_dir.name}", leave=False):
        batch = make_batch(data, range(start, min(start + BATCH, count)), anchors=ANCHORS,
                           block_size=drafter.config.block_size, max_length=1024, seed=SEED)
        positions = torch.arange(batch.tokens.shape[1]).expand_as(batch.tokens)
        features = target.features(batch.tokens, positions, batch.valid.long())
        with torch.autocast(target.device.type, dtype=torch.bfloat16, enabled=autocast_bf16):
            hidden = block_hidden(drafter, target, features, batch)  # [B, N, Q, H]
            drafts = target.logits(hidden[:, :, 1:]).argmax(dim=-1)  # [B, N, Q-1]
        right = (drafts == batch.labels) & batch.label_valid
        committed.append(committed_per_anchor(right, batch).flatten())
        valid.append(batch.anchor_valid.flatten())
        first_right += int(right[..., 0].sum())
        first_valid += int(batch.label_valid[..., 0].sum())
    runs, valid_all = torch.cat(committed), torch.cat(valid)
    return {"drafter": str(drafter_dir), "committed": round(float(runs[valid_all].float().mean()), 4),
            "tau_est": round(tokens_per_step(runs, valid_all), 4), "acc1": round(first_right / max(1, first_valid), 4),
            "sequences": count, "blocks": int(valid_all.sum())}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("data", help="draw the dev prompts and regenerate the target's responses to them")
    make.add_argument("--count", type=int, default=800)
    make.add_argument("--work", type=Path, default=Path("runs/dev"))
    score = sub.add_parser("score", help="score drafters on the dev data")
    score.add_argument("--data", type=Path, required=True, help="a data folder `data` wrote")
    score.add_argument("drafters", type=Path, nargs="+")
    score.add_argument("--limit", type=int, default=None, help="score only the first N sequences")
    score.add_argument("--out", type=Path, default=None, help="also write the scores as JSON here")
    for command in (make, score):
        command.add_argument("--models", type=Path, default=None, help="demo models folder (default: found upwards)")
        command.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    models = args.models or default_models_dir()
    recipe = DemoRecipe()
    if args.command == "data" and args.count < 1:
        parser.error(f"--count {args.count}: expected at least one prompt")
    if args.command == "score":
        missing = [str(d) for d in args.drafters if not (d / "config.json").is_file()]
        if missing or not (args.data / "index.json").is_file():
            parser.error(f"{', '.join(missing) or args.data}: expected drafter directories (config.json) and a "
                         "data folder written by `dflash_demo.dev_score data` (index.json)")
    target, bf16 = load_demo_target(models, recipe, args.device)
    if args.command == "data":
        args.work.mkdir(parents=True, exist_ok=True)
        prompts = args.work / "dev_prompts.jsonl"
        if not prompts.is_file():
            write_dev_prompts(prompts, args.count, recipe)
        print(build_data(args.work, models, prompts, recipe, device=args.device, kind="both",
                         prompt_range=(0, args.count), loaded=(target, bf16)))
        return 0
    from dflash_core.training.trainer import load_data

    data = load_data(args.data)
    scores = []
    for drafter in args.drafters:
        scores.append(dev_score(target, drafter, data, autocast_bf16=bf16, limit=args.limit))
        print(json.dumps(scores[-1]), flush=True)
    if args.out is not None:
        from dflash_core.files.atomic import write_json

        write_json(args.out, {"data": str(args.data), "anchors": ANCHORS, "seed": SEED, "scores": scores})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

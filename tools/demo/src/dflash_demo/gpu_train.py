"""The demo drafter's recipe on one CUDA GPU: prompts -> target-regenerated data -> drafter -> its
continuations -> held-out tau.

    tools/demo/gpu/train_drafter.sh OUT_DIR        (budget: 8 minutes on one GPU)

The same `DemoRecipe` and stages as `make models` (`dflash_demo.build`), with the device chosen and the
data-generation batch sized for a GPU; the drafter is written in the published format. The budget is kept by
construction: a continuation starts only if, priced at the time the one before it took, it ends before
`--budget-min` less `--tau-reserve-s` (the held-out measurement's share); the stages that did not fit are
named in tau.json (`budget`), and the drafter published is the last stage run. OUT gets:
  work/            training prompts (standard-library train split) and the regenerated data
  work/drafter_run the base drafter (config.json + model.safetensors) and its resumable train_state/
  work/drafter     the published drafter: the last continuation's weights, the base run's read-out list
  tau.json         held-out tau at block B (whole block verified every step), greedy and T=1, fp32 and bf16,
                   with the time of every stage
The held-out prompts are `models/demo/heldout.jsonl` (files of the held-out split, never trained on).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from dflash_core.files.atomic import write_json
from dflash_core.training.data import read_prompts

from .build import DemoRecipe, build_continuations, build_data, build_drafter, publish_drafter, write_jsonl
from .corpus import split_corpus
from .heldout import heldout_tau
from .paths import default_models_dir
from .prompts import code_prompts


class StageBudget:
    """Asked before each continuation: does it fit, priced at the last one's time (`build_continuations`' go_on)?"""

    def __init__(self, started: float, usable_s: float, first_s: float = 0.0) -> None:
        self.started, self.usable_s = started, usable_s
        self.first_s = first_s  # the price of the first continuation, which has no stage before it
        self.ran: list[str] = []
        self.first_skipped: str | None = None  # the chain ends at the first stage that does not fit

    def __call__(self, stage, last_s: float) -> bool:
        if time.perf_counter() - self.started + (last_s or self.first_s) <= self.usable_s:
            self.ran.append(stage.name)
            return True
        self.first_skipped = stage.name
        print(f"budget: {stage.name} would end past {self.usable_s:.0f} s of the run; stopping after "
              f"{len(self.ran)} continuations", flush=True)
        return False

    def summary(self, minutes: float) -> dict:
        return {"minutes": minutes, "continuations_run": len(self.ran), "first_skipped": self.first_skipped}


def main(argv: list[str] | None = None) -> int:
    recipe = DemoRecipe()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="output folder (resumes a run already there)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", type=Path, default=None, help="demo models folder (default: found upwards)")
    parser.add_argument("--train-prompts", type=int, default=recipe.train_prompts)
    parser.add_argument("--response-tokens", type=int, default=recipe.response_tokens)
    parser.add_argument("--epochs", type=float, default=recipe.epochs)
    parser.add_argument("--continue-steps", type=int, default=None,
                        help="optimizer steps of each continuation (default: the recipe's)")
    parser.add_argument("--data-batch", type=int, default=256, help="prompts per target generate() batch")
    parser.add_argument("--eval-prompts", type=int, default=24, help="held-out prompts for the final tau")
    parser.add_argument("--eval-tokens", type=int, default=128, help="new tokens per held-out prompt")
    parser.add_argument("--budget-min", type=float, default=8.0,
                        help="wall-clock budget of the whole run; continuations that would not fit are skipped")
    parser.add_argument("--tau-reserve-s", type=float, default=60.0,
                        help="seconds of the budget kept for the held-out tau at the end")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device is visible (torch {torch.__version__})")
    models = args.models or default_models_dir()
    continuations = recipe.continuations if args.continue_steps is None else tuple(
        replace(stage, steps=args.continue_steps) for stage in recipe.continuations)
    recipe = replace(recipe, response_tokens=args.response_tokens, epochs=args.epochs,
                     eval_prompts=min(recipe.eval_prompts, args.eval_prompts),
                     continuations=continuations).scaled_to(args.train_prompts)
    work, times, started = args.out / "work", {}, time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)

    def stage(name: str, begun: float) -> None:
        times[name] = round(time.perf_counter() - begun, 1)
        print(f"{name}: {times[name]} s", flush=True)

    begun = time.perf_counter()
    train_prompts = work / "train_prompts.jsonl"
    if not train_prompts.is_file():  # the standard library's train split only: held-out files never appear
        split = split_corpus()
        write_jsonl(train_prompts, code_prompts(split, split.train, recipe.prompt_pool, seed=2))
    stage("prompts_s", begun)
    begun = time.perf_counter()
    data = build_data(work, models, train_prompts, recipe, device=args.device, batch_size=args.data_batch)
    stage("data_s", begun)
    begun = time.perf_counter()
    base = build_drafter(work, models, data, models / "heldout.jsonl", recipe, device=args.device,
                         eval_max_new_tokens=args.eval_tokens)
    stage("train_s", begun)
    begun = time.perf_counter()
    # the first continuation priced at the base run's time per step (the base may have resumed: then nothing)
    base_steps = json.loads((base / "train_state" / "state.json").read_text())["meta"]["step"]
    first_s = times["train_s"] * recipe.continuations[0].steps / max(1, base_steps) if recipe.continuations else 0.0
    budget = StageBudget(started, 60 * args.budget_min - args.tau_reserve_s, first_s)
    last = build_continuations(work, models, base, train_prompts, models / "heldout.jsonl", recipe,
                               device=args.device, data_batch=args.data_batch, eval_max_new_tokens=args.eval_tokens,
                               go_on=budget)
    run = work / "drafter"
    publish_drafter(last, run, read_out_list_from=base)
    stage("continue_s", begun)
    begun = time.perf_counter()
    heldout = read_prompts(models / "heldout.jsonl")[: args.eval_prompts]
    taus = heldout_tau(models / "target", run, heldout, max_new_tokens=args.eval_tokens, device=args.device)
    stage("tau_s", begun)
    device_name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    summary = {"device": device_name, "torch": torch.__version__, "drafter": str(run), "recipe": asdict(recipe),
               "heldout_prompts": len(heldout), "max_new_tokens": args.eval_tokens,
               "block_size": recipe.block_size, "tau": taus, "budget": budget.summary(args.budget_min),
               "seconds": times | {"total_s": round(time.perf_counter() - started, 1)}}
    write_json(args.out / "tau.json", summary)
    print(json.dumps(summary["tau"] | {"total_s": summary["seconds"]["total_s"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

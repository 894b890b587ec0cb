"""The recipe-lever ablation and the learning curve of issue 9, on the demo pair.

    python -m dflash_demo.ablation --budget-s 900 [--only baseline,soft,...] [--device cuda]
    python -m dflash_demo.ablation --curve soft --curve-steps 4000 --eval-every 250

Ablation: every lever of `LEVERS` changes the demo recipe (`DemoRecipe`) in one way and trains for the
same wall-clock budget: all levers are first timed round-robin (one step of each in turn, so under the
same machine load), then each is trained for budget / its step time steps (so deeper drafters or more
anchors get fewer steps, as at equal cost they would); the `data-*` levers train the baseline on the
first part of the data (how tau grows with data). Each result is the held-out tau (whole block of 16
verified every step, greedy, fp32, `models/demo/heldout.jsonl`).
Curve: one setting trained with a held-out evaluation every N steps; tau against training tokens.
Writes `NAME.{json,md,png}` (--name, default ablation) / `learning_curve.{json,md,png}` under --out; runs live under
--work/ablation and resume (a finished run is only evaluated).
"""

from __future__ import annotations

import argparse
import copy
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from dflash_core.files.atomic import write_json
from dflash_core.loading import load_tokenizer
from dflash_core.files.text import read_json_object
from dflash_core.training.data import TokenDataset, read_prompts
from dflash_core.training.recipe import TrainConfig
from dflash_core.training.train_state import STATE_FILE
from dflash_core.training.trainer import STATE_DIR, Distributed, RunOptions, Trainer, load_data

from .build import DemoRecipe, load_demo_target
from .heldout import heldout_tau

LEVERS: dict[str, dict] = {
    "baseline": {},  # the demo recipe: hard labels, 1 draft layer fed by the middle target layer, 48 anchors
    "soft": {"distill": "soft"},
    "mix": {"distill": "mix"},
    "features-3": {"feature_layers": 3},
    "features-6": {"feature_layers": 6},
    "anchors-128": {"anchors": 128},
    "anchors-256": {"anchors": 256},
    "init-target": {"init_from_target": True},
    "depth-2": {"draft_layers": 2, "feature_layers": 1},  # depth alone: the features stay the baseline's
    "depth-3": {"draft_layers": 3, "feature_layers": 1},
    "depth-2-features-6": {"draft_layers": 2, "feature_layers": 6},  # the two capacity levers together
    "data-quarter": {},  # the baseline on the first part of the data (DATA_SHARES): how tau grows with data
    "data-half": {},
}
DATA_SHARES = {"data-quarter": 0.25, "data-half": 0.5}
TIMED_STEPS = 3  # steps timed per lever (after one warm-up) to turn the budget into a step count
STEP_TIMES_FILE = "step_times.json"  # per budget folder: the seconds per step every lever was given


class _Setup:
    """What every run shares: the target, tokenizer, data, held-out prompts and device."""

    def __init__(self, models: Path, data: Path, device: str, eval_prompts: int, eval_tokens: int) -> None:
        self.models, self.device = models, device
        self.target, self.bf16 = load_demo_target(models, DemoRecipe(), device)
        self.tokenizer = load_tokenizer(models / "target")
        self.data = load_data(data)
        self.prompts = read_prompts(models / "heldout.jsonl")[:eval_prompts]
        self.eval_tokens = eval_tokens

    def trainer(self, train: TrainConfig, out: Path, eval_every: int = 0, data_share: float = 1.0) -> Trainer:
        options = RunOptions(out=out, checkpoint_every=50, eval_every=eval_every,
                             eval_prompts=self.prompts if eval_every else [], eval_max_new_tokens=self.eval_tokens)
        data = first_shards(self.data, data_share) if data_share < 1 else self.data
        return Trainer(self.target, self.tokenizer, data, train, options, Distributed(device=torch.device(self.device)))

    def tau(self, drafter: Path) -> float:
        taus = heldout_tau(self.models / "target", drafter, self.prompts, max_new_tokens=self.eval_tokens,
                           device=self.device, dtypes=("fp32",), temperatures=(0.0,))
        return taus["fp32"]["T=0"]


def first_shards(data: TokenDataset, share: float) -> TokenDataset:
    """The data set cut to its first `share` of shards (whole shards: the fingerprint a run is resumed
    against stays a function of the shards it trains on)."""
    shards = data.index["shards"]
    kept = shards[: max(1, round(len(shards) * share))]
    part = copy.copy(data)
    part.index = {**data.index, "shards": kept}
    part.samples = data.samples[: sum(shard["samples"] for shard in kept)]
    return part


def lever_config(name: str, recipe: DemoRecipe, bf16: bool = True) -> TrainConfig:
    if name not in LEVERS:
        raise SystemExit(f"ablation: unknown lever {name!r}; expected some of {', '.join(LEVERS)}")
    return replace(recipe.train_config(bf16=bf16), **LEVERS[name])


def time_levers(setup: _Setup, names: list[str], recipe: DemoRecipe, scratch: Path) -> dict[str, float]:
    """Seconds per optimizer step of each lever on this machine (fastest of TIMED_STEPS after a warm-up).

    Round-robin, one step of each lever in turn, so every lever is timed under the same load: timed one
    after another, a lever timed while something else ran beside it looked 20% faster or slower than it is.
    """
    trainers = {name: setup.trainer(replace(lever_config(name, recipe, setup.bf16), max_steps=1000), scratch / name)
                for name in names}
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(TIMED_STEPS + 1):
        for name, trainer in trainers.items():
            setup.target.set_layer_ids(trainer.drafter.config.target_layer_ids)  # the target is shared
            started = time.perf_counter()
            trainer.train_step()
            if round_:  # round 0 is the warm-up
                times[name].append(time.perf_counter() - started)
    shutil.rmtree(scratch, ignore_errors=True)
    return {name: min(values) for name, values in times.items()}


def step_times(setup: _Setup, names: list[str], recipe: DemoRecipe, budget_dir: Path, scratch: Path) -> dict[str, float]:
    """Seconds per step of every lever of this budget, kept in `budget_dir/step_times.json`.

    A lever added to a budget later is timed round-robin beside the baseline and scaled by the ratio of the
    baseline's stored time to its time now, so its step count stays comparable with the levers timed before.
    """
    path = budget_dir / STEP_TIMES_FILE
    stored = {k: float(v) for k, v in read_json_object(path).items()} if path.is_file() else {}
    missing = [name for name in names if name not in stored]
    if missing:
        timed = time_levers(setup, ["baseline"] + [n for n in missing if n != "baseline"], recipe, scratch)
        scale = stored["baseline"] / timed["baseline"] if "baseline" in stored else 1.0
        stored.update({name: timed[name] * scale for name in missing})
        stored.setdefault("baseline", timed["baseline"])
        write_json(path, stored)
    return stored


def planned_steps(run: Path) -> int | None:
    """The step count a run already started with (its budget was turned into steps once)."""
    state = run / STATE_DIR / STATE_FILE
    if not state.is_file():
        return None
    return read_json_object(state)["meta"]["train"]["max_steps"]


def ablate(setup: _Setup, names: list[str], recipe: DemoRecipe, budget_s: float, work: Path) -> list[dict]:
    budget_dir = work / f"budget-{budget_s:g}s"
    per_step = step_times(setup, names, recipe, budget_dir, work / "scratch")
    rows = []
    for name in names:
        train = lever_config(name, recipe, setup.bf16)
        run = budget_dir / name
        steps = planned_steps(run) or max(1, int(budget_s / per_step[name]))
        started = time.perf_counter()
        report = setup.trainer(replace(train, max_steps=steps), run, data_share=DATA_SHARES.get(name, 1.0)).run()
        trained_s = time.perf_counter() - started
        changes = LEVERS[name] or ({"data": f"first {DATA_SHARES[name]:g} of the shards"} if name in DATA_SHARES else {})
        rows.append({"lever": name, "changes": changes, "steps": steps,
                     "seconds_per_step": round(per_step[name], 3), "train_s": round(trained_s, 1),
                     "final_loss": report["history"][-1] if report["history"] else None, "tau": setup.tau(run)})
        print(f"{name}: {steps} steps, held-out tau {rows[-1]['tau']:.3f}", flush=True)
    return rows


def curve(setup: _Setup, name: str, recipe: DemoRecipe, steps: int, eval_every: int, work: Path) -> dict:
    """Held-out tau every `eval_every` steps of one setting; tokens = steps x batch x mean sample length."""
    train = replace(lever_config(name, recipe, setup.bf16), max_steps=steps)
    report = setup.trainer(train, work / f"curve-{name}-{steps}", eval_every=eval_every,
                           data_share=DATA_SHARES.get(name, 1.0)).run()
    index = setup.data.index
    mean_tokens = sum(s["tokens"] for s in index["shards"]) / max(1, sum(s["samples"] for s in index["shards"]))
    last = dict(report["tau_history"])  # the final evaluation repeats the periodic one at the last step
    points = [{"step": step, "tokens": int(step * train.batch_size * train.grad_accum * mean_tokens), "tau": tau}
              for step, tau in sorted(last.items())]
    return {"lever": name, "steps": steps, "eval_every": eval_every, "points": points}


def compare_curves(spec: str, out: Path, name: str, command: str) -> int:
    """NAME.{json,md,png} under `out`: held-out tau of several finished curves, step by step."""
    from dflash_bench.report import plot_lines, write_report

    curves = {}
    for item in spec.split(","):
        label, sep, folder = item.partition("=")
        if not sep or not label.strip():
            raise SystemExit(f"--compare item {item!r} is not LABEL=DIR")
        curves[label.strip()] = read_json_object(Path(folder) / "learning_curve.json", expected="a learning_curve.json of this tool")["data"]
    steps = sorted({p["step"] for c in curves.values() for p in c["points"]})
    taus = {label: {p["step"]: p["tau"] for p in c["points"]} for label, c in curves.items()}
    rows = [[step] + [f"{taus[label][step]:.2f}" if step in taus[label] else "" for label in curves] for step in steps]
    write_report(out, name, title="Held-out tau vs training step: " + ", ".join(curves), command=command,
                 columns=["step"] + [f"{label} ({c['lever']}, {c['steps']}-step schedule)" for label, c in curves.items()],
                 rows=rows, data={"curves": curves},
                 notes=["each curve's own report states its machine, data and evaluation"])
    plot_lines(out / f"{name}.png", "Learning curves (demo pair)", "training tokens", "held-out tau (block 16, greedy)",
               {label: ([p["tokens"] for p in c["points"]], [p["tau"] for p in c["points"]]) for label, c in curves.items()})
    print((out / f"{name}.md").read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    from dflash_bench.report import plot_bars, plot_lines, write_report

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=Path, default=Path("models/demo"))
    parser.add_argument("--data", type=Path, default=Path("runs/demo/data"), help="`make models` data stage")
    parser.add_argument("--work", type=Path, default=Path("runs/demo/ablation"))
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="ablation", help="report name: NAME.{json,md,png} under --out")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--budget-s", type=float, default=900.0, help="wall-clock training budget of every lever")
    parser.add_argument("--only", default="", help=f"comma-separated levers (default all: {', '.join(LEVERS)})")
    parser.add_argument("--curve", default=None, help="instead: the learning curve of this lever")
    parser.add_argument("--curve-steps", type=int, default=4000)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--eval-prompts", type=int, default=16)
    parser.add_argument("--eval-tokens", type=int, default=128)
    parser.add_argument("--compare", default=None, metavar="LABEL=DIR,...",
                        help="instead: one table and plot of finished curves (each DIR holds a learning_curve.json)")
    args = parser.parse_args(argv)
    command = "python -m dflash_demo.ablation " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.compare:
        return compare_curves(args.compare, args.out, args.name, command)
    setup = _Setup(args.models, args.data, args.device, args.eval_prompts, args.eval_tokens)
    recipe = DemoRecipe()
    note = (f"held-out tau: whole block verified every step, greedy, fp32, first {len(setup.prompts)} prompts of "
            f"{args.models / 'heldout.jsonl'}, {args.eval_tokens} new tokens; device {args.device}")
    if args.curve:
        result = curve(setup, args.curve, recipe, args.curve_steps, args.eval_every, args.work)
        points = result["points"]
        write_report(args.out, "learning_curve", title=f"Held-out tau vs training tokens ({args.curve})",
                     command=command, columns=["step", "training tokens", "held-out tau"],
                     rows=[[p["step"], p["tokens"], p["tau"]] for p in points], data=result, notes=[note])
        plot_lines(args.out / "learning_curve.png", f"Learning curve ({args.curve}, demo pair)",
                   "training tokens", "held-out tau (block 16, greedy)",
                   {args.curve: ([p["tokens"] for p in points], [p["tau"] for p in points])})
        return 0
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(LEVERS)
    rows = ablate(setup, names, recipe, args.budget_s, args.work)
    write_report(args.out, args.name, title=f"Recipe levers at {args.budget_s:g} s of training each (demo pair)",
                 command=command, columns=["lever", "changes", "steps", "s/step", "final loss", "held-out tau"],
                 rows=[[r["lever"], r["changes"] or "-", r["steps"], r["seconds_per_step"],
                        r["final_loss"], r["tau"]] for r in rows],
                 data={"rows": rows, "budget_s": args.budget_s},
                 notes=[note, "every run: the demo recipe (DemoRecipe) with one change; steps = budget / the "
                        "setting's step time (all levers timed round-robin under the same load), so every lever "
                        "costs the same wall-clock"])
    plot_bars(args.out / f"{args.name}.png", f"Held-out tau by recipe lever ({args.budget_s:g} s each)", "held-out tau",
              [r["lever"] for r in rows], [r["tau"] for r in rows])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

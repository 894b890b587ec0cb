"""Where the demo recipe is heading: held-out tau after each of its stages, fitted and extrapolated.

Reads a stage record (`docs/results/recipe_stages.json`: for the base run and each continuation, in
order, its optimizer steps, its data and the held-out tau measured after it) and fits, over the stages
from `--fit-from` on, two curves of tau (fp32, T=0) against the cumulative optimizer steps S:

  log-linear   tau = a + b ln S    gains shrink in proportion to the steps already taken (the pessimist)
  linear       tau = a + b S       every stage gains what the fitted ones did (the optimist)

and, for each, where it reaches each goal: the cumulative steps, the stages of the record's last stage
length still to run, and their training hours at the last stage's minutes (data regeneration not
included). The truth of a recipe that keeps drawing fresh prompts lies between the two.

    python -m dflash_demo.recipe_curve --stages docs/results/recipe_stages.json --out docs/results

Writes NAME.{json,md,png} under --out (default name recipe_curve).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dflash_core.errors import DataError
from dflash_core.files.text import read_json_object

SETTINGS = (("fp32", "T=0"), ("fp32", "T=1"), ("bf16", "T=0"), ("bf16", "T=1"))


@dataclass(frozen=True)
class Stage:
    name: str
    data: str
    steps: int  # this stage's optimizer steps
    total_steps: int  # cumulative, this stage included
    minutes: float  # its training time
    tau: dict[str, dict[str, float]]  # {dtype: {"T=t": held-out tau}}; a setting not measured is absent


@dataclass(frozen=True)
class Fit:
    kind: str  # "log-linear" or "linear"
    a: float
    b: float
    r2: float

    def at(self, steps: float) -> float:
        return self.a + self.b * (math.log(steps) if self.kind == "log-linear" else steps)

    def steps_to(self, goal: float) -> float | None:
        """Cumulative steps at which the fit reaches `goal`; None when it does not (slope <= 0, or past 1e304)."""
        if self.b <= 0:
            return None
        x = (goal - self.a) / self.b
        if self.kind == "linear":
            return x
        return math.exp(x) if x < 700 else None


def read_stages(path: Path) -> list[Stage]:
    """The record's stages with cumulative steps; a malformed record is one DataError naming what is wrong."""
    record = read_json_object(path, expected="a stage record: {'stages': [{'name', 'steps', 'data', 'tau', ...}]}")
    entries = record.get("stages")
    if not isinstance(entries, list) or not entries:
        raise DataError(f"{path}: 'stages' must be a non-empty list of stages, got {type(entries).__name__}")
    stages, total = [], 0
    for i, entry in enumerate(entries):
        where = f"{path}: stage {i}"
        if not isinstance(entry, dict):
            raise DataError(f"{where} is not an object")
        steps = entry.get("steps")
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise DataError(f"{where}: 'steps' must be a positive integer, got {steps!r}")
        tau = entry.get("tau")
        if not isinstance(tau, dict) or not _valid_taus(tau):
            raise DataError(f"{where}: 'tau' must map dtype -> {{'T=t': tau >= 1}}, got {tau!r}")
        minutes = entry.get("train_minutes", 0.0)
        if not isinstance(minutes, (int, float)) or minutes < 0:
            raise DataError(f"{where}: 'train_minutes' must be a number >= 0, got {minutes!r}")
        total += steps
        stages.append(Stage(str(entry.get("name", f"stage {i}")), str(entry.get("data", "")), steps, total,
                            float(minutes), tau))
    return stages


def _valid_taus(tau: dict) -> bool:
    return all(isinstance(by_t, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 1
                                              for v in by_t.values()) for by_t in tau.values())


def least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """(a, b, r2) of y = a + b x."""
    n = len(xs)
    if n < 2 or len(ys) != n:
        raise ValueError(f"a line needs at least 2 points with one y each, got {n} x and {len(ys)} y")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("all points sit at the same step: no slope to fit")
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    total = sum((y - my) ** 2 for y in ys)
    residual = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    return a, b, 1.0 - residual / total if total else 1.0


def fit_curves(stages: Sequence[Stage], dtype: str = "fp32", temperature: str = "T=0") -> list[Fit]:
    """Both fits of one setting's tau against cumulative steps, over the stages that measured it."""
    points = [(s.total_steps, s.tau[dtype][temperature]) for s in stages if temperature in s.tau.get(dtype, {})]
    steps, taus = [p[0] for p in points], [p[1] for p in points]
    return [Fit("log-linear", *least_squares([math.log(x) for x in steps], taus)),
            Fit("linear", *least_squares(steps, taus))]


def predictions(fits: Sequence[Fit], last: Stage, goals: Sequence[float]) -> list[dict]:
    """Per fit and goal: cumulative steps, stages of the last stage's length still to run, their hours."""
    rows = []
    for fit in fits:
        for goal in goals:
            steps = fit.steps_to(goal)
            more = None if steps is None else max(0, math.ceil((steps - last.total_steps) / last.steps))
            rows.append({"fit": fit.kind, "goal": goal, "total_steps": None if more is None else round(steps),
                         "more_stages": more, "more_train_hours": None if more is None else round(more * last.minutes / 60, 1)})
    return rows


def main(argv: list[str] | None = None) -> int:
    from dflash_bench.report import plot_lines, write_report

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", type=Path, default=Path("docs/results/recipe_stages.json"))
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="recipe_curve")
    parser.add_argument("--fit-from", default="sampled_run", help="first stage of the fits (its name in the record)")
    parser.add_argument("--goals", default="5,6", help="comma-separated fp32 T=0 tau goals")
    args = parser.parse_args(argv)
    command = "python -m dflash_demo.recipe_curve " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        goals = [float(g) for g in args.goals.split(",")]
    except ValueError:
        raise SystemExit(f"error: --goals {args.goals!r}: expected comma-separated numbers") from None
    try:
        stages = read_stages(args.stages)
    except DataError as error:
        raise SystemExit(f"error: {error}") from None
    names = [s.name for s in stages]
    if args.fit_from not in names:
        raise SystemExit(f"error: --fit-from {args.fit_from!r} is not a stage of {args.stages} ({', '.join(names)})")
    fitted = stages[names.index(args.fit_from):]
    try:
        fits = fit_curves(fitted)
    except ValueError as error:
        raise SystemExit(f"error: {args.stages}: {error} (stages from {args.fit_from} with fp32 T=0 tau)") from None
    predicted = predictions(fits, stages[-1], goals)
    columns = ["stage", "data", "steps (cumulative)"] + [f"{d} {t}" for d, t in SETTINGS] + [f"{f.kind} fit" for f in fits]
    rows = [[s.name, s.data, s.total_steps] + [s.tau.get(d, {}).get(t, "") for d, t in SETTINGS]
            + [round(f.at(s.total_steps), 3) if s in fitted else "" for f in fits] for s in stages]
    notes = [f"{f.kind} fit over {args.fit_from}..{stages[-1].name}: tau = {f.a:.3f} + {f.b:.4g} "
             f"{'ln S' if f.kind == 'log-linear' else 'S'} (R^2 {f.r2:.3f})" for f in fits]
    notes += [f"{p['fit']}: tau {p['goal']:g} at S = {p['total_steps']:,}, {p['more_stages']} more {stages[-1].steps}-step "
              f"stages, {p['more_train_hours']} h of training at {stages[-1].minutes:g} min per stage"
              if p["total_steps"] is not None else f"{p['fit']}: tau {p['goal']:g} not within reach of this fit" for p in predicted]
    write_report(args.out, args.name, title="Held-out tau after each stage of the demo recipe, fitted",
                 command=command, columns=columns, rows=rows,
                 data={"stages": [s.__dict__ for s in stages], "fit_from": args.fit_from,
                       "fits": [f.__dict__ for f in fits], "predictions": predicted}, notes=notes)
    series = {f"{d} {t}": ([s.total_steps for s in stages if t in s.tau.get(d, {})],
                           [s.tau[d][t] for s in stages if t in s.tau.get(d, {})]) for d, t in SETTINGS}
    reach = [p["total_steps"] for p in predicted if p["fit"] == "linear" and p["total_steps"]]
    end = max([stages[-1].total_steps] + reach)
    xs = [fitted[0].total_steps * (end / fitted[0].total_steps) ** (i / 40) for i in range(41)]
    series.update({f"{f.kind} fit (fp32 T=0)": (xs, [f.at(x) for x in xs]) for f in fits})
    plot_lines(args.out / f"{args.name}.png", "Demo recipe: held-out tau by stage, and where the fits go",
               "optimizer steps, cumulative (log)", "held-out tau (block 16)",
               {k: v for k, v in series.items() if v[0]}, hline=goals[0], dashed=[f"{f.kind} fit (fp32 T=0)" for f in fits],
               logx=True)
    print((args.out / f"{args.name}.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

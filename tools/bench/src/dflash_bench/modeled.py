"""Decoding priced by the machine's cost table: is one drafter (or option) faster than another, without the clock's noise.

Why: on a shared 2-core machine an end-to-end run's speedups move by several percent from one run to the
next, and on 24 prompts the decoder's knife-edge choices (drafter or copy, how many drafts) move tau by as
much (docs/benchmarks.md, "Sixty-four stages"): too coarse to tell two neighbouring drafters apart. Here
`generate` itself decodes each prompt (greedy, batch 1, its defaults unless told otherwise) and records
every step (`DecodeProfile.step_log`); each step is then charged what the decoder's own cost table
(`Tuning.cost_table`, the one its draft-length policy decides by) says it costs:

    plain step      T(1)
    drafter step    T(k+1) + the drafter's pass and read-out of k drafts (`VerifyCostTable.drafting`)
    lookup step     T(k+1) (a copy costs no model pass)

and the target alone one T(1) per token. Given the weights and the table, the figure is deterministic, so
a difference of a fraction of a percent is real; prefill and the loop's own overhead are not in it (the
end-to-end benchmark, `dflash bench e2e`, measures those). Two things would make it depend on the moment,
so both are fixed for a run: one cost table decides and prices for every drafter of a shape (the first such
pair's, as `generate` would find it, or `--costs` from an earlier report: a cached table is re-measured
whenever the machine seems faster than when it was taken), and the drafter reads its own weights
(`--drafter-weights plain`: the bf16 or fp16 copies decoding may pick are chosen per matmul by timing, and
can part at a near-tie). The same decodes' wall time is reported beside the model, as a check of the table.

    python -m dflash_bench.modeled --target models/demo/target --drafters OLD NEW --prompts P.jsonl \\
        --count 64 --out runs/modeled
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from tqdm import tqdm

from dflash_core.decode.loop import generate
from dflash_core.tuning.cost_table import VerifyCostTable
from dflash_core.tuning.draft_length import DraftLengthPolicy
from dflash_core.tuning.plan import Tuning
from dflash_core.loading import Pair, encode_prompt, stop_token_ids
from dflash_core.decode.profiling import DecodeProfile, StepRecord

SOURCES = ("drafter", "lookup", "plain")
MEASURED = ("prefill_s", "decode_s", "verify_s", "draft_s")


def step_seconds(record: StepRecord, costs: VerifyCostTable) -> float:
    """What the cost table charges for one recorded step (its rows verified together)."""
    rows = len(record.committed)
    verify = costs.verify(rows * (record.drafts + 1))
    return verify + (costs.drafting(record.drafts, rows) if record.source == "drafter" else 0.0)


@dataclass
class ModeledDecode:
    """One pair's decode of a list of prompts, every step priced by `costs`."""

    costs: VerifyCostTable
    tokens: int = 0
    """Tokens the steps committed: each prompt's output but its first token (the prefill's, which the
    target alone pays the same for)."""
    seconds: float = 0.0
    """The steps' modeled time."""
    steps: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    drafts_verified: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    per_prompt: list[dict] = field(default_factory=list)
    measured: dict[str, float] = field(default_factory=lambda: dict.fromkeys(MEASURED, 0.0))
    """The same decodes' wall time by phase (`DecodeProfile`): how well the table priced this run."""

    def add(self, tokens: int, records: Sequence[StepRecord], profile: DecodeProfile | None = None) -> None:
        seconds = sum(step_seconds(record, self.costs) for record in records)
        for record in records:
            self.steps[record.source] += 1
            self.drafts_verified[record.source] += record.drafts
        self.tokens += tokens
        self.seconds += seconds
        for name in MEASURED if profile is not None else ():
            self.measured[name] += getattr(profile, name)
        self.per_prompt.append({"tokens": tokens, "steps": len(records), "seconds": seconds,
                                "speedup": _speedup(tokens, seconds, self.costs)})

    @property
    def tau(self) -> float:
        """Tokens per verify step."""
        return self.tokens / max(1, sum(self.steps.values()))

    @property
    def speedup(self) -> float:
        """Over the target alone, in the cost model: one plain step per token against the steps' time."""
        return _speedup(self.tokens, self.seconds, self.costs)

    @property
    def measured_over_modeled(self) -> float:
        """Wall time of the steps (decode, loop included) over their modeled time: 1 when the table is right."""
        return self.measured["decode_s"] / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "seconds": self.seconds, "tau": self.tau, "speedup": self.speedup,
                "steps": self.steps, "drafts_verified": self.drafts_verified, "costs": self.costs.to_dict(),
                "measured": self.measured, "measured_over_modeled": self.measured_over_modeled,
                "per_prompt": self.per_prompt}


def _speedup(tokens: int, seconds: float, costs: VerifyCostTable) -> float:
    return tokens * costs.verify(1) / seconds if seconds > 0 else 1.0


def modeled_decode(pair: Pair, texts: Sequence, *, max_new_tokens: int, draft_length: int | str = "auto",
                   context_lookup: bool = True, costs: VerifyCostTable | None = None,
                   label: str = "") -> ModeledDecode:
    """Decode each prompt alone with `generate` (greedy) and price its steps by `costs` (default: the pair's
    cost table). With "auto" the draft-length policy decides by the same table, learning across the prompts
    as `generate`'s own does (`Tuning.history`)."""
    stops = stop_token_ids(pair.target, pair.tokenizer)
    run = ModeledDecode(costs or pair.tuning.cost_table(pair.target, pair.drafter))
    block = pair.drafter.config.block_size
    for text in tqdm(texts, desc=f"modeled decode {label}".rstrip(), unit="prompt", dynamic_ncols=True):
        ids = encode_prompt(pair.tokenizer, text, pair.target.device)
        profile = DecodeProfile(step_log=[])
        policy = (DraftLengthPolicy(run.costs, block, history=pair.tuning.history(pair.drafter)) if draft_length == "auto"
                  else draft_length)
        result = generate(pair.target, pair.drafter, ids, max_new_tokens=max_new_tokens, stop_token_ids=stops,
                          draft_length=policy, context_lookup=context_lookup, tree="off", profile=profile)
        run.add(max(0, result.num_new_tokens - 1), profile.step_log, profile)
    return run


def read_costs(path: Path) -> VerifyCostTable:
    """A cost table from a JSON file: the table itself, or a report of this tool (its first drafter's table)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cost table {path} is not readable JSON ({error})") from None
    if isinstance(data, dict) and isinstance(data.get("data"), dict) and data["data"]:
        data = next(iter(data["data"].values())).get("costs")
    try:
        return VerifyCostTable.from_dict(data)
    except (ValueError, AttributeError, TypeError) as error:
        raise ValueError(f"cost table {path}: {error}") from None


def main(argv: Sequence[str] | None = None) -> int:
    import shlex
    import sys

    from dflash_core.errors import DFlashError
    from dflash_core.loading import load_pair
    from dflash_core.training.data import read_prompts

    from .report import plot_bars, write_report

    parser = argparse.ArgumentParser(prog="python -m dflash_bench.modeled", description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--drafters", type=Path, nargs="+", required=True, help="drafter directories, compared in order")
    parser.add_argument("--prompts", type=Path, required=True, help="JSONL with a 'prompt' per line")
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="auto", help="auto (default, as decoding chooses), fp32 or bf16")
    parser.add_argument("--draft-length", default="auto", help="auto (default) or a fixed k")
    parser.add_argument("--no-context-lookup", action="store_true", help="the drafter as the only draft source")
    parser.add_argument("--drafter-weights", default="plain", choices=("plain", "auto", "bf16", "fp16-packed"),
                        help="plain (default): the drafter's own weights, the same drafts from run to run")
    parser.add_argument("--costs", type=Path, help="a cost table (JSON: seconds, draft_s, head_s) or an earlier "
                                                   "report of this tool, whose first table is reused")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--name", default="modeled")
    args = parser.parse_args(argv)
    if args.count < 1 or args.max_new_tokens < 2:
        parser.error(f"--count must be >= 1 and --max-new-tokens >= 2, got {args.count} and {args.max_new_tokens}")
    draft_length = args.draft_length
    if draft_length != "auto":
        if not draft_length.isdigit():
            parser.error(f"--draft-length must be 'auto' or a whole number of drafts, got {draft_length!r}")
        draft_length = int(draft_length)
    try:
        fixed = read_costs(args.costs) if args.costs else None
        texts = read_prompts(args.prompts)[: args.count]
        runs, tuning = {}, Tuning.cached()
        for number, drafter in enumerate(args.drafters, 1):
            pair = load_pair(args.target, drafter, dtype=args.dtype, drafter_weights=args.drafter_weights,
                             tuning=tuning)
            # the Tuning keeps one table per pair key (machine, shapes, read-out, weights)
            costs = fixed or pair.tuning.cost_table(pair.target, pair.drafter)
            name = str(drafter) if str(drafter) not in runs else f"{drafter} #{number}"  # the same one twice: a check
            runs[name] = modeled_decode(pair, texts, max_new_tokens=args.max_new_tokens, draft_length=draft_length,
                                        context_lookup=not args.no_context_lookup, costs=costs, label=drafter.name)
    except (DFlashError, OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    first = next(iter(runs.values()))
    rows = [(name, round(run.tau, 3), "/".join(str(run.steps[s]) for s in SOURCES),
             round(run.drafts_verified["drafter"] / max(1, run.steps["drafter"]), 2),
             round(run.speedup, 3), round(run.speedup / first.speedup, 4), round(run.measured_over_modeled, 3),
             round(run.measured["prefill_s"] / max(1e-9, run.measured["prefill_s"] + run.measured["decode_s"]), 3))
            for name, run in runs.items()]
    table_from = str(args.costs) if args.costs else "each pair's, one per drafter shape for the process"
    command = "python -m dflash_bench.modeled " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    write_report(args.out, args.name, title="Decoding priced by the machine's cost table", command=command,
                 columns=("drafter", "tau", "steps drafter / lookup / plain", "drafts verified per drafter step",
                          "cost-model speedup vs the target alone", "vs the first drafter",
                          "measured decode / modeled", "prefill share of measured time"),
                 rows=rows, data={name: run.to_dict() for name, run in runs.items()},
                 notes=[f"{len(texts)} prompts from {args.prompts}, each alone (batch 1), up to {args.max_new_tokens} "
                        f"greedy tokens; dtype {args.dtype}; draft length {args.draft_length}; context lookup "
                        f"{'off' if args.no_context_lookup else 'on'}; drafter weights {args.drafter_weights}",
                        f"cost tables: {table_from}; "
                        + "; ".join(f"{Path(name).name}: T(1) {run.costs.seconds[0] * 1e3:.3f} ms, "
                                    f"T({run.costs.block_size}) {run.costs.seconds[-1] * 1e3:.3f} ms, "
                                    f"drafter pass {run.costs.draft_s * 1e3:.3f} ms" for name, run in runs.items()),
                        "each step charged by the decoder's cost table: a plain step T(1), a drafter step T(k+1) + "
                        "its pass and read-out, a lookup step T(k+1); the target alone T(1) a token; prefill and "
                        "loop overhead excluded (deterministic for given weights and table)",
                        "measured decode / modeled: the same decodes' wall time after prefill (loop included) over "
                        "their modeled time, a check of the table on this run (not deterministic); prefill share: "
                        "what the modeled speedup leaves out and every method pays alike",
                        f"plot: {args.name}.png"])
    plot_bars(args.out / f"{args.name}.png", "Decoding priced by the cost table: speedup over the target alone",
              "cost-model speedup", [Path(name).name for name in runs], [run.speedup for run in runs.values()],
              hline=1.0)
    print(json.dumps({name: {"tau": round(run.tau, 3), "speedup": round(run.speedup, 3)} for name, run in runs.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

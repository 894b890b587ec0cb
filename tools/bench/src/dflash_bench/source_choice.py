"""Which draft source should a step use? Both sources' acceptance at every position, and what choosing is worth.

The decoder has two draft sources (docs/architecture.md, "Draft source"): the drafter and context
lookup (a copy of what followed the latest earlier occurrence of the row's last n-gram). Each step it
picks one from what each has achieved so far. This measures how much a better choice could add, at T=0:

1. the target's greedy output for each prompt (the target alone, one token per step);
2. at every position p of that output (p = the last committed token), how many drafts each source
   would have had accepted there: the drafter's whole block drafted from the target's features of
   tokens < p (what the decoder's drafter sees), and the lookup copy of the history up to p;
3. decoding replayed from those numbers under a rule that picks the source per step, each step
   charged by the machine's cost table (`Tuning.cost_table`, the decoder's own).

"oracle" picks, knowing both outcomes, the one of drafter / lookup / plain step with the most tokens
per second: no rule that decides before verifying can beat it, so oracle / the decoder's rule bounds
what source choice can still buy. Replaying "drafter" reproduces the decoder's acceptance lengths at
`draft_length=B-1, context_lookup=False` step for step (tested).

    python -m dflash_bench.source_choice --target models/demo/target --drafter models/demo/drafter \\
        --prompts PROMPTS.jsonl --count 64 --out runs/source_choice
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from tqdm import tqdm

from dflash_core.tuning.plan import Tuning
from dflash_core.decode.autoregressive import generate_autoregressive
from dflash_core.decode.context_lookup import NgramIndex
from dflash_core.tuning.cost_table import VerifyCostTable
from dflash_core.model.draft_vocab import read_out_for


@dataclass
class PositionAcceptance:
    """One prompt: per position p of the output (index 0 = the prefill's token), drafts each source gets accepted."""

    output_tokens: int
    drafter: list[int]  # accepted drafts of the drafter's block at p (0..B-1)
    lookup: list[int]  # accepted tokens of the lookup copy at p (0 where there is no copy)
    copy: list[int]  # length of the lookup copy at p (0: no earlier occurrence, the source cannot draft)


def _accepted(drafts: Sequence[int], truth: Sequence[int]) -> int:
    count = 0
    while count < min(len(drafts), len(truth)) and drafts[count] == truth[count]:
        count += 1
    return count


@torch.inference_mode()
def position_acceptance(target, drafter, prompt: list[int], output: list[int]) -> PositionAcceptance:
    """Both sources at every position of `output` (the target's greedy continuation of `prompt`).

    The drafter runs its own weights: exactly a decoder's drafts with `drafter_weights="plain"`; a decoder reading
    bf16 or fp16-packed copies (the CPU's choice) can differ where two tokens are near a tie."""
    block, mask = drafter.config.block_size, drafter.config.mask_token_id
    tokens = prompt + output
    device = target.device
    features = target(torch.tensor([tokens], device=device), torch.arange(len(tokens), device=device)[None]).features
    read_out = read_out_for(drafter, target)
    drafted, looked, copies = [], [], []
    history = NgramIndex(tokens[: len(prompt) + 1])  # the decoder's lookup index, one token added per position
    for p in range(len(prompt), len(tokens)):
        truth = tokens[p + 1 : p + block]
        noise = target.embed(torch.tensor([[tokens[p]] + [mask] * (block - 1)], device=device))
        positions = torch.arange(p + block, device=device)[None]  # context 0..p-1, then the block p..p+B-1
        hidden = drafter(noise, features[:, :p], positions)
        drafted.append(_accepted(read_out(hidden[:, 1:])[0].tolist(), truth))
        copy = history.continuation(block - 1)
        looked.append(_accepted(copy, truth))
        copies.append(len(copy))
        history.extend(tokens[p + 1 : p + 2])
    return PositionAcceptance(len(output), drafted, looked, copies)


# a rule: (drafter's accepted, lookup's accepted, copy length, costs) -> (accepted drafts, step seconds)
Rule = Callable[[int, int, int, VerifyCostTable], tuple[int, float]]


def _drafter(d: int, l: int, copy: int, costs: VerifyCostTable) -> tuple[int, float]:
    return d, costs.step(costs.block_size - 1)


def _lookup_step(l: int, copy: int, costs: VerifyCostTable) -> tuple[int, float]:
    return l, costs.verify(copy + 1)  # a copy costs no model pass: only its wider verify


def _lookup_else_drafter(d: int, l: int, copy: int, costs: VerifyCostTable) -> tuple[int, float]:
    return _lookup_step(l, copy, costs) if copy else _drafter(d, l, copy, costs)


def _lookup_else_plain(d: int, l: int, copy: int, costs: VerifyCostTable) -> tuple[int, float]:
    return _lookup_step(l, copy, costs) if copy else (0, costs.verify(1))


def _oracle(d: int, l: int, copy: int, costs: VerifyCostTable) -> tuple[int, float]:
    options = [_drafter(d, l, copy, costs), (0, costs.verify(1))] + ([_lookup_step(l, copy, costs)] if copy else [])
    return max(options, key=lambda option: (option[0] + 1) / option[1])


RULES: dict[str, Rule] = {
    "drafter": _drafter,  # the whole block of drafter drafts every step
    "lookup_else_plain": _lookup_else_plain,  # prompt lookup in this loop
    "lookup_else_drafter": _lookup_else_drafter,  # a copy whenever there is one, else the drafter
    "oracle": _oracle,
}


def replay(rows: Sequence[PositionAcceptance], costs: VerifyCostTable, rule: Rule) -> dict:
    """Decode every row again from its per-position numbers under `rule`.

    Returns tokens committed per step (one list per row), tau (tokens / steps) and the cost model's
    speedup over the target alone (tokens x one plain step's time / the steps' time)."""
    lengths, seconds = [], 0.0
    for row in rows:
        committed, steps = 1, []  # the prefill committed output token 0
        while committed < row.output_tokens:
            p = committed - 1
            accepted, cost = rule(row.drafter[p], row.lookup[p], row.copy[p], costs)
            steps.append(min(accepted + 1, row.output_tokens - committed))
            committed += steps[-1]
            seconds += cost
        lengths.append(steps)
    tokens = sum(map(sum, lengths))
    count = sum(map(len, lengths))
    return {"lengths": lengths, "tau": round(tokens / max(1, count), 3),
            "speedup": round(tokens * costs.verify(1) / seconds, 3) if seconds else 1.0}


def main(argv: Sequence[str] | None = None) -> int:
    import shlex
    import sys

    from dflash_core.loading import encode_prompt, load_pair, stop_token_ids
    from dflash_core.training.data import read_prompts

    from .report import write_report

    parser = argparse.ArgumentParser(prog="python -m dflash_bench.source_choice", description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--drafter", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, required=True, help="JSONL with a 'prompt' per line")
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="fp32", help="fp32 (default: the greedy output is exact), bf16 or auto")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--name", default="source_choice")
    args = parser.parse_args(argv)
    if args.count < 1 or args.max_new_tokens < 2:
        parser.error(f"--count must be >= 1 and --max-new-tokens >= 2, got {args.count} and {args.max_new_tokens}")
    pair = load_pair(args.target, args.drafter, dtype=args.dtype, tuning=Tuning.cached())
    stops = stop_token_ids(pair.target, pair.tokenizer)
    rows = []
    for text in tqdm(read_prompts(args.prompts)[: args.count], desc="both sources at every position"):
        prompt = encode_prompt(pair.tokenizer, text, pair.target.device)
        output = generate_autoregressive(pair.target, prompt, max_new_tokens=args.max_new_tokens,
                                         stop_token_ids=stops).tokens[0]
        rows.append(position_acceptance(pair.target, pair.drafter, prompt[0].tolist(), output))
    costs = pair.tuning.cost_table(pair.target, pair.drafter)
    results = {name: replay(rows, costs, rule) for name, rule in RULES.items()}
    command = "python -m dflash_bench.source_choice " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    write_report(args.out, args.name, title="Draft source per step: rules replayed on both sources' acceptance",
                 command=command, columns=("rule", "tau", "cost-model speedup vs the target alone"),
                 rows=[(name, r["tau"], r["speedup"]) for name, r in results.items()],
                 data={"costs": costs.to_dict(), "rows": [asdict(row) for row in rows],
                       "lengths": {name: r["lengths"] for name, r in results.items()}},
                 notes=[f"{len(rows)} prompts from {args.prompts}, up to {args.max_new_tokens} greedy tokens, {args.dtype}",
                        "drafter: the whole block every step; lookup_else_plain: a copy when there is one, else a "
                        "plain step (prompt lookup); lookup_else_drafter: a copy when there is one, else the drafter; "
                        "oracle: per step the best of drafter / copy / plain knowing both outcomes (an upper bound "
                        "for any rule that decides before verifying)",
                        "speedup: the cost model's (the decoder's cost table; prefill and loop overhead excluded)"])
    print(json.dumps({name: {"tau": r["tau"], "speedup": r["speedup"]} for name, r in results.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Tokens accepted per step against token-tree size, at equal drafter: what a tree buys before costs.

Every prompt is decoded with the drafter as the only draft source and the whole block drafted each step
(no draft-length policy, no context lookup), verifying the argmax chain (`chain`, B-1 drafts) or a token
tree of N nodes (`dflash_core.decode.tree`), N over --sizes; tau is the mean tokens committed per step.
Outputs are checked against the chain's (greedy: identical). The trees' calibration is learnt over the
prompts in order, as a serving process learns it (the same `Tuning` for every size, reset per size).

    python -m dflash_bench.tree_sizes --target T --drafter D --prompts-file P --out docs/results --name NAME
"""

from __future__ import annotations

import sys
from pathlib import Path

from tqdm import tqdm

from dflash_core.decode.loop import generate
from dflash_core.loading import encode_prompt, load_pair, stop_token_ids
from dflash_core.training.data import read_prompts
from dflash_core.tuning.plan import Tuning

DEFAULT_SIZES = (1, 2, 4, 8, 15, 24, 31, 48, 64)


def measure(target_dir: Path, drafter_dir: Path, prompts: list, *, sizes, dtype: str, max_new_tokens: int,
            temperature: float) -> dict:
    pair = load_pair(target_dir, drafter_dir, dtype=dtype, device="cpu", tuning=Tuning.cached())
    stops = stop_token_ids(pair.target, pair.tokenizer)
    block = pair.drafter.config.block_size
    encoded = [encode_prompt(pair.tokenizer, p, "cpu") for p in prompts]
    rows, reference = [], None
    for size in tqdm(["chain", *sizes], desc="tree sizes", unit="size", dynamic_ncols=True):
        tuning = Tuning()  # a fresh calibration per size, learnt over the prompts in order
        steps, committed, outputs = 0, 0, []
        for ids in encoded:
            result = generate(pair.target, pair.drafter, ids, max_new_tokens=max_new_tokens, stop_token_ids=stops,
                              draft_length=block - 1, context_lookup=False, tree="off" if size == "chain" else size,
                              temperature=temperature, seed=0, tuning=tuning)
            lengths = result.acceptance_lengths[0]
            steps, committed = steps + len(lengths), committed + sum(lengths)
            outputs.append(result.tokens[0])
        reference = outputs if reference is None else reference
        same = sum(a == b for a, b in zip(outputs, reference))
        rows.append({"size": size, "tau": committed / max(1, steps), "steps": steps,
                     "identical_to_chain": f"{same}/{len(outputs)}" if temperature == 0 else None})
    chain = rows[0]["tau"]
    for row in rows:
        row["vs_chain"] = row["tau"] / chain if chain else None
    return {"dtype": str(pair.target.dtype).removeprefix("torch."), "block_size": block, "prompts": len(prompts),
            "max_new_tokens": max_new_tokens, "temperature": temperature, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    from .report import pair_parser, plot_lines, write_report

    parser = pair_parser(__doc__, max_new_tokens=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--name", default="tree_sizes")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    prompts = read_prompts(args.prompts_file)[: args.prompts]
    result = measure(args.target, args.drafter, prompts, sizes=sizes, dtype=args.dtype,
                     max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    columns = ["verified", "tau", "vs chain", "steps", "identical to the chain"]
    block = result["block_size"]
    rows = [[f"chain ({block - 1} drafts)" if r["size"] == "chain" else f"tree of {r['size']} nodes", r["tau"],
             r["vs_chain"], r["steps"], r["identical_to_chain"] or "n/a (T > 0)"] for r in result["rows"]]
    trees = [r for r in result["rows"] if r["size"] != "chain"]
    pair_name = args.target.resolve().parent.name
    plot_lines(args.out / f"{args.name}.png", f"Tokens per step vs token-tree size ({pair_name} pair, "
               f"T={args.temperature:g})", "tree nodes", "tokens committed per step (tau)",
               {"tree": ([r["size"] for r in trees], [r["tau"] for r in trees]),
                f"chain of {block - 1}": ([trees[0]["size"], trees[-1]["size"]], [result["rows"][0]["tau"]] * 2)},
               dashed=[f"chain of {block - 1}"])
    notes = [f"{result['prompts']} prompts of {args.prompts_file}, {args.max_new_tokens} new tokens, "
             f"{result['dtype']}, "
             "whole block drafted every step, drafter only (no context lookup)"]
    command = "python -m dflash_bench.tree_sizes " + " ".join(sys.argv[1:] if argv is None else argv)
    write_report(args.out, args.name, title="Token trees: tokens per step by size, at equal drafter",
                 command=command, columns=columns, rows=rows, data=result, notes=notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where greedy DFlash and the greedy target alone part in reduced precision, and why.

Verification scores 16 tokens in one forward, the target alone scores one; in bf16 the two shapes
run different matmul kernels with different accumulation orders, so the same logit can round
differently. When the target's top two tokens are closer than that rounding, the two decoders can
pick different tokens at that position (and then continue differently). In fp32 the rounding is
2^16 times finer and the outputs match. This tool finds each first divergence and measures, with
an fp32 copy of the target on the same prefix, how far apart the two competing tokens really are.

    python -m dflash_bench.divergence --out docs/results [--prompts 24] [--dtype bf16]
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from dflash_core.tuning.plan import Tuning
from dflash_core.decode.autoregressive import generate_autoregressive
from dflash_core.decode.loop import generate
from dflash_core.dtypes import SHORT_NAMES, precision
from dflash_core.loading import encode_prompt, load_pair, load_target, stop_token_ids
from dflash_core.training.data import read_prompts


def rounding_step(value: float, dtype: str) -> float:
    """Spacing of representable numbers of `dtype` around `value` (one unit in the last place)."""
    exponent = math.floor(math.log2(abs(value))) if value else 0
    return 2.0 ** (exponent - precision(dtype).mantissa_bits)


@torch.inference_mode()
def next_token_logits(target, prefix: list[int]) -> torch.Tensor:
    """[V] fp32 logits of the token after `prefix`, from one plain forward (no cache)."""
    ids = torch.tensor([prefix])
    hidden = target(ids, torch.arange(len(prefix))[None], None, None).hidden[0, -1]
    return target.logits(hidden).float()


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def measure(target_dir: Path, drafter_dir: Path, prompts: list[str], *, dtype: str, max_new_tokens: int) -> dict:
    pair = load_pair(target_dir, drafter_dir, dtype=dtype, device="cpu", tuning=Tuning.cached())
    reference = load_target(target_dir, pair.drafter.config.target_layer_ids, "fp32")
    stops = stop_token_ids(pair.target, pair.tokenizer)
    rows = []
    for index, prompt in enumerate(tqdm(prompts, desc=f"divergence {dtype}", unit="prompt", dynamic_ncols=True)):
        ids = encode_prompt(pair.tokenizer, prompt, "cpu")
        kwargs = {"max_new_tokens": max_new_tokens, "stop_token_ids": stops}
        alone = generate_autoregressive(pair.target, ids, **kwargs).tokens[0]
        spec = generate(pair.target, pair.drafter, ids, tuning=pair.tuning, **kwargs).tokens[0]
        at = first_divergence(alone, spec)
        if at is None or at >= min(len(alone), len(spec)):
            continue
        prefix = ids[0].tolist() + alone[:at]
        exact = next_token_logits(reference, prefix)
        low = next_token_logits(pair.target, prefix)
        chosen = (alone[at], spec[at])
        rows.append({
            "prompt": index, "position": at, "target_alone_token": chosen[0], "dflash_token": chosen[1],
            "fp32_gap": abs(float(exact[chosen[0]] - exact[chosen[1]])),
            "low_precision_gap": abs(float(low[chosen[0]] - low[chosen[1]])),
            "rounding_step": rounding_step(float(low[chosen[0]]), dtype),
            "fp32_choice": ("target alone" if int(exact.argmax()) == chosen[0]
                            else "dflash" if int(exact.argmax()) == chosen[1] else "neither"),
        })
    return {"dtype": dtype, "prompts": len(prompts), "divergent": len(rows), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    from .report import pair_parser, write_report

    parser = pair_parser(__doc__, max_new_tokens=256)
    parser.add_argument("--dtype", choices=SHORT_NAMES, default="bf16")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    args = parser.parse_args(argv)
    prompts = read_prompts(args.prompts_file)[: args.prompts]
    result = measure(args.target, args.drafter, prompts, dtype=args.dtype, max_new_tokens=args.max_new_tokens)
    columns = ["prompt", "first divergence (token)", "fp32 gap of the two tokens",
               f"{args.dtype} gap", f"{args.dtype} rounding step", "fp32 prefers"]
    rows = [[r["prompt"], r["position"], r["fp32_gap"], r["low_precision_gap"], r["rounding_step"], r["fp32_choice"]]
            for r in result["rows"]]
    notes = [f"{result['divergent']} of {result['prompts']} greedy outputs differ in {args.dtype}; "
             "gaps are logit differences between the two competing tokens on the same prefix",
             "rounding step: the spacing of representable values at that logit's magnitude"]
    command = "python -m dflash_bench.divergence " + " ".join(sys.argv[1:] if argv is None else argv)
    write_report(args.out, f"divergence_{args.dtype}", title=f"Where greedy outputs part in {args.dtype}",
                 command=command, columns=columns, rows=rows, data=result, notes=notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

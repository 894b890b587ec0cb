"""Where one decode step's time goes, in units of the target's own one-token forward.

    python -m dflash_bench.step_cost --out docs/results [--dtype fp32] [--context 256] [--compile]

Measured on one pair, after a cached context of `--context` tokens, each the fastest of
`--repeats` runs after a warm-up (other work on a machine only ever adds time):

- `target 1 tok (HF)`: the Hugging Face model's own forward over one token with its cache: the unit;
- verify width q: the same HF forward over q tokens, and our `TargetModel` forward (feature hooks,
  final hidden) + LM head + argmax over q tokens, the verification the decoder really runs;
- drafting, in each weight format the drafter can decode with (plain; fp16-packed for an fp32 drafter
  on a CPU with FBGEMM; bf16 copies where the CPU has bf16 in hardware; rows marked [plain] /
  [fp16-packed] / [bf16]; `dflash_core.kernels.packed_weights`): one block
  pass (`draft_with_cache`), the read-out of k drafts as greedy decoding does it, and the KV
  injection of one accepted token (`extend_cache`); then a whole drafting step (injection of one
  token, block pass, read-out of one draft) timed twice: back to back, and right after a verify of
  the whole block, as decoding meets it (the verify streams the target's weights through the
  caches, so the drafter's must come back from memory);
- with `--compile`: the same draft pass under `torch.compile` (CPU: inductor, C++), to see if it pays.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from dflash_core.tuning.plan import Tuning
from dflash_core.model.draft_vocab import read_out_for
from dflash_core.dtypes import SHORT_NAMES, short_name
from dflash_core.loading import load_pair
from dflash_core.decode.profiling import sync_device
from dflash_core.target.adapter import TargetModel, cache_argument
from dflash_core.target.cache import truncate_cache

from .report import pair_parser, write_report


def _fastest(run, repeats: int, device: torch.device) -> float:
    """Fastest of `repeats` calls of `run()` after one untimed warm-up."""
    return _fastest_after(lambda: None, lambda _: run(), repeats, device)


@torch.inference_mode()
def measure(pair, *, context: int, repeats: int, compile_draft: bool = False) -> dict:
    target: TargetModel = pair.target
    drafter = pair.drafter
    block = drafter.config.block_size
    device = target.device
    ids = torch.randint(0, target.vocab_size, (1, context + block), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)
    positions = torch.arange(context + block, device=device)[None]
    cache = DynamicCache()
    out = target(ids[:, :context], positions[:, :context], cache)

    def hf_forward(q: int):
        def run():
            target.model(input_ids=ids[:, context:context + q], position_ids=positions[:, context:context + q],
                         use_cache=True, **{cache_argument(target.model): cache})
            truncate_cache(cache, context)
        return run

    def verify(q: int):
        def run():
            o = target(ids[:, context:context + q], positions[:, context:context + q], cache)
            target.logits(o.hidden).float().argmax(-1)
            truncate_cache(cache, context)
        return run

    unit = _fastest(hf_forward(1), repeats, device)
    widths = sorted({1, 2, 4, 8, block})
    rows = {f"HF forward, {q} tok": _fastest(hf_forward(q), repeats, device) for q in widths}
    rows |= {f"verify (ours), {q} tok": _fastest(verify(q), repeats, device) for q in widths}
    # the drafter's side in each weight format it can decode with (`Drafter.use_weight_format`), the loaded
    # one first; with more than one, each row names its format
    formats = [drafter.weight_format] + [f for f in _possible_formats(drafter) if f != drafter.weight_format]
    for weight_format in formats:
        drafter.use_weight_format(weight_format)
        suffix = f" [{weight_format}]" if len(formats) > 1 else ""
        drafting = _drafting_rows(pair, out, ids, positions, context, verify, repeats,
                                  compile_draft=compile_draft and weight_format == formats[0])
        rows |= {name + suffix: seconds for name, seconds in drafting.items()}
    drafter.use_weight_format(formats[0])
    return {"unit_s": unit, "seconds": rows, "relative": {k: v / unit for k, v in rows.items()}}


def _possible_formats(drafter) -> tuple[str, ...]:
    from dflash_core.kernels.packed_weights import bf16_matmuls_supported, fp16_packing_supported

    checks = (("fp16-packed", fp16_packing_supported), ("bf16", bf16_matmuls_supported))
    return ("plain",) + tuple(name for name, supported in checks if supported(drafter.device, drafter.dtype))


def _drafting_rows(pair, out, ids, positions, context: int, verify, repeats: int, *,
                   compile_draft: bool = False) -> dict[str, float | str]:
    """The drafter's side of a step in its current weight format, read out as greedy decoding does
    (over its `draft_vocab` when it has one: `read_out_for`)."""
    target, drafter = pair.target, pair.drafter
    block, device = drafter.config.block_size, target.device
    read_out = read_out_for(drafter, target)
    rows = {}
    dcache = drafter.new_cache(1, context + 2 * block)
    drafter.extend_cache(dcache, out.features, positions[:, :context], [context])
    masks = torch.full((1, block - 1), drafter.config.mask_token_id, dtype=torch.long, device=device)
    noise = target.embed(torch.cat([ids[:, context - 1:context], masks], dim=1))
    block_pos = positions[:, context - 1:context - 1 + block]
    rows["draft pass (block)"] = _fastest(lambda: drafter.draft_with_cache(dcache, noise, block_pos), repeats, device)
    hidden = drafter.draft_with_cache(dcache, noise, block_pos)
    for k in (1, 4, block - 1):
        rows[f"draft read-out, {k} drafts"] = _fastest(lambda k=k: read_out(hidden[:, 1:1 + k]), repeats, device)
    rows["KV injection, 1 token"] = _fastest(lambda: _inject_one(drafter, out, positions, context), repeats, device)

    def fresh_context():
        fresh = drafter.new_cache(1, context + 1 + block)  # room for the block's K/V, as decoding allocates
        drafter.extend_cache(fresh, out.features, positions[:, :context], [context])
        return fresh

    def drafting_step(fresh) -> None:  # what the decoder pays to draft: inject the accepted token, draft, read out
        drafter.extend_cache(fresh, out.features[:, -1:], positions[:, context - 1:context], [1])
        read_out(drafter.draft_with_cache(fresh, noise, block_pos)[:, 1:2])

    def after_a_drafting_step():  # the drafter's weights were just used
        drafting_step(fresh_context())
        return fresh_context()

    def after_a_verify():  # the target's were
        fresh = fresh_context()
        verify(block)()
        return fresh

    rows["drafting step, back to back"] = _fastest_after(after_a_drafting_step, drafting_step, repeats, device)
    rows[f"drafting step, right after a {block}-token verify"] = _fastest_after(after_a_verify, drafting_step,
                                                                                repeats, device)
    if compile_draft:
        rows["draft pass (block), torch.compile"] = _compiled_draft(drafter, dcache, noise, block_pos, repeats, device)
    return rows


def _fastest_after(prepare, run, repeats: int, device: torch.device) -> float:
    """Fastest `run(prepare())` over `repeats`, timing only `run` (after one untimed warm-up)."""
    run(prepare())
    times = []
    for _ in range(repeats):
        state = prepare()
        sync_device(device)
        started = time.perf_counter()
        run(state)
        sync_device(device)
        times.append(time.perf_counter() - started)
    return min(times)


def _inject_one(drafter, out, positions, context: int) -> None:
    cache = drafter.new_cache(1, 4)
    drafter.extend_cache(cache, out.features[:, context - 1:context], positions[:, context - 1:context], [1])


def _compiled_draft(drafter, dcache, noise, block_pos, repeats: int, device) -> float | str:
    try:
        compiled = torch.compile(drafter.draft_with_cache, dynamic=False)
        started = time.perf_counter()
        compiled(dcache, noise, block_pos)
        print(f"torch.compile: first call {time.perf_counter() - started:.1f} s", file=sys.stderr)
        return _fastest(lambda: compiled(dcache, noise, block_pos), repeats, device)
    except Exception as exc:  # inductor needs a working C++ toolchain; report instead of failing the run
        return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"


def main(argv: list[str] | None = None) -> int:
    parser = pair_parser(__doc__, prompts=False)
    parser.add_argument("--dtype", choices=("auto",) + SHORT_NAMES, default="auto")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--compile", action="store_true", help="also time the draft pass under torch.compile")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="step_cost")
    args = parser.parse_args(argv)
    pair = load_pair(args.target, args.drafter, dtype=args.dtype, device=args.device, tuning=Tuning.cached())
    result = measure(pair, context=args.context, repeats=args.repeats, compile_draft=args.compile)
    dtype = short_name(pair.target.dtype)
    rows = [[name, seconds * 1e3 if isinstance(seconds, float) else seconds,
             result["relative"][name] if isinstance(seconds, float) else "n/a"]
            for name, seconds in result["seconds"].items()]
    command = "python -m dflash_bench.step_cost " + " ".join(sys.argv[1:] if argv is None else argv)
    notes = [f"{dtype}, {args.device}, context {args.context} tokens, fastest of {args.repeats} after a warm-up",
             "x target token: the time over the HF model's own one-token forward with its cache "
             f"({result['unit_s'] * 1e3:.2f} ms here)", *pair.notes]
    path = write_report(args.out, args.name, title=f"Where a decode step's time goes ({dtype})", command=command,
                        columns=["part", "ms", "x target token"], rows=rows,
                        data=result | {"dtype": dtype, "context": args.context}, notes=notes)
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

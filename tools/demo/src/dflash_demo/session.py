"""`dflash demo`: stream a held-out completion with DFlash, then measure it against the target alone."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from dflash_core.autoregressive import generate_autoregressive
from dflash_core.decoding import generate_stream
from dflash_core.errors import DFlashError
from dflash_core.loading import Pair, encode_prompt, load_pair, stop_token_ids
from dflash_core.profiling import DecodeProfile
from dflash_core.text_stream import TextStream
from dflash_core.training.data import read_prompts
from dflash_core.warmup import warm_up

# Printed when greedy outputs part in reduced precision; docs/benchmarks.md has the measurements.
ROUNDING_NOTE = ("note: in {dtype}, scoring 16 tokens at once and 1 token at a time round logits differently; where "
                 "the target's top two tokens tie within that rounding the two runs may pick differently "
                 "(fp32 outputs are identical; see docs/benchmarks.md, 'Greedy equality in bf16').")


@dataclass(frozen=True)
class DemoRequest:
    """What one demo run does (the flags of `dflash demo`, checked by the CLI)."""

    models: Path
    prompt_index: int = 0
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    summary_prompts: int = 24
    dtype: str = "bf16"
    device: str = "cpu"

    @property
    def sampling(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}


def run_demo(request: DemoRequest) -> None:
    models = request.models
    if not (models / "target" / "config.json").is_file() or not (models / "drafter" / "config.json").is_file():
        raise DFlashError(f"no demo models in {models}: run `make models` to build them (see README).")
    prompts = read_prompts(models / "heldout.jsonl")
    if not 0 <= request.prompt_index < len(prompts):
        raise DFlashError(f"--prompt-index is {request.prompt_index}, expected 0..{len(prompts) - 1} "
                          f"({len(prompts)} prompts in {models / 'heldout.jsonl'}).")
    prompt = prompts[request.prompt_index]
    pair = load_pair(models / "target", models / "drafter", dtype=request.dtype, device=request.device)
    ids = encode_prompt(pair.tokenizer, prompt, request.device)
    stops = stop_token_ids(pair.target, pair.tokenizer)
    c = pair.drafter.config
    print(f"DFlash demo: {pair.target.num_layers}-layer Qwen3 target ({_params(pair.target.model)}M params) "
          f"+ {c.num_hidden_layers}-layer drafter, block {c.block_size}, {request.dtype}, {request.device}",
          file=sys.stderr)
    print(f"held-out prompt #{request.prompt_index} ({ids.shape[1]} tokens):", file=sys.stderr)
    print(prompt, end="")
    warm_up(pair.target, pair.drafter, ids, stops)
    all_identical = _stream_one(pair, ids, stops, request)
    if request.summary_prompts:
        all_identical &= _summary(pair, prompts[: request.summary_prompts], stops, request)
    if not all_identical and request.temperature == 0 and request.dtype != "fp32":
        print(ROUNDING_NOTE.format(dtype=request.dtype), file=sys.stderr)


def _stream_one(pair: Pair, ids, stops: list[int], request: DemoRequest) -> bool:
    """Stream DFlash's completion, then run the target alone on the same prompt; True if identical."""
    printer = TextStream(pair.tokenizer)
    bold = sys.stdout.isatty()
    sys.stdout.write("\033[1m") if bold else None
    profile = DecodeProfile()
    stream = generate_stream(pair.target, pair.drafter, ids, max_new_tokens=request.max_new_tokens,
                             stop_token_ids=stops, profile=profile, **request.sampling)
    for chunk in stream:
        printer.push(chunk[0])
    printer.push([], final=True)
    sys.stdout.write("\033[0m\n") if bold else print()
    result = stream.result
    ar_profile = DecodeProfile()
    ar = generate_autoregressive(pair.target, ids, max_new_tokens=request.max_new_tokens, stop_token_ids=stops,
                                 profile=ar_profile, **request.sampling)
    identical = result.tokens == ar.tokens
    rate, ar_rate = profile.tokens_per_s(result.num_new_tokens), ar_profile.tokens_per_s(ar.num_new_tokens)
    print(f"\nthis prompt: {len(result.tokens[0])} tokens | tau {result.tau:.2f} | DFlash {rate:.1f} tok/s"
          f" | target alone {ar_rate:.1f} tok/s | speedup {rate / ar_rate:.2f}x"
          + (f" | identical to target alone: {'yes' if identical else 'NO'}" if request.temperature == 0 else ""),
          file=sys.stderr)
    return identical


def _summary(pair: Pair, prompts: list[str], stops: list[int], request: DemoRequest) -> bool:
    """Both decoders on several held-out prompts, measured side by side in this run; True if all identical."""
    from dflash_bench.e2e import measure_prompts

    totals = measure_prompts(pair, prompts, stops, max_new_tokens=request.max_new_tokens,
                             device=request.device, label="held-out prompts", **request.sampling)
    row = totals.row()
    line = (f"{len(prompts)} held-out prompts: tau {row['tau']:.2f} | DFlash {row['dflash_tok_s']:.1f} tok/s | "
            f"target alone {row['target_tok_s']:.1f} tok/s | speedup {row['speedup']:.2f}x")
    if request.temperature == 0:
        line += f" | identical to target alone: {row['identical']}"
    print(line, file=sys.stderr)
    return totals.matches == totals.prompts


def _params(model) -> str:
    return f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}"

"""Drafter forward latency against block size: the reason DFlash works is that it is nearly flat.

One block-diffusion pass over a cached context (KV injection already done, as in decoding),
timed at several block sizes for drafters of several depths, in fp32 and bf16, side by side.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tqdm import tqdm

from dflash_core.model.config import DFlashConfig
from dflash_core.model.drafter import Drafter
from dflash_core.dtypes import resolve_dtype

from .report import plot_lines, write_report


def drafter_config(layers: int, hidden: int) -> DFlashConfig:
    """The measured drafter's shape (raises ConfigError for a width or depth that gives no valid drafter)."""
    heads = hidden // 128 if hidden >= 1024 else max(1, hidden // 64)
    return DFlashConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        num_key_value_heads=max(1, heads // 4), head_dim=hidden // heads,
                        intermediate_size=3 * hidden, vocab_size=32000, block_size=16, num_target_layers=36,
                        target_layer_ids=tuple(range(1, 1 + max(layers, 1) * 6, 6))[:layers] or (18,),
                        mask_token_id=31999)


def _drafter(layers: int, hidden: int, dtype: torch.dtype) -> Drafter:
    drafter = Drafter(drafter_config(layers, hidden))
    drafter.reset_parameters(0.02, torch.Generator().manual_seed(0))
    return drafter.to(dtype).eval()


@torch.inference_mode()
def time_forward(drafter: Drafter, block: int, context: int, repeats: int) -> float:
    """Median seconds of one cached draft pass over `context` tokens for a block of `block`."""
    c = drafter.config
    cache = drafter.new_cache(1, context + block)
    features = torch.randn(1, context, c.fc_in_features, dtype=drafter.dtype)
    drafter.extend_cache(cache, features, torch.arange(context)[None], [context])
    noise = torch.randn(1, block, c.hidden_size, dtype=drafter.dtype)
    positions = context + torch.arange(block)[None]
    for _ in range(3):
        drafter.draft_with_cache(cache, noise, positions)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        drafter.draft_with_cache(cache, noise, positions)
        samples.append(time.perf_counter() - start)
    return sorted(samples)[len(samples) // 2]


def run(out: Path, *, hidden: int = 1024, context: int = 512, layers=(1, 5), blocks=(4, 8, 16, 32),
        dtypes=("fp32", "bf16"), repeats: int = 30, command: str = "dflash bench drafter") -> Path:
    results = {}
    jobs = [(d, n) for d in dtypes for n in layers]
    for dtype, n in tqdm(jobs, desc="drafter latency", unit="config", dynamic_ncols=True):
        drafter = _drafter(n, hidden, resolve_dtype(dtype))
        results[f"{n}L-{dtype}"] = {b: time_forward(drafter, b, context, repeats) for b in blocks}
    rows = []
    for key, by_block in results.items():
        rows.append([key] + [by_block[b] * 1e3 for b in blocks] + [by_block[16] / by_block[4] if 16 in by_block
                                                                     and 4 in by_block else float("nan")])
    columns = ["drafter"] + [f"B={b} (ms)" for b in blocks] + ["B16/B4"]
    out.mkdir(parents=True, exist_ok=True)
    plot_lines(out / "drafter_latency.png", f"Drafter forward, hidden {hidden}, {context} context tokens",
               "block size", "latency relative to B=4",
               {k: (list(blocks), [v[b] / v[blocks[0]] for b in blocks]) for k, v in results.items()}, hline=1.3)
    return write_report(out, "drafter_latency", title="Drafter forward latency vs block size", command=command,
                        columns=columns, rows=rows,
                        data={"hidden": hidden, "context": context, "seconds": {k: {str(b): t for b, t in v.items()}
                                                                                for k, v in results.items()}},
                        notes=[f"median of {repeats} cached draft passes (KV injection of the context done once, "
                               "as in decoding); goal: B16/B4 <= 1.3 in bf16",
                               "plot: drafter_latency.png"])

"""End-to-end decoding speed: DFlash vs the target alone, on held-out prompts, side by side.

For every prompt both decoders run back to back on the same target object (same forward path,
same cache class), after a warm-up; totals give tokens/s, speedup, tau, efficiency = speedup / tau
(1.0 would mean drafting and verification were free) and where the time went.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from dflash_core.autoregressive import generate_autoregressive
from dflash_core.decoding import generate
from dflash_core.loading import encode_prompt, load_pair, stop_token_ids
from dflash_core.profiling import DecodeProfile
from dflash_core.training.data import read_prompts


@dataclass
class PairSpec:
    label: str
    target: Path
    drafter: Path
    backend: str = "torch"


@dataclass
class Totals:
    tokens: int = 0
    ar_tokens: int = 0
    spec_s: float = 0.0
    ar_s: float = 0.0
    hf_s: float = 0.0
    hf_tokens: int = 0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    decode_s: float = 0.0
    steps: int = 0
    accepted: int = 0
    matches: int = 0
    prompts: int = 0

    def row(self) -> dict:
        spec_tps, ar_tps = self.tokens / self.spec_s, self.ar_tokens / self.ar_s
        speedup, tau = spec_tps / ar_tps, self.accepted / max(1, self.steps)
        return {"tokens": self.tokens, "tau": tau, "dflash_tok_s": spec_tps, "target_tok_s": ar_tps,
                "speedup": speedup, "efficiency": speedup / tau if tau else 0.0,
                "hf_generate_tok_s": self.hf_tokens / self.hf_s if self.hf_s else None,
                "draft_share": self.draft_s / self.decode_s, "verify_share": self.verify_s / self.decode_s,
                "overhead_share": max(0.0, self.decode_s - self.draft_s - self.verify_s) / self.decode_s,
                "prefill_share": self.prefill_s / self.spec_s, "identical": f"{self.matches}/{self.prompts}"}


def measure_pair(spec: PairSpec, prompts: list[str], *, max_new_tokens: int, dtype: str, temperature: float,
                 hf_baseline: bool = True, seed: int = 0, device: str = "cpu") -> dict:
    pair = load_pair(spec.target, spec.drafter, dtype=dtype, device=device, backend=spec.backend)
    stops = stop_token_ids(pair.target, pair.tokenizer)
    warm = encode_prompt(pair.tokenizer, prompts[0], device)
    generate(pair.target, pair.drafter, warm, max_new_tokens=32, stop_token_ids=stops)
    generate_autoregressive(pair.target, warm, max_new_tokens=8, stop_token_ids=stops)
    totals = measure_prompts(pair, prompts, stops, max_new_tokens=max_new_tokens, temperature=temperature,
                             seed=seed, hf_baseline=hf_baseline, label=spec.label, device=device)
    return totals.row()


def measure_prompts(pair, prompts: list[str], stops: list[int], *, max_new_tokens: int, temperature: float = 0.0,
                    top_p: float = 1.0, top_k: int = 0, seed: int = 0, device: str = "cpu", hf_baseline: bool = False,
                    label: str = "prompts") -> Totals:
    """DFlash and the target alone back to back on every prompt (prompt i sampled with seed + i)."""
    totals = Totals()
    for i, prompt in enumerate(tqdm(prompts, desc=label, unit="prompt", dynamic_ncols=True, leave=False)):
        ids = encode_prompt(pair.tokenizer, prompt, device)
        kwargs = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k,
                  "stop_token_ids": stops, "seed": seed + i}
        ar_profile, spec_profile = DecodeProfile(), DecodeProfile()
        ar = generate_autoregressive(pair.target, ids, profile=ar_profile, **kwargs)
        spec_result = generate(pair.target, pair.drafter, ids, profile=spec_profile, **kwargs)
        totals.tokens += len(spec_result.tokens[0])
        totals.ar_tokens += len(ar.tokens[0])
        totals.spec_s += spec_profile.total_s
        totals.ar_s += ar_profile.total_s
        for name in ("prefill_s", "draft_s", "verify_s", "decode_s"):
            setattr(totals, name, getattr(totals, name) + getattr(spec_profile, name))
        totals.steps += len(spec_result.acceptance_lengths[0])
        totals.accepted += sum(spec_result.acceptance_lengths[0])
        totals.matches += spec_result.tokens == ar.tokens
        totals.prompts += 1
        if hf_baseline and temperature == 0 and i < 4:
            totals.hf_tokens, totals.hf_s = _hf_generate(pair, ids, max_new_tokens, stops, totals)
    return totals


def _hf_generate(pair, ids, max_new_tokens, stops, totals) -> tuple[int, float]:
    """The target's own `model.generate()` (Hugging Face's loop), as a second baseline."""
    start = time.perf_counter()
    with torch.inference_mode():
        out = pair.target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                         do_sample=False, eos_token_id=stops or None,
                                         pad_token_id=stops[0] if stops else 0)
    return totals.hf_tokens + out.shape[1] - ids.shape[1], totals.hf_s + time.perf_counter() - start


def run(out: Path, pairs: list[PairSpec], prompts_file: Path, *, prompts: int = 16, max_new_tokens: int = 256,
        dtypes=("bf16",), temperatures=(0.0,), device: str = "cpu", name: str = "e2e",
        title: str = "DFlash vs the target alone", command: str = "dflash bench e2e") -> Path:
    from .report import plot_bars, write_report

    texts = read_prompts(prompts_file)[:prompts]
    results = []
    for dtype in dtypes:
        for temperature in temperatures:
            for spec in pairs:
                row = measure_pair(spec, texts, max_new_tokens=max_new_tokens, dtype=dtype, temperature=temperature,
                                   device=device)
                results.append({"pair": spec.label, "backend": spec.backend, "dtype": dtype,
                                "temperature": temperature, **row})
    columns = ["pair", "backend", "dtype", "T", "tau", "DFlash tok/s", "target tok/s", "speedup", "efficiency",
               "draft %", "verify %", "overhead %", "identical"]
    rows = [[r["pair"], r["backend"], r["dtype"], r["temperature"], r["tau"], r["dflash_tok_s"], r["target_tok_s"],
             r["speedup"], r["efficiency"], 100 * r["draft_share"], 100 * r["verify_share"],
             100 * r["overhead_share"], r["identical"] if r["temperature"] == 0 else "n/a"] for r in results]
    out.mkdir(parents=True, exist_ok=True)
    plot_bars(out / f"{name}.png", title, "speedup over the target alone",
              [f"{r['pair']} {r['dtype']} T={r['temperature']:g}" for r in results], [r["speedup"] for r in results],
              hline=1.0)
    notes = [f"{len(texts)} held-out prompts from {prompts_file}, up to {max_new_tokens} new tokens each, batch 1",
             "target tok/s: the same TargetModel forward one token at a time (same cache, same code path)",
             "draft/verify/overhead %: shares of decode time (overhead = the loop's own work outside the forwards)",
             f"plot: {name}.png"]
    hf = [r for r in results if r.get("hf_generate_tok_s")]
    if hf:
        notes.append("Hugging Face generate() on the same target: " + ", ".join(
            f"{r['pair']} {r['dtype']}: {r['hf_generate_tok_s']:.1f} tok/s" for r in hf))
    return write_report(out, name, title=title, command=command, columns=columns, rows=rows,
                        data={"results": results}, notes=notes)

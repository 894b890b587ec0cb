"""Writing `dflash bench e2e`'s results: JSON + Markdown (`report.write_report`) and three PNG plots."""

from __future__ import annotations

from pathlib import Path

from .methods import PROMPT_LOOKUP_TOKENS
from .report import plot_bars, plot_lines, plot_points, write_report

COLUMNS = ["pair", "dtype", "T", "batch", "method", "tok/s", "speedup vs ar", "per-prompt speedup min / median / max",
           "tau", "cost-model ceiling (share reached)", "identical to ar"]

ROUNDING_NOTE = ("identical to ar: in reduced precision, scoring several tokens at once and one at a time round the "
                 "target's logits differently; where its top two tokens tie within that rounding the runs may pick "
                 "differently, so differences are counted, not failed (fp32 is compared strictly; see "
                 "docs/benchmarks.md, 'Greedy equality in bf16').")


def _config(r: dict) -> str:
    pair = r["pair"] if r["backend"] == "torch" else f"{r['pair']} ({r['backend']})"
    return f"{pair} {r['dtype']} T={r['temperature']:g}"


def table_row(r: dict) -> list:
    pair = r["pair"] if r["backend"] == "torch" else f"{r['pair']} ({r['backend']})"
    head = [pair, r["dtype"], r["temperature"], r["batch_size"], r["method"]]
    if "n/a" in r:
        return head + [f"n/a ({r['n/a']})", "", "", "", "", ""]
    if r["method"] == "ar":
        return head + [r["tok_s"], r["speedup"], "", "", "", ""]
    slowest = ",".join(map(str, r["slowest_prompts"]))
    spread = f"{r['speedup_min']:.2f} (#{slowest}) / {r['speedup_median']:.2f} / {r['speedup_max']:.2f}"
    identical = r["identical"] if r["identical"] is not None else "n/a (T > 0)"
    ceiling = f"{r['ceiling']:.2f}x ({100 * r['of_ceiling']:.0f}%)" if "ceiling" in r else ""
    tau = r.get("tau", "")
    if "tree_nodes" in r:  # a token tree's mean size beside its tau
        tau = f"{tau:.2f} (tree {r['tree_nodes']:.1f})"
    return head + [r["tok_s"], r["speedup"], spread, tau, ceiling, identical]


def _notes(results: list[dict], *, name: str, prompts_file: Path, prompts: int, max_new_tokens: int,
           rounding_note: bool, repeats: int = 1) -> list[str]:
    notes = [
        f"{prompts} held-out prompts from {prompts_file}, up to {max_new_tokens} new tokens each; every method on the "
        "same target object and dtype; per batch, all methods back to back in an order rotated from batch to batch, "
        "after one untimed warm-up run of each" + (f"; every batch run {repeats} times by every method (rounds "
                                                  "interleaved), each method's fastest round kept" if repeats > 1 else ""),
        "ar: the target alone through DFlash's own loop with no drafter, one token per row per forward, the batch's "
        "rows decoded together; dflash: `generate` with its defaults (drafter and context lookup as draft sources, "
        "auto draft length, a token tree for a greedy request of one prompt, else the drafter's argmax chain); "
        "dflash_chain / dflash_tree: the same verifying the chain only / a token tree of automatic size always; "
        "dflash_drafter / dflash_tree_drafter: the drafter as the only source, its chain / a tree; dflash_full: "
        "`generate` verifying the whole block of drafter drafts as a chain every step (its tau is the drafter's "
        "acceptance at block B); "
        "dflash_plain_weights: dflash with the drafter reading its own fp32 weights instead of fp16-packed or bf16 "
        "copies; dflash_fp16_weights: dflash with fp16-packed copies where it decodes bf16 ones; "
        "dflash_trimmed: dflash verifying only the drafts the drafter's confidence says pay (`confidence_trim=True`); "
        "prompt_lookup: Hugging Face `generate(..., "
        f"prompt_lookup_num_tokens={PROMPT_LOOKUP_TOKENS})` (wall time); assisted: Hugging Face `generate(..., "
        "assistant_model=ASSISTANT)` (wall time) with the pair's assistant/ beside its target, in the target's dtype "
        "and weight format; hf_generate: Hugging Face `generate()` with no drafts",
        "cost-model ceiling: per prompt (per batch at batch > 1), max over k of E(k) T(0) / T(k), with E(k) from that "
        "prompt's dflash_full acceptance per block position and T(k) from the machine's cost table (the one dflash's "
        "draft-length policy uses), combined weighted by time: what a loop that knew each prompt's acceptance and "
        "always verified its best k would reach on this machine; share reached = speedup / ceiling (the drafter's "
        "ceiling: dflash_drafter is bounded by it, dflash passes it where context-lookup copies are accepted)",
        "per-prompt speedup: one value per prompt at batch 1, per batch of prompts at larger batch sizes; batches "
        "wrap round to the first prompts to stay full; #i: the slowest one's prompt index (0-based, in file order; "
        "the JSON has every batch's in prompts_per_batch)",
    ]
    for r in results:
        if "draft_share" in r:
            notes.append(f"{r['method']} time, {_config(r)} batch {r['batch_size']}: "
                         f"draft {100 * r['draft_share']:.0f}%, verify {100 * r['verify_share']:.0f}%, "
                         f"loop {100 * r['overhead_share']:.0f}% of decode; "
                         f"prefill {100 * r['prefill_share']:.0f}% of the total; speedup / tau "
                         f"{r['speedup'] / r['tau']:.2f}")
    if rounding_note:
        notes.append(ROUNDING_NOTE)
    notes += _shared_text_notes(results)
    for r in results:
        if "speedup_min_decoding" in r and r["method"] != "ar":
            single = ", ".join("#" + ",".join(map(str, b)) for b in r["single_token_prompts"])
            slowest = ",".join(map(str, r["slowest_decoding_prompts"]))
            notes.append(f"{r['method']}, {_config(r)} batch {r['batch_size']}: per-prompt minimum "
                         f"{r['speedup_min_decoding']:.2f} (#{slowest}) over the prompts the target writes more than one "
                         f"token for ({single}: one token, so one prefill against another)")
    notes.append(f"plots: {name}.png (speedup by method), {name}_per_prompt.png, {name}_batch.png (throughput)")
    return notes


def _shared_text_notes(results: list[dict]) -> list[str]:
    """Per configuration and batch size: speedups over the batches where every method wrote ar's text."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        if "shared_text_speedup" in r:
            groups.setdefault((_config(r), r["batch_size"]), []).append(r)
    notes = []
    for (config, batch), rows in groups.items():
        batches = len(rows[0]["prompts_per_batch"])
        speedups = {r["method"]: r["shared_text_speedup"] for r in rows}
        line = ", ".join(f"{m} {x:.2f}x" for m, x in speedups.items() if m != "ar")
        ratio = (f"; dflash / prompt_lookup {speedups['dflash'] / speedups['prompt_lookup']:.2f}x"
                 if {"dflash", "prompt_lookup"} <= speedups.keys() else "")
        notes.append(f"same text, {config} batch {batch}: on the {rows[0]['shared_text_batches']} of {batches} "
                     f"{'prompts' if batch == 1 else 'batches'} where every method wrote exactly ar's tokens (the "
                     f"others decoded other text after a near-tie), speedup vs ar: {line}{ratio}")
    return notes


def _plots(out: Path, name: str, title: str, results: list[dict]) -> None:
    measured = [r for r in results if "n/a" not in r]
    configs = sorted({_config(r) for r in measured}, key=[_config(r) for r in measured].index)
    sizes = sorted({r["batch_size"] for r in results})

    def label(r: dict) -> str:
        parts = ([_config(r)] if len(configs) > 1 else []) + [r["method"]]
        return " ".join(parts + ([f"b={r['batch_size']}"] if len(sizes) > 1 else []))

    peers = [r for r in measured if r["method"] != "ar"]
    plot_bars(out / f"{name}.png", f"{title}: speedup over the target alone (ar)", "speedup vs ar",
              [label(r) for r in peers], [r["speedup"] for r in peers], hline=1.0)
    plot_points(out / f"{name}_per_prompt.png", "Speedup over ar, one point per prompt (per batch at batch > 1)",
                "speedup vs ar", {label(r): r["speedup_per_batch"] for r in peers}, hline=1.0)
    series = {}
    for r in measured:
        key = f"{_config(r)} {r['method']}" if len(configs) > 1 else r["method"]
        xs, ys = series.setdefault(key, ([], []))
        xs.append(r["batch_size"])
        ys.append(r["tok_s"])
    plot_lines(out / f"{name}_batch.png", "Throughput vs batch size (no point where a method cannot run it)",
               "prompts per batch", "new tokens / s", series)


def write(out: Path, name: str, results: list[dict], *, title: str, command: str, prompts_file: Path, prompts: int,
          max_new_tokens: int, rounding_note: bool, repeats: int = 1) -> Path:
    """out/name.json (every row, per-batch speedups included), out/name.md and the plots; returns the .md path."""
    out.mkdir(parents=True, exist_ok=True)
    _plots(out, name, title, results)
    notes = _notes(results, name=name, prompts_file=prompts_file, prompts=prompts, max_new_tokens=max_new_tokens,
                   rounding_note=rounding_note, repeats=repeats)
    return write_report(out, name, title=title, command=command, columns=COLUMNS,
                        rows=[table_row(r) for r in results], data={"results": results}, notes=notes)

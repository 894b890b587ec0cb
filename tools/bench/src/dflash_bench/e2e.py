"""End-to-end decoding speed: DFlash and its peers against the target alone, on held-out prompts.

Every method (`methods.RUNNERS`: `ar` the target alone, `dflash`, Hugging Face `prompt_lookup`, ...)
runs on the same target object in the same dtype. Per batch size, each method first gets one short
warm-up run (not timed); then, for every batch of prompts, all methods run back to back, their order
rotated from one batch to the next so that none always runs first or last. At temperature 0 each
method's tokens are compared with `ar`'s row by row: in fp32 a difference fails the run; in reduced
precision it is counted and explained (ties in the target's logits round differently when scored 16
tokens at once and one at a time).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import torch
from tqdm import tqdm

from dflash_core.decode.loop import as_target
from dflash_core.tuning.plan import Tuning
from dflash_core.dtypes import short_name
from dflash_core.errors import DFlashError
from dflash_core.loading import Pair, encode_prompt, load_pair, stop_token_ids
from dflash_core.sampling.tokens import SamplingParams
from dflash_core.training.data import read_prompts

from .ceiling import acceptance_by_position, ceiling_speedup
from .methods import (DEFAULT_METHODS, RUNNERS, DecodeSettings, MethodRun, Mismatch, NotApplicable, PromptBatch,
                      Runner, assisted_runner, check_methods, compare_with_reference)

WARMUP_TOKENS = 8


@dataclass
class PairSpec:
    label: str
    target: Path
    drafter: Path
    backend: str = "torch"

    @property
    def assistant(self) -> Path:
        """Where the `assisted` method's small draft model lives (next to the target)."""
        return self.target.parent / "assistant"


class OutputMismatch(DFlashError):
    """A method's greedy output is not the target's in fp32 (the report is written before this is raised)."""

    def __init__(self, message: str, report: Path) -> None:
        super().__init__(message)
        self.report = report


@dataclass
class Comparison:
    """All methods on all batches of one batch size (pair, dtype and temperature fixed)."""

    batch_size: int
    methods: tuple[str, ...]
    runs: dict[str, list[MethodRun]] = field(default_factory=dict)
    not_applicable: dict[str, str] = field(default_factory=dict)
    """Method -> why it cannot run this batch size."""
    batches: list[tuple[int, ...]] = field(default_factory=list)
    """Prompt index of every row of every batch."""
    mismatches: list[Mismatch] = field(default_factory=list)
    compared: bool = False
    """True when outputs were compared with `ar` (temperature 0)."""


def encode_prompts(pair: Pair, texts: Sequence[str], device) -> list[list[int]]:
    return [encode_prompt(pair.tokenizer, text, device)[0].tolist() for text in texts]


def make_batches(prompt_ids: Sequence[Sequence[int]], batch_size: int, *, pad_id: int, device) -> list[PromptBatch]:
    """Full batches over all prompts: batch j holds prompts j*b .. j*b+b-1, wrapping round to prompt 0."""
    n = len(prompt_ids)
    batches = []
    for start in range(0, n, batch_size):
        index = [(start + r) % n for r in range(batch_size)]
        batches.append(PromptBatch.of([prompt_ids[i] for i in index], index, pad_id=pad_id, device=device))
    return batches


def compare(pair: Pair, prompt_ids: Sequence[Sequence[int]], settings: DecodeSettings, *,
            methods: Sequence[str] = DEFAULT_METHODS, batch_size: int = 1,
            runners: dict[str, Runner] | None = None, label: str = "prompts", repeats: int = 1) -> Comparison:
    """Warm up, then run every method on every batch, interleaved; compare with `ar` at temperature 0.

    With `repeats` > 1 every batch runs that many rounds of all methods (the order rotated each round) and
    each method keeps its fastest round: a burst of other work on the machine then spoils one round, not
    the per-prompt ratio (the outputs of the rounds are identical: same prompts, same seed).
    """
    if repeats < 1:
        raise DFlashError(f"--repeats is {repeats}, expected an integer >= 1.")
    runners = runners or RUNNERS
    methods = ("ar", *[m for m in methods if m != "ar"])  # the baseline every figure is relative to
    pad = settings.stop_token_ids[0] if settings.stop_token_ids else 0
    batches = make_batches(prompt_ids, batch_size, pad_id=pad, device=pair.target.device)
    result = Comparison(batch_size, methods, {m: [] for m in methods})
    warm = replace(settings, max_new_tokens=min(WARMUP_TOKENS, settings.max_new_tokens))
    # what `generate`'s draft-length policy learnt from earlier requests, kept per method (as if each method had
    # the process to itself) and replayed by every round of a batch (the rounds are repeats, not more requests);
    # the warm-up teaches nothing
    tuning = pair.tuning
    fresh = tuning.saved_histories(pair.drafter)
    learnt = {method: fresh for method in methods}
    for method in methods:
        try:
            runners[method](pair, batches[0], warm)
        except NotApplicable as exc:
            result.not_applicable[method] = str(exc)
        tuning.restore_histories(pair.drafter, fresh)
    active = [m for m in methods if m not in result.not_applicable]
    for j, batch in enumerate(tqdm(batches, desc=label, unit="batch", dynamic_ncols=True, leave=False)):
        seeded = replace(settings, seed=settings.seed + j)
        fastest: dict[str, MethodRun] = {}
        before = dict(learnt)
        for round_ in range(repeats):
            turn = (j + round_) % len(active)
            for method in active[turn:] + active[:turn]:
                tuning.restore_histories(pair.drafter, before[method])
                run = runners[method](pair, batch, seeded)
                learnt[method] = tuning.saved_histories(pair.drafter)
                if method not in fastest or run.seconds < fastest[method].seconds:
                    fastest[method] = run
        for method in active:
            result.runs[method].append(fastest[method])
        result.batches.append(batch.prompts)
    tuning.restore_histories(pair.drafter, fresh)  # the next comparison starts where this one did
    if settings.temperature == 0:
        result.compared = True
        for method in active[1:]:
            for batch, ref, run in zip(batches, result.runs["ar"], result.runs[method]):
                result.mismatches += compare_with_reference(method, ref, run, batch.prompts, batch_size)
    return result


def summarize(comparison: Comparison) -> list[dict]:
    """One row per method: tokens/s, speedup over `ar` (overall and per batch), tau, time shares."""
    ar = comparison.runs["ar"]
    ar_rates = [_rate(r) for r in ar]
    ar_total = sum(map(_count, ar)) / sum(r.seconds for r in ar)  # tokens/s of the target alone
    # batches where the target writes one token per row (it stops at once): nothing to speculate, so their
    # "speedup" is one prefill against another; the minimum over the batches that decode is reported beside
    single = [i for i, r in enumerate(ar) if all(len(t) <= 1 for t in r.tokens)]
    shared = _shared_text_batches(comparison)
    rows = []
    for method in comparison.methods:
        row = {"method": method, "batch_size": comparison.batch_size}
        if method in comparison.not_applicable:
            rows.append(row | {"n/a": comparison.not_applicable[method]})
            continue
        runs = comparison.runs[method]
        tokens, seconds = sum(_count(r) for r in runs), sum(r.seconds for r in runs)
        per_batch = [_rate(r) / a for r, a in zip(runs, ar_rates)]
        slowest = min(range(len(per_batch)), key=per_batch.__getitem__)
        rows.append(row | {
            "rows": sum(len(r.tokens) for r in runs), "tokens": tokens, "seconds": seconds,
            "tok_s": tokens / seconds, "speedup": (tokens / seconds) / ar_total,
            "speedup_per_batch": per_batch, "prompts_per_batch": [list(b) for b in comparison.batches],
            "slowest_prompts": list(comparison.batches[slowest]), "speedup_min": min(per_batch),
            "speedup_median": statistics.median(per_batch), "speedup_max": max(per_batch),
            **_decoding_minimum(per_batch, single, comparison.batches),
            "identical": _identical(comparison, method), **_steps(runs),
            **_shared_text_speedup(runs, ar, shared)})
    return rows


def _shared_text_batches(comparison: Comparison) -> list[int] | None:
    """Batches in which every method wrote exactly ar's tokens, where some other batch differs (else None).

    In reduced precision a method that scores several tokens at once can part from ar at a near-tie and
    go on to write other text, more or less repetitive than ar's, so its speed there is measured on
    another workload; on these batches every method decoded the same text.
    """
    if not comparison.mismatches:
        return None
    differing = {m.prompt for m in comparison.mismatches}
    return [j for j, batch in enumerate(comparison.batches) if not differing.intersection(batch)]


def _shared_text_speedup(runs: list[MethodRun], ar: list[MethodRun], shared: list[int] | None) -> dict:
    """Speedup over ar counted over the shared-text batches only (tokens over seconds, both summed)."""
    if not shared:
        return {}
    mine = sum(_count(runs[j]) for j in shared) / sum(runs[j].seconds for j in shared)
    alone = sum(_count(ar[j]) for j in shared) / sum(ar[j].seconds for j in shared)
    return {"shared_text_batches": len(shared), "shared_text_speedup": mine / alone}


def add_ceiling(rows: list[dict], comparison: Comparison, pair: Pair, settings: DecodeSettings) -> None:
    """On the dflash rows: the cost model's ceiling for dflash_full's acceptance and the share reached.

    It is the drafter's ceiling: `dflash_drafter` (the drafter its only source) is bounded by it, `dflash`
    (context lookup besides) is not, and passes it where copies from the context are accepted.

    Per batch (one prompt at batch 1): p_i from that batch's dflash_full steps, its ceiling speedup
    c_j = max_k E(k) T(0) / T(k); over all batches, the time-weighted ceiling sum(n_j) / sum(n_j / c_j)
    (n_j: tokens of batch j), i.e. a loop that knew each prompt's acceptance and always verified its best
    k. Needs both methods in the comparison; the cost table is the one `generate`'s draft-length policy
    used (`pair.tuning`'s, cached per machine, pair and way of choosing tokens).
    """
    full = comparison.runs.get("dflash_full")
    measured = [r for r in rows if r["method"] in ("dflash", "dflash_drafter") and "n/a" not in r]
    if not full or not measured:
        return
    block = pair.drafter.config.block_size
    sampling = SamplingParams(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k)
    costs = pair.tuning.cost_table(as_target(pair.target, pair.drafter), pair.drafter, sampling)
    tokens, ceiling_time, per_batch = 0, 0.0, []
    for run in full:
        acceptance = acceptance_by_position(run.acceptance_lengths, block)
        ceiling, _ = ceiling_speedup(costs, acceptance, comparison.batch_size)
        n = _count(run)
        tokens, ceiling_time = tokens + n, ceiling_time + n / ceiling
        per_batch.append(round(ceiling, 3))
    pooled = acceptance_by_position([row for run in full for row in run.acceptance_lengths], block)
    ceiling = tokens / ceiling_time
    for row in measured:
        row.update(acceptance_by_position=[round(p, 4) for p in pooled], ceiling=ceiling,
                   ceiling_per_batch=per_batch, of_ceiling=row["speedup"] / ceiling,
                   pooled_ceiling_k=ceiling_speedup(costs, pooled, comparison.batch_size)[1])


def _decoding_minimum(per_batch: list[float], single: list[int], batches: list[tuple[int, ...]]) -> dict:
    """The per-batch minimum over batches where the target writes more than one token (when some do not)."""
    if not single:
        return {}
    decoding = [i for i in range(len(per_batch)) if i not in single]
    out = {"single_token_prompts": [list(batches[i]) for i in single]}
    if decoding:
        slowest = min(decoding, key=per_batch.__getitem__)
        out |= {"speedup_min_decoding": per_batch[slowest], "slowest_decoding_prompts": list(batches[slowest])}
    return out


def _count(run: MethodRun) -> int:
    return sum(len(t) for t in run.tokens)


def _rate(run: MethodRun) -> float:
    return _count(run) / run.seconds


def _identical(comparison: Comparison, method: str) -> str | None:
    if not comparison.compared:
        return None
    rows = sum(len(b) for b in comparison.batches)
    return f"{rows - sum(m.method == method for m in comparison.mismatches)}/{rows}"


def _steps(runs: list[MethodRun]) -> dict:
    """tau and where a speculative method's time went (only for runs that report steps and phases)."""
    if not runs or runs[0].acceptance_lengths is None:
        return {}
    steps = [a for r in runs for row in r.acceptance_lengths for a in row]
    out = {"tau": sum(steps) / max(1, len(steps))}
    profiles = [r.profile for r in runs if r.profile is not None]
    trees = sum(p.tree_steps for p in profiles)
    if trees:  # the token trees' mean size, and the share of drafter steps that verified one
        out |= {"tree_nodes": sum(p.tree_nodes for p in profiles) / trees,
                "tree_share": trees / max(1, sum(p.drafter_steps for p in profiles))}
    decode = sum(p.decode_s for p in profiles)
    if decode > 0:
        draft, verify = sum(p.draft_s for p in profiles), sum(p.verify_s for p in profiles)
        out |= {"draft_share": draft / decode, "verify_share": verify / decode,
                "overhead_share": max(0.0, decode - draft - verify) / decode,
                "prefill_share": sum(p.prefill_s for p in profiles) / sum(p.total_s for p in profiles)}
    return out


def measure_pair(spec: PairSpec, texts: Sequence[str], *, methods: Sequence[str] = DEFAULT_METHODS,
                 batch_sizes: Sequence[int] = (1,), max_new_tokens: int, dtype: str, temperature: float,
                 seed: int = 0, device: str = "cpu", runners: dict[str, Runner] | None = None, repeats: int = 1
                 ) -> tuple[list[dict], list[Mismatch], bool]:
    """Rows of `summarize` for every batch size, the mismatches, and whether they are failures (fp32).

    dtype "auto" is resolved by `load_pair` (a measured probe); every row records the dtype used.
    """
    pair = load_pair(spec.target, spec.drafter, dtype=dtype, device=device, backend=spec.backend,
                     tuning=Tuning.cached())
    if "assisted" in methods:  # the assistant lives beside the pair's target
        runners = (runners or RUNNERS) | {"assisted": assisted_runner(spec.assistant)}
    used = short_name(pair.target.dtype)
    dtype = used if dtype != "auto" else f"auto ({used})"
    for note in pair.notes:
        print(f"note: {note}", file=sys.stderr)
    stops = tuple(stop_token_ids(pair.target, pair.tokenizer))
    settings = DecodeSettings(max_new_tokens, stops, temperature=temperature, seed=seed)
    prompt_ids = encode_prompts(pair, texts, device)
    rows, mismatches = [], []
    for b in batch_sizes:
        comparison = compare(pair, prompt_ids, settings, methods=methods, batch_size=b, runners=runners,
                             label=f"{spec.label} {dtype} T={temperature:g} batch {b}", repeats=repeats)
        summary = summarize(comparison)
        add_ceiling(summary, comparison, pair, settings)
        rows += [row | {"dtype": dtype} for row in summary]
        mismatches += comparison.mismatches
    strict = pair.target.model.dtype == torch.float32
    return rows, mismatches, strict


def run(out: Path, pairs: list[PairSpec], prompts_file: Path, *, prompts: int = 16, max_new_tokens: int = 256,
        dtypes=("auto",), temperatures=(0.0,), device: str = "cpu", methods: Sequence[str] = DEFAULT_METHODS,
        batch_sizes: Sequence[int] = (1,), name: str = "e2e", title: str = "DFlash and its peers vs the target alone",
        command: str = "dflash bench e2e", runners: dict[str, Runner] | None = None, repeats: int = 1) -> Path:
    """Measure, write out/name.{json,md,png} (+ _per_prompt.png, _batch.png); raise OutputMismatch in fp32."""
    from .e2e_report import write

    for spec in pairs:
        check_methods(methods, assistant=spec.assistant)
    texts = read_prompts(prompts_file)[:prompts]
    results, failures, counted = [], [], False
    for dtype in dtypes:
        for temperature in temperatures:
            for spec in pairs:
                rows, mismatches, strict = measure_pair(
                    spec, texts, methods=methods, batch_sizes=batch_sizes, max_new_tokens=max_new_tokens,
                    dtype=dtype, temperature=temperature, device=device, runners=runners, repeats=repeats)
                config = {"pair": spec.label, "backend": spec.backend, "dtype": rows[0]["dtype"] if rows else dtype,
                          "temperature": temperature}
                results += [config | row for row in rows]
                failures += [(config, m) for m in mismatches] if strict else []
                counted |= bool(mismatches) and not strict
    path = write(out, name, results, title=title, command=command, prompts_file=prompts_file, prompts=len(texts),
                 max_new_tokens=max_new_tokens, rounding_note=counted, repeats=repeats)
    if failures:
        config, first = failures[0]
        more = f"; {len(failures) - 1} more" if len(failures) > 1 else ""
        raise OutputMismatch(f"{first.line()} at temperature 0 in {config['dtype']} (pair {config['pair']}){more}; "
                             f"report: {path}", path)
    return path

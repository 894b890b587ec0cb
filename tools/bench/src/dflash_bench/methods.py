"""The decoding methods `dflash bench e2e` compares: one runner each, all on the same loaded pair.

Every runner has the signature of `Runner`: it decodes one left-padded batch of prompts with
`pair.target` (the same model object, dtype and device for every method) and returns the new tokens
of each row and the seconds the decode took. A runner that cannot decode a batch raises
`NotApplicable` before doing any work; the benchmark then records "n/a (reason)".

Adding a method is one function and one entry in RUNNERS. `assisted` (Hugging Face assisted
generation with a small autoregressive draft model trained on the same corpus and tokenizer,
`models/demo/assistant`) needs that model, so its runner is made per pair by `assisted_runner(path)`
(the model is loaded once, in the target's dtype and on its device).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import torch

from dflash_core.decode.autoregressive import generate_autoregressive
from dflash_core.decode.loop import generate
from dflash_core.errors import CompatibilityError, DFlashError
from dflash_core.loading import Pair
from dflash_core.decode.profiling import DecodeProfile, sync_device
from dflash_core.kernels.prepacked_linear import prepack_linears

PROMPT_LOOKUP_TOKENS = 10
"""Drafts per step of Hugging Face prompt lookup (`prompt_lookup_num_tokens`), its documented example."""


@dataclass(frozen=True)
class PromptBatch:
    """Prompts decoded together: left-padded ids and their mask (1 = token, 0 = padding)."""

    input_ids: torch.Tensor  # [b, T]
    attention_mask: torch.Tensor  # [b, T]
    prompts: tuple[int, ...]
    """Which prompt each row is (an index into the benchmark's prompt list)."""

    @classmethod
    def of(cls, rows: Sequence[Sequence[int]], prompts: Sequence[int], *, pad_id: int,
           device: str | torch.device = "cpu") -> "PromptBatch":
        width = max(len(r) for r in rows)
        ids = torch.tensor([[pad_id] * (width - len(r)) + list(r) for r in rows], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
        return cls(ids.to(device), mask.to(device), tuple(prompts))

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]


@dataclass(frozen=True)
class DecodeSettings:
    """What every method is asked to do (identical for all methods of one comparison)."""

    max_new_tokens: int
    stop_token_ids: tuple[int, ...] = ()
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0


@dataclass
class MethodRun:
    """One method on one batch: outputs, time, and what the method can say about its steps."""

    tokens: list[list[int]]
    """New tokens of each row, up to and including the first stop token."""
    seconds: float
    """Wall time of the decode (from a `DecodeProfile` where the method fills one)."""
    profile: DecodeProfile | None = None
    acceptance_lengths: list[list[int]] | None = None
    """Tokens committed per verify step of each row (speculative methods that report them)."""


class NotApplicable(Exception):
    """This method cannot decode this batch (e.g. its batch size); the message says why."""


class Runner(Protocol):
    def __call__(self, pair: Pair, batch: PromptBatch, settings: DecodeSettings) -> MethodRun: ...


def _sampling(settings: DecodeSettings) -> dict:
    return {"max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature,
            "top_p": settings.top_p, "top_k": settings.top_k, "stop_token_ids": list(settings.stop_token_ids),
            "seed": settings.seed}


def run_ar(pair: Pair, batch: PromptBatch, settings: DecodeSettings) -> MethodRun:
    """The target alone through DFlash's own loop with no drafter (rows decoded together as one batch)."""
    profile = DecodeProfile()
    result = generate_autoregressive(pair.target, batch.input_ids, attention_mask=batch.attention_mask,
                                     profile=profile, **_sampling(settings))
    return MethodRun(result.tokens, profile.total_s, profile)


def run_dflash(pair: Pair, batch: PromptBatch, settings: DecodeSettings, *, draft_length: int | str = "auto",
               context_lookup: bool = True, confidence_trim: bool = False, tree: int | str | None = None) -> MethodRun:
    """DFlash `generate` (rows decoded together as one batch), by default its defaults."""
    profile = DecodeProfile()
    result = generate(pair.target, pair.drafter, batch.input_ids, attention_mask=batch.attention_mask,
                      draft_length=draft_length, context_lookup=context_lookup, confidence_trim=confidence_trim,
                      tree=tree, profile=profile, tuning=pair.tuning, **_sampling(settings))
    return MethodRun(result.tokens, profile.total_s, profile, result.acceptance_lengths)


def run_dflash_drafter(pair: Pair, batch: PromptBatch, settings: DecodeSettings) -> MethodRun:
    """DFlash with the drafter's argmax chain as its only draft source (no context lookup, no token tree): what
    the drafter alone buys."""
    return run_dflash(pair, batch, settings, context_lookup=False, tree="off")


def run_dflash_full(pair: Pair, batch: PromptBatch, settings: DecodeSettings) -> MethodRun:
    """DFlash verifying the drafter's whole block as a chain every step (k = B-1): the drafter's own acceptance,
    tau at block B."""
    return run_dflash(pair, batch, settings, draft_length=pair.drafter.config.block_size - 1, tree="off")


def run_dflash_chain(pair: Pair, batch: PromptBatch, settings: DecodeSettings) -> MethodRun:
    """DFlash defaults verifying the drafter's argmax chain only (`tree="off"`): `dflash_tree`'s reference."""
    return run_dflash(pair, batch, settings, tree="off")


def run_dflash_tree(pair: Pair, batch: PromptBatch, settings: DecodeSettings) -> MethodRun:
    """DFlash defaults with token trees of automatic size (`generate(..., tree="auto")`, `dflash_core.decode.tree`):
    what the drafter's other candidates buy, side by side with `dflash`."""
    return run_dflash(pair, batch, settings, tree="auto")


def run_dflash_tree_drafter(pair: Pair, batch: PromptBatch, settings: DecodeSettings) -> MethodRun:
    """`dflash_tree` with the drafter as its only draft source: trees against `dflash_drafter`'s chains."""
    return run_dflash(pair, batch, settings, tree="auto", context_lookup=False)


def run_dflash_trimmed(pair: Pair, batch: PromptBatch, settings: DecodeSettings) -> MethodRun:
    """DFlash defaults plus trimming each step's drafts by the drafter's confidence (`generate(...,
    confidence_trim=True)`, `dflash_core.decode.draft_confidence`): what the trimming buys, side by side with `dflash`."""
    return run_dflash(pair, batch, settings, confidence_trim=True)


def run_dflash_plain_weights(pair: Pair, batch: PromptBatch, settings: DecodeSettings) -> MethodRun:
    """DFlash defaults with the drafter reading its own weights, where it decodes fp16-packed or bf16 copies
    (`dflash_core.kernels.packed_weights`): what the copies buy, side by side with `dflash`."""
    return _dflash_with_weights(pair, batch, settings, "plain")


def run_dflash_fp16_weights(pair: Pair, batch: PromptBatch, settings: DecodeSettings) -> MethodRun:
    """DFlash defaults with the drafter decoding fp16-packed copies, where it decodes another format (bf16
    copies, on a CPU with bf16 in hardware): the two kinds of copy side by side."""
    return _dflash_with_weights(pair, batch, settings, "fp16-packed")


def _dflash_with_weights(pair: Pair, batch: PromptBatch, settings: DecodeSettings, weight_format: str) -> MethodRun:
    drafter = pair.drafter
    loaded = getattr(drafter, "weight_format", "plain")
    if loaded == weight_format or loaded == "plain":
        raise NotApplicable(f"the drafter decodes with {loaded} weights already (weight copies: an fp32 drafter on a "
                            "CPU, and `load_pair(..., drafter_weights=\"auto\")` keeping them)")
    try:
        drafter.use_weight_format(weight_format)
    except CompatibilityError as exc:
        raise NotApplicable(str(exc)) from None
    try:
        with torch.inference_mode():  # the copies, and their kernel timings, now: not inside the timed decode, and
            drafter.decode_weights()  # made even where the draft-length policy never drafts in this batch
        return run_dflash(pair, batch, settings)
    finally:
        drafter.use_weight_format(loaded)


def run_prompt_lookup(pair: Pair, batch: PromptBatch, settings: DecodeSettings) -> MethodRun:
    """Hugging Face prompt-lookup decoding: drafts copied from n-gram matches in the context."""
    return _hf_generate(pair, batch, settings, prompt_lookup_num_tokens=PROMPT_LOOKUP_TOKENS)


def run_hf_generate(pair: Pair, batch: PromptBatch, settings: DecodeSettings) -> MethodRun:
    """Hugging Face's own `generate()` loop on the target, no drafts (opt-in: a second plain baseline)."""
    return _hf_generate(pair, batch, settings)


def assisted_runner(assistant_dir: Path) -> Runner:
    """Hugging Face assisted generation with the AR draft model in `assistant_dir` (loaded on first use, in the
    target's dtype and device, its linear layers prepacked where the target's are: bf16 on a CPU with oneDNN)."""
    loaded: dict[tuple, torch.nn.Module] = {}

    def run_assisted(pair: Pair, batch: PromptBatch, settings: DecodeSettings) -> MethodRun:
        key = (pair.target.dtype, str(pair.target.device))
        if key not in loaded:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(str(assistant_dir), dtype=pair.target.dtype,
                                                         use_safetensors=True, trust_remote_code=False)
            loaded[key] = model.to(pair.target.device).eval()
            prepack_linears(loaded[key])  # its fastest weight format, as `load_pair` gives the target (bf16 CPU)
        return _hf_generate(pair, batch, settings, assistant_model=loaded[key])

    return run_assisted


RUNNERS: dict[str, Runner] = {"ar": run_ar, "dflash": run_dflash, "dflash_drafter": run_dflash_drafter,
                              "dflash_full": run_dflash_full, "dflash_plain_weights": run_dflash_plain_weights,
                              "dflash_fp16_weights": run_dflash_fp16_weights,
                              "dflash_trimmed": run_dflash_trimmed, "dflash_chain": run_dflash_chain,
                              "dflash_tree": run_dflash_tree,
                              "dflash_tree_drafter": run_dflash_tree_drafter,
                              "prompt_lookup": run_prompt_lookup, "hf_generate": run_hf_generate}
DEFAULT_METHODS = ("ar", "dflash", "dflash_drafter", "dflash_full", "prompt_lookup", "assisted")
PLANNED = {"assisted": "Hugging Face assisted generation with the small draft model models/demo/assistant"}


def _hf_generate(pair: Pair, batch: PromptBatch, settings: DecodeSettings, **method) -> MethodRun:
    stops = list(settings.stop_token_ids)
    kwargs = {"max_new_tokens": settings.max_new_tokens, "do_sample": settings.temperature > 0,
              "eos_token_id": stops or None, "pad_token_id": stops[0] if stops else 0, **method}
    if settings.temperature > 0:
        kwargs.update(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k)
        torch.manual_seed(settings.seed)
    device = pair.target.device
    sync_device(device)
    start = time.perf_counter()
    try:
        with torch.inference_mode():
            out = pair.target.model.generate(batch.input_ids, attention_mask=batch.attention_mask, **kwargs)
    except ValueError as exc:
        if batch.size > 1 and "batch" in str(exc).lower():  # transformers' own refusal, before any forward
            import transformers

            raise NotApplicable(f"transformers {transformers.__version__} runs it one prompt at a time "
                                f"(\"{str(exc).strip()}\")") from None
        raise
    sync_device(device)
    seconds = time.perf_counter() - start
    width = batch.input_ids.shape[1]
    return MethodRun([cut_at_stop(row, stops) for row in out[:, width:].tolist()], seconds)


def cut_at_stop(tokens: Sequence[int], stops: Sequence[int]) -> list[int]:
    """Tokens up to and including the first stop token (what follows it in a batch is padding)."""
    for i, token in enumerate(tokens):
        if token in stops:
            return list(tokens[: i + 1])
    return list(tokens)


def check_methods(names: Sequence[str], *, assistant: Path) -> None:
    """Refuse, in one line, a method that is unknown or cannot run here (before anything loads)."""
    known = [*RUNNERS, *PLANNED]
    for name in names:
        if name not in known:
            raise DFlashError(f"--methods names {name!r}; expected some of {', '.join(known)}.")
    if "assisted" in names:
        if not (assistant / "config.json").is_file():
            raise DFlashError(f"--methods assisted needs the assistant model {assistant} (config.json), which is "
                              "missing: `make models` trains it; or leave `assisted` out.")


def first_difference(reference: Sequence[int], tokens: Sequence[int]) -> int | None:
    """Index of the first new token where `tokens` parts from `reference` (None: identical)."""
    for i, (a, b) in enumerate(zip(reference, tokens)):
        if a != b:
            return i
    return None if len(reference) == len(tokens) else min(len(reference), len(tokens))


@dataclass(frozen=True)
class Mismatch:
    method: str
    prompt: int
    position: int
    batch_size: int

    def line(self) -> str:
        return (f"{self.method} differs from ar on prompt {self.prompt} at new token {self.position} "
                f"(batch size {self.batch_size})")


def compare_with_reference(method: str, reference: MethodRun, run: MethodRun, prompts: Sequence[int],
                           batch_size: int) -> list[Mismatch]:
    """One Mismatch per row of `run` whose tokens are not exactly `reference`'s (rows = `prompts`)."""
    found = []
    for prompt, ref, got in zip(prompts, reference.tokens, run.tokens, strict=True):
        position = first_difference(ref, got)
        if position is not None:
            found.append(Mismatch(method, prompt, position, batch_size))
    return found


def flip_one_token(runner: Runner, position: int = 2) -> Runner:
    """A deliberately wrong method (the comparison's negative control): row 0's token at `position` + 1."""

    def wrong(pair: Pair, batch: PromptBatch, settings: DecodeSettings) -> MethodRun:
        run = runner(pair, batch, settings)
        row = run.tokens[0]
        if len(row) > position:
            row[position] = (row[position] + 1) % pair.target.vocab_size
        return run

    return wrong

